// Executor, float8 part: binds the planned float8 buffers (scratch, weight copies, saved input
// amax) to the model context and layer views, and quantises the weight copies once per step.
#include "train/executor.h"

namespace smelt {

void Executor::setup_float8() {
  if (plan_.float8_scratch < 0) return;
  context_.float8_recipe = plan_.options.float8.recipe;
  context_.float8_scratch =
      float8_scratch_views(plan_.float8_sizes, view(plan_.float8_scratch), view(plan_.float8_statistics));
}

std::array<Float8LinearState, kLayerWeightCount> Executor::float8_states(int layer) const {
  std::array<Float8LinearState, kLayerWeightCount> states;
  if (plan_.float8_scratch < 0) return states;
  const auto& lb = plan_.layers.at(static_cast<size_t>(layer));
  const TensorView input_amax = plan_.float8_input_amax >= 0 ? view(plan_.float8_input_amax) : TensorView();
  const TensorView values = plan_.float8_weights >= 0 ? view(plan_.float8_weights) : TensorView();
  const TensorView scales = plan_.float8_weights >= 0 ? view(plan_.float8_weight_scales) : TensorView();
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
        TensorView(values.as<uint8_t>() + value_offset, DType::e4m3, Shape{2 * out * in}, values.device),
        TensorView(scales.as<float>() + scale_offset, DType::f32,
                   Shape{float8_weight_scale_count(plan_.options.float8.recipe, out, in)}, scales.device));
  }
  return states;
}

void Executor::quantize_float8_weights() {
  if (plan_.float8_weights < 0) return;
  const Float8Scratch& scratch = context_.float8_scratch;
  for (int layer = 0; layer < static_cast<int>(plan_.model.n_layers); ++layer) {
    const auto states = float8_states(layer);
    Step step{StepKind::cast_weights, layer};
    for (int w = 0; w < kLayerWeightCount; ++w) {
      if (states[static_cast<size_t>(w)].weight.empty()) continue;
      const TensorView weight = weight_view(layout_.layer(layer, static_cast<LayerWeight>(w)), step);
      quantize_weight(backend_, plan_.options.float8.recipe, weight, states[static_cast<size_t>(w)].weight,
                      scratch.activation.amax, scratch.activation_transposed.amax);
    }
  }
}

}  // namespace smelt
