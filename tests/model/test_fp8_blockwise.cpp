// The blockwise float8 recipe on the CPU backend: every GEMM operand of a linear (codes and
// scales) against a reference written here from the recipe's definition (1x128 tiles along K
// for x, dy, dy^T and x^T; 128x128 blocks for W and W^T; e4m3; no fast accumulation), with
// shapes that leave partial tiles and blocks at the edges; and the planned weight copies after
// an optimizer step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/numerics.h"
#include "model/fp8_linear.h"
#include "model_fixture.h"
#include "recording_backend.h"
#include "support/fresh_random.h"

namespace smelt {
namespace {

using testing::RecordedGemm;
using testing::RecordingBackend;
using testing::TinyRun;
using testing::transposed;
using testing::tiny_model;

constexpr int64_t kTile = 128;

// (rows, cols) values with a magnitude per 128x128 region (2^-6 .. 2^6), so a scale taken from
// the wrong tile or block gives other codes.
std::vector<float> regional_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  Random random(testing_support::fresh(seed), 5);
  const int64_t band_cols = cols / kTile + 1;
  std::vector<float> band(size_t((rows / kTile + 1) * band_cols));
  for (float& b : band) b = std::exp2(float(random.below(13)) - 6.0f);
  std::vector<float> m(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m[size_t(r * cols + c)] = float(random.normal()) * band[size_t((r / kTile) * band_cols + c / kTile)];
  return m;
}

struct BlockOperand {
  std::vector<uint8_t> codes;
  std::vector<float> scales;  // NaN where the layout pads
};

// The reference quantisation of a K-major (rows, k) matrix: 1x128 tiles (scales column-major,
// scale[tile * rows + row]) or 128x128 blocks (row-major, the block-column count padded to a
// multiple of 4). Dequantisation scales amax / 448, codes e4m3(value / scale).
BlockOperand block_reference(const std::vector<float>& m, int64_t rows, int64_t k, bool blocks) {
  const int64_t tiles = (k + kTile - 1) / kTile, row_bands = (rows + kTile - 1) / kTile;
  const int64_t stride = (tiles + 3) / 4 * 4;
  BlockOperand e;
  e.scales.assign(size_t(blocks ? row_bands * stride : rows * tiles), NAN);
  e.codes.resize(size_t(rows * k));
  for (int64_t r0 = 0; r0 < rows; r0 += blocks ? kTile : 1)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t r1 = std::min(rows, r0 + (blocks ? kTile : 1)), c0 = t * kTile, c1 = std::min(k, c0 + kTile);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(m[size_t(r * k + c)]));
      const float scale = std::max(amax, 1e-12f) / 448.0f;
      e.scales[size_t(blocks ? (r0 / kTile) * stride + t : t * rows + r0)] = scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) e.codes[size_t(r * k + c)] = float_to_e4m3(m[size_t(r * k + c)] / scale);
    }
  return e;
}

void expect_same_scales(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) continue;  // padding: never read
    ASSERT_EQ(got[i], want[i]) << "scale " << i;
  }
}

void expect_block_gemm(const RecordedGemm& gemm, const BlockOperand& a, const BlockOperand& b, bool b_blocks,
                       const char* what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(gemm.args.a.dtype, DType::e4m3);
  EXPECT_EQ(gemm.args.b.dtype, DType::e4m3);
  EXPECT_EQ(gemm.args.scaling_a, OperandScaling::tile_1x128);
  EXPECT_EQ(gemm.args.scaling_b, b_blocks ? OperandScaling::block_128x128 : OperandScaling::tile_1x128);
  EXPECT_FALSE(gemm.args.transpose_a);
  EXPECT_TRUE(gemm.args.transpose_b);
  EXPECT_FALSE(gemm.args.fast_accumulation);
  EXPECT_EQ(gemm.a, a.codes);
  EXPECT_EQ(gemm.b, b.codes);
  expect_same_scales(gemm.scale_a, a.scales);
  expect_same_scales(gemm.scale_b, b.scales);
}

