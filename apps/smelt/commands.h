// The subcommands' bodies, one file each.
#pragma once
#include <string>

#include "core/config.h"

namespace smelt {

int run_train(const JobConfig& config);

struct PlanCommandOptions {
  std::string format = "text";
  bool list_steps = false;
  double memory_budget_gb = 0;
};
int run_plan(const JobConfig& config, const PlanCommandOptions& options);

}  // namespace smelt
