// `smelt plan`'s options beyond PlanCommandOptions (commands.h): the device the plan is
// made for, calibrated timings and the memory timeline files; and the option wiring.
#pragma once
#include <string>

#include "commands.h"

namespace smelt {

struct PlanTargetOptions {
  std::string gpu = "h200";   // cost-model ceilings and default memory: h200 or h100
  double gpu_memory_gb = 0;   // 0: the GPU's (141 for h200, 80 for h100)
  std::string op_timings;     // calibrated per-op timings (JSON)
  std::string timeline_html;  // --timeline FILE.html
  std::string timeline_json;  // --timeline-json FILE
};

// Registers every `smelt plan` option (--format, --steps, --memory-budget-gb included).
void add_plan_command_options(CLI::App& command, PlanCommandOptions& options, PlanTargetOptions& target);
int run_plan(const JobConfig& config, const PlanCommandOptions& options, const PlanTargetOptions& target);

}  // namespace smelt