// One linear, N = 200 tokens, in = 136, out = 260: every operand has a partial tile or block.
void check_blockwise_linear(bool weight_copies) {
  SCOPED_TRACE(weight_copies ? "weight copies" : "weights quantised per use");
  const Float8Recipe recipe = Float8Recipe::blockwise;
  const int64_t tokens = 200, in = 136, out = 260;
  RecordingBackend backend;
  std::vector<float> workspace(1 << 20, NAN);
  backend.set_workspace(TensorView(workspace.data(), DType::f32, Shape{int64_t(workspace.size())}));
  std::vector<float> x = regional_matrix(tokens, in, 1), w = regional_matrix(out, in, 2);
  std::vector<float> dy = regional_matrix(tokens, out, 3);
  std::vector<float> y(size_t(tokens * out), NAN), dx(size_t(tokens * in), NAN), dw(size_t(out * in), NAN);
  Float8ScratchSizes sizes;
  sizes.activation = tokens * std::max(in, out);
  sizes.activation_transposed = tokens * out;
  sizes.input_transposed = tokens * in;
  sizes.weight = sizes.weight_transposed = weight_copies ? 0 : out * in;
  sizes.scales = tokens * 3;  // dy's tiles: the most of any operand here
  std::vector<uint8_t> values(size_t(float8_scratch_value_bytes(sizes)), 0xAA);
  std::vector<float> statistics(size_t(float8_scratch_statistic_floats(sizes)), NAN);
  const Float8Scratch scratch =
      float8_scratch_views(sizes, TensorView(values.data(), DType::e4m3, Shape{int64_t(values.size())}),
                           TensorView(statistics.data(), DType::f32, Shape{int64_t(statistics.size())}));
  const TensorView xv(x.data(), DType::f32, Shape{tokens, in}), wv(w.data(), DType::f32, Shape{out, in});
  const TensorView dyv(dy.data(), DType::f32, Shape{tokens, out});
  std::vector<uint8_t> copy(size_t(2 * out * in), 0xAA);
  std::vector<float> copy_scales(size_t(float8_weight_scale_count(recipe, out, in)), NAN);
  EXPECT_EQ(copy_scales.size(), size_t(3 * 4 + 2 * 4));  // W: 3 x 2 blocks, W^T: 2 x 3, strides 4
  Float8LinearState state;
  if (weight_copies) {
    state.weight = float8_weight_views(recipe, out, in, TensorView(copy.data(), DType::e4m3, Shape{2 * out * in}),
                                       TensorView(copy_scales.data(), DType::f32, Shape{int64_t(copy_scales.size())}));
    quantize_weight(backend, recipe, wv, state.weight, scratch.activation.amax, scratch.activation_transposed.amax);
  }
  float8_linear_forward(backend, recipe, scratch, state, xv, wv, TensorView(y.data(), DType::f32, Shape{tokens, out}),
                        {});
  float8_linear_backward(backend, recipe, scratch, state, xv, wv, dyv,
                         TensorView(dx.data(), DType::f32, Shape{tokens, in}), false,
                         TensorView(dw.data(), DType::f32, Shape{out, in}));
  ASSERT_EQ(backend.gemms.size(), 3u);
  expect_block_gemm(backend.gemms[0], block_reference(x, tokens, in, false), block_reference(w, out, in, true), true,
                    "output: x tiles, W blocks");
  expect_block_gemm(backend.gemms[1], block_reference(dy, tokens, out, false),
                    block_reference(transposed(w, out, in), in, out, true), true, "grad-input: dy tiles, W^T blocks");
  expect_block_gemm(backend.gemms[2], block_reference(transposed(dy, tokens, out), out, tokens, false),
                    block_reference(transposed(x, tokens, in), in, tokens, false), false,
                    "grad-weight: dy^T tiles, x^T tiles (both along the tokens)");
  // The results are the products of the dequantised operands (code * scale).
  const BlockOperand qx = block_reference(x, tokens, in, false), qw = block_reference(w, out, in, true);
  for (int64_t i = 0; i < tokens; i += 37)
    for (int64_t j = 0; j < out; j += 29) {
      double sum = 0, magnitude = 0;
      for (int64_t l = 0; l < in; ++l) {
        const double term = double(e4m3_to_float(qx.codes[size_t(i * in + l)])) * qx.scales[size_t((l / kTile) * tokens + i)] *
                            double(e4m3_to_float(qw.codes[size_t(j * in + l)])) * qw.scales[size_t((j / kTile) * 4 + l / kTile)];
        sum += term;
        magnitude += std::fabs(term);
      }
      EXPECT_NEAR(y[size_t(i * out + j)], sum, 1e-6 * magnitude + 1e-30) << "y " << i << ", " << j;
    }
  for (float v : dx) ASSERT_TRUE(std::isfinite(v));
  for (float v : dw) ASSERT_TRUE(std::isfinite(v));
}

TEST(Float8Blockwise, LinearOperandsMatchTheRecipe) {
  check_blockwise_linear(true);
  check_blockwise_linear(false);
}

// The planned copies after two optimizer steps are the updated master weights in blocks.
TEST(Float8Blockwise, WeightCopiesAreTheUpdatedWeightsInBlocks) {
  TinyRun run(testing::debug_model(160, 2, 136, 11), DType::bf16, "selective-op", 2, 6);
  run.use_float8(Float8Recipe::blockwise);
  run.initialise(5);
  OptimizerSettings settings;
  settings.lr = 1e-2f;
  for (int step = 1; step <= 2; ++step) {
    run.load_random_batch(uint64_t(step));
    settings.step = step;
    run.executor->run(settings);
  }
  const auto* master = run.executor->view(run.plan.parameters).as<const float>();
  const auto* copies = run.executor->view(run.plan.float8_weights).as<const uint8_t>();
  const auto* scales = run.executor->view(run.plan.float8_weight_scales).as<const float>();
  int checked = 0;
  for (int64_t layer = 0; layer < run.plan.model.n_layers; ++layer)
    for (LayerWeight w : {LayerWeight::wq, LayerWeight::w1, LayerWeight::w2}) {
      const auto& info = run.executor->layout().layer(layer, w);
      const auto spec = layer_weight_spec(w, run.plan.model);
      const int64_t out = spec.dims[0], in = spec.dims[1];
      SCOPED_TRACE(info.name);
      std::vector<float> weight(master + info.offset, master + info.offset + out * in);
      const int64_t values = run.plan.float8_weight_layout.value_offset[size_t(layer)][size_t(w)];
      const int64_t scale = run.plan.float8_weight_layout.scale_offset[size_t(layer)][size_t(w)];
      const BlockOperand rows = block_reference(weight, out, in, true);
      const BlockOperand columns = block_reference(transposed(weight, out, in), in, out, true);
      EXPECT_EQ(std::vector<uint8_t>(copies + values, copies + values + out * in), rows.codes);
      EXPECT_EQ(std::vector<uint8_t>(copies + values + out * in, copies + values + 2 * out * in), columns.codes);
      const int64_t row_scales = int64_t(rows.scales.size()), column_scales = int64_t(columns.scales.size());
      expect_same_scales(std::vector<float>(scales + scale, scales + scale + row_scales), rows.scales);
      expect_same_scales(std::vector<float>(scales + scale + row_scales, scales + scale + row_scales + column_scales),
                         columns.scales);
      ++checked;
    }
  EXPECT_EQ(checked, 6);
}

}  // namespace
}  // namespace smelt
