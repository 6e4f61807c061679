// Building the StepPlan: steps in execution order, buffers with live ranges, packing.
#include "plan/step_plan.h"

#include <algorithm>
#include <climits>
#include <memory>

#include "core/error.h"
#include "plan/plan_builder.h"
#include "plan/shard_layout.h"
#include "plan/shard_scheduler.h"

namespace smelt {

std::string Step::name() const {
  auto layer_prefix = [&] { return "layers." + std::to_string(layer) + "."; };
  switch (kind) {
    case StepKind::embedding_forward: return "forward tok_embeddings";
    case StepKind::layer_forward:
      return "forward " + layer_prefix() + std::string(forward_op_info(static_cast<ForwardOp>(op)).name);
    case StepKind::final_norm_forward: return "forward norm";
    case StepKind::output_head: return "forward+backward output+loss";
    case StepKind::final_norm_backward: return "backward norm";
    case StepKind::layer_recompute:
      return "recompute " + layer_prefix() + std::string(forward_op_info(static_cast<ForwardOp>(op)).name);
    case StepKind::layer_backward:
      return "backward " + layer_prefix() + std::string(backward_op_info(static_cast<BackwardOp>(op)).name);
    case StepKind::embedding_backward: return "backward tok_embeddings";
    case StepKind::gradient_norm: return "gradient norm";
    case StepKind::optimizer: return "optimizer AdamW";
    case StepKind::cast_weights: return "cast weights";
    case StepKind::loss_reduce: return "loss";
    case StepKind::all_gather:
    case StepKind::reduce_scatter: {
      std::string text = kind == StepKind::all_gather ? "all-gather " : "reduce-scatter ";
      if (layer >= 0) return text.append("layers.").append(std::to_string(layer));
      return text.append(unit == 0 ? "tok_embeddings" : "norm+output");
    }
    case StepKind::all_reduce_gradients: {
      const std::string what = layer >= 0 ? "layers." + std::to_string(layer) : unit == 0 ? "tok_embeddings" : "norm+output";
      return "all-reduce gradients " + what + " (replicas)";
    }
    case StepKind::float8_shard_amax: return "float8 weight amax (shards)";
    case StepKind::all_reduce_float8_amax: return "all-reduce float8 weight amax (max)";
    case StepKind::float8_shard_cast: return "cast weight shards to e4m3";
    case StepKind::all_reduce_gradient_norm: return "all-reduce gradient sum of squares";
    case StepKind::all_reduce_loss: return "all-reduce loss";
  }
  return "?";
}

int64_t StepPlan::parameter_count() const { return model.total_parameters(); }

StepPlan::LinearCount StepPlan::block_linears() const {
  LinearCount count;
  for (const auto& layer : layers)
    for (int w = 0; w < kLayerWeightCount; ++w)
      if (is_linear(static_cast<LayerWeight>(w))) ++count.total, count.float8 += layer.float8[size_t(w)];
  return count;
}

DType StepPlan::gradient_reduce_dtype() const {
  return options.reduce_dtype == DType::bf16 ? DType::bf16 : master_dtype(options.compute_dtype);
}

DType StepPlan::replica_reduce_dtype() const {
  return options.microbatches > 1 && sharded() ? master_dtype(options.compute_dtype) : gradient_reduce_dtype();
}

int64_t StepPlan::local_parameter_count() const {
  const ParameterLayout layout(model);
  return sharded() ? ShardLayout(layout, options.shard_degree).local_total() : layout.total();  // replicas: the whole model
}

const ParameterRun& StepPlan::run_holding(const ParameterInfo& info, const char* caller) const {
  // The run holding the parameter's first element (runs are sorted by begin).
  auto run = std::upper_bound(compute_copy_ranges.begin(), compute_copy_ranges.end(), info.offset,
                              [](int64_t offset, const ParameterRun& r) { return offset < r.begin; });
  SMELT_CHECK(run != compute_copy_ranges.begin(), std::string(caller) + ": parameter " + info.name + " before the first run");
  --run;
  SMELT_CHECK(info.offset + info.numel() <= run->begin + run->count,
              std::string(caller) + ": parameter " + info.name + " spans two runs");
  return *run;
}

int64_t StepPlan::compute_copy_offset(const ParameterInfo& info) const {
  if (compute_weights < 0) return -1;
  if (compute_copy_ranges.empty()) return info.offset;  // a copy of every element
  const ParameterRun& run = run_holding(info, "compute_copy_offset");
  return run.copied() ? run.copy_offset + (info.offset - run.begin) : -1;
}

StepPlan::GradientPlace StepPlan::gradient_place(const ParameterInfo& info) const {
  if (compute_copy_ranges.empty()) return {gradients, info.offset};
  const ParameterRun& run = run_holding(info, "gradient_place");
  const int buffer = run.own_grad ? embedding_gradient : run.low_grad ? linear_gradients : gradients;
  return {buffer, run.gradient_offset() + (info.offset - run.begin)};
}

namespace {

// Unsharded plans with a compute dtype other than the weights': their compute copy is packed
// from runs (compute_copy_ranges).
bool packed_compute_copy(const PlanOptions& options) {
  const bool sharded = options.shard_degree > 1 || options.shard_single_rank;
  return !sharded && options.compute_dtype != parameter_dtype(options);
}

}  // namespace

DType parameter_dtype(const PlanOptions& options) {
  if (options.forward_only && options.float8.recipe == Float8Recipe::none) return options.compute_dtype;
  return master_dtype(options.compute_dtype);
}

bool low_precision_linear_grads(const PlanOptions& options) {
  // Replicas all-reduce each unit's gradients as one range of the flat layout: they keep it.
  // Gradient accumulation adds to them: in bf16 each microbatch would round the running sum.
  return packed_compute_copy(options) && options.replicate_degree == 1 && options.microbatches == 1 &&
         options.compute_dtype == DType::bf16 && options.linear_grad_dtype == DType::bf16;
}

bool separate_embedding_gradient(const PlanOptions& options) {
  return packed_compute_copy(options) && !options.forward_only && options.replicate_degree == 1 &&
         options.microbatches == 1;
}

int64_t gradient_elements(const std::vector<ParameterRun>& ranges, bool low) {
  int64_t total = 0;
  for (const auto& r : ranges)
    if (r.low_grad == low && !r.own_grad) total += r.count;
  return total;
}

bool optimizer_takes_float8_weight_amax(const PlanOptions& options) {
  return packed_compute_copy(options) && float8_fused_amax(options.float8);
}

std::vector<ParameterRun> compute_copy_ranges(const ModelConfig& model, const PlanOptions& options) {
  if (!packed_compute_copy(options)) return {};
  const ParameterLayout layout(model);
  const auto& parameters = layout.parameters();
  const bool float8 = options.float8.recipe != Float8Recipe::none;
  auto copied = [&](int64_t layer, LayerWeight weight) {
    if (!is_linear(weight) || !float8) return true;
    return !float8_linear_enabled(options.float8, model, layer, weight);
  };
  const bool amax_slots = optimizer_takes_float8_weight_amax(options);
  const bool low_grads = low_precision_linear_grads(options);
  // The output projection's gradient is written once when the head runs in one loss chunk.
  const bool low_output_grad = low_grads && options.loss_chunk_tokens >= options.shape.tokens();
  const bool own_embedding_grad = separate_embedding_gradient(options);
  std::vector<ParameterRun> ranges;
  int64_t copy_total = 0, grad_total = 0, low_grad_total = 0;
  for (size_t index = 0; index < parameters.size(); ++index) {
    // The embedding (index 0) has none, the output projection (last) one when it is persistent; the
    // final norm keeps its.
    bool keep = index != 0 && (index + 1 != parameters.size() || options.persistent_output_copy);
    const int64_t block_index = static_cast<int64_t>(index) - 1;
    int32_t slot = -1;
    bool low = false;
    if (index != 0 && block_index < model.n_layers * kLayerWeightCount) {
      const auto weight = static_cast<LayerWeight>(block_index % kLayerWeightCount);
      keep = copied(block_index / kLayerWeightCount, weight);
      if (amax_slots && !keep) slot = static_cast<int32_t>(block_index);  // a float8 linear: layer * 7 + weight
      low = low_grads && is_linear(weight);
    } else if (index + 1 == parameters.size()) {
      low = low_output_grad;
    }
    const int64_t begin = parameters[index].offset;
    const int64_t end = index + 1 < parameters.size() ? parameters[index + 1].offset : layout.total();
    if (index == 0 && own_embedding_grad) {  // the embedding's gradient, in a buffer of its own
      ranges.push_back({begin, end - begin, -1, -1, false, 0, true});
      continue;
    }
    if (!ranges.empty() && ranges.back().copied() == keep && slot < 0 && ranges.back().amax_slot < 0 &&
        ranges.back().low_grad == low && !ranges.back().own_grad) {
      ranges.back().count = end - ranges.back().begin;
    } else {
      ranges.push_back({begin, end - begin, keep ? copy_total : -1, slot, low, low ? low_grad_total : grad_total});
    }
    if (keep) copy_total += end - begin;
    (low ? low_grad_total : grad_total) += end - begin;
  }
  return ranges;
}

int64_t compute_copy_elements(const std::vector<ParameterRun>& ranges) {
  int64_t total = 0;
  for (const auto& r : ranges)
    if (r.copied()) total += r.count;
  return total;
}

int64_t largest_gather_unit(const ModelConfig& model) {
  return std::max({model.layer_parameters(), model.embedding_parameters(), model.vocab_size * model.dim + model.dim});
}

double StepPlan::step_flops() const {
  double total = 0;
  for (const auto& s : steps) total += s.flops;
  return total;
}

double StepPlan::recompute_flops() const {
  double total = 0;
  for (const auto& s : steps)
    if (s.kind == StepKind::layer_recompute) total += s.flops;
  return total;
}

size_t StepPlan::bytes_of(BufferClass kind) const {
  size_t total = 0;
  for (const auto& b : buffers)
    if (b.request.kind == kind) total += (b.request.bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  return total;
}

namespace {

using plan_detail::float8_gather_wanted;
using plan_detail::PlanBuilder;
using plan_detail::ShardScheduler;
using plan_detail::spec_shape;

// Float8 buffers: one scratch set reused by every float8 linear in turn; in unsharded plans the
// float8 weight copies (the GEMMs' only weights, written after each optimizer step) and, for
// tensorwise, the forward's input amax of every float8 linear.
void add_float8_buffers(PlanBuilder& b, StepPlan& plan, int64_t tokens) {
  const Float8Recipe recipe = plan.options.float8.recipe;
  const bool weight_copies = !plan.sharded();
  const bool transposes_per_use = weight_copies && float8_transposes_per_use(plan.options.float8);
  plan.float8_sizes = float8_scratch_sizes(plan.model, tokens, recipe, !weight_copies && !float8_gather_wanted(plan),
                                           transposes_per_use);
  const Shape scratch_bytes{float8_scratch_value_bytes(plan.float8_sizes)};
  plan.float8_scratch = b.buffer("float8 scratch, forward (x in e4m3, K-major)", DType::e4m3, scratch_bytes,
                                 BufferClass::workspace);
  if (!plan.options.forward_only)
    plan.float8_scratch_backward = b.buffer(transposes_per_use
                                                ? "float8 scratch, recompute and backward (x, dy, dy^T, x^T, W^T in e4m3/e5m2)"
                                                : "float8 scratch, recompute and backward (x, dy, dy^T, x^T in e4m3/e5m2)",
                                            DType::e4m3, scratch_bytes, BufferClass::workspace);
  if (float8_fused_amax(plan.options.float8))
    plan.float8_producer_amax = b.buffer("float8 amax taken by producers (SwiGLU out, d gate, d up, the norms' "
                                         "outputs, wo's dy per block)",
                                         DType::f32, Shape{plan.model.n_layers * kProducerAmaxPerBlock},
                                         BufferClass::workspace, true);
  plan.float8_statistics = b.buffer("float8 scratch amax and scales", DType::f32,
                                    Shape{float8_scratch_statistic_floats(plan.float8_sizes)}, BufferClass::workspace,
                                    true);
  if (!weight_copies) return;
  std::vector<std::array<bool, kLayerWeightCount>> float8;
  for (const auto& lb : plan.layers) float8.push_back(lb.float8);
  plan.float8_weight_layout = float8_weight_layout(plan.model, recipe, float8, !transposes_per_use);
  plan.float8_weights = b.buffer(transposes_per_use ? "float8 weights (W, e4m3; W^T transposed from it at each use)"
                                                    : "float8 weights (W and W^T, e4m3)",
                                 DType::e4m3,
                                 Shape{plan.float8_weight_layout.value_bytes}, BufferClass::compute_weights, true);
  plan.float8_weight_scales = b.buffer("float8 weight scales", DType::f32, Shape{plan.float8_weight_layout.scale_floats},
                                       BufferClass::compute_weights, true);
  if (optimizer_takes_float8_weight_amax(plan.options) && !plan.options.forward_only)
    plan.float8_weight_amax = b.buffer("float8 weight amax (taken by AdamW for the cast)", DType::f32,
                                       Shape{plan.model.n_layers * kLayerWeightCount}, BufferClass::workspace, true);
  if (float8_gemm_cast(recipe, LinearGemm::output).a.scaling == OperandScaling::tensorwise)
    plan.float8_input_amax = b.buffer("float8 input amax (forward -> grad-weight)", DType::f32,
                                      Shape{plan.model.n_layers * kLayerWeightCount}, BufferClass::workspace, true);
}

}  // namespace

std::array<bool, kActivationCount> float8_saved_inputs(const LayerBuffers& lb, const Float8Options& float8) {
  std::array<bool, kActivationCount> saved{};
  if (!float8.save_inputs_in_float8 || !float8_gemm_enabled(float8.recipe, LinearGemm::grad_weight)) return saved;
  for (int a = 0; a < kActivationCount; ++a) {
    const auto act = static_cast<Activation>(a);
    if (!lb.kept[a] || act == Activation::layer_input || act == Activation::layer_output) continue;
    bool read_by_float8_linears = true, read = false;
    for (int op = 0; op < kBackwardOpCount; ++op) {
      const auto& reads = backward_op_info(static_cast<BackwardOp>(op)).reads;
      if (std::find(reads.begin(), reads.end(), act) == reads.end()) continue;
      read = true;
      const auto w = linear_weight(forward_op_of(static_cast<BackwardOp>(op)));
      read_by_float8_linears = read_by_float8_linears && w && lb.float8[static_cast<int>(*w)] && linear_input(*w) == act;
    }
    for (int op = 0; op < kForwardOpCount; ++op) {
      if (!lb.recomputed[op]) continue;
      const auto& info = forward_op_info(static_cast<ForwardOp>(op));
      const bool touches = std::find(info.inputs.begin(), info.inputs.end(), act) != info.inputs.end() ||
                           std::find(info.outputs.begin(), info.outputs.end(), act) != info.outputs.end();
      if (touches) read_by_float8_linears = false;
    }
    saved[a] = read && read_by_float8_linears;
  }
  return saved;
}

StepPlan build_step_plan(const ModelConfig& model, const PlanOptions& options) {
  SMELT_CHECK(options.policy.mode != CheckpointMode::automatic || !options.keep_sets.empty(),
              "build_step_plan needs a resolved policy; resolve 'auto' with choose_automatic_policy first");
  SMELT_CHECK(options.keep_sets.empty() || static_cast<int64_t>(options.keep_sets.size()) == model.n_layers,
              "keep_sets has " + std::to_string(options.keep_sets.size()) + " entries for " +
                  std::to_string(model.n_layers) + " blocks");
  SMELT_CHECK(options.shard_degree >= 1, "shard_degree must be at least 1");
  SMELT_CHECK(options.replicate_degree >= 1, "replicate_degree must be at least 1");
  SMELT_CHECK(!options.forward_only || (options.shard_degree == 1 && options.replicate_degree == 1 &&
                                        !options.shard_single_rank && options.microbatches == 1),
              "a forward-only plan is for one unsharded model and one microbatch");
  const bool training = !options.forward_only;
  if (options.float8.recipe != Float8Recipe::none) {
    if (options.compute_dtype != DType::bf16 && options.compute_dtype != DType::f32)
      fail(ErrorKind::config, "float8 recipe '" + std::string(float8_recipe_name(options.float8.recipe)) +
                                  "' expects a bf16 or f32 compute dtype, found " +
                                  std::string(dtype_name(options.compute_dtype)) + "; set training.mixed_precision_param");
    if (float8_linear_enabled(options.float8, "output"))
      fail(ErrorKind::config, "float8.filter_fqns: expected it to keep the output projection in bf16 (an entry "
                              "matching 'output'), found none; the float8 output head is not implemented yet, "
                              "add \"output\" to float8.filter_fqns");
  }
  StepPlan plan;
  plan.model = model;
  plan.options = options;
  PlanBuilder b(plan);
  const ParameterLayout layout(model);
  const DType compute = options.compute_dtype;
  const StepShape& shape = options.shape;
  const int64_t tokens = shape.tokens();
  const int64_t layers = model.n_layers;

  // Persistent state.
  ShardScheduler shard(b, plan);
  const Shape flat{shard.sharded() ? shard.local_total() : layout.total()};
  const DType master = parameter_dtype(options), statistics = statistics_dtype(compute);
  // Unsharded with a compute dtype other than the master's: the runs of the compute copy and of
  // the gradients (compute_copy_ranges).
  if (compute != master) plan.compute_copy_ranges = compute_copy_ranges(model, options);
  plan.parameters = b.buffer(master == master_dtype(compute) ? "parameters (master)"
                                                              : "parameters (" + std::string(dtype_name(master)) + ")",
                             master, flat, BufferClass::parameters, true);
  const bool own_embedding_grad = training && separate_embedding_gradient(options);
  if (own_embedding_grad) {  // not persistent: live from the embedding's backward to the optimizer
    const ParameterRun& run = plan.compute_copy_ranges.front();
    SMELT_CHECK(run.own_grad && run.begin == 0, "build_step_plan: the embedding's run has no gradient buffer of its own");
    plan.embedding_gradient = b.buffer("gradients (embedding, from its backward to the optimizer)", master,
                                       Shape{run.count}, BufferClass::gradients);
  }
  if (training && low_precision_linear_grads(options)) {
    const bool output_too = plan.compute_copy_ranges.back().low_grad;  // the output projection is the last run
    const std::string f32 = own_embedding_grad ? (output_too ? "gradients (norms)" : "gradients (norms, output)")
                                               : (output_too ? "gradients (embedding, norms)"
                                                             : "gradients (embedding, norms, output)");
    plan.gradients = b.buffer(f32, master, Shape{gradient_elements(plan.compute_copy_ranges, false)},
                              BufferClass::gradients, true);
    plan.linear_gradients = b.buffer(output_too ? "gradients (block linears and output, bf16)"
                                                : "gradients (block linears, bf16)",
                                     DType::bf16,
                                     Shape{gradient_elements(plan.compute_copy_ranges, true)}, BufferClass::gradients, true);
  } else if (own_embedding_grad) {
    plan.gradients = b.buffer("gradients (all but the embedding)", master,
                              Shape{gradient_elements(plan.compute_copy_ranges, false)}, BufferClass::gradients, true);
  } else if (training) {
    plan.gradients = b.buffer("gradients", master, flat, BufferClass::gradients, true);
  }
  if (training) {
    plan.exp_avg = b.buffer("AdamW exp_avg", master, flat, BufferClass::optimizer_state, true);
    plan.exp_avg_sq = b.buffer("AdamW exp_avg_sq", master, flat, BufferClass::optimizer_state, true);
  }
  if (compute != master) {
    // Unsharded: only the weights compute-dtype GEMMs and ops read (compute_copy_ranges).
    const std::string what = plan.compute_copy_ranges.empty() ? " copy)" : " copy of what its GEMMs and norms read)";
    plan.compute_weights = b.buffer(std::string("weights (") + std::string(dtype_name(compute)) + what, compute,
                                    plan.compute_copy_ranges.empty() ? flat
                                                                     : Shape{compute_copy_elements(plan.compute_copy_ranges)},
                                    BufferClass::compute_weights, true);
  }
  shard.add_buffers(compute, master);
  plan.tokens = b.buffer("input tokens", DType::i32, Shape{tokens}, BufferClass::data, true);
  plan.targets = b.buffer("target tokens", DType::i32, Shape{tokens}, BufferClass::data, true);
  plan.rope_frequencies = b.buffer("rope frequencies", DType::f32, Shape{shape.seq_len, model.head_dim() / 2, 2},
                                   BufferClass::workspace, true);
  if (options.backend_workspace_bytes > 0)
    plan.workspace = b.buffer("backend workspace", DType::f32,
                              Shape{static_cast<int64_t>((options.backend_workspace_bytes + 3) / 4)},
                              BufferClass::workspace, true);
  plan.loss = b.buffer("loss", statistics, Shape{1}, BufferClass::loss, true);
  if (training)
    plan.grad_sum_squares = b.buffer("gradient sum of squares", statistics, Shape{1}, BufferClass::loss, true);

  // Residual stream and per-block buffers.
  for (int64_t i = 0; i <= layers; ++i)
    plan.residual.push_back(b.buffer(i == 0 ? "tok_embeddings.out" : "layers." + std::to_string(i - 1) + ".output",
                                     compute, Shape{tokens, model.dim}, BufferClass::activations));
  plan.layers.resize(layers);
  bool any_float8 = false;
  for (int64_t i = 0; i < layers; ++i) {
    auto& lb = plan.layers[i];
    const std::string prefix = "layers." + std::to_string(i) + ".";
    if (options.keep_sets.empty()) {
      lb.kept = keep_set(options.policy, i);
    } else {
      lb.kept = options.keep_sets[i];
      lb.kept[static_cast<int>(Activation::layer_input)] = true;
      lb.kept[static_cast<int>(Activation::layer_output)] = false;
    }
    if (training) lb.recomputed = recompute_ops(lb.kept);
    for (int w = 0; w < kLayerWeightCount; ++w) {
      const auto weight = static_cast<LayerWeight>(w);
      if (!is_linear(weight)) continue;
      lb.float8[w] = float8_linear_enabled(options.float8, model, int64_t(i), weight);
      any_float8 = any_float8 || lb.float8[w];
    }
    std::array<bool, kActivationCount> recomputed_output{};
    for (int op = 0; op < kForwardOpCount; ++op)
      if (lb.recomputed[op])
        for (Activation a : forward_op_info(static_cast<ForwardOp>(op)).outputs) recomputed_output[static_cast<int>(a)] = true;
    for (int a = 0; a < kActivationCount; ++a) {
      auto act = static_cast<Activation>(a);
      if (act == Activation::layer_input) {
        lb.forward[a] = lb.backward[a] = plan.residual[i];
      } else if (act == Activation::layer_output) {
        lb.forward[a] = lb.backward[a] = plan.residual[i + 1];
      } else {
        auto spec = activation_spec(act, model, shape, compute);
        lb.forward[a] = b.buffer(prefix + std::string(activation_name(act)), spec.dtype, spec_shape(spec),
                                 BufferClass::activations);
        lb.backward[a] = lb.forward[a];
        if (recomputed_output[a] && !lb.kept[a])
          lb.backward[a] = b.buffer(prefix + std::string(activation_name(act)) + " (recomputed)", spec.dtype,
                                    spec_shape(spec), BufferClass::recompute);
      }
    }
    for (int g = 0; g < kGradientCount && training; ++g) {
      const Gradient gradient = static_cast<Gradient>(g);
      // The SwiGLU backward is the last reader of gate and up and the first writer of their
      // gradients, element by element: the gradients take the activations' memory (two (N, F)
      // buffers less at the backward's peak).
      if (gradient == Gradient::gate || gradient == Gradient::up) {
        const Activation source = gradient == Gradient::gate ? Activation::gate : Activation::up;
        const auto spec = gradient_spec(gradient, model, shape, compute);
        const auto& buffer = plan.buffers[static_cast<size_t>(lb.backward[static_cast<int>(source)])];
        if (buffer.dtype == spec.dtype && buffer.shape == spec_shape(spec)) {
          lb.gradient[g] = lb.backward[static_cast<int>(source)];
          continue;
        }
      }
      auto spec = gradient_spec(gradient, model, shape, compute);
      lb.gradient[g] = b.buffer(prefix + std::string(gradient_name(gradient)), spec.dtype, spec_shape(spec),
                                BufferClass::activation_gradients);
    }
    const auto float8_saved = float8_saved_inputs(lb, options.float8);
    for (int a = 0; a < kActivationCount && training; ++a) {
      if (!float8_saved[a]) continue;
      const auto act = static_cast<Activation>(a);
      const int64_t in = activation_spec(act, model, shape, compute).dims[1];
      const OperandCast cast = float8_gemm_cast(options.float8.recipe, LinearGemm::grad_weight).b;
      lb.float8_saved[a] = b.buffer(prefix + std::string(activation_name(act)) + " (x^T in " +
                                        std::string(dtype_name(cast.dtype)) + ", for the backward)",
                                    DType::e4m3, Shape{float8_saved_input_bytes(options.float8.recipe, in, tokens)},
                                    BufferClass::activations);
    }
    if (options.attention_backward_scratch_bytes > 0 && training)
      lb.attention_scratch = b.buffer(prefix + "attention backward scratch", DType::f32,
                                      Shape{static_cast<int64_t>((options.attention_backward_scratch_bytes + 3) / 4)},
                                      BufferClass::workspace);
  }

  if (any_float8) add_float8_buffers(b, plan, tokens);
  if (any_float8) shard.add_float8_gather(compute);

  // Output head buffers.
  const int64_t chunk = std::max<int64_t>(1, std::min(options.loss_chunk_tokens, tokens));
  plan.final_norm_out = b.buffer("norm.out", compute, Shape{tokens, model.dim}, BufferClass::activations);
  plan.final_rstd = b.buffer("norm.rstd", statistics, Shape{tokens}, BufferClass::activations);
  if (training) {
    plan.final_norm_out_grad = b.buffer("grad.norm.out", compute, Shape{tokens, model.dim}, BufferClass::activation_gradients);
    plan.residual_gradient = b.buffer("grad.residual", compute, Shape{tokens, model.dim}, BufferClass::activation_gradients);
  }
  // Logits in the compute dtype (a bf16 GEMM's output, as autocast gives PyTorch); the
  // cross-entropy reads them in f32 and writes the gradient over them.
  plan.logits = b.buffer("output.logits (chunk; its gradient in place)", compute, Shape{chunk, model.vocab_size},
                         BufferClass::loss);
  plan.grad_logits = plan.logits;
  plan.losses = b.buffer("per-token losses", statistics, Shape{tokens}, BufferClass::loss);
  if (!plan.compute_copy_ranges.empty() && !plan.compute_copy_ranges.back().copied())  // cast by the head, live only there
    plan.output_weight = b.buffer("output.weight (" + std::string(dtype_name(compute)) + ", cast for the output head)",
                                  compute, Shape{model.vocab_size, model.dim}, BufferClass::compute_weights);

  // Forward.
  shard.emit_float8_cast();
  shard.begin_use(shard.embedding_use());
  b.emit(shard.tag({StepKind::embedding_forward}, shard.embedding_use(), false), {plan.tokens, plan.residual[0]});
  for (int64_t i = 0; i < layers; ++i) {
    const auto& lb = plan.layers[i];
    shard.begin_use(shard.forward_use(i));
    for (int op = 0; op < kForwardOpCount; ++op) {
      const auto& info = forward_op_info(static_cast<ForwardOp>(op));
      std::vector<int> ids;
      for (Activation a : info.inputs) ids.push_back(lb.forward[static_cast<int>(a)]);
      for (Activation a : info.inputs) ids.push_back(lb.float8_saved[static_cast<int>(a)]);  // x^T written here
      for (Activation a : info.outputs) ids.push_back(lb.forward[static_cast<int>(a)]);
      if (plan.float8_scratch >= 0) ids.push_back(plan.float8_scratch);
      b.emit(shard.tag({StepKind::layer_forward, static_cast<int>(i), static_cast<uint8_t>(op),
                        forward_op_flops(static_cast<ForwardOp>(op), model, shape)},
                       shard.forward_use(i), false),
             ids);
    }
  }
  // The projection's forward GEMM, and for training its two backward GEMMs.
  const double head_flops = (training ? 6.0 : 2.0) * static_cast<double>(tokens * model.dim * model.vocab_size);
  shard.begin_use(shard.head_use());
  b.emit(shard.tag({StepKind::final_norm_forward}, shard.head_use(), false),
         {plan.residual[layers], plan.final_norm_out, plan.final_rstd});
  if (!training) {
    b.emit({StepKind::output_head, -1, 0, head_flops},
           {plan.final_norm_out, plan.targets, plan.logits, plan.losses, plan.output_weight});
    b.emit({StepKind::loss_reduce}, {plan.losses, plan.loss});
    b.finish();
    return plan;
  }
  b.emit(shard.tag({StepKind::output_head, -1, 0, head_flops}, shard.head_use(), true),
         {plan.final_norm_out, plan.targets, plan.logits, plan.grad_logits, plan.losses, plan.final_norm_out_grad,
          plan.output_weight});
  b.emit(shard.tag({StepKind::final_norm_backward}, shard.head_use(), true),
         {plan.residual[layers], plan.final_rstd, plan.final_norm_out_grad, plan.residual_gradient});
  shard.reduce_scatter(shard.head_unit());

  // Backward, block by block, each preceded by its recomputation.
  for (int64_t i = layers - 1; i >= 0; --i) {
    const auto& lb = plan.layers[i];
    shard.begin_use(shard.backward_use(i));
    for (int op = 0; op < kForwardOpCount; ++op) {
      if (!lb.recomputed[op]) continue;
      const auto& info = forward_op_info(static_cast<ForwardOp>(op));
      std::vector<int> ids;
      for (Activation a : info.inputs) ids.push_back(lb.backward[static_cast<int>(a)]);
      for (Activation a : info.outputs) ids.push_back(lb.backward[static_cast<int>(a)]);
      if (plan.float8_scratch_backward >= 0) ids.push_back(plan.float8_scratch_backward);
      b.emit(shard.tag({StepKind::layer_recompute, static_cast<int>(i), static_cast<uint8_t>(op),
                        forward_op_flops(static_cast<ForwardOp>(op), model, shape)},
                       shard.backward_use(i), false),
             ids);
    }
    for (int op = 0; op < kBackwardOpCount; ++op) {
      const auto& info = backward_op_info(static_cast<BackwardOp>(op));
      std::vector<int> ids{plan.residual_gradient};
      for (Activation a : info.reads)
        ids.push_back(lb.float8_saved[static_cast<int>(a)] >= 0 ? lb.float8_saved[static_cast<int>(a)]
                                                                 : lb.backward[static_cast<int>(a)]);
      for (Gradient g : info.gradient_reads) ids.push_back(lb.gradient[static_cast<int>(g)]);
      for (Gradient g : info.gradient_writes) ids.push_back(lb.gradient[static_cast<int>(g)]);
      if (static_cast<BackwardOp>(op) == BackwardOp::attention && lb.attention_scratch >= 0)
        ids.push_back(lb.attention_scratch);
      if (plan.float8_scratch_backward >= 0) ids.push_back(plan.float8_scratch_backward);
      b.emit(shard.tag({StepKind::layer_backward, static_cast<int>(i), static_cast<uint8_t>(op),
                        backward_op_flops(static_cast<BackwardOp>(op), model, shape)},
                       shard.backward_use(i), true),
             ids);
    }
    shard.reduce_scatter(shard.block_unit(i));
  }
  b.emit(shard.tag({StepKind::embedding_backward}, -1, true, shard.embedding_unit()),
         {plan.tokens, plan.residual_gradient, plan.embedding_gradient});
  shard.reduce_scatter(shard.embedding_unit());
  b.emit({StepKind::gradient_norm}, {plan.gradients, plan.linear_gradients, plan.embedding_gradient, plan.grad_sum_squares});
  shard.all_reduce(StepKind::all_reduce_gradient_norm, plan.grad_sum_squares);
  // The optimizer also writes the compute copy of the weights (the cast is fused into it).
  b.emit({StepKind::optimizer}, {plan.parameters, plan.gradients, plan.linear_gradients, plan.embedding_gradient,
                                 plan.exp_avg, plan.exp_avg_sq, plan.compute_weights, plan.float8_weight_amax});
  if (plan.float8_weights >= 0)  // the float8 weight copies of the next step, from the updated master weights
    b.emit({StepKind::cast_weights}, {plan.parameters, plan.float8_weights, plan.float8_weight_scales,
                                      plan.float8_statistics, plan.float8_weight_amax});
  b.emit({StepKind::loss_reduce}, {plan.losses, plan.loss});
  shard.all_reduce(StepKind::all_reduce_loss, plan.loss);
  b.finish();
  return plan;
}

}  // namespace smelt
