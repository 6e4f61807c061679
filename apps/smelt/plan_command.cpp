// `smelt plan`: the step plan, memory breakdown, predicted step time and fit against a
// device for a config, every checkpointing policy side by side (auto included) with the largest
// batch each fits, the loss chunks, and the memory timeline, on any machine (nothing is allocated).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "plan_command.h"
#include "plan/auto_policy.h"
#include "plan/loss_chunk.h"
#include "plan/memory_timeline.h"
#include "plan/plan_report.h"
#include "train/batch_headroom.h"
#include "train/evaluate.h"
#include "train/reference_runs.h"
#include "train/run_setup.h"

namespace smelt {

void add_plan_command_options(CLI::App& command, PlanCommandOptions& options, PlanTargetOptions& target) {
  command.add_option("--format", options.format, "text or json")->check(CLI::IsMember({"text", "json"}));
  command.add_flag("--steps", options.list_steps, "List every step of the plan: FLOPs, predicted time, live memory");
  command.add_option("--memory-budget-gb", options.memory_budget_gb,
                     "Arena budget in GB (default: activation_checkpoint.memory_budget_gb, else GPU memory minus a margin)");
  command.add_option("--gpu", target.gpu, "Device the cost model and memory default describe: h200 or h100")
      ->check(CLI::IsMember({"h200", "h100"}));
  command.add_option("--gpu-memory-gb", target.gpu_memory_gb, "Memory of one GPU in GB (default: 141 for h200, 80 for h100)")
      ->check(CLI::PositiveNumber);
  command.add_option("--op-timings", target.op_timings, "Calibrated per-op timings (JSON, docs/memory_plan.md)");
  command.add_option("--timeline", target.timeline_html, "Write the memory timeline as a self-contained HTML page");
  command.add_option("--timeline-json", target.timeline_json, "Write the memory timeline as JSON");
}

namespace {

struct PolicyRow {
  std::string name;
  StepPlan plan;
  PlanTime time;
  BatchHeadroom headroom;  // fixed policies only
};

struct ChunkRow {
  int64_t chunk;
  size_t arena_bytes;
  PlanTime time;
};

// The loss chunks the planner weighs for this step (and the configured one, when it is none of
// them), each planned as the run would be with it: the output copy chosen for that chunk.
std::vector<ChunkRow> loss_chunk_rows(const JobConfig& config, const RunSetup& setup, const CostModel& cost) {
  std::vector<int64_t> chunks = loss_chunk_candidates(setup.plan_options.shape.tokens());
  const int64_t taken = setup.plan_options.loss_chunk_tokens;  // the planner's or the config's
  if (std::find(chunks.begin(), chunks.end(), taken) == chunks.end()) {
    chunks.push_back(taken);
    std::sort(chunks.begin(), chunks.end());
  }
  std::vector<ChunkRow> rows;
  for (int64_t chunk : chunks) {
    PlanOptions o = setup.plan_options;
    o.loss_chunk_tokens = chunk;
    choose_output_copy(config, setup.model, o);
    const StepPlan p = build_step_plan(setup.model, o);
    rows.push_back({chunk, p.memory.arena_bytes, cost.predict(p)});
  }
  return rows;
}

// The largest batch each fixed policy fits, and what it would run at against this config.
void print_batch_headroom(const std::vector<PolicyRow>& rows, const StepPlan& plan, const PlanTime& time) {
  const int64_t passes = plan.options.microbatches;
  std::printf("\nlargest batch that fits the budget (sequences of %lld per pass on each GPU%s; each planned as "
              "that run would be; times from the cost model):\n"
              "  policy              batch        arena        step s    tokens/s/GPU  vs this config\n",
              static_cast<long long>(plan.options.shape.seq_len),
              passes > 1 ? (", " + std::to_string(passes) + " accumulated passes a step").c_str() : "");
  for (const auto& row : rows) {
    if (row.name == "auto") continue;
    const BatchHeadroom& h = row.headroom;
    if (h.batch == 0) {
      std::printf("  %-19s not even one sequence fits\n", row.name.c_str());
      continue;
    }
    const std::string batch = std::to_string(h.batch) + (h.at_limit ? " (limit)" : "");
    char gain[32];
    std::snprintf(gain, sizeof gain, "%+.1f%%", 100 * (h.time.tokens_per_second / time.tokens_per_second - 1));
    std::printf("  %-19s %-12s %-12s %-9.3f %-13.0f %s\n", row.name.c_str(), batch.c_str(),
                format_bytes(h.arena_bytes).c_str(), h.time.seconds, h.time.tokens_per_second, gain);
  }
}

}  // namespace

int run_plan(const JobConfig& config, const PlanCommandOptions& options) { return run_plan(config, options, {}); }

int run_plan(const JobConfig& config, const PlanCommandOptions& options, const PlanTargetOptions& target_options) {
  PlanTarget target;
  target.gpu = target_options.gpu;
  target.device_memory_bytes = target_options.gpu_memory_gb * 1e9;
  target.op_timings_path = target_options.op_timings;
  JobConfig adjusted = config;
  if (options.memory_budget_gb > 0) adjusted.activation_checkpoint.memory_budget_gb = options.memory_budget_gb;
  RunSetup setup = prepare_run(adjusted, nullptr, /*need_tokenizer=*/false, target);
  const CostModel cost = setup.cost_model();
  const double budget = setup.memory_budget_bytes;
  StepPlan plan = build_step_plan(setup.model, setup.plan_options);
  const PlanTime time = cost.predict(plan);

  // The alternatives: the same run under each fixed policy, and auto under the budget.
  std::vector<PolicyRow> rows;
  for (const char* name : {"none", "selective-layer:2", "selective-op", "full"}) {
    PlanOptions o = setup.plan_options;
    o.policy = parse_checkpoint_policy(name);
    o.keep_sets.clear();
    choose_head_options(adjusted, setup.model, o, budget);
    StepPlan p = build_step_plan(setup.model, o);
    PlanTime t = cost.predict(p);
    BatchHeadroom headroom = largest_fitting_batch(setup, o, cost, default_batch_search_limit(o.shape.seq_len));
    rows.push_back({name, std::move(p), t, headroom});
  }
  std::string auto_failure;
  if (plan.options.policy.mode == CheckpointMode::automatic) {
    rows.push_back({"auto", plan, time});
  } else {
    try {
      PlanOptions o = setup.plan_options;
      o.policy.mode = CheckpointMode::automatic;
      reset_head_options(adjusted, o);  // as prepare_run searches: the head's choices after the keep-sets
      AutoPolicyResult chosen = choose_automatic_policy(setup.model, o, budget, cost);
      PlanOptions resolved = chosen.plan.options;
      choose_head_options(adjusted, setup.model, resolved, budget);
      StepPlan p = build_step_plan(setup.model, resolved);
      PlanTime t = cost.predict(p);
      rows.push_back({"auto", std::move(p), t});
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::memory) throw;
      auto_failure = "nothing fits the budget";
    }
  }
  const std::vector<ChunkRow> chunk_rows = loss_chunk_rows(adjusted, setup, cost);
  // What `smelt eval` plans for these weights and batches (one device only).
  size_t evaluation_arena = 0;
  if (!plan.data_parallel())
    evaluation_arena = build_step_plan(setup.model, evaluation_plan_options(setup.plan_options)).memory.arena_bytes;
  // PyTorch's run of the same step on this GPU, where the built-in table has one (smelt bench's column).
  const ReferenceTable references = builtin_reference_table(setup.ceilings.gpu_name);
  const std::optional<ReferenceRun> reference = find_reference(
      references, reference_query(adjusted, setup.model, plan, setup.ceilings.gpu_name, 1));
  const bool fits = static_cast<double>(plan.memory.arena_bytes) <= budget;
  std::vector<std::string> changes;
  if (!fits) changes = changes_that_fit(setup.model, setup.plan_options, budget, cost);

