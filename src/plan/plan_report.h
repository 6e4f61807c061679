// Human and machine readable views of a StepPlan: the step list, the memory
// breakdown by buffer class, the peak and where it occurs, recompute FLOPs.
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "plan/step_plan.h"

namespace smelt {

std::string format_bytes(size_t bytes);  // "1.23 GiB", "456.0 MiB"
// "selective-op, bf16, 8192 tokens/step, 195 steps, arena 53.12 GiB (peak at backward layers.7.attention.sdpa)"
std::string plan_summary_line(const StepPlan& plan);
// The memory breakdown by class (sizes and what is live at the peak), per-layer kept activations,
// recompute FLOPs; with `list_steps`, every step with its FLOPs and live memory.
std::string format_plan(const StepPlan& plan, bool list_steps);
nlohmann::json plan_to_json(const StepPlan& plan, bool list_steps);

}  // namespace smelt
