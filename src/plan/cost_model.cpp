// Per-step time predictions: a roofline over FLOPs and bytes moved, kernel launch
// costs, fp8 cast traffic, FSDP collectives overlapped per block, calibrated timings.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "ops/cuda_workspace.h"

namespace smelt {

double attention_flops(const DeviceCeilings& c, int64_t head_dim, bool backward) {
  const double at_128 = 1 / (backward ? c.attention_backward_flops : c.attention_forward_flops);
  const double at_64 = 1 / (backward ? c.attention_backward_flops_d64 : c.attention_forward_flops_d64);
  // Seconds per FLOP, linear in 1 / head_dim through the two measured head dims; wide heads keep at
  // least half the 128-wide time per FLOP.
  const double position = 128.0 / static_cast<double>(std::max<int64_t>(1, head_dim)) - 1;  // 0 at 128, 1 at 64
  const double seconds = std::max(0.5 * at_128, at_128 + (at_64 - at_128) * position);
  return 1 / seconds;
}

DeviceCeilings h200_ceilings() { return DeviceCeilings{}; }

DeviceCeilings h100_ceilings() {
  DeviceCeilings c;
  c.gpu_name = "NVIDIA H100 80GB HBM3";
  c.memory_bytes = 80e9;
  // The H200's chip under the same 700 W cap: its GEMM and attention rates (measured alike on
  // both, docs/benchmarks.md, seventeenth round); less memory bandwidth (3.35 TB/s against 4.8).
  c.elementwise_bytes_per_second = 2.6e12;
  c.streaming_bytes_per_second = 3.0e12;
  return c;
}

DeviceCeilings cpu_ceilings() {
  DeviceCeilings c;
  c.gpu_name = "cpu";
  c.memory_bytes = 64e9;
  c.gemm_flops = 0.3e12;
  c.float8_gemm_flops = 0.05e12;  // emulated
  c.attention_forward_flops = c.attention_forward_flops_d64 = 0.1e12;
  c.attention_backward_flops = c.attention_backward_flops_d64 = 0.1e12;
  c.elementwise_bytes_per_second = 20e9;
  c.streaming_bytes_per_second = 20e9;
  c.kernel_launch_seconds = 2e-6;
  c.collective_bytes_per_second = 10e9;
  return c;
}

DeviceCeilings ceilings_by_name(const std::string& name) {
  if (name == "h200" || name == "H200") return h200_ceilings();
  if (name == "h100" || name == "H100") return h100_ceilings();
  if (name == "cpu") return cpu_ceilings();
  fail(ErrorKind::config, "--gpu: expected h200, h100 or cpu, found '" + name + "'");
}

// ---- calibrated timings ------------------------------------------------------------

namespace {
constexpr char kSeparator = '\x1f';
constexpr const char* kTimingFormat = "smelt-op-timings";
constexpr int kTimingVersion = 1;

std::string cache_key(const std::string& gpu, const std::string& op, const std::string& shape) {
  return gpu + kSeparator + op + kSeparator + shape;
}
}  // namespace

OpTimingCache OpTimingCache::load(const std::string& path) {
  std::ifstream file(path);
  if (!file) fail(ErrorKind::input, "op timing cache '" + path + "' cannot be opened; check the path or leave it out");
  nlohmann::json j;
  try {
    file >> j;
  } catch (const std::exception& e) {
    fail(ErrorKind::input, "op timing cache '" + path + "' is not valid JSON (" + e.what() + "); delete it to re-time");
  }
  if (!j.is_object() || j.value("format", "") != kTimingFormat || j.value("version", 0) != kTimingVersion ||
      !j.contains("entries") || !j["entries"].is_array())
    fail(ErrorKind::input, "op timing cache '" + path + "': expected an object with format \"" + kTimingFormat +
                               "\", version " + std::to_string(kTimingVersion) +
                               " and an \"entries\" array; found something else. Delete it to re-time");
  OpTimingCache cache;
  size_t index = 0;
  for (const auto& e : j["entries"]) {
    const bool valid = e.is_object() && e.contains("gpu") && e["gpu"].is_string() && e.contains("op") &&
                       e["op"].is_string() && e.contains("shape") && e["shape"].is_string() && e.contains("seconds") &&
                       e["seconds"].is_number() && e["seconds"].get<double>() > 0 &&
                       std::isfinite(e["seconds"].get<double>());
    if (!valid)
      fail(ErrorKind::input, "op timing cache '" + path + "', entry " + std::to_string(index) +
                                 ": expected {\"gpu\": string, \"op\": string, \"shape\": string, \"seconds\": "
                                 "positive number}, found " + e.dump() + "; fix or delete the entry");
    cache.set(e["gpu"], e["op"], e["shape"], e["seconds"]);
    ++index;
  }
  return cache;
}

void OpTimingCache::save(const std::string& path) const {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& [key, seconds] : seconds_) {
    const size_t first = key.find(kSeparator), second = key.find(kSeparator, first + 1);
    entries.push_back({{"gpu", key.substr(0, first)},
                       {"op", key.substr(first + 1, second - first - 1)},
                       {"shape", key.substr(second + 1)},
                       {"seconds", seconds}});
  }
  nlohmann::json j = {{"format", kTimingFormat}, {"version", kTimingVersion}, {"entries", entries}};
  // Written whole under a temporary name, then renamed: a reader never sees half a cache.
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary);
    if (!file) fail(ErrorKind::input, "cannot write the op timing cache '" + path + "'; check the folder exists");
    file << j.dump(1) << "\n";
    if (!file.flush()) fail(ErrorKind::input, "writing the op timing cache '" + temporary + "' failed (disk full?)");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) fail(ErrorKind::input, "cannot rename '" + temporary + "' to '" + path + "': " + error.message());
}

