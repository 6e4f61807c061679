// `smelt plan`: the step plan and memory breakdown for a config, and every
// checkpointing policy side by side, on any machine (nothing is allocated).
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "plan/plan_report.h"
#include "train/run_setup.h"

namespace smelt {

int run_plan(const JobConfig& config, const PlanCommandOptions& options) {
  RunSetup setup = prepare_run(config, nullptr, /*need_tokenizer=*/false);
  StepPlan plan = build_step_plan(setup.model, setup.plan_options);
  const double budget = options.memory_budget_gb * 1e9;

  // The alternatives: the same run under each fixed policy.
  std::vector<std::string> policies = {"none", "selective-layer:2", "selective-op", "full"};
  nlohmann::json comparison = nlohmann::json::array();
  std::string table = "\ncheckpointing policies (same model, batch and dtype):\n"
                      "  policy               arena          activations+recompute   recompute FLOPs   fits\n";
  for (const auto& name : policies) {
    PlanOptions o = setup.plan_options;
    o.policy = parse_checkpoint_policy(name);
    StepPlan p = build_step_plan(setup.model, o);
    const size_t activations = p.bytes_of(BufferClass::activations) + p.bytes_of(BufferClass::recompute);
    const char* fits = budget > 0 ? (static_cast<double>(p.memory.arena_bytes) <= budget ? "yes" : "no") : "-";
    char line[256];
    std::snprintf(line, sizeof line, "  %-20s %-14s %-23s %-17.3g %s%s\n", name.c_str(),
                  format_bytes(p.memory.arena_bytes).c_str(), format_bytes(activations).c_str(), p.recompute_flops(), fits,
                  name == plan.options.policy.str() ? "   <- this config" : "");
    table += line;
    comparison.push_back({{"policy", name},
                          {"arena_bytes", p.memory.arena_bytes},
                          {"recompute_flops", p.recompute_flops()},
                          {"fits", budget > 0 ? nlohmann::json(static_cast<double>(p.memory.arena_bytes) <= budget)
                                              : nlohmann::json(nullptr)}});
  }

  if (options.format == "json") {
    nlohmann::json j = plan_to_json(plan, options.list_steps);
    j["policies"] = comparison;
    if (budget > 0) j["memory_budget_bytes"] = budget;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << format_plan(plan, options.list_steps) << table;
  if (budget > 0)
    std::cout << "\nmemory budget: " << options.memory_budget_gb << " GB; this config's arena "
              << (static_cast<double>(plan.memory.arena_bytes) <= budget ? "fits" : "does NOT fit") << "\n";
  return 0;
}

}  // namespace smelt
