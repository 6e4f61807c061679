// The largest batch that fits: a doubling then bisecting search over planned arenas.
#include "train/batch_headroom.h"

#include <algorithm>

#include "core/error.h"

namespace smelt {

namespace {

constexpr int64_t kLargestPassTokens = int64_t(1) << 20;

// `options` at a local batch of `batch`, as prepare_run makes them for a run configured with it.
PlanOptions at_batch(const RunSetup& setup, PlanOptions options, int64_t batch, const Backend* backend) {
  options.shape.batch = batch;
  size_workspaces(setup.config.job.device, setup.model, options, backend);
  choose_head_options(setup.config, setup.model, options, setup.memory_budget_bytes);
  return options;
}

}  // namespace

int64_t default_batch_search_limit(int64_t seq_len) {
  return std::max<int64_t>(1, kLargestPassTokens / std::max<int64_t>(1, seq_len));
}

BatchHeadroom largest_fitting_batch(const RunSetup& setup, const PlanOptions& options, const CostModel& cost,
                                    int64_t limit, const Backend* backend) {
  if (!options.keep_sets.empty() || options.policy.mode == CheckpointMode::automatic)
    fail(ErrorKind::internal, "largest_fitting_batch: expected a fixed checkpointing policy, found '" +
                                  options.policy.str() + "' with keep-sets; search under each fixed policy instead");
  if (limit < 1) fail(ErrorKind::internal, "largest_fitting_batch: expected a limit of at least one sequence");
  const double budget = setup.memory_budget_bytes;
  auto fits = [&](int64_t batch) {
    const StepPlan plan = build_step_plan(setup.model, at_batch(setup, options, batch, backend));
    return static_cast<double>(plan.memory.arena_bytes) <= budget;
  };
  BatchHeadroom result;
  if (!fits(1)) return result;
  // Invariant: `low` fits; `high` does not (or is past the limit).
  int64_t low = 1, high = limit + 1;
  while (low < limit) {
    const int64_t next = std::min(limit, low * 2);
    if (!fits(next)) {
      high = next;
      break;
    }
    low = next;
  }
  while (high - low > 1) {
    const int64_t middle = low + (high - low) / 2;
    if (fits(middle)) low = middle;
    else high = middle;
  }
  result.batch = low;
  result.at_limit = low == limit;
  const StepPlan plan = build_step_plan(setup.model, at_batch(setup, options, low, backend));
  result.arena_bytes = plan.memory.arena_bytes;
  result.time = cost.predict(plan);
  return result;
}

}  // namespace smelt