void OpTimingCache::set(const std::string& gpu, const std::string& op, const std::string& shape, double seconds) {
  seconds_[cache_key(gpu, op, shape)] = seconds;
}

std::optional<double> OpTimingCache::find(const std::string& gpu, const std::string& op, const std::string& shape) const {
  auto it = seconds_.find(cache_key(gpu, op, shape));
  if (it == seconds_.end()) return std::nullopt;
  return it->second;
}

std::string op_timing_key(const Step& step) {
  switch (step.kind) {
    case StepKind::layer_forward:
    case StepKind::layer_recompute:
      return "forward " + std::string(forward_op_info(static_cast<ForwardOp>(step.op)).name);
    case StepKind::layer_backward:
      return "backward " + std::string(backward_op_info(static_cast<BackwardOp>(step.op)).name);
    default: return step.name();
  }
}

std::string shape_timing_key(const ModelConfig& m, const PlanOptions& o, bool float8_linears) {
  return "batch=" + std::to_string(o.shape.batch) + " seq=" + std::to_string(o.shape.seq_len) +
         " dim=" + std::to_string(m.dim) + " heads=" + std::to_string(m.n_heads) +
         " kv_heads=" + std::to_string(m.n_kv_heads) + " ffn=" + std::to_string(m.ffn_dim) +
         " vocab=" + std::to_string(m.vocab_size) + " layers=" + std::to_string(m.n_layers) +
         " dtype=" + std::string(dtype_name(o.compute_dtype)) + " float8=" + (float8_linears ? "on" : "off") +
         " loss_chunk=" + std::to_string(o.loss_chunk_tokens) + " shard=" + std::to_string(o.shard_degree);
}

// ---- the roofline ---------------------------------------------------------------------

namespace {

double weight_elements(LayerWeight w, const ModelConfig& m) {
  auto spec = layer_weight_spec(w, m);
  return static_cast<double>(spec.dims[0]) * static_cast<double>(spec.dims[1]);
}

// The linears that run in float8 (the cast_weights step quantises them): how many, and their elements.
struct Float8Weights {
  double linears = 0, elements = 0;
};
Float8Weights float8_weights(const ModelConfig& m, const PlanOptions& o) {
  Float8Weights total;
  if (o.float8.recipe == Float8Recipe::none) return total;
  for (int64_t layer = 0; layer < m.n_layers; ++layer)
    for (int w = 0; w < kLayerWeightCount; ++w) {
      const auto weight = static_cast<LayerWeight>(w);
      if (!is_linear(weight)) continue;
      if (float8_linear_enabled(o.float8, m, layer, weight))
        total.linears += 1, total.elements += weight_elements(weight, m);
    }
  return total;
}

// The linears that read the input the one before them quantised (Float8InputReuse): k and v
// after q, up after gate.
bool shares_float8_input(ForwardOp op) {
  return op == ForwardOp::k_proj || op == ForwardOp::v_proj || op == ForwardOp::up_proj;
}

}  // namespace

