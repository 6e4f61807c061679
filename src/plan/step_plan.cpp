// Building the StepPlan: steps in execution order, buffers with live ranges, packing.
#include "plan/step_plan.h"

#include <algorithm>
#include <climits>

#include "core/error.h"

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
  }
  return "?";
}

int64_t StepPlan::parameter_count() const { return model.total_parameters(); }

int64_t StepPlan::local_parameter_count() const {
  const int64_t degree = std::max<int64_t>(1, options.shard_degree);
  return (ParameterLayout(model).total() + degree - 1) / degree;
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

class PlanBuilder {
 public:
  PlanBuilder(StepPlan& plan) : plan_(plan) {}

  int buffer(std::string name, DType dtype, Shape shape, BufferClass kind, bool persistent = false) {
    PlannedBuffer b;
    b.request.name = std::move(name);
    b.request.bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    b.request.kind = kind;
    b.dtype = dtype;
    b.shape = shape;
    plan_.buffers.push_back(b);
    first_.push_back(INT_MAX);
    last_.push_back(-1);
    persistent_.push_back(persistent);
    return static_cast<int>(plan_.buffers.size()) - 1;
  }

  void emit(Step step, std::initializer_list<int> ids) { emit(step, std::vector<int>(ids)); }
  void emit(Step step, const std::vector<int>& ids) {
    int index = static_cast<int>(plan_.steps.size());
    plan_.steps.push_back(step);
    for (int id : ids) {
      if (id < 0) continue;
      first_[id] = std::min(first_[id], index);
      last_[id] = std::max(last_[id], index);
    }
  }

  void finish() {
    const int count = static_cast<int>(plan_.steps.size());
    std::vector<BufferRequest> requests;
    for (size_t i = 0; i < plan_.buffers.size(); ++i) {
      auto& r = plan_.buffers[i].request;
      if (persistent_[i]) {
        r.first_step = 0;
        r.last_step = count - 1;
      } else {
        SMELT_CHECK(last_[i] >= 0, "buffer '" + r.name + "' is never used by any step");
        r.first_step = first_[i];
        r.last_step = last_[i];
      }
      requests.push_back(r);
    }
    plan_.memory = pack_buffers(requests, count);
  }

 private:
  StepPlan& plan_;
  std::vector<int> first_, last_;
  std::vector<bool> persistent_;
};

Shape spec_shape(const TensorSpec& spec) {
  return spec.dims[1] == 1 ? Shape{spec.dims[0]} : Shape{spec.dims[0], spec.dims[1]};
}

}  // namespace

