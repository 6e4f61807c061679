// Float8 linears: recipe table, operand quantisation (amax -> scale -> cast, on the device)
// and the three GEMMs of a linear, each in the "TN" form a float8 GEMM needs:
// out = a @ b^T with a (M, K) and b (N, K) both K-major, so rowwise scales run along K.
#include "model/fp8_linear.h"

#include <algorithm>

#include "core/error.h"
#include "model/layer_graph.h"

namespace smelt {

Float8Recipe parse_float8_recipe(const std::string& name) {
  if (name == "none") return Float8Recipe::none;
  if (name == "tensorwise") return Float8Recipe::tensorwise;
  if (name == "rowwise") return Float8Recipe::rowwise;
  fail(ErrorKind::config, "float8.recipe: expected one of none, tensorwise, rowwise, found '" + name +
                              "'; rowwise_with_gw_hp and blockwise are not implemented yet, pick one of the three");
}

std::string_view float8_recipe_name(Float8Recipe recipe) {
  switch (recipe) {
    case Float8Recipe::none: return "none";
    case Float8Recipe::tensorwise: return "tensorwise";
    case Float8Recipe::rowwise: return "rowwise";
  }
  return "?";
}

bool float8_linear_enabled(const Float8Options& options, const std::string& fqn) {
  if (options.recipe == Float8Recipe::none) return false;
  for (const auto& filter : options.filter_fqns)
    if (!filter.empty() && fqn.find(filter) != std::string::npos) return false;
  return true;
}

GemmCast float8_gemm_cast(Float8Recipe recipe, LinearGemm gemm) {
  GemmCast cast;
  if (recipe == Float8Recipe::rowwise) {
    const OperandCast rowwise{DType::e4m3, OperandScaling::rowwise, true};
    cast.a = cast.b = rowwise;
    return cast;
  }
  SMELT_CHECK(recipe == Float8Recipe::tensorwise, "float8_gemm_cast needs a float8 recipe");
  const OperandCast forward{DType::e4m3, OperandScaling::tensorwise, false};
  const OperandCast gradient{DType::e5m2, OperandScaling::tensorwise, false};
  switch (gemm) {
    case LinearGemm::output: cast = {forward, forward, true}; break;       // x, W
    case LinearGemm::grad_input: cast = {gradient, forward, false}; break;  // dy, W^T
    case LinearGemm::grad_weight: cast = {gradient, forward, false}; break; // dy^T, x^T
  }
  return cast;
}

Float8ScratchSizes float8_scratch_sizes(const ModelConfig& model, int64_t tokens) {
  Float8ScratchSizes sizes;
  for (LayerWeight w : {LayerWeight::wq, LayerWeight::wk, LayerWeight::wv, LayerWeight::wo, LayerWeight::w1,
                        LayerWeight::w3, LayerWeight::w2}) {
    const auto spec = layer_weight_spec(w, model);
    const int64_t out = spec.dims[0], in = spec.dims[1];
    // a: x (N, in), dy (N, out), dy^T (out, N); b: W (out, in), W^T (in, out), x^T (in, N).
    sizes.operand_a = std::max(sizes.operand_a, tokens * std::max(in, out));
    sizes.operand_b = std::max(sizes.operand_b, in * std::max(out, tokens));
    sizes.scale_a = std::max({sizes.scale_a, tokens, out});
    sizes.scale_b = std::max({sizes.scale_b, out, in});
  }
  return sizes;
}

QuantizedOperand quantize_operand(Backend& backend, const TensorView& source, bool transpose, const OperandCast& cast,
                                  const TensorView& values_scratch, const TensorView& scale_scratch) {
  const int64_t rows = transpose ? source.cols() : source.rows();
  const int64_t cols = transpose ? source.rows() : source.cols();
  const bool rowwise = cast.scaling == OperandScaling::rowwise;
  const int64_t scale_count = rowwise ? rows : 1;
  SMELT_CHECK(values_scratch.numel() >= rows * cols && scale_scratch.numel() >= scale_count,
              "float8 scratch smaller than the operand " + source.str() + "; size it with float8_scratch_sizes");
  QuantizedOperand q;
  q.values = TensorView(values_scratch.data, cast.dtype, Shape{rows, cols}, values_scratch.device);
  q.scale = TensorView(scale_scratch.data, DType::f32, Shape{scale_count}, scale_scratch.device);
  q.scaling = cast.scaling;
  AmaxArgs amax;
  amax.x = source;
  amax.amax = q.scale;
  amax.rowwise = rowwise;
  amax.transpose = transpose;
  backend.amax(amax);
  backend.scale_from_amax({q.scale, q.scale, cast.dtype, cast.round_scale_to_power_of_two});
  QuantizeArgs quantize;
  quantize.src = source;
  quantize.dst = q.values;
  quantize.scale = q.scale;
  quantize.rowwise = rowwise;
  quantize.transpose = transpose;
  backend.quantize(quantize);
  return q;
}

namespace {

// out (=|+=) a_source' @ b_source'^T where ' is the transpose when asked: both quantised K-major.
void float8_gemm(Backend& backend, const GemmCast& cast, const Float8Scratch& scratch, const TensorView& a_source,
                 bool transpose_a_source, const TensorView& b_source, bool transpose_b_source, const TensorView& out,
                 const TensorView& addend, bool accumulate) {
  const QuantizedOperand a =
      quantize_operand(backend, a_source, transpose_a_source, cast.a, scratch.operand_a, scratch.scale_a);
  const QuantizedOperand b =
      quantize_operand(backend, b_source, transpose_b_source, cast.b, scratch.operand_b, scratch.scale_b);
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
  g.fast_accumulation = cast.fast_accumulation;
  backend.gemm(g);
}

}  // namespace

void float8_linear_forward(Backend& backend, Float8Recipe recipe, const Float8Scratch& scratch, const TensorView& x,
                           const TensorView& weight, const TensorView& y, const TensorView& addend) {
  // y (N, out) = x (N, in) @ W (out, in)^T: both already K-major.
  float8_gemm(backend, float8_gemm_cast(recipe, LinearGemm::output), scratch, x, false, weight, false, y, addend, false);
}

void float8_linear_backward(Backend& backend, Float8Recipe recipe, const Float8Scratch& scratch, const TensorView& x,
                            const TensorView& weight, const TensorView& grad_output, const TensorView& grad_input,
                            bool accumulate_grad_input, const TensorView& grad_weight) {
  // dx (N, in) = dy (N, out) @ (W^T (in, out))^T: K = out, so W is quantised transposed.
  float8_gemm(backend, float8_gemm_cast(recipe, LinearGemm::grad_input), scratch, grad_output, false, weight, true,
              grad_input, {}, accumulate_grad_input);
  // dW (out, in) = dy^T (out, N) @ (x^T (in, N))^T: K = N, so both are quantised transposed.
  float8_gemm(backend, float8_gemm_cast(recipe, LinearGemm::grad_weight), scratch, grad_output, true, x, true,
              grad_weight, {}, false);
}

}  // namespace smelt
