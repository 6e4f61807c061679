// Float8 linears on the GPU against the CPU emulation: the float8 weight copies, every quantised
// activation operand (dy, dy^T, x^T) and their scales bit-identical, and the outputs of the GEMMs
// (cuBLASLt float8, tensorwise and outer-vector scales, with and without a residual addend and an
// accumulated grad-input; block scales for blockwise) within accumulation-order tolerance. Each recipe runs with weights
// quantised once (planned copies) and per use (as sharded plans do), and the weight copies
// quantised from an f32 master.
#include <algorithm>
#include <array>
#include <cstring>

#include "cuda_test_support.h"
#include "model/fp8_linear.h"

namespace smelt::test {
namespace {

constexpr int64_t kTokens = 64, kIn = 128, kOut = 96;

class CudaFloat8LinearTest : public CudaOpsTest {
 protected:
  // Keep x for the backward as float8 x^T (Float8LinearState::saved_input), written by the forward;
  // the backward then gets no x at all.
  bool keep_x_in_float8_ = false;
  // Tensorwise weight copies without W^T: the backward transposes W's codes into scratch.
  bool transpose_per_use_ = false;

  // The first `count` elements of a view (host or device) as a host tensor.
  HostTensor prefix(const TensorView& view, int64_t count) {
    const TensorView part(view.data, view.dtype, Shape{count}, view.device);
    if (view.device == Device::cuda) return download(part);
    HostTensor host(view.dtype, Shape{count});
    std::memcpy(host.view.data, part.data, part.bytes());
    return host;
  }

