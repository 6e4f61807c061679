// The automatic checkpointing policy: per block, which activations to keep and which
// forward ops to recompute so that predicted step time is least and the packed arena
// fits a memory budget; and, when nothing fits, the smallest change that would.
#pragma once
#include <string>
#include <vector>

#include "plan/cost_model.h"
#include "plan/step_plan.h"

namespace smelt {

// One block's choice: what it keeps (layer_input always), and what that costs.
struct KeepCandidate {
  KeepSet kept{};
  size_t kept_bytes = 0;       // kept activations besides the block input (aligned), live forward -> backward
  size_t transient_bytes = 0;  // recompute buffers, live only around the block's backward
  double recompute_seconds = 0;
};

// The keep-sets of one block on the Pareto frontier of (kept bytes, recompute time) or of
// (kept + transient bytes, recompute time), least kept first. Blocks share shapes: one list serves all.
std::vector<KeepCandidate> keep_candidates(const ModelConfig& model, const PlanOptions& options, const CostModel& cost);

struct AutoPolicyResult {
  StepPlan plan;          // built with options.keep_sets = the choice; arena <= budget
  PlanTime time;
  int plans_built = 0;    // plans packed while verifying and tightening
  std::string chosen_by;  // "dynamic programme" or the fixed policy that matched or beat it
};

// Chooses keep-sets for every block minimizing predicted step time subject to the packed
// arena <= budget_bytes. Throws Error(ErrorKind::memory) with the breakdown and the smallest
// change that fits when even recomputing everything does not fit.
AutoPolicyResult choose_automatic_policy(const ModelConfig& model, const PlanOptions& options, double budget_bytes,
                                         const CostModel& cost);

// The smallest changes of the run that make its plan fit (checkpointing policy, batch size,
// sequence length, shard degree), one line each, "--training.local_batch_size=2 (arena 71.2 GiB)".
std::vector<std::string> changes_that_fit(const ModelConfig& model, const PlanOptions& options, double budget_bytes,
                                          const CostModel& cost);
// The message of the memory error: the breakdown of `plan` against the budget, and the changes.
std::string does_not_fit_message(const StepPlan& plan, double budget_bytes, const std::vector<std::string>& changes);

}  // namespace smelt
