// Building the StepPlan: steps in execution order, buffers with live ranges, packing.
#include "plan/step_plan.h"

#include <algorithm>
#include <climits>
#include <memory>

#include "core/error.h"
#include "plan/shard_layout.h"

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

int64_t StepPlan::local_parameter_count() const {
  const ParameterLayout layout(model);
  return sharded() ? ShardLayout(layout, options.shard_degree).local_total() : layout.total();  // replicas: the whole model
}

int64_t StepPlan::compute_copy_offset(const ParameterInfo& info) const {
  if (compute_weights < 0) return -1;
  if (compute_copy_ranges.empty()) return info.offset;  // a copy of every element
  // The run holding the parameter's first element (runs are sorted by begin).
  auto run = std::upper_bound(compute_copy_ranges.begin(), compute_copy_ranges.end(), info.offset,
                              [](int64_t offset, const ComputeCopyRange& r) { return offset < r.begin; });
  SMELT_CHECK(run != compute_copy_ranges.begin(), "compute_copy_offset: parameter " + info.name + " before the first run");
  --run;
  SMELT_CHECK(info.offset + info.numel() <= run->begin + run->count,
              "compute_copy_offset: parameter " + info.name + " spans two copy runs");
  return run->copied() ? run->copy_offset + (info.offset - run->begin) : -1;
}

std::vector<ComputeCopyRange> compute_copy_ranges(const ModelConfig& model, const PlanOptions& options) {
  const bool sharded = options.shard_degree > 1 || options.shard_single_rank;
  if (sharded || options.compute_dtype == master_dtype(options.compute_dtype)) return {};
  const ParameterLayout layout(model);
  const auto& parameters = layout.parameters();
  const bool float8 = options.float8.recipe != Float8Recipe::none;
  auto copied = [&](int64_t layer, LayerWeight weight) {
    if (weight == LayerWeight::attn_norm || weight == LayerWeight::ffn_norm || !float8) return true;
    return !float8_linear_enabled(options.float8, "layers." + std::to_string(layer) + "." +
                                                      std::string(layer_weight_name(weight)));
  };
  std::vector<ComputeCopyRange> ranges;
  int64_t copy_total = 0;
  for (size_t index = 0; index < parameters.size(); ++index) {
    // The embedding (index 0) and the output projection (last) have none; the final norm keeps its.
    bool keep = index != 0 && index + 1 != parameters.size();
    const int64_t block_index = static_cast<int64_t>(index) - 1;
    if (index != 0 && block_index < model.n_layers * kLayerWeightCount)
      keep = copied(block_index / kLayerWeightCount, static_cast<LayerWeight>(block_index % kLayerWeightCount));
    const int64_t begin = parameters[index].offset;
    const int64_t end = index + 1 < parameters.size() ? parameters[index + 1].offset : layout.total();
    if (!ranges.empty() && ranges.back().copied() == keep) {
      ranges.back().count = end - ranges.back().begin;
    } else {
      ranges.push_back({begin, end - begin, keep ? copy_total : -1});
    }
    if (keep) copy_total += end - begin;
  }
  return ranges;
}

