// Timing training steps on synthetic tokens.
#include "train/benchmark.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/median.h"
#include "core/random.h"
#include "plan/plan_report.h"
#include "train/backends.h"
#include "train/device_monitor.h"
#include "train/executor.h"
#include "train/metrics.h"
#include "train/reference_runs.h"
#include "train/run_setup.h"
#include "train/trace.h"
#include "train/trainer_ranks.h"
#ifdef SMELT_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace smelt {

namespace {

size_t device_free_bytes(const Backend& backend) {
#ifdef SMELT_HAVE_CUDA
  if (backend.device() == Device::cuda) return cuda_free_device_memory();
#endif
  (void)backend;
  return 0;
}

// Merges the traced per-op means (seconds, one entry per op of the plan, layers averaged) into
// the op timing cache at `path`, keyed by this GPU's cost-model name and the run's shape.
void merge_calibration(const std::string& path, const RunSetup& setup, const StepPlan& plan,
                       const std::vector<double>& per_step_ms, std::ostream& log) {
  OpTimingCache cache = std::filesystem::exists(path) ? OpTimingCache::load(path) : OpTimingCache{};
  std::map<std::string, std::pair<double, int>> sums;  // op key -> (seconds, occurrences)
  for (size_t i = 0; i < plan.steps.size() && i < per_step_ms.size(); ++i) {
    if (!(per_step_ms[i] > 0)) continue;
    auto& [seconds, count] = sums[op_timing_key(plan.steps[i])];
    seconds += per_step_ms[i] / 1e3;
    ++count;
  }
  const std::string shape = shape_timing_key(setup.model, plan.options, setup.float8_linears);
  for (const auto& [op, sum] : sums) cache.set(setup.ceilings.gpu_name, op, shape, sum.first / sum.second);
  cache.save(path);
  log << "calibration: " << sums.size() << " op timings on " << setup.ceilings.gpu_name << " for '" << shape
      << "' merged into " << path << " (" << cache.size() << " entries)\n";
}


// The runs to compare with: the built-in table of this GPU, a file, or none.
std::optional<ReferenceTable> reference_table(const std::string& path, const std::string& gpu_name) {
  if (path == "none") return std::nullopt;
  return path.empty() ? builtin_reference_table(gpu_name) : load_reference_table(path);
}

}  // namespace

