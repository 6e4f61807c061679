// Whether the output projection's compute copy is persistent (PlanOptions::persistent_output_copy)
// when the config leaves it to the planner (training.output_weight_copy = "auto").
#pragma once

#include "plan/step_plan.h"

namespace smelt {

// True for plans with a packed compute copy (unsharded, compute dtype other than the master's)
// whose arena is no larger with a persistent output copy than with the per-step cast. That holds
// where the output head is the step's peak: there the cast's buffer already holds the copy's bytes,
// so keeping them across the step raises no peak, and the step saves the cast's pass over the
// master (on the 8B proxy 2.1 GB read and 1.05 GB written, about 1 ms). Elsewhere the per-step
// cast keeps the copy's bytes (1.05 GB on the proxy) off the peak.
bool choose_persistent_output_copy(const ModelConfig& model, PlanOptions options);

}  // namespace smelt
