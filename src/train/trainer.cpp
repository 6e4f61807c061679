// The training loop: plan, allocate, initialise, then step, log and validate.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <ostream>

#include "core/median.h"
#include "data/loader.h"
#include "plan/plan_report.h"
#include "train/backends.h"
#include "train/checkpoint.h"
#include "train/device_monitor.h"
#include "train/executor.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/tensorboard.h"
#include "train/model_weights.h"
#include "train/run_setup.h"
#include "train/step_guard.h"
#include "train/trainer_ranks.h"

namespace smelt {

namespace {

// Forward-only pass over `batches` validation batches: the forward steps, the
// final norm, the output head and the loss. Gradients it touches are rewritten by
// the next training step before anything reads them.
double validation_loss(Executor& executor, DataLoader& loader, int64_t batches, std::vector<int32_t>& inputs,
                       std::vector<int32_t>& targets) {
  double total = 0;
  OptimizerSettings unused;
  for (int64_t b = 0; b < batches; ++b) {
    loader.next_batch(inputs.data(), targets.data());
    executor.load_batch(inputs.data(), targets.data());
    executor.run_loss(unused);
    total += executor.loss();
  }
  return total / static_cast<double>(std::max<int64_t>(1, batches));
}

// Rank 0's checkpoint settings as they are; the other ranks write nothing and load what rank 0
// resumes from (checkpoint.load, or the newest checkpoint in its folder).
JobConfig checkpoint_config_for_rank(const JobConfig& config, const RunRanks& ranks, const std::string& run_folder) {
  if (ranks.world_size <= 1) return config;
  std::string source;
  if (ranks.leader()) {
    source = resolve_run_path(run_folder, config.checkpoint.load, "checkpoint.load");
    if (source.empty() && config.checkpoint.enable)
      source = find_newest_checkpoint(resolve_run_path(run_folder, config.checkpoint.folder, "checkpoint.folder"));
  }
  source = ranks.communicator->exchange_text(source).at(0);
  if (ranks.leader()) return config;
  JobConfig follower = config;
  follower.checkpoint.enable = false;
  follower.checkpoint.load = source;
  return follower;
}

}  // namespace

TrainResult train(const JobConfig& config, std::ostream& log, Communicator* communicator) {
  using clock = std::chrono::steady_clock;
  const LaunchEnvironment environment = read_launch_environment();
  auto backend = make_backend(config.job.device, communicator ? 0 : environment.local_rank,
                              config.training.gemm_autotune);
  const RunRanks ranks = join_ranks(config, environment, *backend, communicator);
  if (ranks.world_size > 1) check_same_config(*ranks.communicator, config_to_json(config));
  RunSetup setup = prepare_run(config, backend.get());
  const auto& model = setup.model;
  StepPlan plan = build_step_plan(model, setup.plan_options);
  const StepShape shape = setup.plan_options.shape;

  log << "smelt " << SMELT_VERSION << ": " << describe(model) << "\n";
  log << "plan: " << plan_summary_line(plan) << "\n";
  const CommunicationVolume communication = communication_volume(plan);
  if (plan.data_parallel())
    log << rank_label(ranks) << "FSDP over " << ranks.world_size << " rank(s) (" << ranks.communicator->name()
        << "): weights gathered in " << dtype_name(communication.gather_dtype) << ", gradients reduced in "
        << dtype_name(communication.reduce_dtype) << ", " << format_bytes(static_cast<size_t>(communication.total_bytes()))
        << " of collectives per step\n";
  hold_to_memory_budget(setup, *backend, log);

  TrainResult result;
  result.run_folder = (std::filesystem::path(config.job.dump_folder) / config.job.name).string();
  if (ranks.leader()) {
    std::filesystem::create_directories(result.run_folder);
    write_file_atomically(result.run_folder + "/config.json", config_to_json(config));
  }

  const DatasetOptions data = dataset_options(setup, ranks.rank, ranks.world_size);
  // Rank 0 tokenizes text into the cache first; the others then read it.
  if (!ranks.leader()) ranks.communicator->barrier();
  Dataset dataset = open_dataset(data, *setup.tokenizer);
  if (ranks.leader() && ranks.world_size > 1) ranks.communicator->barrier();
  log << "data: " << dataset.description << "\n";

  Executor executor(plan, *backend, ranks.communicator);
  executor.enable_graph(config.training.cuda_graph);
  result.arena_bytes = executor.arena().size();
  {
    std::vector<float> host(static_cast<size_t>(executor.layout().total()), 0.0f);
    initialize_parameters(executor.layout(), model, static_cast<uint64_t>(config.training.seed), host.data());
    executor.load_parameters(host.data());
    executor.reset_optimizer_state();
  }
  log << "memory: one " << backend->name() << " arena of " << format_bytes(executor.arena().size())
      << ", nothing allocated after this point\n";

  LrSchedule schedule;
  schedule.lr = config.optimizer.lr;
  schedule.warmup_steps = config.lr_scheduler.warmup_steps;
  schedule.total_steps = config.training.steps;
  schedule.decay_ratio = config.lr_scheduler.decay_ratio;
  schedule.decay = parse_decay_type(config.lr_scheduler.decay_type);
  schedule.min_lr_factor = config.lr_scheduler.min_lr_factor;

  OptimizerSettings optimizer;
  optimizer.beta1 = static_cast<float>(config.optimizer.beta1);
  optimizer.beta2 = static_cast<float>(config.optimizer.beta2);
  optimizer.eps = static_cast<float>(config.optimizer.eps);
  optimizer.weight_decay = static_cast<float>(config.optimizer.weight_decay);
  optimizer.max_norm = static_cast<float>(config.training.max_norm);

  const double flops_per_token = model.training_flops_per_token(shape.seq_len);
  const int64_t microbatches = executor.microbatches();  // gradient accumulation: passes per step
  const int64_t tokens_per_step = shape.tokens() * microbatches;
  const bool on_gpu = backend->device() == Device::cuda;
  std::vector<int32_t> inputs(static_cast<size_t>(shape.tokens())), targets(inputs.size());
  std::vector<double> step_seconds;
  const auto start = clock::now();
  // A step's time runs from the previous step's gradient sync to its own: the previous update
  // (launched without waiting) and this step's forward and backward, so in steady state one whole
  // step. Validation and checkpoint pauses are left out (previous_end moves past them).
  auto previous_end = start;
  double interval_seconds = 0;
  int64_t interval_steps = 0;

  // Every evaluation reads the same batches, the first validation.steps of the split, so the
  // validation losses of a run (and of runs that differ in anything but the data) compare.
  const LoaderState validation_start = dataset.validation ? dataset.validation->state() : LoaderState{};
  auto run_validation = [&]() -> double {
    if (!config.validation.enable || !dataset.validation) return -1;
    dataset.validation->restore(validation_start);
    return validation_loss(executor, *dataset.validation, config.validation.steps, inputs, targets);
  };
  // Resume (checkpoint.load, or the newest checkpoint in the folder), then guard and checkpoint every step.
  std::string tokenizer_spec = config.model.tokenizer_path;
  if (tokenizer_spec != "byte") tokenizer_spec = std::filesystem::absolute(tokenizer_spec).string();
  // Sharded over several ranks: every rank writes its own shards' files (rank 0 the index) and
  // resumes from the checkpoint rank 0 chose, reading only its ranges. Otherwise rank 0 alone
  // writes the whole model and the others resume from what it chose.
  const ShardLayout* shards = per_rank_checkpoints(executor, ranks) ? executor.shard_layout() : nullptr;
  const JobConfig checkpoint_config = shards ? config : checkpoint_config_for_rank(config, ranks, result.run_folder);
  Checkpointer checkpointer(checkpoint_config, result.run_folder, model, executor.layout(), tokenizer_spec, shape.seq_len,
                            shards, shards ? ranks.communicator : nullptr);
  TrainingProgress progress = checkpointer.resume(executor, *dataset.train, log);
  auto after_step = [&](int64_t step) {
    const bool due = config.checkpoint.enable && (step == config.training.steps || step % config.checkpoint.interval == 0);
    if (ranks.leader() || shards)
      checkpointer.after_step(executor, progress, step == config.training.steps, log);
    else if (due)
      take_part_in_checkpoint(executor);
    if (due) previous_end = clock::now();
  };
  StepGuard guard(config.training, progress);
  DeviceMonitor monitor(backend->pci_bus_id(), 100);  // the GPU's clock and power per logged interval
  monitor.start();
  double energy_joules = 0;  // the GPU's, since training began here (summed over the intervals)
  MetricsLog metrics(ranks.leader() ? result.run_folder + "/metrics.jsonl" : "", /*append=*/progress.step > 0);
  std::unique_ptr<TensorBoardWriter> tensorboard;
  if (config.metrics.enable_tensorboard && ranks.leader()) {
    tensorboard = std::make_unique<TensorBoardWriter>(result.run_folder + "/tensorboard");
    log << "tensorboard: tensorboard --logdir " << result.run_folder << "/tensorboard\n";
  }
  // The update (optimizer, weight cast) runs only after the guard has seen this step's loss and
  // gradient norm; every other step (the loss reduction included) runs first, in plan order.

  if (config.validation.enable && dataset.validation && progress.step == 0) {
    result.first_validation_loss = run_validation();
    log << "validation loss before training: " << result.first_validation_loss << "\n";
  }

  for (int64_t step = progress.step + 1; step <= config.training.steps; ++step) {
    optimizer.lr = static_cast<float>(schedule.at(step));
    for (int64_t microbatch = 0; microbatch < microbatches; ++microbatch) {
      dataset.train->next_batch(inputs.data(), targets.data());
      executor.load_batch(inputs.data(), targets.data());  // waits for the microbatch before, which reads the tokens
      executor.run_microbatch(optimizer, microbatch);
    }
    const double loss = executor.loss();  // synchronises: forward and backward are complete
    const auto gradients_done = clock::now();
    const double seconds = std::chrono::duration<double>(gradients_done - previous_end).count();
    previous_end = gradients_done;
    if (guard.check(step, loss, executor.gradient_norm(), log) == StepVerdict::apply) {
      optimizer.step = progress.optimizer_steps;  // AdamW's bias correction counts applied updates
      executor.run_update(optimizer);
    }
    progress.step = step;
    step_seconds.push_back(seconds);
    interval_seconds += seconds;
    result.losses.push_back(loss);
    if (result.losses.size() == 1) result.first_loss = loss;  // the first step of this run (resumed runs too)
    result.final_loss = loss;
    ++interval_steps;

    const bool validate = config.validation.enable && dataset.validation &&
                          (step % config.validation.freq == 0 || step == config.training.steps);
    const bool report = step == 1 || step % config.metrics.log_freq == 0 || step == config.training.steps;
    if (!report && !validate) {
      after_step(step);
      continue;
    }
    const auto now = clock::now();
    StepMetrics m;
    m.step = step;
    m.loss = loss;
    m.grad_norm = executor.gradient_norm();
    m.lr = optimizer.lr;
    m.tokens_per_second = static_cast<double>(interval_steps * tokens_per_step) / std::max(interval_seconds, 1e-9);
    m.tflops = m.tokens_per_second * flops_per_token / 1e12;
    m.mfu_percent = on_gpu ? 100.0 * m.tflops / kHopperPeakTflops : -1;
    m.memory_gib = static_cast<double>(executor.arena().size()) / double(1ull << 30);
    m.elapsed_seconds = std::chrono::duration<double>(now - start).count();
    const DeviceReport gpu = monitor.take();
    if (gpu.available()) {
      m.sm_clock_mhz = gpu.sm_clock_mhz;
      m.power_watts = gpu.power_watts;
    }
    // Every window's energy counts, also one too short for a clock sample, or the sum falls short.
    if (gpu.has_energy()) m.energy_joules = (energy_joules += gpu.energy_joules);
    if (plan.data_parallel()) {
      m.ranks = ranks.world_size;
      m.gather_dtype = std::string(dtype_name(communication.gather_dtype));
      m.reduce_dtype = std::string(dtype_name(communication.reduce_dtype));
      m.communication_bytes = communication.total_bytes();
    }
    if (validate) {
      m.validation_loss = run_validation();
      result.final_validation_loss = m.validation_loss;
      previous_end = clock::now();
    }
    metrics.write(m);
    if (tensorboard) {
      tensorboard->scalar("loss/train", m.loss, step);
      if (m.validation_loss >= 0) tensorboard->scalar("loss/validation", m.validation_loss, step);
      tensorboard->scalar("optimizer/grad_norm", m.grad_norm, step);
      tensorboard->scalar("optimizer/lr", m.lr, step);
      tensorboard->scalar("throughput/tokens_per_second", m.tokens_per_second, step);
      tensorboard->scalar("throughput/tflops", m.tflops, step);
      if (m.mfu_percent >= 0) tensorboard->scalar("throughput/mfu_percent", m.mfu_percent, step);
      tensorboard->scalar("memory/arena_gib", m.memory_gib, step);
      if (m.sm_clock_mhz >= 0) tensorboard->scalar("gpu/sm_clock_mhz", m.sm_clock_mhz, step);
      if (m.power_watts >= 0) tensorboard->scalar("gpu/power_watts", m.power_watts, step);
      if (m.energy_joules >= 0) tensorboard->scalar("gpu/energy_kilojoules", m.energy_joules / 1e3, step);
      tensorboard->flush();
    }
    log << rank_label(ranks) << MetricsLog::console_line(m) << "\n" << std::flush;
    after_step(step);
    interval_seconds = 0;
    interval_steps = 0;
  }
  checkpointer.finish(log);

  // The final weights, with what generation needs to use them.
  if (ranks.leader()) {
    save_model_weights(result.run_folder + "/model.safetensors", executor, tokenizer_spec, shape.seq_len);
    log << "weights: " << result.run_folder << "/model.safetensors\n";
  } else {
    executor.read_parameters(nullptr);  // the gather save_model_weights does on rank 0
  }

  result.steps = config.training.steps;
  result.seconds = std::chrono::duration<double>(clock::now() - start).count();
  // Median over steps after the first few (warm-up: caches, library heuristics).
  std::vector<double> steady(step_seconds.begin() + std::min<size_t>(step_seconds.size() / 4, 5), step_seconds.end());
  double median_seconds = median(steady.empty() ? step_seconds : steady);
  result.median_tokens_per_second = median_seconds > 0 ? static_cast<double>(tokens_per_step) / median_seconds : 0;
  result.median_tflops = result.median_tokens_per_second * flops_per_token / 1e12;
  return result;
}

}  // namespace smelt
