// Traces of a training step: Chrome trace JSON (opens in Perfetto) with one span per
// plan step, and a text summary of where the time goes, grouped by op.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "plan/step_plan.h"

namespace smelt {

// `milliseconds[i]` is the time of plan step i (Executor::step_milliseconds), laid out in plan
// order on the compute-stream track. `collective_windows[i]` (Executor::collective_windows; may be
// empty), where not {-1, -1}, is when step i's collectives ran on the communication stream (ms
// from the first step's start): a span on the communication-stream track.
void write_chrome_trace(const std::string& path, const StepPlan& plan, const std::vector<double>& milliseconds,
                        const std::vector<std::pair<double, double>>& collective_windows = {});
// One line per op kind ("backward attention.sdpa"), summed over blocks, largest first, with shares.
// With `predicted` (the cost model's time of each plan step, ms), also the prediction and the
// measured time over it, per line and for the total: where the planner's figures are off.
std::string trace_summary(const StepPlan& plan, const std::vector<double>& milliseconds,
                          const std::vector<double>& predicted = {});

}  // namespace smelt
