// How far a run's batch can grow: the largest local batch (sequences per pass on each rank) whose
// step plan fits the memory budget under a given checkpointing policy. `smelt plan` prints it for
// every fixed policy, so "what fits" is answered upward as well as downward (changes_that_fit).
#pragma once
#include <cstdint>

#include "ops/backend.h"
#include "plan/cost_model.h"
#include "plan/step_plan.h"
#include "train/run_setup.h"

namespace smelt {

struct BatchHeadroom {
  int64_t batch = 0;       // the largest local batch that fits (0: not even one sequence)
  bool at_limit = false;   // `batch` is the search's limit and fits: larger ones may fit as well
  size_t arena_bytes = 0;  // of that batch's plan (with the head options the planner picks for it)
  PlanTime time;           // its predicted step
};

// The largest local batch up to `limit` whose plan under `options`' fixed policy (keep_sets
// empty) fits setup.memory_budget_bytes, with the same sequence length, passes per step and
// layout. Each batch is planned as prepare_run plans a run configured with it: workspaces for its
// shape (from `backend`, else the estimates for setup.config.job.device), then the loss chunk and
// output copy chosen within the budget; that run's arena decides the fit (the base loss chunk's
// would not: one chunk, keeping the output projection's gradient in bf16, can be smaller). Arenas
// grow with the batch, so the search doubles and then bisects: about 2 log2(batch) batches.
BatchHeadroom largest_fitting_batch(const RunSetup& setup, const PlanOptions& options, const CostModel& cost,
                                    int64_t limit, const Backend* backend = nullptr);

// The search's default limit: passes of at most 2^20 tokens (one sequence at least).
int64_t default_batch_search_limit(int64_t seq_len);

}  // namespace smelt
