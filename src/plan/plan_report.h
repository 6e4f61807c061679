// Human and machine readable views of a StepPlan: the step list, the memory
// breakdown by buffer class, the peak and where it occurs, recompute FLOPs.
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "plan/cost_model.h"
#include "plan/step_plan.h"

namespace smelt {

std::string format_bytes(size_t bytes);  // "1.23 GiB", "456.0 MiB"
// "selective-op, bf16, 8192 tokens/step, 195 steps, arena 53.12 GiB (peak at backward layers.7.attention.sdpa)"
std::string plan_summary_line(const StepPlan& plan);
// Data-parallel plans: "8 ranks = 2 replica(s) x 4 shard(s) (HSDP: ...)", and the step's
// collectives with their dtypes and bytes (communication_volume).
std::string parallel_layout(const StepPlan& plan);
std::string communication_summary(const StepPlan& plan);
// The memory breakdown by class (sizes and what is live at the peak), per-layer kept activations,
// recompute FLOPs; with `list_steps`, every step with its FLOPs and live memory, and with `time`
// (the plan's prediction) the time predicted for each (ms).
std::string format_plan(const StepPlan& plan, bool list_steps, const PlanTime* time = nullptr);
nlohmann::json plan_to_json(const StepPlan& plan, bool list_steps, const PlanTime* time = nullptr);

// "1.234 s/step (compute 1.10 s, of which recompute 0.10 s; exposed communication 0.03 s): 6,640 tokens/s
// per GPU, 26,560 over 4 GPUs, MFU 49.6%"; MFU by torchtitan's count against `peak_flops` (989 TFLOPS).
std::string format_prediction(const StepPlan& plan, const PlanTime& time, double peak_flops = 989e12);
nlohmann::json prediction_to_json(const StepPlan& plan, const PlanTime& time, double peak_flops = 989e12);
// "fits, with margin 12.34 GB (arena 65.30 GB of a 77.60 GB budget)" or "does NOT fit: over by ...".
std::string fit_description(size_t arena_bytes, double budget_bytes);

}  // namespace smelt