BenchResult run_benchmark(const JobConfig& config, const BenchOptions& options, std::ostream& log) {
  using clock = std::chrono::steady_clock;
  // Sharded configs (and launches of several ranks) bench each rank's step with its collectives;
  // the figures are per GPU, as torchtitan reports them.
  const LaunchEnvironment environment = read_launch_environment();
  auto backend = make_backend(config.job.device, environment.local_rank, config.training.gemm_autotune);
  const RunRanks ranks = join_ranks(config, environment, *backend, nullptr);
  if (ranks.world_size > 1) check_same_config(*ranks.communicator, config_to_json(config));
  RunSetup setup = prepare_run(config, backend.get(), /*need_tokenizer=*/false);
  StepPlan plan = build_step_plan(setup.model, setup.plan_options);
  const StepShape shape = setup.plan_options.shape;  // one microbatch
  const int64_t microbatches = setup.plan_options.microbatches;
  const double tokens_per_step = static_cast<double>(shape.tokens() * microbatches);

  BenchResult r;
  r.gpu_name = backend->device_model();
  const std::optional<ReferenceTable> references = reference_table(options.reference_path, r.gpu_name);  // a bad file fails first

  r.device = config.job.device;
  r.precision = precision_label(config);
  r.policy = plan.options.policy.str();
  r.batch = shape.batch;
  r.seq_len = shape.seq_len;
  r.layers = setup.model.n_layers;
  r.label = setup.model.flavor + " x" + std::to_string(r.layers) + " " + r.precision + " " + r.policy + " b" +
            std::to_string(r.batch) + " s" + std::to_string(r.seq_len);
  if (microbatches > 1) r.label += " x" + std::to_string(microbatches) + " accumulated";
  if (plan.data_parallel()) {
    r.label += plan.sharded() ? " fsdp" : " dp";
    r.label += std::to_string(ranks.world_size) + " " + ranks.communicator->name();
  }
  r.predicted_bytes = plan.memory.arena_bytes;
  const PlanTime predicted = setup.cost_model().predict(plan);
  r.predicted_step_ms = predicted.seconds * 1e3;
  log << "bench: " << describe(setup.model) << "\n" << "plan: " << plan_summary_line(plan) << "\n" << std::flush;

  hold_to_memory_budget(setup, *backend, log);
  const size_t free_before = device_free_bytes(*backend);
  Executor executor(plan, *backend, ranks.communicator);
  {
    std::vector<float> host(static_cast<size_t>(executor.layout().total()));
    initialize_parameters(executor.layout(), setup.model, static_cast<uint64_t>(config.training.seed), host.data());
    executor.load_parameters(host.data());
    executor.reset_optimizer_state();
  }
  std::vector<int32_t> inputs(static_cast<size_t>(shape.tokens())), targets(inputs.size());
  Random random(static_cast<uint64_t>(config.training.seed), 17);
  for (auto& t : inputs) t = static_cast<int32_t>(random.below(static_cast<uint64_t>(setup.tokenizer ? setup.tokenizer->vocab_size() : setup.model.vocab_size)));
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = inputs[(i + 1) % inputs.size()];
  executor.load_batch(inputs.data(), targets.data());
  executor.enable_graph(config.training.cuda_graph);

  OptimizerSettings optimizer;
  optimizer.lr = static_cast<float>(config.optimizer.lr);
  optimizer.beta1 = static_cast<float>(config.optimizer.beta1);
  optimizer.beta2 = static_cast<float>(config.optimizer.beta2);
  optimizer.eps = static_cast<float>(config.optimizer.eps);
  optimizer.weight_decay = static_cast<float>(config.optimizer.weight_decay);
  optimizer.max_norm = static_cast<float>(config.training.max_norm);

  std::vector<double> milliseconds;
  std::vector<double> per_step_ms(plan.steps.size(), 0.0);
  // Each step's collectives on the communication stream (start, end), summed, and how many traced steps had them.
  std::vector<std::pair<double, double>> windows(plan.steps.size(), {0.0, 0.0});
  std::vector<int> windowed(plan.steps.size(), 0);
  const bool tracing = !options.trace_path.empty();
  DeviceMonitor monitor(backend->pci_bus_id());
  for (int64_t step = 1; step <= options.warmup + options.steps; ++step) {
    optimizer.step = step;
    if (step == options.warmup + 1) monitor.start();
    if (tracing && step == options.warmup + 1) executor.enable_timing(true);
    const auto start = clock::now();
    // Gradient accumulation: every microbatch reads the same synthetic tokens (loaded once).
    for (int64_t microbatch = 0; microbatch < microbatches; ++microbatch) executor.run_microbatch(optimizer, microbatch);
    executor.run_update(optimizer);
    const double loss = executor.loss();  // waits for the step
    if (tracing && step > options.warmup) {
      auto ms = executor.step_milliseconds();
      for (size_t i = 0; i < ms.size(); ++i) per_step_ms[i] += ms[i] / static_cast<double>(options.steps);
      const auto step_windows = executor.collective_windows();
      for (size_t i = 0; i < step_windows.size(); ++i) {
        if (step_windows[i].first < 0) continue;
        windows[i].first += step_windows[i].first;
        windows[i].second += step_windows[i].second;
        ++windowed[i];
      }
    }
    const double ms = std::chrono::duration<double, std::milli>(clock::now() - start).count();
    if (step == 1) r.first_loss = loss;
    r.last_loss = loss;
    if (!std::isfinite(loss)) fail(ErrorKind::internal, "bench: loss is not finite at step " + std::to_string(step));
    if (step > options.warmup) milliseconds.push_back(ms);
    log << "  step " << step << (step <= options.warmup ? " (warm-up)" : "") << ": " << ms << " ms, loss " << loss
        << "\n" << std::flush;
  }
  const DeviceReport device = monitor.stop();
  if (backend->device() == Device::cuda) log << describe_device_report(device) << "\n";
  r.sm_clock_mhz = device.sm_clock_mhz;
  r.sm_clock_max_mhz = device.sm_clock_max_mhz;
  r.power_watts = device.power_watts;
  r.power_limit_watts = device.power_limit_watts;
  r.power_capped = device.power_capped;
  r.temperature_c = device.temperature_c;
  if (device.has_energy() && options.steps > 0) {
    r.joules_per_step = device.energy_joules / static_cast<double>(options.steps);
    r.tokens_per_joule = tokens_per_step / r.joules_per_step;
    log << "energy: " << r.joules_per_step << " J per step, " << r.tokens_per_joule << " tokens per joule\n";
  }
  if (tracing && options.report) {
    // Each step's time as the planner predicts it, for the summary's comparison.
    std::vector<double> predicted_ms;
    for (double seconds : predicted.step_seconds) predicted_ms.push_back(seconds * 1e3);
    for (size_t i = 0; i < windows.size(); ++i)  // means over the traced steps
      windows[i] = windowed[i] == 0 ? std::pair{-1.0, -1.0}
                                    : std::pair{windows[i].first / windowed[i], windows[i].second / windowed[i]};
    write_chrome_trace(options.trace_path, plan, per_step_ms, windows);
    log << "\nwhere the time goes (mean of " << options.steps << " traced steps"
        << (microbatches > 1 ? ", each step's last microbatch and its update" : "") << "; trace: " << options.trace_path
        << ")\n"
        << trace_summary(plan, per_step_ms, predicted_ms) << std::flush;
    if (!options.calibrate_path.empty()) merge_calibration(options.calibrate_path, setup, plan, per_step_ms, log);
  }
  const size_t free_after = device_free_bytes(*backend);
  if (backend->device() == Device::cuda) {
    log << "CUDA graph: " << (executor.graph_active() ? "captured and replayed" : "off (ops launched one by one)") << "\n";
    log << "GEMM algorithms: "
        << (config.training.gemm_autotune ? "the fastest of cuBLASLt's candidates, timed per shape in the first step"
                                          : "cuBLASLt's heuristic first choice (training.gemm_autotune = false)")
        << "\n";
  }
  r.measured_bytes = backend->device() == Device::cuda ? free_before - free_after : executor.arena().size();

  r.step_ms = median(milliseconds);
  const auto [fastest, slowest] = std::minmax_element(milliseconds.begin(), milliseconds.end());
  r.step_ms_min = milliseconds.empty() ? 0 : *fastest;
  r.step_ms_max = milliseconds.empty() ? 0 : *slowest;
  r.tokens_per_second = r.step_ms > 0 ? tokens_per_step / (r.step_ms / 1e3) : 0;
  r.tflops = r.tokens_per_second * setup.model.training_flops_per_token(shape.seq_len) / 1e12;
  r.mfu_percent = 100.0 * r.tflops / kHopperPeakTflops;
  if (references) {
    const std::optional<ReferenceRun> match =
        find_reference(*references, reference_query(config, setup.model, plan, r.gpu_name, ranks.world_size));
    if (match) {
      r.reference = match;
      r.reference_source = references->source;
      if (options.report)
        log << compare_with_reference(r.reference_source, *match, "smelt", r.tokens_per_second,
                                      static_cast<double>(r.measured_bytes))
            << "\n";
    } else if (options.report) {
      log << "reference: none of the " << references->runs.size() << " runs of " << references->path << " ("
          << references->gpu << ") describes this step on " << r.gpu_name
          << " (scripts/pytorch_reference.py measures PyTorch's here: --reference FILE)\n";
    }
  }
  if (options.report && r.step_ms > 0 && r.predicted_step_ms > 0) {
    char line[256];
    std::snprintf(line, sizeof line, "%.1f ms per step predicted, %.1f measured (median; measured / predicted %.3f)",
                  r.predicted_step_ms, r.step_ms, r.step_ms / r.predicted_step_ms);
    log << "cost model (" << setup.ceilings.gpu_name
        << (predicted.calibrated_steps > 0 ? ", calibrated"
            : predicted.timing_cache     ? "; no op timing matches this plan, ceilings used"
                                         : "")
        << "): " << line << "\n";
  }
  return r;
}

