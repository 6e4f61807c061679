#include "plan/output_copy.h"

namespace smelt {

bool choose_persistent_output_copy(const ModelConfig& model, PlanOptions options) {
  options.persistent_output_copy = false;
  const StepPlan per_step = build_step_plan(model, options);
  if (per_step.output_weight < 0) return false;  // no packed compute copy: nothing to keep
  options.persistent_output_copy = true;
  return build_step_plan(model, options).memory.arena_bytes <= per_step.memory.arena_bytes;
}

}  // namespace smelt
