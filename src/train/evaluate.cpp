// The evaluation loop: weights into the executor of a one-pass plan, then the validation batches.
#include "train/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "data/loader.h"
#include "dist/launch_environment.h"
#include "plan/plan_report.h"
#include "train/backends.h"
#include "train/executor.h"
#include "train/model_weights.h"
#include "train/run_setup.h"

namespace smelt {

namespace {

// The config of the run the weights are evaluated in: their shapes and tokenizer, one pass a step.
JobConfig evaluation_config(const JobConfig& config, const SavedModel& saved, const std::string& tokenizer) {
  JobConfig c = config;
  c.model = model_section_of(saved.model);
  c.model.tokenizer_path = tokenizer.empty() ? saved.tokenizer : tokenizer;
  c.training.global_batch_size = -1;  // no accumulation: each batch is one forward pass
  return c;
}

// The run's setup as training would make it (the same loss chunk, so the same GEMM shapes in the
// head), without refusing on the training step's memory: planned without the backend (whose
// workspace the estimates equal), and when an automatic policy finds no training step under the
// budget, as `full`; evaluation keeps nothing for a backward either way.
RunSetup evaluation_setup(const JobConfig& config) {
  try {
    return prepare_run(config, nullptr);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::memory) throw;
    JobConfig full = config;
    full.activation_checkpoint.mode = "full";
    return prepare_run(full, nullptr);
  }
}

}  // namespace

PlanOptions evaluation_plan_options(PlanOptions training) {
  training.forward_only = true;
  training.persistent_output_copy = true;
  training.microbatches = 1;
  return training;
}

EvaluateResult evaluate(const JobConfig& config, const EvaluateOptions& options, std::ostream& log) {
  using clock = std::chrono::steady_clock;
  if (options.weights.empty()) fail(ErrorKind::config, "--weights: expected the weights to evaluate, found none");
  if (options.batches < 0)
    fail(ErrorKind::config, "--batches: expected a positive count (0: validation.steps), found " +
                                std::to_string(options.batches));
  if (read_launch_environment().world_size > 1)
    fail(ErrorKind::config, "smelt eval runs on one device; it found WORLD_SIZE > 1 (a launcher's environment). "
                            "Run it without the launcher");
  SavedModel saved = load_weights_from(options.weights, "--weights", options.tokenizer);
  if (options.tokenizer.empty() && saved.tokenizer.empty())
    fail(ErrorKind::config, "--weights '" + options.weights + "' records no tokenizer (a Hugging Face folder); pass "
                            "--tokenizer, e.g. the folder's original/tokenizer.model");
  const JobConfig c = evaluation_config(config, saved, options.tokenizer);
  auto backend = make_backend(c.job.device, 0, c.training.gemm_autotune);
  RunSetup setup = evaluation_setup(c);
  {
    ModelConfig planned = setup.model;
    planned.flavor = saved.model.flavor;
    if (model_config_to_json(planned) != model_config_to_json(saved.model))
      fail(ErrorKind::internal, "smelt eval: the run's model " + model_config_to_json(planned) +
                                    " differs from the weights' " + model_config_to_json(saved.model));
  }
  StepPlan plan = build_step_plan(setup.model, evaluation_plan_options(setup.plan_options));
  const StepShape shape = setup.plan_options.shape;
  EvaluateResult result;
  result.model = describe(saved.model) + ", from " + options.weights;
  log << "smelt " << SMELT_VERSION << " eval: " << result.model << "\n";
  log << "plan: " << plan_summary_line(plan) << "\n";

  ValidationData validation = open_validation_data(dataset_options(setup), *setup.tokenizer);
  result.data = validation.description;
  log << "data: " << result.data << "\n";

  // Sequence k is tokens [kT, kT + T]; the loader wraps around after the last whole one.
  const int64_t sequences = (validation.tokens - 1) / shape.seq_len;
  const int64_t available = sequences / shape.batch;
  if (available == 0)
    fail(ErrorKind::input, result.data + ": expected at least one batch of " + std::to_string(shape.batch) + " x " +
                               std::to_string(shape.seq_len + 1) + " tokens, found " + std::to_string(sequences) +
                               " sequence(s); use a smaller training.local_batch_size or more data");
  const int64_t wanted = options.batches > 0 ? options.batches : c.validation.steps;
  result.batches = std::min(wanted, available);
  result.all_data = wanted > available;
  result.tokens = result.batches * shape.tokens();

  Executor executor(plan, *backend);
  executor.load_parameters(saved.parameters.data());
  log << "memory: one " << backend->name() << " arena of " << format_bytes(executor.arena().size()) << "\n";
  log << "evaluating " << result.batches << " batch(es) of " << shape.batch << " x " << shape.seq_len << " tokens"
      << (result.all_data ? " (all the data holds; " + std::to_string(wanted) + " asked for)" : std::string()) << "\n"
      << std::flush;

  std::vector<int32_t> inputs(static_cast<size_t>(shape.tokens())), targets(inputs.size());
  OptimizerSettings unused;
  double total = 0;
  const auto start = clock::now();
  auto last_report = start;
  for (int64_t b = 0; b < result.batches; ++b) {
    validation.loader->next_batch(inputs.data(), targets.data());
    executor.load_batch(inputs.data(), targets.data());
    executor.run_loss(unused);
    total += executor.loss();
    const auto now = clock::now();
    if (now - last_report > std::chrono::seconds(10) && b + 1 < result.batches) {
      log << "  " << b + 1 << " of " << result.batches << " batches, loss so far " << total / double(b + 1) << "\n"
          << std::flush;
      last_report = now;
    }
  }
  result.seconds = std::chrono::duration<double>(clock::now() - start).count();
  result.loss = total / static_cast<double>(result.batches);
  if (!std::isfinite(result.loss))
    fail(ErrorKind::input, "smelt eval: the loss of '" + options.weights + "' is " + std::to_string(result.loss) +
                               "; the weights hold non-finite values or overflow in " + c.training.mixed_precision_param);
  result.perplexity = std::exp(result.loss);
  result.bits_per_token = result.loss / std::log(2.0);
  return result;
}

}  // namespace smelt