namespace {
nlohmann::json with_speedup(nlohmann::json reference, double speedup) {
  reference["speedup"] = speedup;
  return reference;
}
}  // namespace

nlohmann::json bench_to_json(const BenchResult& r) {
  return {{"label", r.label},
          {"device", r.device},
          {"precision", r.precision},
          {"policy", r.policy},
          {"batch", r.batch},
          {"seq_len", r.seq_len},
          {"layers", r.layers},
          {"tokens_per_second", r.tokens_per_second},
          {"step_ms", r.step_ms},
          {"step_ms_min", r.step_ms_min},
          {"step_ms_max", r.step_ms_max},
          {"tflops", r.tflops},
          {"mfu_percent", r.mfu_percent},
          {"predicted_bytes", r.predicted_bytes},
          {"predicted_step_ms", r.predicted_step_ms},
          {"measured_bytes", r.measured_bytes},
          {"first_loss", r.first_loss},
          {"last_loss", r.last_loss},
          {"sm_clock_mhz", r.sm_clock_mhz},
          {"sm_clock_max_mhz", r.sm_clock_max_mhz},
          {"power_watts", r.power_watts},
          {"power_limit_watts", r.power_limit_watts},
          {"power_capped", r.power_capped},
          {"temperature_c", r.temperature_c},
          {"joules_per_step", r.joules_per_step},
          {"tokens_per_joule", r.tokens_per_joule},
          {"gpu_name", r.gpu_name},
          {"reference", r.has_reference() ? with_speedup(reference_run_json(r.reference_source, *r.reference),
                                                         r.tokens_per_second / r.reference->tokens_per_second)
                                          : nlohmann::json(nullptr)}};
}