double CostModel::roofline_seconds(const Step& step, const ModelConfig& m, const PlanOptions& o) const {
  const DeviceCeilings& c = ceilings_;
  const double tokens = static_cast<double>(o.shape.tokens());
  const double width = static_cast<double>(dtype_size(o.compute_dtype));
  const double stream = tokens * static_cast<double>(m.dim) * width;  // one (N, D) activation
  auto local_parameters = [&] {  // only the whole-model steps need it (the layout is costly to build)
    return std::ceil(static_cast<double>(ParameterLayout(m).total()) / static_cast<double>(std::max<int64_t>(1, o.shard_degree)));
  };
  auto low_precision_gradients = [&] {  // the block linears' weight gradients, when kept in bf16
    if (!low_precision_linear_grads(o)) return 0.0;
    return static_cast<double>(gradient_elements(compute_copy_ranges(m, o), true));
  };
  auto activation_bytes = [&](Activation a) { return static_cast<double>(activation_spec(a, m, o.shape, o.compute_dtype).bytes()); };
  auto gradient_bytes = [&](Gradient g) { return static_cast<double>(gradient_spec(g, m, o.shape, o.compute_dtype).bytes()); };
  const bool fp8 = float8_linears_ && o.compute_dtype != DType::f32 && o.compute_dtype != DType::f64;
  // Unsharded float8 weights are quantised once per step (the cast_weights step); gathered ones per use.
  const bool sharded = o.shard_degree > 1 || o.shard_single_rank;
  // Gradient accumulation: the share of a step's passes that add to the gradients (all but the first).
  const double microbatches = static_cast<double>(std::max<int64_t>(1, o.microbatches));
  const double later_microbatches = (microbatches - 1) / microbatches;
  double flops = step.flops, flop_rate = c.gemm_flops, bytes = 0, extra_bytes = 0, launches = 1;

  switch (step.kind) {
    case StepKind::layer_forward:
    case StepKind::layer_recompute: {
      const auto op = static_cast<ForwardOp>(step.op);
      const auto& info = forward_op_info(op);
      for (Activation a : info.inputs) bytes += activation_bytes(a);
      for (Activation a : info.outputs) bytes += activation_bytes(a);
      if (op == ForwardOp::attention) flop_rate = attention_flops(c, m.head_dim(), false);
      if (auto w = linear_weight(op)) {
        bytes += weight_elements(*w, m) * width;
        if (op == ForwardOp::q_proj || op == ForwardOp::k_proj) {  // RoPE in place: one more pass
          extra_bytes += 2 * activation_bytes(info.outputs[0]);
          launches += 1;
        }
        if (fp8) {  // amax + cast of the input (read, read, write a byte), and of a gathered weight
          flop_rate = c.float8_gemm_flops;
          // k and v (and up) take the quantised input q's (gate's) forward made, one step before;
          // a recompute runs alone and casts its own.
          const bool input_shared = step.kind == StepKind::layer_forward && shares_float8_input(op);
          if (!input_shared) extra_bytes += activation_bytes(info.inputs[0]) / width * (2 * width + 1), launches += 2;
          if (sharded) extra_bytes += weight_elements(*w, m) * (2 * width + 1), launches += 2;
        }
      }
      break;
    }
    case StepKind::layer_backward: {
      const auto op = static_cast<BackwardOp>(step.op);
      const auto& info = backward_op_info(op);
      for (Activation a : info.reads) bytes += activation_bytes(a);
      for (Gradient g : info.gradient_reads) bytes += gradient_bytes(g);
      for (Gradient g : info.gradient_writes) bytes += gradient_bytes(g);
      if (op == BackwardOp::down_proj || op == BackwardOp::o_proj) bytes += stream;           // reads d residual
      // The norms add to the residual gradient (read, write), and sum the weight's partials from the
      // same reads (wider rows read x and dy again).
      if (op == BackwardOp::ffn_norm || op == BackwardOp::attn_norm)
        bytes += (m.dim <= kCudaRmsNormOnePassMaxDim ? 2 : 4) * stream, launches += 2;
      if (op == BackwardOp::attention) flop_rate = attention_flops(c, m.head_dim(), true), launches += 1;
      if (auto w = linear_weight(forward_op_of(op))) {
        launches += 1;  // grad-input and grad-weight GEMMs
        bytes += weight_elements(*w, m) * (width + 4);  // weight read, f32 weight gradient written
        // and read where a later microbatch adds to it, in the GEMM's epilogue: measured not hidden
        // by its math (8B proxy, tensorwise: +1.4 ms per pass over the 8 blocks, 1.8 ms at bandwidth)
        extra_bytes += weight_elements(*w, m) * 4 * later_microbatches;
        if (op == BackwardOp::q_proj || op == BackwardOp::k_proj) extra_bytes += 2 * gradient_bytes(info.gradient_reads[0]), launches += 1;
        if (fp8) {  // casts of the output gradient (two layouts from one read, after an amax pass), the
          flop_rate = c.float8_gemm_flops;  // input (transposed; k, v and up take q's and gate's) and a gathered weight
          const double inputs = activation_bytes(info.reads[0]) / width;
          const double outputs = static_cast<double>(gradient_spec(info.gradient_reads.empty() ? Gradient::swiglu_out
                                                                                               : info.gradient_reads[0],
                                                                   m, o.shape, o.compute_dtype)
                                                         .dims[1]) *
                                 tokens;
          extra_bytes += outputs * (2 * width + 2), launches += 2;
          if (!shares_float8_input(forward_op_of(op))) extra_bytes += inputs * (width + 1), launches += 1;
          if (sharded) extra_bytes += weight_elements(*w, m) * (2 * width + 1), launches += 2;
          if (!sharded && float8_transposes_per_use(o.float8))  // W^T from W's codes: read, write a byte
            extra_bytes += 2 * weight_elements(*w, m), launches += 1;
        }
      }
      break;
    }
    case StepKind::embedding_forward: bytes = 2 * stream + tokens * 4; break;
    case StepKind::embedding_backward:  // zeroes the f32 table gradient (a step's first pass), then adds each token's row
      bytes = stream + tokens * static_cast<double>(m.dim) * 8 + tokens * 4 +
              static_cast<double>(m.vocab_size) * static_cast<double>(m.dim) * 4 / microbatches;
      launches = 2;
      break;
    case StepKind::final_norm_forward: bytes = 2 * stream + tokens * 4; break;
    case StepKind::final_norm_backward: bytes = 4 * stream + tokens * 4, launches = 2; break;
    case StepKind::output_head: {
      // Per chunk: logits GEMM (compute-dtype logits written), cross-entropy (read, gradient
      // written over them), grad-input and grad-weight GEMMs, each reading the (V, D) weight.
      const double chunk = static_cast<double>(std::max<int64_t>(1, std::min(o.loss_chunk_tokens, o.shape.tokens())));
      const double chunks = std::ceil(tokens / chunk);
      const double vocabulary = static_cast<double>(m.vocab_size);
      bytes = tokens * vocabulary * 4 * width + 3 * stream +
              chunks * 3 * vocabulary * static_cast<double>(m.dim) * width;
      launches = chunks * 4;
      // The output projection's weight gradient: after its first chunk each grad-weight GEMM reads
      // and rewrites it in f32, and a later microbatch's first chunk reads it too, in the GEMMs'
      // epilogues after their math (measured: not hidden by it).
      extra_bytes += vocabulary * static_cast<double>(m.dim) * (8 * (chunks - 1) + 4 * later_microbatches);
      if (!sharded && o.compute_dtype != master_dtype(o.compute_dtype) && !o.persistent_output_copy)  // cast first
        bytes += vocabulary * static_cast<double>(m.dim) * (4 + width), launches += 1;
      break;
    }
    case StepKind::gradient_norm:  // bf16 linear gradients: two bytes less for each of theirs
      bytes = 4 * local_parameters() - 2 * low_precision_gradients(), launches = low_precision_gradients() > 0 ? 4 : 2;
      break;
    case StepKind::optimizer: {  // read p g m v, write p m v, and the compute copy where there is one
      const bool copy = o.compute_dtype != master_dtype(o.compute_dtype);
      const std::vector<ParameterRun> runs = copy ? compute_copy_ranges(m, o) : std::vector<ParameterRun>{};
      const double copied = !copy ? 0 : runs.empty() ? local_parameters() : static_cast<double>(compute_copy_elements(runs));
      bytes = 28 * local_parameters() - 2 * low_precision_gradients() + width * copied, launches = 2;
      break;
    }
    case StepKind::cast_weights: {  // unsharded float8 linears from the fp32 master: an amax pass (none when
      const Float8Weights f = float8_weights(m, o);  // AdamW took the amax) and a cast pass read it, the cast
      const double copies = float8_transposes_per_use(o.float8) ? 1 : 2;  // writes W and W^T (e4m3; W alone
      const bool amax_pass = !optimizer_takes_float8_weight_amax(o);     // when W^T is made per use)
      bytes = ((amax_pass ? 4 : 0) + 4 + copies) * f.elements, launches = (amax_pass ? 2 : 1) * f.linears;
      break;
    }
    case StepKind::loss_reduce: bytes = tokens * 4; break;
    case StepKind::float8_shard_amax: bytes = 2 * local_parameters(); break;  // the weight shards, read once (upper bound)
    case StepKind::float8_shard_cast: bytes = 3 * local_parameters(); break;  // read, write e4m3
    case StepKind::all_gather:
    case StepKind::reduce_scatter:
    case StepKind::all_reduce_gradients:
    case StepKind::all_reduce_gradient_norm:
    case StepKind::all_reduce_loss:
    case StepKind::all_reduce_float8_amax: return 0;  // communication: predict() adds it, with its overlap
  }
  const bool streaming = step.kind == StepKind::optimizer || step.kind == StepKind::gradient_norm ||
                         step.kind == StepKind::cast_weights;
  const double bandwidth = streaming ? c.streaming_bytes_per_second : c.elementwise_bytes_per_second;
  return std::max(flops / flop_rate, bytes / bandwidth) + extra_bytes / bandwidth + launches * c.kernel_launch_seconds;
}

