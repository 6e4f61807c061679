// ShardScheduler: the data-parallel part of a step plan (FSDP gathers and reduce-scatters,
// replica all-reduces, their buffers, the float8 all-gather), used by build_step_plan.
#pragma once
#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "plan/plan_builder.h"
#include "plan/shard_layout.h"

namespace smelt::plan_detail {

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
// Without resharding after forward, each block gathers into a buffer of its own (slot 2 + block)
// for its forward, and its backward reads it there without a gather; the embedding and the head
// take turns in the first gather buffer.
// With one rank per shard group the same steps run in place (StepPlan::collectives_in_place): the
// gather and reduce-scatter buffers are the unit's part of the flat weights and gradients (and,
// for the float8 all-gather, of the e4m3 shards), and none is planned.
class ShardScheduler {
 public:
  ShardScheduler(PlanBuilder& builder, StepPlan& plan) : builder_(builder), plan_(plan) {
    if (!plan.data_parallel()) return;
    sharded_ = plan.sharded();
    plan.collectives_in_place = sharded_ && plan.options.shard_degree == 1;
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
    if (!plan.options.reshard_after_forward) {
      kept_size_.assign(static_cast<size_t>(layers), 0);
      for (size_t k = 0; k < uses_.size(); ++k) {
        const int unit = uses_[k];
        const int64_t layer = layout_->unit(unit).layer;
        const bool backward = static_cast<int>(k) > head_use();
        gathers_.push_back(!backward);
        slots_.push_back(layer >= 0 ? 2 + static_cast<int>(layer) : 0);
        if (layer >= 0) kept_size_[static_cast<size_t>(layer)] = layout_->unit(unit).padded;
        else gather_size_[0] = std::max(gather_size_[0], layout_->unit(unit).padded);
      }
      return;
    }
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
    if (!plan_.collectives_in_place) {
      plan_.gather_current = builder_.buffer("all-gather weights (buffer 1 of 2)", compute, Shape{gather_size_[0]},
                                             BufferClass::communication, true);
      if (gather_size_[1] > 0)
        plan_.gather_next = builder_.buffer("all-gather weights (buffer 2 of 2)", compute, Shape{gather_size_[1]},
                                            BufferClass::communication, true);
      for (size_t layer = 0; layer < kept_size_.size(); ++layer)
        plan_.gather_kept.push_back(builder_.buffer("all-gather weights of layers." + std::to_string(layer) +
                                                        ", kept from forward to backward",
                                                    compute, Shape{kept_size_[layer]}, BufferClass::communication, true));
    }
    for (int r = 0; r < 2; ++r) {
      if (gradient_size_[r] == 0) continue;
      const std::string which = " (buffer " + std::to_string(r + 1) + " of 2)";
      if (!plan_.collectives_in_place)
        plan_.reduce_scatter[r] = builder_.buffer("reduce-scatter gradients" + which, master, Shape{gradient_size_[r]},
                                                  BufferClass::communication, true);
      if (reduce == DType::bf16 && master != DType::bf16) {
        plan_.reduce_send[r] = builder_.buffer("reduce-scatter gradients, bf16 sent" + which, DType::bf16,
                                               Shape{gradient_size_[r]}, BufferClass::communication, true);
        plan_.reduce_receive[r] = builder_.buffer("reduce-scatter gradients, bf16 shard" + which, DType::bf16,
                                                  Shape{shard_size_[r]}, BufferClass::communication, true);
      } else if (plan_.options.microbatches > 1 && !plan_.collectives_in_place) {
        // Gradient accumulation: each pass's shard lands here and is added to the gradient shard.
        plan_.reduce_receive[r] = builder_.buffer("reduce-scatter gradients, shard received (accumulated)" + which,
                                                  master, Shape{shard_size_[r]}, BufferClass::communication, true);
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
    if (writes_gradients) step.unit_gradients = gradient_buffer(step.unit);
    return step;
  }
  // After a unit's last gradient-writing step: its reduce-scatter (sharded) and its all-reduce
  // over replicas (replicate_degree > 1).
  void reduce_scatter(int unit) {
    if (!active()) return;
    Step step{StepKind::reduce_scatter, layout_->unit(unit).layer};
    step.unit = unit;
    step.op = static_cast<uint8_t>(gradient_slot_[static_cast<size_t>(unit)]);
    if (sharded_) {
      step.unit_gradients = gradient_buffer(unit);
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
    if (!plan_.options.reshard_after_forward)
      fail(ErrorKind::config, "float8.all_gather = true with parallelism.reshard_after_forward_policy = \"never\" is "
                              "not supported yet: set float8.all_gather = false to keep gathered weights, or leave the "
                              "policy at \"default\"");
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
    for (int r = 0; r < 2 && !plan_.collectives_in_place; ++r) {  // in place: the shards are the gathered units
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
  // In place (one rank per shard group): the unit's part of the weights, or of the gradient shard.
  int gather_buffer(int slot) const {
    if (plan_.collectives_in_place) return plan_.compute_weights >= 0 ? plan_.compute_weights : plan_.parameters;
    return slot == 0 ? plan_.gather_current : slot == 1 ? plan_.gather_next : plan_.gather_kept[static_cast<size_t>(slot - 2)];
  }
  int gradient_buffer(int unit) const {
    if (plan_.collectives_in_place) return plan_.gradients;
    return plan_.reduce_scatter[static_cast<size_t>(gradient_slot_[static_cast<size_t>(unit)])];
  }
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
  std::vector<int64_t> kept_size_;  // without resharding after forward: each block's gather buffer
};

}  // namespace smelt::plan_detail
