// Executor, float8 part: binds the planned float8 buffers (scratch, weight copies, saved input
// amax) to the model context and layer views, and quantises the weight copies once per step from
// the fp32 master weights; with the float8 all-gather, casts this rank's shards and uses the
// gathered e4m3 weights.
#include <algorithm>

#include "train/executor.h"

namespace smelt {

void Executor::setup_float8() {
  if (plan_.float8_scratch < 0) return;
  context_.float8_recipe = plan_.options.float8.recipe;
  float8_forward_scratch_ =
      float8_scratch_views(plan_.float8_sizes, view(plan_.float8_scratch), view(plan_.float8_statistics));
  float8_backward_scratch_ = plan_.float8_scratch_backward < 0
                                 ? float8_forward_scratch_
                                 : float8_scratch_views(plan_.float8_sizes, view(plan_.float8_scratch_backward),
                                                        view(plan_.float8_statistics));
  context_.float8_scratch = float8_forward_scratch_;
  share_float8_inputs(true);
}

void Executor::select_float8_scratch(const Step& step) {
  if (plan_.float8_scratch < 0) return;
  context_.float8_scratch = step.kind == StepKind::layer_forward ? float8_forward_scratch_ : float8_backward_scratch_;
}

std::array<Float8LinearState, kLayerWeightCount> Executor::float8_states(int layer) const {
  std::array<Float8LinearState, kLayerWeightCount> states;
  if (plan_.float8_scratch < 0) return states;
  const auto& lb = plan_.layers.at(static_cast<size_t>(layer));
  const TensorView input_amax = plan_.float8_input_amax >= 0 ? view(plan_.float8_input_amax) : TensorView();
  const TensorView values = plan_.float8_weights >= 0 ? view(plan_.float8_weights) : TensorView();
  const TensorView scales = plan_.float8_weights >= 0 ? view(plan_.float8_weight_scales) : TensorView();
  const bool transposed = !float8_transposes_per_use(plan_.options.float8);  // planned W^T copies
  for (int w = 0; w < kLayerWeightCount; ++w) {
    if (!lb.float8[static_cast<size_t>(w)]) continue;
    auto& state = states[static_cast<size_t>(w)];
    if (!input_amax.empty())
      state.input_amax = TensorView(input_amax.as<float>() + layer * kLayerWeightCount + w, DType::f32, Shape{1},
                                    input_amax.device);
    if (values.empty()) continue;  // sharded: weights quantised per use
    const auto spec = layer_weight_spec(static_cast<LayerWeight>(w), plan_.model);
    const int64_t out = spec.dims[0], in = spec.dims[1];
    const int64_t value_offset = plan_.float8_weight_layout.value_offset.at(static_cast<size_t>(layer))[static_cast<size_t>(w)];
    const int64_t scale_offset = plan_.float8_weight_layout.scale_offset.at(static_cast<size_t>(layer))[static_cast<size_t>(w)];
    state.weight = float8_weight_views(
        plan_.options.float8.recipe, out, in,
        TensorView(values.as<uint8_t>() + value_offset, DType::e4m3, Shape{(transposed ? 2 : 1) * out * in}, values.device),
        TensorView(scales.as<float>() + scale_offset, DType::f32,
                   Shape{float8_weight_scale_count(plan_.options.float8.recipe, out, in)}, scales.device),
        transposed);
  }
  return states;
}

// Unsharded plans: every float8 linear's W and W^T from its fp32 master weight (float8 linears
// have no compute-dtype copy; quantising the master rounds once, to e4m3).
void Executor::quantize_float8_weights(bool after_optimizer) {
  if (plan_.float8_weights < 0) return;
  const Float8Scratch& scratch = context_.float8_scratch;
  const TensorView master = view(plan_.parameters);
  const bool amax_ready = after_optimizer && plan_.float8_weight_amax >= 0;
  for (int layer = 0; layer < static_cast<int>(plan_.model.n_layers); ++layer) {
    const auto states = float8_states(layer);
    for (int w = 0; w < kLayerWeightCount; ++w) {
      if (states[static_cast<size_t>(w)].weight.empty()) continue;
      const TensorView weight = ParameterLayout::slice(master, layout_.layer(layer, static_cast<LayerWeight>(w)));
      TensorView ready;  // AdamW's amax of this weight
      if (amax_ready) {
        const TensorView all = view(plan_.float8_weight_amax);
        ready = TensorView(all.as<float>() + layer * kLayerWeightCount + w, DType::f32, Shape{1}, all.device);
      }
      quantize_weight(backend_, plan_.options.float8.recipe, weight, states[static_cast<size_t>(w)].weight,
                      scratch.activation.amax, scratch.activation_transposed.amax, ready);
    }
  }
}

}  // namespace smelt

// ---- Float8 all-gather (sharded tensorwise plans with PlanOptions::float8_all_gather) ----------