int64_t compute_copy_elements(const std::vector<ComputeCopyRange>& ranges) {
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

// Weights gathered in e4m3: sharded, tensorwise, asked for.
bool float8_gather_wanted(const StepPlan& plan) {
  return plan.sharded() && plan.options.float8_all_gather && plan.options.float8.recipe == Float8Recipe::tensorwise;
}

// The FSDP schedule of a sharded plan (inert for unsharded ones). Weights are used in this
// order: the embedding, blocks 0..L-1 forward, the head (norm and output, forward and backward),
// blocks L-1..0 backward (with their recomputation). Each use reads its unit from one of two
// gather buffers; the all-gather of use k+1 is issued before use k computes (prefetch) into the
// other buffer, and skipped when the unit is still there (the last block, around the head).
// Gradients: each unit's backward writes one of two buffers, alternately, and its reduce-scatter
// follows at once, so it runs during the next unit's backward. With replicas (replicate_degree >
// 1) an all-reduce over the replica group follows each reduce-scatter (HSDP) or, unsharded (plain
// data parallel), each unit's backward: the unit's part of the flat gradients, in place (a bf16
// reduce goes through one of two bf16 buffers). There are no gathers then.
class ShardScheduler {
 public:
  ShardScheduler(PlanBuilder& builder, StepPlan& plan) : builder_(builder), plan_(plan) {
    if (!plan.data_parallel()) return;
    sharded_ = plan.sharded();
    layout_ = std::make_unique<ShardLayout>(ParameterLayout(plan.model), sharded_ ? plan.options.shard_degree : 1);
    const int layers = static_cast<int>(plan.model.n_layers);
    gradient_slot_.assign(layout_->units().size(), 0);
    int next = 0;
    auto assign = [&](int unit) {
      gradient_slot_[static_cast<size_t>(unit)] = next;
      gradient_size_[static_cast<size_t>(next)] = std::max(gradient_size_[static_cast<size_t>(next)], layout_->unit(unit).padded);
      shard_size_[static_cast<size_t>(next)] = std::max(shard_size_[static_cast<size_t>(next)], layout_->unit(unit).shard);
      next = 1 - next;
    };
    // Reduce order: the head, blocks L-1..0, the embedding; buffers alternate.
    assign(layout_->head_unit());
    for (int i = layers - 1; i >= 0; --i) assign(layout_->block_unit(i));
    assign(layout_->embedding_unit());
    if (!sharded_) return;
    uses_.push_back(layout_->embedding_unit());
    for (int i = 0; i < layers; ++i) uses_.push_back(layout_->block_unit(i));
    uses_.push_back(layout_->head_unit());
    for (int i = layers - 1; i >= 0; --i) uses_.push_back(layout_->block_unit(i));
    std::array<int, 2> resident{-1, -1};
    for (size_t k = 0; k < uses_.size(); ++k) {
      const int unit = uses_[k];
      int slot = resident[0] == unit ? 0 : resident[1] == unit ? 1 : -1;
      gathers_.push_back(slot < 0);
      if (slot < 0) slot = k == 0 ? 0 : 1 - slots_[k - 1];
      resident[static_cast<size_t>(slot)] = unit;
      slots_.push_back(slot);
      gather_size_[static_cast<size_t>(slot)] = std::max(gather_size_[static_cast<size_t>(slot)], layout_->unit(unit).padded);
    }
  }

  bool active() const { return layout_ != nullptr; }  // any data parallelism
  bool sharded() const { return sharded_; }
  int64_t local_total() const { return layout_->local_total(); }

  // The persistent communication buffers.
  void add_buffers(DType compute, DType master) {
    if (!active()) return;
    const DType reduce = plan_.options.reduce_dtype;
    if (reduce != DType::f32 && reduce != DType::bf16)
      fail(ErrorKind::config, "parallelism.reduce_dtype: expected float32 or bfloat16, found " +
                                  std::string(dtype_name(reduce)));
    if (!sharded_) {  // plain data parallel: gradients all-reduced in place, or through bf16 copies
      for (int r = 0; r < 2; ++r)
        if (reduce == DType::bf16 && master != DType::bf16 && gradient_size_[r] > 0)
          plan_.reduce_send[r] = builder_.buffer("all-reduce gradients, bf16 copy (buffer " + std::to_string(r + 1) +
                                                     " of 2)", DType::bf16, Shape{gradient_size_[r]},
                                                 BufferClass::communication, true);
      return;
    }
    plan_.gather_current = builder_.buffer("all-gather weights (buffer 1 of 2)", compute, Shape{gather_size_[0]},
                                           BufferClass::communication, true);
    if (gather_size_[1] > 0)
      plan_.gather_next = builder_.buffer("all-gather weights (buffer 2 of 2)", compute, Shape{gather_size_[1]},
                                          BufferClass::communication, true);
    for (int r = 0; r < 2; ++r) {
      if (gradient_size_[r] == 0) continue;
      const std::string which = " (buffer " + std::to_string(r + 1) + " of 2)";
      plan_.reduce_scatter[r] = builder_.buffer("reduce-scatter gradients" + which, master, Shape{gradient_size_[r]},
                                                BufferClass::communication, true);
      if (reduce == DType::bf16 && master != DType::bf16) {
        plan_.reduce_send[r] = builder_.buffer("reduce-scatter gradients, bf16 sent" + which, DType::bf16,
                                               Shape{gradient_size_[r]}, BufferClass::communication, true);
        plan_.reduce_receive[r] = builder_.buffer("reduce-scatter gradients, bf16 shard" + which, DType::bf16,
                                                  Shape{shard_size_[r]}, BufferClass::communication, true);
      }
    }
  }

  // Before use k computes: the gather of use 0 (at k = 0) and the prefetch of use k + 1.
  void begin_use(size_t k) {
    if (!sharded_) return;
    if (k == 0) gather(0);
    if (k + 1 < uses_.size()) gather(k + 1);
  }
  // `step` as part of use k (weights from its gather buffer; -1: no weights), with its unit's
  // gradient buffer when it writes gradients.
  Step tag(Step step, int k, bool writes_gradients, int unit_without_weights = -1) const {
    if (!sharded_) return step;
    step.unit = k >= 0 ? uses_[static_cast<size_t>(k)] : unit_without_weights;
    if (k >= 0) step.gathered_weights = gather_buffer(slots_[static_cast<size_t>(k)]);
    if (writes_gradients) step.unit_gradients = plan_.reduce_scatter[static_cast<size_t>(gradient_slot_[static_cast<size_t>(step.unit)])];
    return step;
  }
  // After a unit's last gradient-writing step: its reduce-scatter (sharded) and its all-reduce
  // over replicas (replicate_degree > 1).
  void reduce_scatter(int unit) {
    if (!active()) return;
    Step step{StepKind::reduce_scatter, layout_->unit(unit).layer};
    step.unit = unit;
    if (sharded_) {
      step.unit_gradients = plan_.reduce_scatter[static_cast<size_t>(gradient_slot_[static_cast<size_t>(unit)])];
      builder_.emit(step, {plan_.gradients});
    }
    if (!plan_.replicated()) return;
    step.kind = StepKind::all_reduce_gradients;
    const int send = plan_.reduce_send[static_cast<size_t>(gradient_slot_[static_cast<size_t>(unit)])];
    if (!sharded_) step.unit_gradients = send;  // plain data parallel, bf16: the copy (-1: in place)
    builder_.emit(step, {plan_.gradients, send});
  }
  // The gradient norm needs a sum over the shard group (replicas hold the same shards; unsharded
  // replicas the same whole gradients); the loss a mean over every rank.
  void all_reduce(StepKind kind, int buffer) {
    if (!active() || (kind == StepKind::all_reduce_gradient_norm && !sharded_)) return;
    builder_.emit({kind}, {buffer});
  }

  // Float8 all-gather: its buffers (after the blocks' float8 choices are known) and, at the start
  // of the step, the amax / all-reduce / cast steps that fill this rank's e4m3 shards.
  void add_float8_gather(DType compute) {
    if (!float8_gather_wanted(plan_)) return;
    std::vector<std::array<bool, kLayerWeightCount>> float8;
    for (const auto& lb : plan_.layers) float8.push_back(lb.float8);
    layout_->gather_in_float8(ParameterLayout(plan_.model), float8);
    int64_t largest = 0, remainders = 0;
    for (const auto& u : layout_->units())
      if (u.float8_gathered()) largest = std::max(largest, u.padded), remainders += u.remainder;
    if (largest == 0) return;
    const int64_t ranks = layout_->ranks();
    plan_.float8_shards = builder_.buffer("float8 all-gather: weight shards (e4m3)", DType::e4m3,
                                          Shape{layout_->local_total()}, BufferClass::communication, true);
    plan_.float8_gather_scales = builder_.buffer("float8 all-gather: weight amax / scales", DType::f32,
                                                 Shape{plan_.model.n_layers * kLayerWeightCount},
                                                 BufferClass::communication, true);
    plan_.float8_remainder_shard = builder_.buffer("float8 all-gather: norms shard (packed)", compute,
                                                   Shape{std::max<int64_t>(1, remainders)}, BufferClass::communication, true);
    for (int r = 0; r < 2; ++r) {
      const std::string which = " (buffer " + std::to_string(r + 1) + " of 2)";
      plan_.float8_gather[static_cast<size_t>(r)] = builder_.buffer("all-gather float8 weights" + which, DType::e4m3,
                                                                    Shape{largest}, BufferClass::communication, true);
      plan_.float8_remainder_gather[static_cast<size_t>(r)] =
          builder_.buffer("all-gather norms of float8 units" + which, compute,
                          Shape{std::max<int64_t>(1, layout_->largest_remainder() * ranks)}, BufferClass::communication, true);
    }
    plan_.float8_gather_transposed = builder_.buffer("float8 gathered W^T (one unit)", DType::e4m3, Shape{largest},
                                                     BufferClass::communication, true);
  }
  void emit_float8_cast() {
    if (plan_.float8_shards < 0) return;
    const int weights = plan_.compute_weights >= 0 ? plan_.compute_weights : plan_.parameters;
    builder_.emit({StepKind::float8_shard_amax}, {weights, plan_.float8_gather_scales});
    builder_.emit({StepKind::all_reduce_float8_amax}, {plan_.float8_gather_scales});
    builder_.emit({StepKind::float8_shard_cast}, {weights, plan_.float8_gather_scales, plan_.float8_shards,
                                                  plan_.float8_remainder_shard});
  }
  // Use indices: the embedding's forward, block i's forward, the head, block i's backward.
  int embedding_use() const { return 0; }
  int forward_use(int64_t layer) const { return 1 + static_cast<int>(layer); }
  int head_use() const { return static_cast<int>(plan_.model.n_layers) + 1; }
  int backward_use(int64_t layer) const { return 2 * static_cast<int>(plan_.model.n_layers) + 1 - static_cast<int>(layer); }
  int embedding_unit() const { return active() ? layout_->embedding_unit() : -1; }
  int head_unit() const { return active() ? layout_->head_unit() : -1; }
  int block_unit(int64_t layer) const { return active() ? layout_->block_unit(layer) : -1; }

 private:
  int gather_buffer(int slot) const { return slot == 0 ? plan_.gather_current : plan_.gather_next; }
  void gather(size_t k) {
    if (!gathers_[k]) return;
    const int unit = uses_[k];
    Step step{StepKind::all_gather, layout_->unit(unit).layer};
    step.op = static_cast<uint8_t>(static_cast<int>(k) > head_use() ? 1 : 0);  // 0: for a forward, 1: for a backward
    step.unit = unit;
    step.gathered_weights = gather_buffer(slots_[k]);
    builder_.emit(step, {plan_.compute_weights >= 0 ? plan_.compute_weights : plan_.parameters});
  }

  PlanBuilder& builder_;
  StepPlan& plan_;
  bool sharded_ = false;
  std::unique_ptr<ShardLayout> layout_;
  std::vector<int> uses_, slots_;
  std::vector<bool> gathers_;
  std::vector<int> gradient_slot_;
  std::array<int64_t, 2> gather_size_{}, gradient_size_{}, shard_size_{};
};

// Float8 buffers: one scratch set reused by every float8 linear in turn; in unsharded plans the
// float8 weight copies (the GEMMs' only weights, written after each optimizer step) and, for
// tensorwise, the forward's input amax of every float8 linear.
void add_float8_buffers(PlanBuilder& b, StepPlan& plan, int64_t tokens) {
  const Float8Recipe recipe = plan.options.float8.recipe;
  const bool weight_copies = !plan.sharded();
  plan.float8_sizes = float8_scratch_sizes(plan.model, tokens, recipe, !weight_copies && !float8_gather_wanted(plan));
  const Shape scratch_bytes{float8_scratch_value_bytes(plan.float8_sizes)};
  plan.float8_scratch = b.buffer("float8 scratch, forward (x in e4m3, K-major)", DType::e4m3, scratch_bytes,
                                 BufferClass::workspace);
  plan.float8_scratch_backward = b.buffer("float8 scratch, recompute and backward (x, dy, dy^T, x^T in e4m3/e5m2)",
                                          DType::e4m3, scratch_bytes, BufferClass::workspace);
  plan.float8_statistics = b.buffer("float8 scratch amax and scales", DType::f32,
                                    Shape{float8_scratch_statistic_floats(plan.float8_sizes)}, BufferClass::workspace,
                                    true);
  if (!weight_copies) return;
  std::vector<std::array<bool, kLayerWeightCount>> float8;
  for (const auto& lb : plan.layers) float8.push_back(lb.float8);
  plan.float8_weight_layout = float8_weight_layout(plan.model, recipe, float8);
  plan.float8_weights = b.buffer("float8 weights (W and W^T, e4m3)", DType::e4m3,
                                 Shape{plan.float8_weight_layout.value_bytes}, BufferClass::compute_weights, true);
  plan.float8_weight_scales = b.buffer("float8 weight scales", DType::f32, Shape{plan.float8_weight_layout.scale_floats},
                                       BufferClass::compute_weights, true);
  if (float8_gemm_cast(recipe, LinearGemm::output).a.scaling == OperandScaling::tensorwise)
    plan.float8_input_amax = b.buffer("float8 input amax (forward -> grad-weight)", DType::f32,
                                      Shape{plan.model.n_layers * kLayerWeightCount}, BufferClass::workspace, true);
}

}  // namespace