  const std::string title = setup.model.flavor + ", " + plan.options.policy.str() + ", " +
                            std::string(dtype_name(plan.options.compute_dtype)) +
                            (setup.float8_linears ? " + fp8 " + config.float8.recipe : "") +
                            (plan.options.shard_degree > 1 ? ", FSDP " + std::to_string(plan.options.shard_degree) : "") +
                            ": memory timeline of one training step";
  if (!target_options.timeline_html.empty())
    write_text_file(target_options.timeline_html, memory_timeline_html(plan, title));
  if (!target_options.timeline_json.empty())
    write_text_file(target_options.timeline_json, memory_timeline_json(plan, title).dump(1) + "\n");

  if (options.format == "json") {
    nlohmann::json j = plan_to_json(plan, options.list_steps, &time);
    nlohmann::json comparison = nlohmann::json::array(), automatic = nullptr;
    for (const auto& row : rows) {
      nlohmann::json r = {{"policy", row.name},
                          {"arena_bytes", row.plan.memory.arena_bytes},
                          {"recompute_flops", row.plan.recompute_flops()},
                          {"prediction", prediction_to_json(row.plan, row.time)},
                          {"fits", static_cast<double>(row.plan.memory.arena_bytes) <= budget}};
      if (row.name == "auto") {
        automatic = r;
      } else {
        r["largest_batch"] = {{"local_batch_size", row.headroom.batch},
                              {"at_search_limit", row.headroom.at_limit},
                              {"arena_bytes", row.headroom.arena_bytes},
                              {"step_seconds", row.headroom.time.seconds},
                              {"tokens_per_second", row.headroom.time.tokens_per_second}};
        comparison.push_back(r);
      }
    }
    j["policies"] = comparison;
    j["auto"] = automatic;
    nlohmann::json chunks = nlohmann::json::array();
    for (const auto& row : chunk_rows)
      chunks.push_back({{"loss_chunk_tokens", row.chunk},
                        {"arena_bytes", row.arena_bytes},
                        {"step_seconds", row.time.seconds},
                        {"tokens_per_second", row.time.tokens_per_second},
                        {"this_config", row.chunk == plan.options.loss_chunk_tokens}});
    j["loss_chunks"] = chunks;
    j["prediction"] = prediction_to_json(plan, time);
    j["device"] = {{"gpu", setup.ceilings.gpu_name}, {"memory_bytes", setup.ceilings.memory_bytes}};
    j["memory_budget_bytes"] = budget;
    j["fits"] = fits;
    j["margin_bytes"] = budget - static_cast<double>(plan.memory.arena_bytes);
    j["changes_that_fit"] = changes;
    j["evaluation_arena_bytes"] = evaluation_arena > 0 ? nlohmann::json(evaluation_arena) : nlohmann::json();
    j["reference"] = nlohmann::json();
    if (reference) {
      j["reference"] = reference_run_json(references.source, *reference);
      j["reference"]["predicted_speedup"] = time.tokens_per_second / reference->tokens_per_second;
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  std::cout << format_plan(plan, options.list_steps, &time);
  char line[512];
  std::cout << "predicted: " << format_prediction(plan, time) << "\n";
  std::snprintf(line, sizeof line, "device:    %s ceilings%s, %.1f GB memory; budget %.2f GB (%s)\n",
                setup.ceilings.gpu_name.c_str(), setup.float8_linears ? " with fp8 linear GEMMs" : "",
                setup.ceilings.memory_bytes / 1e9, budget / 1e9,
                setup.memory_budget_explicit ? "set" : "memory minus the safety margin");
  std::cout << line;
  std::cout << "fit:       " << fit_description(plan.memory.arena_bytes, budget) << "\n";
  for (const auto& change : changes) std::cout << "           would fit with " << change << "\n";
  if (evaluation_arena > 0)
    std::cout << "eval:      " << format_bytes(evaluation_arena)
              << " for smelt eval of these weights and batches (forward only: no gradients or optimizer state)\n";
  if (reference)
    std::cout << compare_with_reference(references.source, *reference, "predicted", time.tokens_per_second,
                                        static_cast<double>(plan.memory.arena_bytes))
              << "\n";

  std::cout << "\ncheckpointing policies (same model, batch, dtype and layout; times from the cost model):\n"
               "  policy              arena        act.+recompute  recompute FLOPs  step s    tokens/s/GPU  fits (margin GB)\n";
  for (const auto& row : rows) {
    const size_t activations = row.plan.bytes_of(BufferClass::activations) + row.plan.bytes_of(BufferClass::recompute);
    const double margin = budget - static_cast<double>(row.plan.memory.arena_bytes);
    std::snprintf(line, sizeof line, "  %-19s %-12s %-15s %-16.3g %-9.3f %-13.0f %s (%.2f)%s\n", row.name.c_str(),
                  format_bytes(row.plan.memory.arena_bytes).c_str(), format_bytes(activations).c_str(),
                  row.plan.recompute_flops(), row.time.seconds, row.time.tokens_per_second, margin >= 0 ? "yes" : "no",
                  margin / 1e9, row.name == plan.options.policy.str() ? "   <- this config" : "");
    std::cout << line;
  }
  if (!auto_failure.empty()) std::cout << "  auto                " << auto_failure << "\n";

  print_batch_headroom(rows, plan, time);

  char rule[160];
  std::snprintf(rule, sizeof rule, "the planner takes the largest whose arena is within %.0f%% of the first's, and the budget",
                100 * kLossChunkMemoryAllowance);
  std::printf("\nloss chunks (%s; times from the cost model):\n"
              "  tokens    arena        vs %-6lld  step s    tokens/s/GPU  fits (margin GB)\n",
              config.training.loss_chunk_tokens > 0 ? "set by training.loss_chunk_tokens" : rule,
              static_cast<long long>(chunk_rows.front().chunk));
  for (const auto& row : chunk_rows) {
    const double margin = budget - static_cast<double>(row.arena_bytes);
    const double growth = static_cast<double>(row.arena_bytes) / static_cast<double>(chunk_rows.front().arena_bytes) - 1;
    char percent[32];
    std::snprintf(percent, sizeof percent, "%+.1f%%", 100 * growth);
    std::snprintf(line, sizeof line, "  %-9lld %-12s %-9s %-9.3f %-13.0f %s (%.2f)%s\n", static_cast<long long>(row.chunk),
                  format_bytes(row.arena_bytes).c_str(), percent, row.time.seconds, row.time.tokens_per_second,
                  margin >= 0 ? "yes" : "no", margin / 1e9,
                  row.chunk == plan.options.loss_chunk_tokens ? "   <- this config" : "");
    std::cout << line;
  }
  return 0;
}

}  // namespace smelt