double CostModel::step_seconds(const Step& step, const ModelConfig& model, const PlanOptions& options) const {
  if (cache_) {
    if (auto seconds = cache_->find(ceilings_.gpu_name, op_timing_key(step),
                                    shape_timing_key(model, options, float8_linears_)))
      return *seconds;
  }
  return roofline_seconds(step, model, options);
}

double CostModel::forward_op_seconds(ForwardOp op, const ModelConfig& model, const PlanOptions& options) const {
  Step step{StepKind::layer_recompute, 0, static_cast<uint8_t>(op), forward_op_flops(op, model, options.shape)};
  return step_seconds(step, model, options);
}

PlanTime CostModel::predict(const StepPlan& plan) const {
  PlanTime t;
  const ModelConfig& m = plan.model;
  const PlanOptions& o = plan.options;
  const std::string shape_key = cache_ ? shape_timing_key(m, o, float8_linears_) : "";
  t.timing_cache = cache_ != nullptr;
  // Per block: forward time, and recompute + backward time (what collectives can hide behind).
  std::vector<double> forward(m.n_layers, 0.0), backward(m.n_layers, 0.0);
  const double microbatches = static_cast<double>(std::max<int64_t>(1, o.microbatches));
  double head = 0;
  for (const Step& s : plan.steps) {
    double seconds = roofline_seconds(s, m, o);
    if (cache_)
      if (auto cached = cache_->find(ceilings_.gpu_name, op_timing_key(s), shape_key)) seconds = *cached, ++t.calibrated_steps;
    t.step_seconds.push_back(seconds);
    if (!runs_once_per_step(s.kind)) seconds *= microbatches;  // gradient accumulation: once per microbatch
    t.compute_seconds += seconds;
    if (s.kind == StepKind::layer_recompute) t.recompute_seconds += seconds;
    if (s.kind == StepKind::layer_forward) forward[s.layer] += seconds;
    if (s.kind == StepKind::layer_recompute || s.kind == StepKind::layer_backward) backward[s.layer] += seconds;
    if (s.kind == StepKind::output_head) head += seconds;
  }
  const double degree = static_cast<double>(o.shard_degree), replicas = static_cast<double>(o.replicate_degree);
  if (o.shard_degree > 1 || o.replicate_degree > 1) {
    // FSDP: each block's weights are gathered before its forward and again before its backward,
    // its gradients reduce-scattered after; the next block's transfer overlaps this block's compute.
    // Replicas (plain data parallel, HSDP): the unit's gradients (or shard) are then all-reduced over
    // the replica group, which a ring does in 2 (R-1)/R of their size per rank. With gradient
    // accumulation every pass gathers and reduce-scatters; replicas all-reduce once, in the last
    // pass (in the master dtype when sharded: the accumulated shard).
    const double share = (degree - 1) / degree, bandwidth = ceilings_.collective_bytes_per_second;
    const double replica_share = 2 * (replicas - 1) / replicas / degree;
    const double compute_width = static_cast<double>(dtype_size(o.compute_dtype));
    const double reduce_width = static_cast<double>(dtype_size(plan.gradient_reduce_dtype()));  // gradients travel in it
    const double replica_width = static_cast<double>(dtype_size(plan.replica_reduce_dtype()));
    const double block_width = plan.float8_gathered() ? 1.0 : compute_width;   // float8 all-gather: e4m3 blocks
    const double block = static_cast<double>(m.layer_parameters());
    const double gather = block * block_width * share / bandwidth;
    const double scatter = block * reduce_width * share / bandwidth;
    const double replica = block * replica_width * replica_share / bandwidth;
    for (int64_t i = 0; i < m.n_layers; ++i) {  // per pass: forward[i] and backward[i] hold every pass's
      const double forward_pass = forward[i] / microbatches, backward_pass = backward[i] / microbatches;
      t.communication_seconds += microbatches * (2 * gather + scatter) + replica;
      t.exposed_communication_seconds += microbatches * std::max(0.0, gather - forward_pass) +
                                         (microbatches - 1) * std::max(0.0, gather + scatter - backward_pass) +
                                         std::max(0.0, gather + scatter + replica - backward_pass);
    }
    const double ends = static_cast<double>(m.embedding_parameters() + m.vocab_size * m.dim);
    const double ends_gather = ends * compute_width * share / bandwidth;
    const double ends_scatter = ends * reduce_width * share / bandwidth;
    const double ends_replica = ends * replica_width * replica_share / bandwidth;
    t.communication_seconds += microbatches * (2 * ends_gather + ends_scatter) + ends_replica;
    // The embedding's gather starts each pass (exposed); the output head's traffic overlaps the head.
    const double embedding_share = static_cast<double>(m.embedding_parameters()) / ends;
    const double head_pass = head / microbatches;
    t.exposed_communication_seconds += microbatches * ends_gather * embedding_share;
    t.exposed_communication_seconds +=
        (microbatches - 1) * std::max(0.0, (ends_gather * (2 - embedding_share) + ends_scatter) - head_pass) +
        std::max(0.0, (ends_gather * (2 - embedding_share) + ends_scatter + ends_replica) - head_pass);
  }
  t.seconds = t.compute_seconds + t.exposed_communication_seconds;
  t.tokens_per_second = t.seconds > 0 ? static_cast<double>(o.shape.tokens()) * microbatches / t.seconds : 0;
  return t;
}

}  // namespace smelt