namespace smelt {

namespace {

// Elements [offset, offset + count) of a flat view, as (1, count) when `row` (what amax and
// quantize take) or (count).
TensorView span_of(const TensorView& v, int64_t offset, int64_t count, bool row = false) {
  SMELT_CHECK(offset >= 0 && count >= 0 && offset + count <= v.numel(), "span_of out of range of " + v.str());
  return TensorView(static_cast<char*>(v.data) + static_cast<size_t>(offset) * dtype_size(v.dtype), v.dtype,
                    row ? Shape{1, count} : Shape{count}, v.device);
}

}  // namespace

void Executor::run_float8_gather_step(const Step& step) {
  Communicator& group = *shard_group_;
  const int64_t rank = group.rank();
  const TensorView scales = view(plan_.float8_gather_scales);  // (L * 7) amax, then scales in place
  const TensorView weights = view(plan_.compute_weights >= 0 ? plan_.compute_weights : plan_.parameters);
  const TensorView shards = view(plan_.float8_shards);
  // Calls body(parameter, scale index, first local element, count) for this rank's part of every float8 linear.
  auto for_each_part = [&](auto body) {
    for (int layer = 0; layer < static_cast<int>(plan_.model.n_layers); ++layer) {
      const ShardUnit& unit = shard_layout_->unit(shard_layout_->block_unit(layer));
      for (int w = 0; w < kLayerWeightCount; ++w) {
        if (!plan_.layers[static_cast<size_t>(layer)].float8[static_cast<size_t>(w)]) continue;
        const ParameterInfo& p = layout_.layer(layer, static_cast<LayerWeight>(w));
        const int64_t mine = rank * unit.shard;  // this rank's part: unit elements [mine, mine + shard)
        const int64_t first = std::max(p.offset - unit.offset, mine);
        const int64_t last = std::min(p.offset - unit.offset + p.numel(), mine + unit.shard);
        body(layer * kLayerWeightCount + w, unit.shard_offset + first - mine, last - first);
      }
    }
  };
  switch (step.kind) {
    case StepKind::float8_shard_amax:
      backend_.fill(scales, 0.0f);
      for_each_part([&](int index, int64_t first, int64_t count) {
        if (count <= 0) return;
        AmaxArgs a;
        a.x = span_of(weights, first, count, true);
        a.amax = span_of(scales, index, 1);
        backend_.amax(a);
      });
      return;
    case StepKind::all_reduce_float8_amax: group.wait(group.all_reduce(scales, ReduceOp::max)); return;
    case StepKind::float8_shard_cast: {
      const OperandCast cast = float8_gemm_cast(plan_.options.float8.recipe, LinearGemm::output).b;
      ScaleFromAmaxArgs s;
      s.amax = scales;
      s.scale = scales;
      s.format = cast.dtype;
      s.round_to_power_of_two = cast.round_scale_to_power_of_two;
      backend_.scale_from_amax(s);
      for_each_part([&](int index, int64_t first, int64_t count) {
        if (count <= 0) return;
        QuantizeArgs q;
        q.src = span_of(weights, first, count, true);
        q.dst = span_of(shards, first, count, true);
        q.scale = span_of(scales, index, 1);
        backend_.quantize(q);
      });
      // The float8 units' other parameters (norms), packed.
      const TensorView packed = view(plan_.float8_remainder_shard);
      int64_t offset = 0;
      for (const ShardUnit& unit : shard_layout_->units()) {
        if (!unit.float8_gathered()) continue;
        int64_t cursor = offset;
        for (const auto& [first, count] : shard_layout_->remainder_runs(unit, rank)) {
          backend_.convert({span_of(weights, unit.shard_offset + first - rank * unit.shard, count),
                            span_of(packed, cursor, count)});
          cursor += count;
        }
        offset += unit.remainder;
      }
      float8_transposed_layer_ = -1;  // new weights: W^T copies are made again
      return;
    }
    default: break;
  }
  SMELT_CHECK(false, "run_float8_gather_step: not a float8 gather step: " + step.name());
}

TensorView Executor::float8_unit_rows(const ShardUnit& unit, int slot) const {
  return span_of(view(float8_rows_buffer(slot)), plan_.collectives_in_place ? unit.shard_offset : 0, unit.padded);
}

// The e4m3 gather of a float8 unit's shards, and of its norms (packed) beside it.
// In place (one rank): the shards are the gathered unit, and its norms are already in the compute
// copy, where the layer reads them (collectives_in_place), so there is nothing to unpack.
void Executor::gather_float8_unit(const ShardUnit& unit, int slot) {
  Communicator& c = *shard_group_;
  const bool in_place = plan_.collectives_in_place;
  set_pending(float8_rows_buffer(slot), c,
              c.all_gather(span_of(view(plan_.float8_shards), unit.shard_offset, unit.shard),
                           float8_unit_rows(unit, slot)));
  if (unit.remainder > 0) {
    int64_t offset = 0;
    for (const ShardUnit& u : shard_layout_->units()) {
      if (&u == &unit) break;
      offset += u.remainder;
    }
    const int remainder = in_place ? plan_.float8_remainder_shard : plan_.float8_remainder_gather[static_cast<size_t>(slot)];
    set_pending(remainder, c,
                c.all_gather(span_of(view(plan_.float8_remainder_shard), offset, unit.remainder),
                             span_of(view(remainder), in_place ? offset : 0, unit.remainder * shard_layout_->ranks())));
  }
  if (in_place) return;
  int index = 0;
  while (&shard_layout_->unit(index) != &unit) ++index;
  float8_unpack_unit_[static_cast<size_t>(slot)] = index;
}

// Once the gather has landed: every rank's packed norms into their places in the compute-dtype
// gather buffer (where the layer code reads them).
void Executor::unpack_float8_remainder(int slot) {
  const int index = float8_unpack_unit_[static_cast<size_t>(slot)];
  if (index < 0) return;
  float8_unpack_unit_[static_cast<size_t>(slot)] = -1;
  const ShardUnit& unit = shard_layout_->unit(index);
  const int remainder = plan_.float8_remainder_gather[static_cast<size_t>(slot)];
  wait_pending(remainder);
  const TensorView gathered = view(slot == 0 ? plan_.gather_current : plan_.gather_next);
  for (int64_t q = 0; q < shard_layout_->ranks(); ++q) {
    int64_t cursor = q * unit.remainder;
    for (const auto& [first, count] : shard_layout_->remainder_runs(unit, q)) {
      backend_.convert({span_of(view(remainder), cursor, count), span_of(gathered, first, count)});
      cursor += count;
    }
  }
}

// Before a block's backward: W^T of each float8 linear from its gathered e4m3 W, by transposing
// the codes (W and W^T share the one global scale, so these are the codes a transposed cast of the
// weight writes: 2 bytes of traffic per element instead of a decode and a second cast).
void Executor::transpose_float8_unit(int layer, int slot) {
  if (float8_transposed_layer_ == layer) return;
  float8_transposed_layer_ = layer;
  const ShardUnit& unit = shard_layout_->unit(shard_layout_->block_unit(layer));
  if (!unit.float8_gathered()) return;
  std::array<Float8LinearState, kLayerWeightCount> states;
  gathered_float8_states(layer, slot, states);
  for (const Float8LinearState& state : states) {
    const Float8Weight& weight = state.weight;
    if (weight.empty()) continue;
    SMELT_CHECK(weight.rows.values.dtype == weight.transposed.values.dtype,
                "transpose_float8_unit: W and W^T of a gathered weight must share their float8 type");
    backend_.transpose({weight.rows.values, weight.transposed.values});
  }
}

void Executor::gathered_float8_states(const Step& step, std::array<Float8LinearState, kLayerWeightCount>& states) const {
  if (step.gathered_weights < 0 || step.layer < 0 || step.unit < 0) return;
  gathered_float8_states(step.layer, gather_slot(step.gathered_weights), states);
}

void Executor::gathered_float8_states(int layer, int slot, std::array<Float8LinearState, kLayerWeightCount>& states) const {
  const ShardUnit& unit = shard_layout_->unit(shard_layout_->block_unit(layer));
  if (!unit.float8_gathered()) return;
  const TensorView rows = float8_unit_rows(unit, slot);
  const TensorView transposed = view(plan_.float8_gather_transposed);
  const TensorView scales = view(plan_.float8_gather_scales);
  const Float8Recipe recipe = plan_.options.float8.recipe;
  for (int w = 0; w < kLayerWeightCount; ++w) {
    if (!plan_.layers[static_cast<size_t>(layer)].float8[static_cast<size_t>(w)]) continue;
    const ParameterInfo& p = layout_.layer(layer, static_cast<LayerWeight>(w));
    const auto spec = layer_weight_spec(static_cast<LayerWeight>(w), plan_.model);
    const int64_t out = spec.dims[0], in = spec.dims[1], at = p.offset - unit.offset;
    const TensorView scale = span_of(scales, layer * kLayerWeightCount + w, 1);
    Float8Weight& weight = states[static_cast<size_t>(w)].weight;
    weight.rows = {TensorView(rows.as<uint8_t>() + at, float8_gemm_cast(recipe, LinearGemm::output).b.dtype, Shape{out, in},
                              rows.device),
                   scale, OperandScaling::tensorwise};
    weight.transposed = {TensorView(transposed.as<uint8_t>() + at, float8_gemm_cast(recipe, LinearGemm::grad_input).b.dtype,
                                    Shape{in, out}, transposed.device),
                         scale, OperandScaling::tensorwise};
  }
}

}  // namespace smelt
