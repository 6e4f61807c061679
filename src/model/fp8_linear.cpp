// Float8 linears: recipe table, weight and activation quantisation (amax pass, then one cast
// pass that computes the scale and writes one or both layouts) and the three GEMMs of a linear,
// each in the "TN" form a float8 GEMM needs: out = a @ b^T with a (M, K) and b (N, K) both
// K-major, so rowwise scales run along K.
#include "model/fp8_linear.h"

#include <algorithm>

#include "core/error.h"
#include "core/float8_blocks.h"
#include "model/layer_graph.h"

namespace smelt {

Float8Recipe parse_float8_recipe(const std::string& name) {
  if (name == "none") return Float8Recipe::none;
  if (name == "tensorwise") return Float8Recipe::tensorwise;
  if (name == "rowwise") return Float8Recipe::rowwise;
  if (name == "rowwise_with_gw_hp") return Float8Recipe::rowwise_with_gw_hp;
  if (name == "blockwise") return Float8Recipe::blockwise;
  fail(ErrorKind::config, "float8.recipe: expected one of none, tensorwise, rowwise, rowwise_with_gw_hp, blockwise, "
                          "found '" + name + "'");
}

std::string_view float8_recipe_name(Float8Recipe recipe) {
  switch (recipe) {
    case Float8Recipe::none: return "none";
    case Float8Recipe::tensorwise: return "tensorwise";
    case Float8Recipe::rowwise: return "rowwise";
    case Float8Recipe::rowwise_with_gw_hp: return "rowwise_with_gw_hp";
    case Float8Recipe::blockwise: return "blockwise";
  }
  return "?";
}

bool float8_linear_enabled(const Float8Options& options, const std::string& fqn) {
  if (options.recipe == Float8Recipe::none) return false;
  for (const auto& filter : options.filter_fqns)
    if (!filter.empty() && fqn.find(filter) != std::string::npos) return false;
  return true;
}

bool float8_gains_on_shape(Float8Recipe recipe, int64_t out, int64_t in) {
  if (out % 16 != 0 || in % 16 != 0) return false;  // cuBLASLt's float8 kernels need both
  if (recipe == Float8Recipe::tensorwise) return !(out <= 4096 && in <= 1024);
  return !(in <= 2048 || out <= 1024 || (in <= 4096 && out <= 2048));
}

bool float8_linear_enabled(const Float8Options& options, const ModelConfig& model, int64_t layer, LayerWeight weight) {
  if (!float8_linear_enabled(options, "layers." + std::to_string(layer) + "." + std::string(layer_weight_name(weight))))
    return false;
  const bool automatic = std::find(options.filter_fqns.begin(), options.filter_fqns.end(), kFloat8AutoFilter) !=
                         options.filter_fqns.end();
  if (!automatic) return true;
  const auto spec = layer_weight_spec(weight, model);
  return float8_gains_on_shape(options.recipe, spec.dims[0], spec.dims[1]);
}

bool float8_gemm_enabled(Float8Recipe recipe, LinearGemm gemm) {
  if (recipe == Float8Recipe::none) return false;
  return !(recipe == Float8Recipe::rowwise_with_gw_hp && gemm == LinearGemm::grad_weight);
}

GemmCast float8_gemm_cast(Float8Recipe recipe, LinearGemm gemm) {
  SMELT_CHECK(float8_gemm_enabled(recipe, gemm), "float8_gemm_cast: recipe " + std::string(float8_recipe_name(recipe)) +
                                                     " runs this GEMM in the compute dtype");
  GemmCast cast;
  if (recipe == Float8Recipe::blockwise) {  // activations and gradients in tiles, weights in blocks
    const OperandCast tiles{DType::e4m3, OperandScaling::tile_1x128, false};
    const OperandCast blocks{DType::e4m3, OperandScaling::block_128x128, false};
    cast.a = tiles;  // x, dy, dy^T
    cast.b = gemm == LinearGemm::grad_weight ? tiles : blocks;  // W, W^T, x^T
    return cast;
  }
  if (recipe == Float8Recipe::rowwise || recipe == Float8Recipe::rowwise_with_gw_hp) {
    const OperandCast rowwise{DType::e4m3, OperandScaling::rowwise, true};
    cast.a = cast.b = rowwise;
    return cast;
  }
  const OperandCast forward{DType::e4m3, OperandScaling::tensorwise, false};
  const OperandCast gradient{DType::e5m2, OperandScaling::tensorwise, false};
  switch (gemm) {
    case LinearGemm::output: cast = {forward, forward, true}; break;       // x, W
    case LinearGemm::grad_input: cast = {gradient, forward, false}; break;  // dy, W^T
    case LinearGemm::grad_weight: cast = {gradient, forward, false}; break; // dy^T, x^T
  }
  return cast;
}

Float8ScratchSizes float8_scratch_sizes(const ModelConfig& model, int64_t tokens, Float8Recipe recipe,
                                        bool per_use_weights, bool transposes_per_use) {
  Float8ScratchSizes sizes;
  const bool grad_weight = float8_gemm_enabled(recipe, LinearGemm::grad_weight);
  const GemmCast output = float8_gemm_cast(recipe, LinearGemm::output);
  const GemmCast input = float8_gemm_cast(recipe, LinearGemm::grad_input);
  sizes.scales = 1;
  for (LayerWeight w : {LayerWeight::wq, LayerWeight::wk, LayerWeight::wv, LayerWeight::wo, LayerWeight::w1,
                        LayerWeight::w3, LayerWeight::w2}) {
    const auto spec = layer_weight_spec(w, model);
    const int64_t out = spec.dims[0], in = spec.dims[1];
    // x (N, in) and dy (N, out); dy^T (out, N) and x^T (in, N) for the grad-weight GEMM.
    sizes.activation = std::max(sizes.activation, tokens * std::max(in, out));
    if (grad_weight) {
      sizes.activation_transposed = std::max(sizes.activation_transposed, tokens * out);
      sizes.input_transposed = std::max(sizes.input_transposed, tokens * in);
    }
    if (per_use_weights) sizes.weight = std::max(sizes.weight, out * in);
    if (per_use_weights || transposes_per_use) sizes.weight_transposed = std::max(sizes.weight_transposed, out * in);
    sizes.scales = std::max({sizes.scales, operand_scale_count(output.a.scaling, tokens, in),
                             operand_scale_count(input.a.scaling, tokens, out),
                             operand_scale_count(output.b.scaling, out, in),
                             operand_scale_count(input.b.scaling, in, out)});
    if (grad_weight) {
      const GemmCast weight = float8_gemm_cast(recipe, LinearGemm::grad_weight);
      sizes.scales = std::max({sizes.scales, operand_scale_count(weight.a.scaling, out, tokens),
                               operand_scale_count(weight.b.scaling, in, tokens)});
    }
  }
  return sizes;
}

namespace {

constexpr int64_t kSlotAlignment = 256;  // bytes; also keeps 16-byte vector accesses aligned
constexpr int64_t kStatisticAlignment = 4;  // floats

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

int64_t float8_scratch_value_bytes(const Float8ScratchSizes& sizes) {
  return round_up(sizes.activation, kSlotAlignment) + round_up(sizes.activation_transposed, kSlotAlignment) +
         round_up(sizes.input_transposed, kSlotAlignment) + round_up(sizes.weight, kSlotAlignment) +
         round_up(sizes.weight_transposed, kSlotAlignment);
}

int64_t float8_scratch_statistic_floats(const Float8ScratchSizes& sizes) {
  return 5 * 2 * round_up(sizes.scales, kStatisticAlignment);
}

Float8Scratch float8_scratch_views(const Float8ScratchSizes& sizes, const TensorView& values,
                                   const TensorView& statistics) {
  SMELT_CHECK(int64_t(values.bytes()) >= float8_scratch_value_bytes(sizes) &&
                  statistics.dtype == DType::f32 && statistics.numel() >= float8_scratch_statistic_floats(sizes),
              "float8 scratch buffers " + values.str() + " and " + statistics.str() +
                  " smaller than float8_scratch_sizes asks for");
  auto* bytes = static_cast<uint8_t*>(values.data);
  auto* floats = static_cast<float*>(statistics.data);
  const int64_t stride = round_up(sizes.scales, kStatisticAlignment);
  int slot_index = 0;
  auto slot = [&](int64_t count) {
    Float8Slot s;
    s.values = TensorView(bytes, DType::e4m3, Shape{count}, values.device);
    s.amax = TensorView(floats + (2 * slot_index) * stride, DType::f32, Shape{sizes.scales}, statistics.device);
    s.scale = TensorView(floats + (2 * slot_index + 1) * stride, DType::f32, Shape{sizes.scales}, statistics.device);
    bytes += round_up(count, kSlotAlignment);
    ++slot_index;
    if (count == 0) s.values = TensorView();
    return s;
  };
  Float8Scratch scratch;
  scratch.activation = slot(sizes.activation);
  scratch.activation_transposed = slot(sizes.activation_transposed);
  scratch.input_transposed = slot(sizes.input_transposed);
  scratch.weight = slot(sizes.weight);
  scratch.weight_transposed = slot(sizes.weight_transposed);
  return scratch;
}

Float8WeightLayout float8_weight_layout(const ModelConfig& model, Float8Recipe recipe,
                                        const std::vector<std::array<bool, kLayerWeightCount>>& float8,
                                        bool transposed) {
  Float8WeightLayout layout;
  for (const auto& layer : float8) {
    std::array<int64_t, kLayerWeightCount> values, scales;
    values.fill(-1);
    scales.fill(-1);
    for (int w = 0; w < kLayerWeightCount; ++w) {
      if (!layer[size_t(w)]) continue;
      const auto spec = layer_weight_spec(static_cast<LayerWeight>(w), model);
      const int64_t out = spec.dims[0], in = spec.dims[1];
      values[size_t(w)] = layout.value_bytes;
      scales[size_t(w)] = layout.scale_floats;
      layout.value_bytes += round_up((transposed ? 2 : 1) * out * in, kSlotAlignment);
      layout.scale_floats += round_up(float8_weight_scale_count(recipe, out, in), kStatisticAlignment);
    }
    layout.value_offset.push_back(values);
    layout.scale_offset.push_back(scales);
  }
  return layout;
}

int64_t operand_scale_count(OperandScaling scaling, int64_t rows, int64_t cols) {
  switch (scaling) {
    case OperandScaling::none:
    case OperandScaling::tensorwise: return 1;
    case OperandScaling::rowwise: return rows;
    case OperandScaling::tile_1x128: return tile_scale_count(rows, cols);
    case OperandScaling::block_128x128: return block_scale_count(rows, cols);
  }
  return 1;
}

int64_t float8_weight_scale_count(Float8Recipe recipe, int64_t out, int64_t in) {
  const OperandScaling scaling = float8_gemm_cast(recipe, LinearGemm::output).b.scaling;
  return operand_scale_count(scaling, out, in) + operand_scale_count(scaling, in, out);
}

Float8Weight float8_weight_views(Float8Recipe recipe, int64_t out, int64_t in, const TensorView& values,
                                 const TensorView& scales, bool transposed) {
  const OperandCast rows_cast = float8_gemm_cast(recipe, LinearGemm::output).b;
  const OperandCast transposed_cast = float8_gemm_cast(recipe, LinearGemm::grad_input).b;
  const int64_t rows_scales = operand_scale_count(rows_cast.scaling, out, in);
  const int64_t transposed_scales = operand_scale_count(transposed_cast.scaling, in, out);
  SMELT_CHECK(values.numel() >= (transposed ? 2 : 1) * out * in &&
                  scales.numel() >= float8_weight_scale_count(recipe, out, in),
              "float8 weight copy views too small for (" + std::to_string(out) + ", " + std::to_string(in) + ")");
  auto* bytes = static_cast<uint8_t*>(values.data);
  auto* floats = static_cast<float*>(scales.data);
  Float8Weight w;
  w.rows.values = TensorView(bytes, rows_cast.dtype, Shape{out, in}, values.device);
  w.rows.scale = TensorView(floats, DType::f32, Shape{rows_scales}, scales.device);
  w.rows.scaling = rows_cast.scaling;
  if (!transposed) return w;
  w.transposed.values = TensorView(bytes + out * in, transposed_cast.dtype, Shape{in, out}, values.device);
  w.transposed.scale = TensorView(floats + rows_scales, DType::f32, Shape{transposed_scales}, scales.device);
  w.transposed.scaling = transposed_cast.scaling;
  return w;
}

int64_t float8_saved_input_bytes(Float8Recipe recipe, int64_t in, int64_t tokens) {
  const OperandCast cast = float8_gemm_cast(recipe, LinearGemm::grad_weight).b;
  return round_up(in * tokens, kSlotAlignment) + 4 * operand_scale_count(cast.scaling, in, tokens);
}

QuantizedOperand float8_saved_input_view(Float8Recipe recipe, int64_t in, int64_t tokens, const TensorView& buffer) {
  const OperandCast cast = float8_gemm_cast(recipe, LinearGemm::grad_weight).b;
  SMELT_CHECK(int64_t(buffer.bytes()) >= float8_saved_input_bytes(recipe, in, tokens),
              "float8 saved input buffer " + buffer.str() + " too small for x^T (" + std::to_string(in) + ", " +
                  std::to_string(tokens) + ")");
  auto* bytes = static_cast<uint8_t*>(buffer.data);
  QuantizedOperand q;
  q.values = TensorView(bytes, cast.dtype, Shape{in, tokens}, buffer.device);
  q.scale = TensorView(bytes + round_up(in * tokens, kSlotAlignment), DType::f32,
                       Shape{operand_scale_count(cast.scaling, in, tokens)}, buffer.device);
  q.scaling = cast.scaling;
  return q;
}

void quantize_weight(Backend& backend, Float8Recipe recipe, const TensorView& weight, const Float8Weight& copy,
                     const TensorView& amax, const TensorView& amax_transposed, const TensorView& ready_amax) {
  const int64_t out = weight.rows(), in = weight.cols();
  SMELT_CHECK(copy.rows.values.rows() == out && copy.rows.values.cols() == in,
              "quantize_weight: copy of " + copy.rows.values.str() + " for weight " + weight.str());
  const OperandCast cast = float8_gemm_cast(recipe, LinearGemm::output).b;
  if (cast.scaling == OperandScaling::block_128x128) {  // each block's amax inside the one pass
    BlockQuantizeArgs q;
    q.src = weight;
    q.dst = copy.rows.values;
    q.scale = copy.rows.scale;
    q.dst_transposed = copy.transposed.values;
    q.scale_transposed = copy.transposed.scale;
    q.weight_blocks = true;
    backend.quantize_blocks(q);
    return;
  }
  const bool rowwise = cast.scaling == OperandScaling::rowwise;
  const bool both = !copy.transposed.values.empty();
  const bool ready = !ready_amax.empty();  // tensorwise, amax taken already: the cast alone
  SMELT_CHECK(!ready || (cast.scaling == OperandScaling::tensorwise && ready_amax.numel() == 1),
              "quantize_weight: a ready amax " + ready_amax.str() + " is for tensorwise weights only");
  SMELT_CHECK(ready || (amax.numel() >= (rowwise ? out : 1) && amax_transposed.numel() >= (rowwise && both ? in : 1)),
              "quantize_weight: amax scratch too small for " + weight.str());
  const TensorView row_amax =
      ready ? ready_amax : TensorView(amax.data, DType::f32, Shape{rowwise ? out : 1}, amax.device);
  const TensorView column_amax(amax_transposed.data, DType::f32, Shape{rowwise ? in : 1}, amax_transposed.device);
  if (!ready) {
    AmaxArgs a;
    a.x = weight;
    a.amax = row_amax;
    a.rowwise = rowwise;
    if (rowwise && both) a.column_amax = column_amax;  // tensorwise: both layouts share the tensor's amax
    backend.amax(a);
  }
  QuantizeArgs q;
  q.src = weight;
  q.dst = copy.rows.values;
  q.scale = copy.rows.scale;
  q.amax = row_amax;
  q.rowwise = rowwise;
  q.round_scale_to_power_of_two = cast.round_scale_to_power_of_two;
  if (both) {
    q.dst_transposed = copy.transposed.values;
    q.amax_transposed = rowwise ? column_amax : row_amax;
    q.scale_transposed = copy.transposed.scale;
  }
  backend.quantize(q);
}

namespace {

bool is_block_scaling(OperandScaling scaling) {
  return scaling == OperandScaling::tile_1x128 || scaling == OperandScaling::block_128x128;
}

TensorView prefix(const TensorView& buffer, DType dtype, Shape shape) {
  SMELT_CHECK(buffer.numel() * int64_t(dtype_size(buffer.dtype)) >= shape.numel() * int64_t(dtype_size(dtype)),
              "float8 scratch " + buffer.str() + " smaller than the operand; size it with float8_scratch_sizes");
  return TensorView(buffer.data, dtype, shape, buffer.device);
}

}  // namespace

namespace {

// The operand `source` (or source^T) cast by `cast` occupies in `slot`.
QuantizedOperand slot_operand(const TensorView& source, bool transpose, const OperandCast& cast, const Float8Slot& slot) {
  const int64_t rows = transpose ? source.cols() : source.rows();
  const int64_t cols = transpose ? source.rows() : source.cols();
  const int64_t scale_count = operand_scale_count(cast.scaling, rows, cols);
  return {prefix(slot.values, cast.dtype, Shape{rows, cols}), prefix(slot.scale, DType::f32, Shape{scale_count}),
          cast.scaling};
}

void remember(Float8InputReuse* reuse, Float8InputReuse::Record& record, const TensorView& x, const Float8Slot& slot,
              const TensorView& amax = {}, const void* saved = nullptr) {
  if (reuse) record = {x.data, x.shape, slot.values.data, reuse->step, amax, saved};
}

}  // namespace

QuantizedOperand quantize_operand(Backend& backend, const TensorView& source, bool transpose, const OperandCast& cast,
                                  const Float8Slot& slot, bool amax_ready) {
  const bool rowwise = cast.scaling == OperandScaling::rowwise;
  const QuantizedOperand q = slot_operand(source, transpose, cast, slot);
  if (is_block_scaling(cast.scaling)) {  // one pass: each tile's amax, scale and codes
    BlockQuantizeArgs blocks;
    blocks.src = source;
    (transpose ? blocks.dst_transposed : blocks.dst) = q.values;
    (transpose ? blocks.scale_transposed : blocks.scale) = q.scale;
    blocks.weight_blocks = cast.scaling == OperandScaling::block_128x128;
    backend.quantize_blocks(blocks);
    return q;
  }
  const TensorView amax = prefix(slot.amax, DType::f32, Shape{q.scale.numel()});
  SMELT_CHECK(!amax_ready || cast.scaling == OperandScaling::tensorwise,
              "quantize_operand: an amax taken by the producer is one per tensor; this cast is not tensorwise");
  if (!amax_ready) {
    AmaxArgs amax_args;
    amax_args.x = source;
    amax_args.amax = amax;
    amax_args.rowwise = rowwise;
    amax_args.transpose = transpose;
    backend.amax(amax_args);
  }
  QuantizeArgs quantize;
  quantize.src = source;
  quantize.dst = q.values;
  quantize.scale = q.scale;
  quantize.amax = amax;
  quantize.rowwise = rowwise;
  quantize.transpose = transpose;
  quantize.round_scale_to_power_of_two = cast.round_scale_to_power_of_two;
  backend.quantize(quantize);
  return q;
}

namespace {

// src (rows, cols) cast by `cast` into `slot` (K-major, as quantize_operand) and, in the same read,
// src^T (cols, rows) cast by `transposed_cast` into `transposed`. Rowwise takes src's per-column
// amax into `column_amax` (scratch of at least cols floats); tensorwise shares the one amax, which
// is already in slot.amax when `amax_ready`.
QuantizedOperand quantize_both_layouts(Backend& backend, const TensorView& src, const OperandCast& cast,
                                       const Float8Slot& slot, const OperandCast& transposed_cast,
                                       const QuantizedOperand& transposed, const TensorView& column_amax,
                                       bool amax_ready = false) {
  const QuantizedOperand rows = slot_operand(src, false, cast, slot);
  SMELT_CHECK(transposed.values.rows() == src.cols() && transposed.values.cols() == src.rows() &&
                  transposed.values.dtype == transposed_cast.dtype && transposed.scaling == transposed_cast.scaling,
              "quantize_both_layouts: " + transposed.values.str() + " is not the transposed operand of " + src.str());
  if (is_block_scaling(cast.scaling)) {  // one pass: tiles along cols, and along rows for src^T
    SMELT_CHECK(cast.scaling == OperandScaling::tile_1x128 && transposed_cast.scaling == OperandScaling::tile_1x128,
                "quantize_both_layouts: block scaling writes both layouts only as 1x128 tiles");
    BlockQuantizeArgs blocks;
    blocks.src = src;
    blocks.dst = rows.values;
    blocks.scale = rows.scale;
    blocks.dst_transposed = transposed.values;
    blocks.scale_transposed = transposed.scale;
    backend.quantize_blocks(blocks);
    return rows;
  }
  SMELT_CHECK(transposed_cast.scaling == cast.scaling &&
                  transposed_cast.round_scale_to_power_of_two == cast.round_scale_to_power_of_two,
              "float8 recipe casts an operand and its transpose with different scalings; quantise them separately");
  const bool rowwise = cast.scaling == OperandScaling::rowwise;
  const TensorView amax = prefix(slot.amax, DType::f32, Shape{rows.scale.numel()});
  SMELT_CHECK(!amax_ready || !rowwise, "quantize_both_layouts: a producer's amax is one per tensor; this cast is rowwise");
  AmaxArgs a;
  a.x = src;
  a.amax = amax;
  a.rowwise = rowwise;
  if (rowwise) a.column_amax = prefix(column_amax, DType::f32, Shape{src.cols()});
  if (!amax_ready) backend.amax(a);
  QuantizeArgs q;
  q.src = src;
  q.dst = rows.values;
  q.scale = rows.scale;
  q.amax = amax;
  q.rowwise = rowwise;
  q.round_scale_to_power_of_two = cast.round_scale_to_power_of_two;
  q.dst_transposed = transposed.values;
  q.amax_transposed = rowwise ? a.column_amax : amax;
  q.scale_transposed = transposed.scale;
  backend.quantize(q);
  return rows;
}

// out (=|+=) a @ b^T (+ addend) on two quantised K-major operands.
void float8_gemm(Backend& backend, const QuantizedOperand& a, const QuantizedOperand& b, bool fast_accumulation,
                 const TensorView& out, const TensorView& addend, bool accumulate) {
  GemmArgs g;
  g.a = a.values;
  g.b = b.values;
  g.transpose_b = true;
  g.out = out;
  g.addend = addend;
  g.accumulate = accumulate;
  g.scale_a = a.scale;
  g.scale_b = b.scale;
  g.scaling_a = a.scaling;
  g.scaling_b = b.scaling;
  g.fast_accumulation = fast_accumulation;
  backend.gemm(g);
}

}  // namespace

void float8_linear_forward(Backend& backend, Float8Recipe recipe, const Float8Scratch& scratch,
                           const Float8LinearState& state, const TensorView& x, const TensorView& weight,
                           const TensorView& y, const TensorView& addend, Float8InputReuse* reuse) {
  // y (N, out) = x (N, in) @ W (out, in)^T: both already K-major.
  const GemmCast cast = float8_gemm_cast(recipe, LinearGemm::output);
  const QuantizedOperand& saved = state.saved_input;
  Float8Slot x_slot = scratch.activation;
  // Tensorwise: x's amax goes where the grad-weight GEMM finds it again.
  if (!state.input_amax.empty() && cast.a.scaling == OperandScaling::tensorwise) x_slot.amax = state.input_amax;
  const bool amax_ready = state.input_amax_ready && x_slot.amax.data == state.input_amax.data;
  QuantizedOperand qx;
  if (const auto* earlier = reuse ? reuse->find(reuse->input, x, x_slot) : nullptr) {
    qx = slot_operand(x, false, cast.a, x_slot);
    if (x_slot.amax.data != earlier->amax.data)  // this linear's backward reads its own copy of x's amax
      backend.convert({prefix(earlier->amax, DType::f32, Shape{1}), prefix(x_slot.amax, DType::f32, Shape{1})});
    if (!saved.values.empty() && earlier->saved != saved.values.data) {  // x^T kept elsewhere: cast it alone
      const Float8Slot saved_slot{saved.values, scratch.input_transposed.amax, saved.scale};
      quantize_operand(backend, x, true, float8_gemm_cast(recipe, LinearGemm::grad_weight).b, saved_slot);
    }
    ++reuse->reused;
  } else if (!saved.values.empty()) {  // x for this GEMM and x^T for the backward's, from one read
    qx = quantize_both_layouts(backend, x, cast.a, x_slot, float8_gemm_cast(recipe, LinearGemm::grad_weight).b, saved,
                               scratch.input_transposed.amax, amax_ready);
  } else {
    qx = quantize_operand(backend, x, false, cast.a, x_slot, amax_ready);
  }
  if (reuse) remember(reuse, reuse->input, x, x_slot, x_slot.amax, saved.values.data);
  const QuantizedOperand qw =
      state.weight.empty() ? quantize_operand(backend, weight, false, cast.b, scratch.weight) : state.weight.rows;
  float8_gemm(backend, qx, qw, cast.fast_accumulation, y, addend, false);
}

void float8_linear_backward(Backend& backend, Float8Recipe recipe, const Float8Scratch& scratch,
                            const Float8LinearState& state, const TensorView& x, const TensorView& weight,
                            const TensorView& grad_output, const TensorView& grad_input, bool accumulate_grad_input,
                            const TensorView& grad_weight, Float8InputReuse* reuse, bool accumulate_grad_weight) {
  if (reuse) reuse->input.step = 0;  // dy is cast into the slot that held x
  const QuantizedOperand& saved = state.saved_input;
  const int64_t tokens = grad_output.rows();
  const int64_t in = saved.values.empty() ? x.cols() : saved.values.rows();
  const GemmCast input_cast = float8_gemm_cast(recipe, LinearGemm::grad_input);
  const bool float8_grad_weight = float8_gemm_enabled(recipe, LinearGemm::grad_weight);
  SMELT_CHECK(saved.values.empty() || (float8_grad_weight && saved.values.cols() == tokens),
              "float8_linear_backward: a saved float8 input " + saved.values.str() + " for dy " + grad_output.str() +
                  " under recipe " + std::string(float8_recipe_name(recipe)));
  // dy (N, out) and, when the grad-weight GEMM is in float8, dy^T (out, N), from one read; its
  // amax from dy's producer when it took it (tensorwise).
  Float8Slot dy_slot = scratch.activation;
  const bool dy_amax_ready = !state.grad_amax.empty() && input_cast.a.scaling == OperandScaling::tensorwise;
  if (dy_amax_ready) dy_slot.amax = state.grad_amax;
  QuantizedOperand dy, dy_transposed;
  if (float8_grad_weight) {
    const OperandCast dy_t_cast = float8_gemm_cast(recipe, LinearGemm::grad_weight).a;
    dy_transposed = slot_operand(grad_output, true, dy_t_cast, scratch.activation_transposed);
    dy = quantize_both_layouts(backend, grad_output, input_cast.a, dy_slot, dy_t_cast, dy_transposed,
                               scratch.activation_transposed.amax, dy_amax_ready);
  } else {
    dy = quantize_operand(backend, grad_output, false, input_cast.a, dy_slot, dy_amax_ready);
  }

  // dx (N, in) = dy (N, out) @ (W^T (in, out))^T: K = out, so W is used transposed.
  QuantizedOperand w_transposed;
  if (state.weight.empty()) {  // sharded: cast from the gathered weight
    w_transposed = quantize_operand(backend, weight, true, input_cast.b, scratch.weight_transposed);
  } else if (state.weight.transposed.values.empty()) {  // W's codes transposed: tensorwise, one shared scale
    const QuantizedOperand& w = state.weight.rows;
    SMELT_CHECK(w.scaling == OperandScaling::tensorwise && input_cast.b.scaling == OperandScaling::tensorwise &&
                    w.values.dtype == input_cast.b.dtype,
                "float8_linear_backward: only a tensorwise W^T can be made by transposing W's codes; recipe " +
                    std::string(float8_recipe_name(recipe)) + " needs its W^T copy");
    w_transposed = {prefix(scratch.weight_transposed.values, w.values.dtype, Shape{w.values.cols(), w.values.rows()}),
                    w.scale, OperandScaling::tensorwise};
    backend.transpose({w.values, w_transposed.values});
  } else {
    w_transposed = state.weight.transposed;
  }
  float8_gemm(backend, dy, w_transposed, input_cast.fast_accumulation, grad_input, {}, accumulate_grad_input);

  if (!float8_grad_weight) {  // dW (out, in) = dy^T @ x in the compute dtype
    GemmArgs g;
    g.a = grad_output;
    g.transpose_a = true;
    g.b = x;
    g.out = grad_weight;
    g.accumulate = accumulate_grad_weight;
    backend.gemm(g);
    return;
  }
  // dW (out, in) = dy^T (out, N) @ (x^T (in, N))^T: K = N. x^T kept from the forward, or cast here:
  // tensorwise takes the forward's amax of x (the same tensor, so the same scale); rowwise needs x's
  // per-column amax.
  const GemmCast weight_cast = float8_gemm_cast(recipe, LinearGemm::grad_weight);
  QuantizedOperand x_transposed;
  if (!saved.values.empty()) {
    x_transposed = saved;
  } else if (reuse && reuse->find(reuse->input_transposed, x, scratch.input_transposed)) {
    x_transposed = slot_operand(x, true, weight_cast.b, scratch.input_transposed);
    ++reuse->reused;
  } else if (!state.input_amax.empty() && weight_cast.b.scaling == OperandScaling::tensorwise) {
    x_transposed = {prefix(scratch.input_transposed.values, weight_cast.b.dtype, Shape{in, tokens}),
                    prefix(scratch.input_transposed.scale, DType::f32, Shape{1}), weight_cast.b.scaling};
    QuantizeArgs q;
    q.src = x;
    q.dst = x_transposed.values;
    q.scale = x_transposed.scale;
    q.transpose = true;
    q.amax = state.input_amax;
    q.round_scale_to_power_of_two = weight_cast.b.round_scale_to_power_of_two;
    backend.quantize(q);
  } else {
    x_transposed = quantize_operand(backend, x, true, weight_cast.b, scratch.input_transposed);
  }
  if (reuse && saved.values.empty()) remember(reuse, reuse->input_transposed, x, scratch.input_transposed);
  float8_gemm(backend, dy_transposed, x_transposed, weight_cast.fast_accumulation, grad_weight, {},
              accumulate_grad_weight);
}

}  // namespace smelt