StepPlan build_step_plan(const ModelConfig& model, const PlanOptions& options) {
  SMELT_CHECK(options.policy.mode != CheckpointMode::automatic || !options.keep_sets.empty(),
              "build_step_plan needs a resolved policy; resolve 'auto' with choose_automatic_policy first");
  SMELT_CHECK(options.keep_sets.empty() || static_cast<int64_t>(options.keep_sets.size()) == model.n_layers,
              "keep_sets has " + std::to_string(options.keep_sets.size()) + " entries for " +
                  std::to_string(model.n_layers) + " blocks");
  SMELT_CHECK(options.shard_degree >= 1, "shard_degree must be at least 1");
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
  const int64_t degree = options.shard_degree;
  const Shape flat{degree == 1 ? layout.total() : (layout.total() + degree - 1) / degree};
  const DType master = master_dtype(compute), statistics = statistics_dtype(compute);
  plan.parameters = b.buffer("parameters (master)", master, flat, BufferClass::parameters, true);
  plan.gradients = b.buffer("gradients", master, flat, BufferClass::gradients, true);
  plan.exp_avg = b.buffer("AdamW exp_avg", master, flat, BufferClass::optimizer_state, true);
  plan.exp_avg_sq = b.buffer("AdamW exp_avg_sq", master, flat, BufferClass::optimizer_state, true);
  if (compute != master)
    plan.compute_weights = b.buffer(std::string("weights (") + std::string(dtype_name(compute)) + " copy)", compute, flat,
                                    BufferClass::compute_weights, true);
  if (degree > 1) {
    const Shape unit{largest_gather_unit(model)};
    plan.gather_current = b.buffer("all-gather weights (current unit)", compute, unit, BufferClass::communication, true);
    plan.gather_next = b.buffer("all-gather weights (prefetched unit)", compute, unit, BufferClass::communication, true);
    plan.reduce_scatter = b.buffer("reduce-scatter gradients (one unit)", master, unit, BufferClass::communication, true);
  }
  plan.tokens = b.buffer("input tokens", DType::i32, Shape{tokens}, BufferClass::data, true);
  plan.targets = b.buffer("target tokens", DType::i32, Shape{tokens}, BufferClass::data, true);
  plan.rope_frequencies = b.buffer("rope frequencies", DType::f32, Shape{shape.seq_len, model.head_dim() / 2, 2},
                                   BufferClass::workspace, true);
  if (options.backend_workspace_bytes > 0)
    plan.workspace = b.buffer("backend workspace", DType::f32,
                              Shape{static_cast<int64_t>((options.backend_workspace_bytes + 3) / 4)},
                              BufferClass::workspace, true);
  plan.loss = b.buffer("loss", statistics, Shape{1}, BufferClass::loss, true);
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
    lb.recomputed = recompute_ops(lb.kept);
    for (int w = 0; w < kLayerWeightCount; ++w) {
      const auto weight = static_cast<LayerWeight>(w);
      if (weight == LayerWeight::attn_norm || weight == LayerWeight::ffn_norm) continue;
      lb.float8[w] = float8_linear_enabled(options.float8, prefix + std::string(layer_weight_name(weight)));
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
    for (int g = 0; g < kGradientCount; ++g) {
      auto spec = gradient_spec(static_cast<Gradient>(g), model, shape, compute);
      lb.gradient[g] = b.buffer(prefix + std::string(gradient_name(static_cast<Gradient>(g))), spec.dtype,
                                spec_shape(spec), BufferClass::activation_gradients);
    }
  }

  // Float8 scratch: one set for the step, reused by every float8 linear in turn.
  if (any_float8) {
    const Float8ScratchSizes sizes = float8_scratch_sizes(model, tokens);
    plan.float8_operand_a = b.buffer("float8 operand a (e4m3/e5m2, K-major)", DType::e4m3, Shape{sizes.operand_a},
                                     BufferClass::workspace, true);
    plan.float8_operand_b = b.buffer("float8 operand b (e4m3/e5m2, K-major)", DType::e4m3, Shape{sizes.operand_b},
                                     BufferClass::workspace, true);
    plan.float8_scale_a = b.buffer("float8 scales a (amax, then scale)", DType::f32, Shape{sizes.scale_a},
                                   BufferClass::workspace, true);
    plan.float8_scale_b = b.buffer("float8 scales b (amax, then scale)", DType::f32, Shape{sizes.scale_b},
                                   BufferClass::workspace, true);
  }

  // Output head buffers.
  const int64_t chunk = std::max<int64_t>(1, std::min(options.loss_chunk_tokens, tokens));
  plan.final_norm_out = b.buffer("norm.out", compute, Shape{tokens, model.dim}, BufferClass::activations);
  plan.final_rstd = b.buffer("norm.rstd", statistics, Shape{tokens}, BufferClass::activations);
  plan.final_norm_out_grad = b.buffer("grad.norm.out", compute, Shape{tokens, model.dim}, BufferClass::activation_gradients);
  plan.residual_gradient = b.buffer("grad.residual", compute, Shape{tokens, model.dim}, BufferClass::activation_gradients);
  plan.logits = b.buffer("output.logits (chunk)", statistics, Shape{chunk, model.vocab_size}, BufferClass::loss);
  plan.grad_logits = compute == statistics ? plan.logits
                                           : b.buffer("grad.output.logits (chunk)", compute,
                                                      Shape{chunk, model.vocab_size}, BufferClass::loss);
  plan.losses = b.buffer("per-token losses", statistics, Shape{tokens}, BufferClass::loss);

  // Forward.
  b.emit({StepKind::embedding_forward}, {plan.tokens, plan.residual[0]});
  for (int64_t i = 0; i < layers; ++i) {
    const auto& lb = plan.layers[i];
    for (int op = 0; op < kForwardOpCount; ++op) {
      const auto& info = forward_op_info(static_cast<ForwardOp>(op));
      std::vector<int> ids;
      for (Activation a : info.inputs) ids.push_back(lb.forward[static_cast<int>(a)]);
      for (Activation a : info.outputs) ids.push_back(lb.forward[static_cast<int>(a)]);
      b.emit({StepKind::layer_forward, static_cast<int>(i), static_cast<uint8_t>(op),
              forward_op_flops(static_cast<ForwardOp>(op), model, shape)},
             ids);
    }
  }
  const double head_flops = 6.0 * static_cast<double>(tokens * model.dim * model.vocab_size);
  b.emit({StepKind::final_norm_forward}, {plan.residual[layers], plan.final_norm_out, plan.final_rstd});
  b.emit({StepKind::output_head, -1, 0, head_flops},
         {plan.final_norm_out, plan.targets, plan.logits, plan.grad_logits, plan.losses, plan.final_norm_out_grad});
  b.emit({StepKind::final_norm_backward},
         {plan.residual[layers], plan.final_rstd, plan.final_norm_out_grad, plan.residual_gradient});

  // Backward, block by block, each preceded by its recomputation.
  for (int64_t i = layers - 1; i >= 0; --i) {
    const auto& lb = plan.layers[i];
    for (int op = 0; op < kForwardOpCount; ++op) {
      if (!lb.recomputed[op]) continue;
      const auto& info = forward_op_info(static_cast<ForwardOp>(op));
      std::vector<int> ids;
      for (Activation a : info.inputs) ids.push_back(lb.backward[static_cast<int>(a)]);
      for (Activation a : info.outputs) ids.push_back(lb.backward[static_cast<int>(a)]);
      b.emit({StepKind::layer_recompute, static_cast<int>(i), static_cast<uint8_t>(op),
              forward_op_flops(static_cast<ForwardOp>(op), model, shape)},
             ids);
    }
    for (int op = 0; op < kBackwardOpCount; ++op) {
      const auto& info = backward_op_info(static_cast<BackwardOp>(op));
      std::vector<int> ids{plan.residual_gradient};
      for (Activation a : info.reads) ids.push_back(lb.backward[static_cast<int>(a)]);
      for (Gradient g : info.gradient_reads) ids.push_back(lb.gradient[static_cast<int>(g)]);
      for (Gradient g : info.gradient_writes) ids.push_back(lb.gradient[static_cast<int>(g)]);
      b.emit({StepKind::layer_backward, static_cast<int>(i), static_cast<uint8_t>(op),
              backward_op_flops(static_cast<BackwardOp>(op), model, shape)},
             ids);
    }
  }
  b.emit({StepKind::embedding_backward}, {plan.tokens, plan.residual_gradient});
  b.emit({StepKind::gradient_norm}, {plan.gradients, plan.grad_sum_squares});
  // The optimizer also writes the compute copy of the weights (the cast is fused into it).
  b.emit({StepKind::optimizer}, {plan.parameters, plan.gradients, plan.exp_avg, plan.exp_avg_sq, plan.compute_weights});
  b.emit({StepKind::loss_reduce}, {plan.losses, plan.loss});
  b.finish();
  return plan;
}

}  // namespace smelt
