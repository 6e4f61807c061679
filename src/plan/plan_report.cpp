// Text and JSON reports of a StepPlan.
#include "plan/plan_report.h"

#include <cstdio>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/shard_layout.h"

namespace smelt {

std::string format_bytes(size_t bytes) {
  char text[64];
  const double b = static_cast<double>(bytes);
  if (b >= double(1ull << 30)) std::snprintf(text, sizeof text, "%.2f GiB", b / double(1ull << 30));
  else if (b >= double(1ull << 20)) std::snprintf(text, sizeof text, "%.1f MiB", b / double(1ull << 20));
  else if (b >= 1024) std::snprintf(text, sizeof text, "%.1f KiB", b / 1024.0);
  else std::snprintf(text, sizeof text, "%zu B", bytes);
  return text;
}

namespace {
std::string float8_linear_summary(const StepPlan& plan);
}  // namespace

std::string plan_summary_line(const StepPlan& plan) {
  std::ostringstream out;
  out << (plan.options.forward_only ? std::string("forward only") : plan.options.policy.str()) << ", "
      << dtype_name(plan.options.compute_dtype) << ", ";
  if (plan.options.float8.recipe != Float8Recipe::none)
    out << "float8 " << float8_recipe_name(plan.options.float8.recipe) << " (" << float8_linear_summary(plan) << "), ";
  const int64_t microbatches = plan.options.microbatches;
  out << plan.options.shape.tokens() * microbatches << " tokens/step (";
  if (microbatches > 1) out << microbatches << " accumulated microbatches of ";
  out << "batch " << plan.options.shape.batch << " x seq " << plan.options.shape.seq_len << "), loss chunk "
      << plan.options.loss_chunk_tokens << ", "
      << plan.steps.size() << " steps, arena "
      << format_bytes(plan.memory.arena_bytes) << " (peak at '" << plan.steps[plan.memory.peak_step].name() << "')";
  return out.str();
}

std::string parallel_layout(const StepPlan& plan) {
  const int64_t shard = plan.options.shard_degree, replicas = plan.options.replicate_degree;
  std::ostringstream out;
  out << plan.world_size() << " ranks = " << replicas << " replica(s) x " << shard << " shard(s)";
  if (plan.sharded() && plan.replicated())
    out << " (HSDP: sharded within groups of " << shard << " consecutive ranks, replicated across " << replicas
        << " groups)";
  else if (plan.sharded())
    out << " (FSDP: parameters, gradients, optimizer state and weight copies divided by " << shard << ")";
  else
    out << " (plain data parallel: every rank holds the whole model, gradients all-reduced per unit)";
  if (!plan.gather_kept.empty()) out << "; each block's gathered weights kept from its forward to its backward";
  if (plan.collectives_in_place)
    out << "; one rank per shard group: the collectives run in place (gathered weights are the local copy, "
           "gradients are written into the shard), so nothing moves";
  return out.str();
}

std::string communication_summary(const StepPlan& plan) {
  const CommunicationVolume v = communication_volume(plan);
  int gathers = 0, scatters = 0, reduces = 0;
  for (const Step& s : plan.steps) {
    gathers += s.kind == StepKind::all_gather;
    scatters += s.kind == StepKind::reduce_scatter;
    reduces += s.kind == StepKind::all_reduce_gradients;
  }
  std::ostringstream out;
  if (gathers > 0)
    out << gathers << " all-gathers ("
        << (plan.float8_gathered() ? "e4m3 float8 linears, the rest " + std::string(dtype_name(plan.options.compute_dtype))
                                   : std::string(dtype_name(v.gather_dtype)))
        << "), " << format_bytes(size_t(v.all_gather_bytes))
        << "; ";
  if (scatters > 0)
    out << scatters << " reduce-scatters (" << dtype_name(v.reduce_dtype) << "), "
        << format_bytes(size_t(v.reduce_scatter_bytes)) << "; ";
  if (reduces > 0 || v.all_reduce_bytes > 0)
    out << reduces << " gradient all-reduces over replicas (" << dtype_name(v.reduce_dtype) << ") and small ones, "
        << format_bytes(size_t(v.all_reduce_bytes)) << "; ";
  out << format_bytes(size_t(v.total_bytes())) << " per step per rank (buffer sizes; a ring sends (N-1)/N of a "
      << "gather or reduce-scatter, 2(N-1)/N of an all-reduce)";
  return out.str();
}

namespace {

constexpr size_t kClassCount = static_cast<size_t>(BufferClass::count);

// The activations a block keeps, by name; those kept as float8 x^T marked "(e4m3 x^T)".
std::string kept_description(const LayerBuffers& lb) {
  std::string kept;
  for (int a = 0; a < kActivationCount; ++a)
    if (lb.kept[a] && static_cast<Activation>(a) != Activation::layer_output) {
      if (!kept.empty()) kept += ' ';  // appended piecewise: GCC 12 warns falsely on a concatenated temporary
      kept += activation_name(static_cast<Activation>(a));
      if (lb.float8_saved[a] >= 0) kept += "(e4m3 x^T)";
    }
  return kept;
}

size_t kept_bytes(const StepPlan& plan, const LayerBuffers& lb) {
  size_t total = 0;
  for (int a = 0; a < kActivationCount; ++a)
    if (lb.kept[a] && static_cast<Activation>(a) != Activation::layer_output)
      total += plan.buffers[lb.float8_saved[a] >= 0 ? lb.float8_saved[a] : lb.forward[a]].request.bytes;
  return total;
}

// What keeping inputs as float8 x^T (save_inputs_in_float8) does to the kept activations.
std::string float8_saved_summary(const StepPlan& plan) {
  if (!plan.options.float8.save_inputs_in_float8) return "inputs kept for backward in the compute dtype (save_inputs_in_float8 off)";
  if (!float8_gemm_enabled(plan.options.float8.recipe, LinearGemm::grad_weight))
    return "inputs kept for backward in the compute dtype (this recipe's grad-weight GEMM is not in float8)";
  int64_t count = 0;
  size_t float8_bytes = 0, compute_bytes = 0;
  for (const auto& lb : plan.layers)
    for (int a = 0; a < kActivationCount; ++a)
      if (lb.float8_saved[a] >= 0) {
        ++count;
        float8_bytes += plan.buffers[lb.float8_saved[a]].request.bytes;
        compute_bytes += plan.buffers[lb.forward[a]].request.bytes;
      }
  if (count == 0) return "no kept activation is read only by float8 linears: none kept in float8";
  return std::to_string(count) + " kept activations held as float8 x^T for the grad-weight GEMMs: " +
         format_bytes(float8_bytes) + " instead of " + format_bytes(compute_bytes);
}

// How many block linears run in float8, and which of the first block's stay in the compute
// dtype (filter_fqns, by name or by the size filter).
std::string float8_linear_summary(const StepPlan& plan) {
  std::string kept;
  for (int w = 0; w < kLayerWeightCount && !plan.layers.empty(); ++w) {
    const auto weight = static_cast<LayerWeight>(w);
    if (is_linear(weight) && !plan.layers[0].float8[size_t(w)])
      kept += (kept.empty() ? "" : ", ") + std::string(layer_weight_name(weight));
  }
  const StepPlan::LinearCount linears = plan.block_linears();
  return std::to_string(linears.float8) + " of " + std::to_string(linears.total) + " block linears in float8" +
         (kept.empty() ? std::string() : "; block 0 keeps " + kept + " in " + std::string(dtype_name(plan.options.compute_dtype)));
}

// The float8 buffers by name and size, for `smelt plan` (empty list without float8 linears).
std::vector<std::pair<std::string, size_t>> float8_buffers(const StepPlan& plan) {
  std::vector<std::pair<std::string, size_t>> list;
  for (int id : {plan.float8_weights, plan.float8_weight_scales, plan.float8_scratch, plan.float8_scratch_backward,
                 plan.float8_statistics, plan.float8_input_amax})
    if (id >= 0) list.emplace_back(plan.buffers[size_t(id)].request.name, plan.buffers[size_t(id)].request.bytes);
  return list;
}

// What the compute-dtype weight copy holds: "bf16 copy 4.16 GiB of 1.62e+09 parameters (...)".
std::string compute_copy_summary(const StepPlan& plan) {
  const auto& buffer = plan.buffers[size_t(plan.compute_weights)];
  std::ostringstream out;
  out << dtype_name(buffer.dtype) << " copy " << format_bytes(buffer.request.bytes) << " of "
      << buffer.shape.numel() << " elements";
  if (plan.sharded()) {
    out << " (this rank's shard of every weight)";
  } else if (plan.compute_copy_ranges.empty()) {
    out << " (every weight)";
  } else {
    int64_t master_read = 0;
    for (const auto& range : plan.compute_copy_ranges)
      if (!range.copied()) master_read += range.count;
    out << (plan.float8_weights >= 0 ? " (norms and the linears not in float8" : " (norms and linears")
        << (plan.output_weight >= 0 ? "" : ", and the output projection")
        << ", written by the optimizer); " << master_read << " elements read from the fp32 master (the embedding";
    if (plan.output_weight >= 0)
      out << (plan.float8_weights >= 0 ? ", the float8 linears, quantised after the optimizer," : ",")
          << " and the output projection, cast into a " << format_bytes(plan.buffers[size_t(plan.output_weight)].request.bytes)
          << " buffer live only during the output head)";
    else
      out << (plan.float8_weights >= 0 ? " and the float8 linears, quantised after the optimizer)" : ")");
  }
  return out.str();
}

// Where the gradients live, for unsharded plans that split them: "block linears' ... in bf16 (4.23
// GiB, ...), the norms' in f32 (64.0 KiB); the embedding's in f32 (1.96 GiB), only from its
// backward to the optimizer; ...". Empty when one buffer holds every gradient for the whole step.
std::string gradient_summary(const StepPlan& plan) {
  if (plan.linear_gradients < 0 && plan.embedding_gradient < 0) return {};
  const bool low_output = plan.linear_gradients >= 0 && plan.compute_copy_ranges.back().low_grad;
  const bool own_embedding = plan.embedding_gradient >= 0;
  auto size_of = [&](int id) { return format_bytes(plan.buffers[size_t(id)].request.bytes); };
  std::ostringstream out;
  if (plan.linear_gradients >= 0)
    out << "block linears'" << (low_output ? " and output's (one loss chunk)" : "") << " in bf16 ("
        << size_of(plan.linear_gradients) << ", what their grad-weight GEMMs round to), ";
  const char* shared = plan.linear_gradients < 0 ? "the others'"
                       : own_embedding           ? (low_output ? "the norms'" : "the norms' and output's")
                                                 : (low_output ? "the embedding's and norms'" : "the embedding's, norms' and output's");
  out << shared << " in " << dtype_name(plan.buffers[size_t(plan.gradients)].dtype) << " (" << size_of(plan.gradients) << ")";
  if (own_embedding)
    out << "; the embedding's in " << dtype_name(plan.buffers[size_t(plan.embedding_gradient)].dtype) << " ("
        << size_of(plan.embedding_gradient) << "), live only from its backward to the optimizer";
  if (plan.linear_gradients >= 0) out << "; training.linear_grad_dtype = float32 keeps all in f32";
  return out.str();
}

}  // namespace

std::string format_plan(const StepPlan& plan, bool list_steps, const PlanTime* time) {
  std::ostringstream out;
  char line[512];
  out << "model:   " << describe(plan.model) << "\n";
  out << "plan:    " << plan_summary_line(plan) << "\n";
  if (plan.data_parallel() && (plan.world_size() > 1 || plan.sharded())) {
    out << "layout:  " << parallel_layout(plan) << "; memory below is one rank's\n";
    out << "comms:   " << communication_summary(plan) << "\n";
  }
  if (plan.compute_weights >= 0) out << "weights: " << compute_copy_summary(plan) << "\n";
  if (const std::string grads = gradient_summary(plan); !grads.empty()) out << "grads:   " << grads << "\n";
  if (plan.float8_scratch >= 0) {
    out << "float8:  recipe " << float8_recipe_name(plan.options.float8.recipe)
        << (plan.float8_weights >= 0 && float8_transposes_per_use(plan.options.float8)
                ? "; weights quantised once per step (after the optimizer, from the fp32 master) into W copies, "
                  "W^T transposed from W's codes at each backward use"
            : plan.float8_weights >= 0 ? "; weights quantised once per step (after the optimizer, from the fp32 master) into W and W^T copies"
            : plan.float8_gathered() ? "; weights gathered in e4m3 (scales from one amax all-reduce), W^T transposed from the gathered codes"
                                     : "; weights quantised at each use (sharded plan, gathered in bf16)")
        << "\n         " << float8_linear_summary(plan) << "\n"
        << "         " << float8_saved_summary(plan) << "\n";
    for (const auto& [name, bytes] : float8_buffers(plan))
      out << "         " << name << ": " << format_bytes(bytes) << "\n";
  }
  out << "\n";
  const auto& peak = plan.memory.live_by_class[plan.memory.peak_step];
  out << "memory by buffer class      allocated (sum of buffers)    live at the peak\n";
  for (size_t c = 0; c < kClassCount; ++c) {
    size_t total = plan.bytes_of(static_cast<BufferClass>(c));
    if (total == 0) continue;
    std::snprintf(line, sizeof line, "  %-24s %16s %24s\n", std::string(buffer_class_name(static_cast<BufferClass>(c))).c_str(),
                  format_bytes(total).c_str(), format_bytes(peak[c]).c_str());
    out << line;
  }
  std::snprintf(line, sizeof line, "  %-24s %16s %24s\n", "arena (packed)", format_bytes(plan.memory.arena_bytes).c_str(),
                format_bytes(plan.memory.peak_live_bytes).c_str());
  out << line;
  out << "  peak at step " << plan.memory.peak_step << ": " << plan.steps[plan.memory.peak_step].name() << "\n\n";

  out << "activations kept for backward, per block:\n";
  std::string previous;
  int64_t run_start = 0;
  auto flush = [&](int64_t end) {
    if (previous.empty()) return;
    std::snprintf(line, sizeof line, "  layers %lld-%lld: %s each: %s\n", (long long)run_start, (long long)end,
                  format_bytes(kept_bytes(plan, plan.layers[run_start])).c_str(), previous.c_str());
    out << line;
  };
  for (int64_t i = 0; i < static_cast<int64_t>(plan.layers.size()); ++i) {
    std::string kept = kept_description(plan.layers[i]);
    if (kept != previous) {
      flush(i - 1);
      previous = kept;
      run_start = i;
    }
  }
  flush(static_cast<int64_t>(plan.layers.size()) - 1);

  const double flops = plan.step_flops(), recompute = plan.recompute_flops();
  std::snprintf(line, sizeof line, "\nFLOPs per step: %.3g executed (matmul + causal attention), of which recompute %.3g (%.1f%%)\n",
                flops, recompute, flops > 0 ? 100.0 * recompute / flops : 0.0);
  out << line;
  std::snprintf(line, sizeof line, "model FLOPs per token (torchtitan's count): %.4g\n",
                plan.model.training_flops_per_token(plan.options.shape.seq_len));
  out << line;

  if (list_steps) {
    const bool timed = time && time->step_seconds.size() == plan.steps.size();
    out << "\nsteps:" << (timed ? " (predicted time, then live memory)" : "") << "\n";
    for (size_t s = 0; s < plan.steps.size(); ++s) {
      size_t live = 0;
      for (size_t c = 0; c < kClassCount; ++c) live += plan.memory.live_by_class[s][c];
      char predicted[32] = "";
      if (timed) std::snprintf(predicted, sizeof predicted, "  %8.3f ms", time->step_seconds[s] * 1e3);
      std::snprintf(line, sizeof line, "  %4zu  %-52s %10.3g FLOP%s  live %s\n", s, plan.steps[s].name().c_str(),
                    plan.steps[s].flops, predicted, format_bytes(live).c_str());
      out << line;
    }
  }
  return out.str();
}

static std::string thousands(double value) {
  std::string digits = std::to_string(static_cast<long long>(value + 0.5)), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

static double model_flops_utilization(const StepPlan& plan, const PlanTime& time, double peak_flops) {
  return time.tokens_per_second * plan.model.training_flops_per_token(plan.options.shape.seq_len) / peak_flops;
}

std::string format_prediction(const StepPlan& plan, const PlanTime& time, double peak_flops) {
  char line[512];
  std::snprintf(line, sizeof line, "%.3f s/step (compute %.3f s, of which recompute %.3f s", time.seconds,
                time.compute_seconds, time.recompute_seconds);
  std::string text = line;
  if (plan.world_size() > 1) {
    std::snprintf(line, sizeof line, "; communication %.3f s, exposed %.3f s", time.communication_seconds,
                  time.exposed_communication_seconds);
    text += line;
  }
  text += "): " + thousands(time.tokens_per_second) + " tokens/s per GPU";
  if (plan.world_size() > 1)
    text += ", " + thousands(time.tokens_per_second * static_cast<double>(plan.world_size())) + " over " +
            std::to_string(plan.world_size()) + " GPUs";
  std::snprintf(line, sizeof line, ", MFU %.1f%%", 100 * model_flops_utilization(plan, time, peak_flops));
  text += line;
  if (time.calibrated_steps > 0) text += " (" + std::to_string(time.calibrated_steps) + " steps from calibrated timings)";
  else if (time.timing_cache)
    text += " (the op timings hold no entry for this GPU and shape key; the ceilings were used: re-time with "
            "smelt bench --trace T --calibrate FILE)";
  return text;
}

nlohmann::json prediction_to_json(const StepPlan& plan, const PlanTime& time, double peak_flops) {
  return {{"step_seconds", time.seconds},
          {"compute_seconds", time.compute_seconds},
          {"recompute_seconds", time.recompute_seconds},
          {"communication_seconds", time.communication_seconds},
          {"exposed_communication_seconds", time.exposed_communication_seconds},
          {"tokens_per_second_per_gpu", time.tokens_per_second},
          {"tokens_per_second", time.tokens_per_second * static_cast<double>(plan.world_size())},
          {"mfu", model_flops_utilization(plan, time, peak_flops)},
          {"calibrated_steps", time.calibrated_steps}};
}

std::string fit_description(size_t arena_bytes, double budget_bytes) {
  char line[256];
  const double arena = static_cast<double>(arena_bytes);
  if (arena <= budget_bytes)
    std::snprintf(line, sizeof line, "fits, with margin %.2f GB (arena %.2f GB of a %.2f GB budget)",
                  (budget_bytes - arena) / 1e9, arena / 1e9, budget_bytes / 1e9);
  else
    std::snprintf(line, sizeof line, "does NOT fit: over by %.2f GB (arena %.2f GB, budget %.2f GB)",
                  (arena - budget_bytes) / 1e9, arena / 1e9, budget_bytes / 1e9);
  return line;
}

nlohmann::json plan_to_json(const StepPlan& plan, bool list_steps, const PlanTime* time) {
  nlohmann::json j;
  j["model"] = {{"flavor", plan.model.flavor},       {"dim", plan.model.dim},
                {"n_layers", plan.model.n_layers},   {"n_heads", plan.model.n_heads},
                {"n_kv_heads", plan.model.n_kv_heads}, {"ffn_dim", plan.model.ffn_dim},
                {"vocab_size", plan.model.vocab_size}, {"parameters", plan.model.total_parameters()}};
  j["policy"] = plan.options.policy.str();
  j["compute_dtype"] = std::string(dtype_name(plan.options.compute_dtype));
  j["batch_size"] = plan.options.shape.batch;
  j["seq_len"] = plan.options.shape.seq_len;
  j["microbatches"] = plan.options.microbatches;  // gradient accumulation: passes per optimizer step
  j["tokens_per_step"] = plan.options.shape.tokens() * plan.options.microbatches;
  j["loss_chunk_tokens"] = plan.options.loss_chunk_tokens;
  // Where the output projection's compute copy comes from: "persistent" (AdamW writes it),
  // "per_step" (the output head casts it), "none" (no compute copy, or a sharded plan's gathers).
  const bool persistent_output = !plan.compute_copy_ranges.empty() && plan.compute_copy_ranges.back().copied();
  j["output_weight_copy"] = plan.output_weight >= 0 ? "per_step" : persistent_output ? "persistent" : "none";
  // "backward_to_optimizer": the embedding's gradient has a buffer of its own, live from its
  // backward to the optimizer; "whole_step": it shares the persistent gradient buffer.
  if (plan.gradients >= 0)
    j["embedding_gradient_live"] = plan.embedding_gradient >= 0 ? "backward_to_optimizer" : "whole_step";
  j["linear_gradients_dtype"] = std::string(dtype_name(plan.linear_gradients >= 0 ? plan.buffers[size_t(plan.linear_gradients)].dtype
                                                                                   : plan.buffers[size_t(plan.gradients)].dtype));
  j["data_parallel_shard_degree"] = plan.options.shard_degree;
  j["data_parallel_replicate_degree"] = plan.options.replicate_degree;
  if (plan.data_parallel()) {
    const CommunicationVolume v = communication_volume(plan);
    j["communication"] = {{"gather_dtype", std::string(dtype_name(v.gather_dtype))},
                          {"reduce_dtype", std::string(dtype_name(v.reduce_dtype))},
                          {"all_gather_bytes", v.all_gather_bytes},
                          {"reduce_scatter_bytes", v.reduce_scatter_bytes},
                          {"all_reduce_bytes", v.all_reduce_bytes},
                          {"bytes_per_step", v.total_bytes()}};
  }
  j["arena_bytes"] = plan.memory.arena_bytes;
  j["peak_live_bytes"] = plan.memory.peak_live_bytes;
  j["peak_step"] = plan.steps[plan.memory.peak_step].name();
  j["step_flops"] = plan.step_flops();
  j["recompute_flops"] = plan.recompute_flops();
  j["model_flops_per_token"] = plan.model.training_flops_per_token(plan.options.shape.seq_len);
  nlohmann::json classes = nlohmann::json::object();
  for (size_t c = 0; c < kClassCount; ++c) {
    size_t total = plan.bytes_of(static_cast<BufferClass>(c));
    if (total == 0) continue;
    classes[std::string(buffer_class_name(static_cast<BufferClass>(c)))] = {
        {"bytes", total}, {"live_at_peak", plan.memory.live_by_class[plan.memory.peak_step][c]}};
  }
  j["memory"] = classes;
  if (plan.float8_scratch >= 0) {
    nlohmann::json float8 = {{"recipe", std::string(float8_recipe_name(plan.options.float8.recipe))},
                             {"weights_quantised_once_per_step", plan.float8_weights >= 0}};
    for (const auto& [name, bytes] : float8_buffers(plan)) float8["buffers"][name] = bytes;
    j["float8"] = float8;
  }
  if (list_steps) {
    nlohmann::json steps = nlohmann::json::array();
    const bool timed = time && time->step_seconds.size() == plan.steps.size();
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      nlohmann::json step = {{"name", plan.steps[i].name()}, {"flops", plan.steps[i].flops}};
      if (timed) step["predicted_ms"] = time->step_seconds[i] * 1e3;
      steps.push_back(step);
    }
    j["steps"] = steps;
  }
  return j;
}

}  // namespace smelt