StepPlan build_step_plan(const ModelConfig& model, const PlanOptions& options) {
  SMELT_CHECK(options.policy.mode != CheckpointMode::automatic || !options.keep_sets.empty(),
              "build_step_plan needs a resolved policy; resolve 'auto' with choose_automatic_policy first");
  SMELT_CHECK(options.keep_sets.empty() || static_cast<int64_t>(options.keep_sets.size()) == model.n_layers,
              "keep_sets has " + std::to_string(options.keep_sets.size()) + " entries for " +
                  std::to_string(model.n_layers) + " blocks");
  SMELT_CHECK(options.shard_degree >= 1, "shard_degree must be at least 1");
  SMELT_CHECK(options.replicate_degree >= 1, "replicate_degree must be at least 1");
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
  const DType master = master_dtype(compute), statistics = statistics_dtype(compute);
  plan.parameters = b.buffer("parameters (master)", master, flat, BufferClass::parameters, true);
  plan.gradients = b.buffer("gradients", master, flat, BufferClass::gradients, true);
  plan.exp_avg = b.buffer("AdamW exp_avg", master, flat, BufferClass::optimizer_state, true);
  plan.exp_avg_sq = b.buffer("AdamW exp_avg_sq", master, flat, BufferClass::optimizer_state, true);
  if (compute != master) {
    // Unsharded: only the weights compute-dtype GEMMs and ops read (compute_copy_ranges).
    plan.compute_copy_ranges = compute_copy_ranges(model, options);
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
    if (options.attention_backward_scratch_bytes > 0)
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
  plan.final_norm_out_grad = b.buffer("grad.norm.out", compute, Shape{tokens, model.dim}, BufferClass::activation_gradients);
  plan.residual_gradient = b.buffer("grad.residual", compute, Shape{tokens, model.dim}, BufferClass::activation_gradients);
  // Logits in the compute dtype (a bf16 GEMM's output, as autocast gives PyTorch); the
  // cross-entropy reads them in f32 and writes the gradient over them.
  plan.logits = b.buffer("output.logits (chunk; its gradient in place)", compute, Shape{chunk, model.vocab_size},
                         BufferClass::loss);
  plan.grad_logits = plan.logits;
  plan.losses = b.buffer("per-token losses", statistics, Shape{tokens}, BufferClass::loss);
  if (!plan.compute_copy_ranges.empty())  // cast from the master by the output head, live only there
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
      for (Activation a : info.outputs) ids.push_back(lb.forward[static_cast<int>(a)]);
      if (plan.float8_scratch >= 0) ids.push_back(plan.float8_scratch);
      b.emit(shard.tag({StepKind::layer_forward, static_cast<int>(i), static_cast<uint8_t>(op),
                        forward_op_flops(static_cast<ForwardOp>(op), model, shape)},
                       shard.forward_use(i), false),
             ids);
    }
  }
  const double head_flops = 6.0 * static_cast<double>(tokens * model.dim * model.vocab_size);
  shard.begin_use(shard.head_use());
  b.emit(shard.tag({StepKind::final_norm_forward}, shard.head_use(), false),
         {plan.residual[layers], plan.final_norm_out, plan.final_rstd});
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
      for (Activation a : info.reads) ids.push_back(lb.backward[static_cast<int>(a)]);
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
  b.emit(shard.tag({StepKind::embedding_backward}, -1, true, shard.embedding_unit()), {plan.tokens, plan.residual_gradient});
  shard.reduce_scatter(shard.embedding_unit());
  b.emit({StepKind::gradient_norm}, {plan.gradients, plan.grad_sum_squares});
  shard.all_reduce(StepKind::all_reduce_gradient_norm, plan.grad_sum_squares);
  // The optimizer also writes the compute copy of the weights (the cast is fused into it).
  b.emit({StepKind::optimizer}, {plan.parameters, plan.gradients, plan.exp_avg, plan.exp_avg_sq, plan.compute_weights});
  if (plan.float8_weights >= 0)  // the float8 weight copies of the next step, from the updated master weights
    b.emit({StepKind::cast_weights}, {plan.parameters, plan.float8_weights, plan.float8_weight_scales,
                                      plan.float8_statistics});
  b.emit({StepKind::loss_reduce}, {plan.losses, plan.loss});
  shard.all_reduce(StepKind::all_reduce_loss, plan.loss);
  b.finish();
  return plan;
}

}  // namespace smelt