BenchResult bench_from_json(const nlohmann::json& j) {
  BenchResult r;
  r.label = j.value("label", "");
  r.device = j.value("device", "");
  r.precision = j.value("precision", "");
  r.policy = j.value("policy", "");
  r.batch = j.value("batch", int64_t{0});
  r.seq_len = j.value("seq_len", int64_t{0});
  r.layers = j.value("layers", int64_t{0});
  r.tokens_per_second = j.value("tokens_per_second", 0.0);
  r.step_ms = j.value("step_ms", 0.0);
  r.step_ms_min = j.value("step_ms_min", 0.0);
  r.step_ms_max = j.value("step_ms_max", 0.0);
  r.tflops = j.value("tflops", 0.0);
  r.mfu_percent = j.value("mfu_percent", 0.0);
  r.predicted_bytes = j.value("predicted_bytes", size_t{0});
  r.predicted_step_ms = j.value("predicted_step_ms", 0.0);
  r.measured_bytes = j.value("measured_bytes", size_t{0});
  r.first_loss = j.value("first_loss", 0.0);
  r.last_loss = j.value("last_loss", 0.0);
  r.sm_clock_mhz = j.value("sm_clock_mhz", 0.0);
  r.sm_clock_max_mhz = j.value("sm_clock_max_mhz", 0.0);
  r.power_watts = j.value("power_watts", 0.0);
  r.power_limit_watts = j.value("power_limit_watts", 0.0);
  r.power_capped = j.value("power_capped", 0.0);
  r.temperature_c = j.value("temperature_c", 0.0);
  r.joules_per_step = j.value("joules_per_step", 0.0);
  r.tokens_per_joule = j.value("tokens_per_joule", 0.0);
  r.gpu_name = j.value("gpu_name", "");
  if (j.contains("reference") && j["reference"].is_object()) {
    r.reference = reference_run_from_json(j["reference"]);
    r.reference_source = j["reference"].value("source", "");
  }
  return r;
}

}  // namespace smelt