  void check(Float8Recipe recipe, bool weight_copies, bool residual, int64_t tokens = kTokens, int64_t in = kIn,
             int64_t out = kOut) {
    const std::string what = std::string(float8_recipe_name(recipe)) +
                             (weight_copies ? ", weight copies" : ", weights per use") +
                             (keep_x_in_float8_ ? ", x kept as float8 x^T" : "") +
                             (transpose_per_use_ ? ", W^T transposed per use" : "") +
                             (residual ? ", residual addend and accumulated dx" : "");
    SCOPED_TRACE(what);
    const bool tensorwise = recipe == Float8Recipe::tensorwise;
    const bool float8_grad_weight = float8_gemm_enabled(recipe, LinearGemm::grad_weight);
    const GemmCast output_cast = float8_gemm_cast(recipe, LinearGemm::output);
    const GemmCast input_cast = float8_gemm_cast(recipe, LinearGemm::grad_input);
    const OperandScaling tiles = input_cast.a.scaling, weights = output_cast.b.scaling;
    Float8ScratchSizes sizes;
    sizes.activation = tokens * std::max(in, out);
    sizes.activation_transposed = float8_grad_weight ? tokens * out : 0;
    sizes.input_transposed = float8_grad_weight ? tokens * in : 0;
    sizes.weight = weight_copies ? 0 : out * in;
    sizes.weight_transposed = weight_copies && !transpose_per_use_ ? 0 : out * in;
    sizes.scales = std::max({tokens, in, out, operand_scale_count(tiles, tokens, std::max(in, out)),
                             operand_scale_count(tiles, std::max(in, out), tokens),
                             operand_scale_count(weights, out, in), operand_scale_count(weights, in, out)});
    const Shape value_shape{float8_scratch_value_bytes(sizes)};
    const Shape statistic_shape{float8_scratch_statistic_floats(sizes)};
    const int64_t weight_scales = float8_weight_scale_count(recipe, out, in);

    HostTensor x = random_tensor(DType::bf16, Shape{tokens, in}, 11, 2.0);
    HostTensor weight = random_tensor(DType::bf16, Shape{out, in}, 12, 0.1);
    HostTensor grad_output = random_tensor(DType::bf16, Shape{tokens, out}, 13, 1e-3);
    HostTensor addend = random_tensor(DType::bf16, Shape{tokens, out}, 14, 1.0);
    HostTensor dx_start = random_tensor(DType::bf16, Shape{tokens, in}, 15, 1e-3);

    // CPU emulation. Byte buffers start as 0x7F, like the device's poisoned ones, so whole
    // buffers compare bit for bit.
    HostTensor cpu_values(DType::e4m3, value_shape), cpu_statistics = nan_tensor(DType::f32, statistic_shape);
    std::memset(cpu_values.view.data, 0x7F, cpu_values.view.bytes());
    HostTensor cpu_copy(DType::e4m3, Shape{2 * out * in}), cpu_copy_scales = nan_tensor(DType::f32, Shape{weight_scales});
    std::memset(cpu_copy.view.data, 0x7F, cpu_copy.view.bytes());
    HostTensor cpu_input_amax = nan_tensor(DType::f32, Shape{1});
    HostTensor cpu_y(DType::bf16, Shape{tokens, out}), cpu_dx = dx_start, cpu_dw(DType::f32, Shape{out, in});
    const Float8Scratch cpu_scratch = float8_scratch_views(sizes, cpu_values.view, cpu_statistics.view);
    Float8LinearState cpu_state;
    if (weight_copies) {
      cpu_state.weight = float8_weight_views(recipe, out, in, cpu_copy.view, cpu_copy_scales.view, !transpose_per_use_);
      quantize_weight(*cpu_, recipe, weight.view, cpu_state.weight, cpu_scratch.activation.amax,
                      cpu_scratch.activation_transposed.amax);
    }
    if (tensorwise) cpu_state.input_amax = cpu_input_amax.view;
    const Shape saved_shape{keep_x_in_float8_ ? float8_saved_input_bytes(recipe, in, tokens) : 0};
    HostTensor cpu_saved(DType::e4m3, saved_shape);
    std::memset(cpu_saved.view.data, 0x7F, cpu_saved.view.bytes());
    if (keep_x_in_float8_) cpu_state.saved_input = float8_saved_input_view(recipe, in, tokens, cpu_saved.view);
    const TensorView backward_x = keep_x_in_float8_ ? TensorView() : x.view;
    float8_linear_forward(*cpu_, recipe, cpu_scratch, cpu_state, x.view, weight.view, cpu_y.view,
                          residual ? addend.view : TensorView());
    float8_linear_backward(*cpu_, recipe, cpu_scratch, cpu_state, backward_x, weight.view, grad_output.view,
                           cpu_dx.view, residual, cpu_dw.view);

    // CUDA.
    const TensorView values = poisoned(DType::e4m3, value_shape), statistics = poisoned(DType::f32, statistic_shape);
    const TensorView copy = poisoned(DType::e4m3, Shape{2 * out * in});
    const TensorView copy_scales = poisoned(DType::f32, Shape{weight_scales});
    const Float8Scratch scratch = float8_scratch_views(sizes, values, statistics);
    Float8LinearState state;
    TensorView device_x = upload(x), device_weight = upload(weight), device_grad = upload(grad_output);
    if (weight_copies) {
      state.weight = float8_weight_views(recipe, out, in, copy, copy_scales, !transpose_per_use_);
      quantize_weight(*cuda_, recipe, device_weight, state.weight, scratch.activation.amax,
                      scratch.activation_transposed.amax);
    }
    if (tensorwise) state.input_amax = poisoned(DType::f32, Shape{1});
    const TensorView saved = keep_x_in_float8_ ? poisoned(DType::e4m3, saved_shape) : TensorView();
    if (keep_x_in_float8_) state.saved_input = float8_saved_input_view(recipe, in, tokens, saved);
    TensorView y = poisoned(DType::bf16, Shape{tokens, out}), dx = upload(dx_start);
    TensorView dw = poisoned(DType::f32, Shape{out, in});
    float8_linear_forward(*cuda_, recipe, scratch, state, device_x, device_weight, y,
                          residual ? upload(addend) : TensorView());
    float8_linear_backward(*cuda_, recipe, scratch, state, keep_x_in_float8_ ? TensorView() : device_x, device_weight,
                           device_grad, dx, residual, dw);
    cuda_->synchronize();
    if (keep_x_in_float8_) expect_bits_equal(cpu_saved, download(saved), "x^T kept from the forward, and its scales");

    // Every quantised operand still in memory: W and W^T (copies or per-use slots), dy, dy^T, x^T.
    if (weight_copies) {
      expect_bits_equal(cpu_copy, download(copy), "weight copies W and W^T");
      expect_bits_equal(cpu_copy_scales, download(copy_scales), "weight copy scales");
    }
    expect_bits_equal(cpu_values, download(values), "scratch operands (dy, dy^T, x^T, per-use W and W^T)");
    auto expect_scales = [&](const Float8Slot& cpu_slot, const Float8Slot& slot, int64_t count, const char* name) {
      expect_bits_equal(prefix(cpu_slot.scale, count), prefix(slot.scale, count), name);
    };
    expect_scales(cpu_scratch.activation, scratch.activation, operand_scale_count(tiles, tokens, out), "dy scales");
    if (float8_grad_weight) {
      expect_scales(cpu_scratch.activation_transposed, scratch.activation_transposed,
                    operand_scale_count(tiles, out, tokens), "dy^T scales");
      expect_scales(cpu_scratch.input_transposed, scratch.input_transposed, operand_scale_count(tiles, in, tokens),
                    "x^T scales");
    }
    if (!weight_copies) {
      expect_scales(cpu_scratch.weight, scratch.weight, operand_scale_count(weights, out, in), "per-use W scales");
      expect_scales(cpu_scratch.weight_transposed, scratch.weight_transposed, operand_scale_count(weights, in, out),
                    "per-use W^T scales");
    }
    if (tensorwise) expect_bits_equal(cpu_input_amax, download(state.input_amax), "saved input amax");
    // Same operands, so only the summation order (and fast accumulation) differs.
    expect_close(cpu_y, download(y), 1e-2, "y");
    expect_close(cpu_dx, download(dx), 1e-2, "dx");
    // f32 dW: float8 GEMMs agree to 1e-4; cuBLASLt's block-scaled kernels add each 128-wide K
    // block's partial sum into the accumulator with its scales, which measured 1.2e-4 here.
    const double dw_tolerance = !float8_grad_weight ? 1e-3 : recipe == Float8Recipe::blockwise ? 5e-4 : 1e-4;
    expect_close(cpu_dw, download(dw), dw_tolerance, "dW");
  }
};

TEST_F(CudaFloat8LinearTest, TensorwiseMatchesTheCpuEmulation) { check(Float8Recipe::tensorwise, true, false); }
TEST_F(CudaFloat8LinearTest, RowwiseMatchesTheCpuEmulation) { check(Float8Recipe::rowwise, true, false); }
// Blockwise on shapes with several tiles and blocks per operand and partial ones at the edges
// (tokens 320, in 384 = 3 tiles: the block scale grid's padded stride; out 208).
TEST_F(CudaFloat8LinearTest, BlockwiseMatchesTheCpuEmulation) {
  for (bool copies : {true, false})
    for (bool residual : {false, true}) check(Float8Recipe::blockwise, copies, residual, 320, 384, 208);
  check(Float8Recipe::blockwise, true, false);
}
TEST_F(CudaFloat8LinearTest, RowwiseWithHighPrecisionGradWeightMatchesTheCpuEmulation) {
  check(Float8Recipe::rowwise_with_gw_hp, true, false);
}
TEST_F(CudaFloat8LinearTest, WeightsQuantisedPerUseMatchTheCpuEmulation) {
  for (Float8Recipe recipe : {Float8Recipe::tensorwise, Float8Recipe::rowwise, Float8Recipe::rowwise_with_gw_hp})
    check(recipe, false, false);
}
// Tensorwise W^T transposed from W's codes at each backward use (no W^T copy): the scratch W^T and
// the grad-input GEMM on it as the CPU has them.
TEST_F(CudaFloat8LinearTest, TensorwiseWithWTransposedPerUseMatchesTheCpuEmulation) {
  transpose_per_use_ = true;
  check(Float8Recipe::tensorwise, true, false);
  check(Float8Recipe::tensorwise, true, true);
}
// x kept for the backward as float8 x^T, written by the forward's cast of x in the same pass: the
// bytes and scales as the CPU writes them, and the backward's GEMMs on them, without x.
TEST_F(CudaFloat8LinearTest, InputKeptAsFloat8TransposeMatchesTheCpuEmulation) {
  keep_x_in_float8_ = true;
  for (Float8Recipe recipe : {Float8Recipe::tensorwise, Float8Recipe::rowwise}) check(recipe, true, true);
  check(Float8Recipe::blockwise, true, false, 320, 384, 208);
}
// The block's wo / w2 add the residual (beta = 1 with C) and wk / wv / w3 accumulate dx.
TEST_F(CudaFloat8LinearTest, ResidualAddendAndAccumulatedGradInputMatchTheCpuEmulation) {
  for (Float8Recipe recipe : {Float8Recipe::tensorwise, Float8Recipe::rowwise, Float8Recipe::rowwise_with_gw_hp})
    check(recipe, true, true);
}

// Unsharded plans quantise float8 linears from the fp32 master weights (they have no bf16 copy):
// W and W^T and their scales from an f32 source, bit-identical to the CPU emulation, for shapes
// on the tiled path (multiples of 16) and off it. The source holds values bf16 cannot represent,
// so a kernel that rounded through bf16 would be caught.
TEST_F(CudaFloat8LinearTest, WeightCopiesFromAnF32MasterMatchTheCpuEmulation) {
  const std::array<std::array<int64_t, 2>, 3> shapes{{{kOut, kIn}, {256, 512}, {40, 72}}};
  for (Float8Recipe recipe : {Float8Recipe::tensorwise, Float8Recipe::rowwise, Float8Recipe::rowwise_with_gw_hp,
                              Float8Recipe::blockwise})
    for (const auto& [out, in] : shapes) {
      SCOPED_TRACE(std::string(float8_recipe_name(recipe)) + " (" + std::to_string(out) + ", " + std::to_string(in) + ")");
      HostTensor weight = random_tensor(DType::f32, Shape{out, in}, 21 + uint64_t(out), 0.05);
      int64_t not_bf16 = 0;
      for (int64_t i = 0; i < weight.numel(); ++i)
        not_bf16 += float(weight.get(i)) != bf16_to_float(float_to_bf16(float(weight.get(i))));
      ASSERT_GT(not_bf16, weight.numel() / 2) << "the master weights must not be bf16 values already";
      const int64_t scale_count = float8_weight_scale_count(recipe, out, in);
      HostTensor cpu_copy(DType::e4m3, Shape{2 * out * in}), cpu_scales = nan_tensor(DType::f32, Shape{scale_count});
      std::memset(cpu_copy.view.data, 0x7F, cpu_copy.view.bytes());
      HostTensor cpu_amax = nan_tensor(DType::f32, Shape{out}), cpu_amax_t = nan_tensor(DType::f32, Shape{in});
      quantize_weight(*cpu_, recipe, weight.view, float8_weight_views(recipe, out, in, cpu_copy.view, cpu_scales.view),
                      cpu_amax.view, cpu_amax_t.view);
      const TensorView copy = poisoned(DType::e4m3, Shape{2 * out * in}), scales = poisoned(DType::f32, Shape{scale_count});
      quantize_weight(*cuda_, recipe, upload(weight), float8_weight_views(recipe, out, in, copy, scales),
                      poisoned(DType::f32, Shape{out}), poisoned(DType::f32, Shape{in}));
      cuda_->synchronize();
      expect_bits_equal(cpu_copy, download(copy), "W and W^T from f32");
      expect_bits_equal(cpu_scales, download(scales), "their scales");
    }
}

}  // namespace
}  // namespace smelt::test
