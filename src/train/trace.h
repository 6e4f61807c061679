// Traces of a training step: Chrome trace JSON (opens in Perfetto) with one span per
// plan step, and a text summary of where the time goes, grouped by op.
#pragma once
#include <string>
#include <vector>

#include "plan/step_plan.h"

namespace smelt {

// `milliseconds[i]` is the time of plan step i (Executor::step_milliseconds).
void write_chrome_trace(const std::string& path, const StepPlan& plan, const std::vector<double>& milliseconds);
// One line per op kind ("backward attention.sdpa"), summed over blocks, largest first, with shares.
std::string trace_summary(const StepPlan& plan, const std::vector<double>& milliseconds);

}  // namespace smelt
