// Tests of block-scaled float8 on the CPU (the blockwise recipe): hand-computed tile and block
// scales and codes in the documented layouts (written out here, not taken from the header), the
// padding of the block scale grid left alone, NaN kept, and a block-scaled GEMM close to the
// unquantised product on inputs whose tiles differ in magnitude by six decades.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/numerics.h"
#include "cpu/cpu_backend.h"
#include "cpu/fp8.h"
#include "support/fresh_random.h"

namespace smelt {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr uint8_t kPoison = 0xAA;
constexpr uint8_t kE4m3Max = 0x7E, kE4m3MinusMax = 0xFE, kE4m3Half = 0x76;  // 448, -448, 224

TensorView view(std::vector<float>& v, int64_t rows, int64_t cols) {
  return TensorView(v.data(), DType::f32, Shape{rows, cols});
}
TensorView codes(std::vector<uint8_t>& v, int64_t rows, int64_t cols, DType dtype = DType::e4m3) {
  return TensorView(v.data(), dtype, Shape{rows, cols});
}
TensorView floats(std::vector<float>& v) { return TensorView(v.data(), DType::f32, Shape{int64_t(v.size())}); }

TEST(CpuBlockQuantize, TilesAlongRowsAndColumnsHandComputed) {
  // (2, 130): column tiles [0, 128) and [128, 130); the transposed output's tiles are src's
  // 2-row columns.
  const int64_t rows = 2, cols = 130;
  std::vector<float> src(size_t(rows * cols), 0.0f);
  src[5] = 2.0f, src[6] = 1.0f, src[7] = -2.0f;  // row 0, tile 0: amax 2
  src[128] = 0.25f, src[129] = 0.5f;              // row 0, tile 1: amax 0.5
  src[cols + 5] = 0.75f;                          // row 1, tile 0: amax 0.75; tile 1 all zero
  std::vector<uint8_t> dst(size_t(rows * cols), kPoison), dst_t(size_t(rows * cols), kPoison);
  std::vector<float> scale(4, kNan), scale_t(130, kNan);
  cpu::quantize_blocks({view(src, rows, cols), codes(dst, rows, cols), floats(scale), codes(dst_t, cols, rows),
                        floats(scale_t), false});

  // Column-major tile scales: scale[tile * rows + row], dequantisation factors amax / 448.
  EXPECT_EQ(scale[0], 2.0f / 448.0f);
  EXPECT_EQ(scale[1], 0.75f / 448.0f);
  EXPECT_EQ(scale[2], 0.5f / 448.0f);
  EXPECT_EQ(scale[3], 1e-12f / 448.0f);  // an all-zero tile divides by the floor
  EXPECT_EQ(dst[5], kE4m3Max);
  EXPECT_EQ(dst[6], kE4m3Half);
  EXPECT_EQ(dst[7], kE4m3MinusMax);
  EXPECT_EQ(dst[128], kE4m3Half);
  EXPECT_EQ(dst[129], kE4m3Max);
  EXPECT_EQ(dst[cols + 5], kE4m3Max);
  EXPECT_EQ(dst[0], 0x00);
  // Transposed (130, 2): one 2-element tile per row c, scale index c (tile 0 of 130 rows).
  EXPECT_EQ(scale_t[5], 2.0f / 448.0f);  // |2| beside 0.75 in column 5
  EXPECT_EQ(scale_t[6], 1.0f / 448.0f);
  EXPECT_EQ(scale_t[129], 0.5f / 448.0f);
  EXPECT_EQ(dst_t[5 * rows + 0], kE4m3Max);
  EXPECT_EQ(dst_t[5 * rows + 1], float_to_e4m3(0.75f / (2.0f / 448.0f)));
  EXPECT_EQ(dst_t[6 * rows + 0], kE4m3Max);
  EXPECT_EQ(dst_t[128 * rows + 0], kE4m3Max);
}

TEST(CpuBlockQuantize, WeightBlocksShareScalesWithTheirTransposeAndLeavePaddingAlone) {
  // (130, 260): 2 x 3 blocks, scale stride round_up(3, 4) = 4; transposed (260, 130): 3 x 2
  // blocks, stride round_up(2, 4) = 4.
  const int64_t rows = 130, cols = 260;
  std::vector<float> src(size_t(rows * cols), 0.0f);
  float magnitude[2][3];
  for (int br = 0; br < 2; ++br)
    for (int bc = 0; bc < 3; ++bc) {
      magnitude[br][bc] = std::ldexp(1.0f, 3 * br + bc - 4);  // distinct powers of two
      const int64_t r = br * 128 + (br == 0 ? 7 : 1), c = bc * 128 + (bc == 2 ? 1 : 9);
      src[size_t(r * cols + c)] = (bc == 1 ? -1.0f : 1.0f) * magnitude[br][bc];
      src[size_t(r * cols + c + 1)] = 0.5f * magnitude[br][bc];
    }
  std::vector<uint8_t> dst(size_t(rows * cols), kPoison), dst_t(size_t(rows * cols), kPoison);
  std::vector<float> scale(2 * 4, kNan), scale_t(3 * 4, kNan);
  cpu::quantize_blocks({view(src, rows, cols), codes(dst, rows, cols), floats(scale), codes(dst_t, cols, rows),
                        floats(scale_t), true});
  for (int br = 0; br < 2; ++br)
    for (int bc = 0; bc < 3; ++bc) {
      SCOPED_TRACE("block " + std::to_string(br) + ", " + std::to_string(bc));
      EXPECT_EQ(scale[size_t(br * 4 + bc)], magnitude[br][bc] / 448.0f);
      EXPECT_EQ(scale_t[size_t(bc * 4 + br)], magnitude[br][bc] / 448.0f);
      const int64_t r = br * 128 + (br == 0 ? 7 : 1), c = bc * 128 + (bc == 2 ? 1 : 9);
      const uint8_t peak = bc == 1 ? kE4m3MinusMax : kE4m3Max;
      EXPECT_EQ(dst[size_t(r * cols + c)], peak);
      EXPECT_EQ(dst[size_t(r * cols + c + 1)], kE4m3Half);
      EXPECT_EQ(dst_t[size_t(c * rows + r)], peak);
      EXPECT_EQ(dst_t[size_t((c + 1) * rows + r)], kE4m3Half);
    }
  for (int br = 0; br < 2; ++br) EXPECT_TRUE(std::isnan(scale[size_t(br * 4 + 3)])) << "padding written";
  for (int bc = 0; bc < 3; ++bc)
    for (int pad : {2, 3}) EXPECT_TRUE(std::isnan(scale_t[size_t(bc * 4 + pad)])) << "padding written";
  for (size_t i = 0; i < dst.size(); ++i) ASSERT_NE(dst[i], kPoison) << "code " << i << " not written";
  for (size_t i = 0; i < dst_t.size(); ++i) ASSERT_NE(dst_t[i], kPoison) << "transposed code " << i << " not written";
}

TEST(CpuBlockQuantize, NanMakesItsTileScaleNanAndOtherTilesStayFinite) {
  const int64_t rows = 3, cols = 256;
  std::vector<float> src(size_t(rows * cols), 1.5f);
  src[size_t(1 * cols + 200)] = kNan;  // row 1, tile 1
  std::vector<uint8_t> dst(size_t(rows * cols), kPoison);
  std::vector<float> scale(6, 0.0f);
  cpu::quantize_blocks({view(src, rows, cols), codes(dst, rows, cols), floats(scale), {}, {}, false});
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(std::isnan(scale[size_t(i)]), i == 1 * rows + 1) << "scale " << i;
}

TEST(CpuBlockQuantize, RejectsWrongScaleCountsNamingTheOutput) {
  const int64_t rows = 4, cols = 300;
  std::vector<float> src(size_t(rows * cols), 1.0f), scale(size_t(rows * 2), kNan);  // needs rows * 3
  std::vector<uint8_t> dst(size_t(rows * cols));
  try {
    cpu::quantize_blocks({view(src, rows, cols), codes(dst, rows, cols), floats(scale), {}, {}, false});
    FAIL() << "expected a scale count error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("12 values"), std::string::npos) << error.what();
  }
  EXPECT_THROW(cpu::quantize_blocks({view(src, rows, cols), {}, {}, {}, {}, false}), Error);
}

// (rows, cols) values whose 128-column tiles (and 128-row bands) differ in magnitude by up to
// six decades, so any scale read from the wrong tile or block shows.
std::vector<float> banded(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 random(uint32_t(testing_support::fresh(seed)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decades(-3.0f, 3.0f);
  std::vector<float> band(size_t((rows / 128 + 1) * (cols / 128 + 1)));
  for (float& b : band) b = std::pow(10.0f, decades(random));
  std::vector<float> m(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m[size_t(r * cols + c)] = normal(random) * band[size_t((r / 128) * (cols / 128 + 1) + c / 128)];
  return m;
}

double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    error += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(error / norm);
}

TEST(CpuBlockGemm, TileByBlockAndTileByTileProductsTrackTheUnquantisedProduct) {
  auto backend = make_cpu_backend();
  std::vector<float> workspace(1 << 22, kNan);
  backend->set_workspace(TensorView(workspace.data(), DType::f32, Shape{int64_t(workspace.size())}));
  const int64_t m = 200, n = 260, k = 384;
  std::vector<float> a = banded(m, k, 1), b = banded(n, k, 2);
  std::vector<double> exact(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t l = 0; l < k; ++l) sum += double(a[size_t(i * k + l)]) * double(b[size_t(j * k + l)]);
      exact[size_t(i * n + j)] = sum;
    }
  for (bool b_blocks : {true, false}) {
    SCOPED_TRACE(b_blocks ? "tiles x blocks" : "tiles x tiles");
    std::vector<uint8_t> qa(size_t(m * k), kPoison), qb(size_t(n * k), kPoison);
    std::vector<float> sa(size_t(m * 3), kNan), sb(size_t(b_blocks ? 3 * 4 : n * 3), kNan);
    cpu::quantize_blocks({view(a, m, k), codes(qa, m, k), floats(sa), {}, {}, false});
    cpu::quantize_blocks({view(b, n, k), codes(qb, n, k), floats(sb), {}, {}, b_blocks});
    std::vector<float> out(size_t(m * n), kNan);
    GemmArgs g;
    g.a = codes(qa, m, k);
    g.b = codes(qb, n, k);
    g.transpose_b = true;
    g.out = view(out, m, n);
    g.scale_a = floats(sa);
    g.scale_b = floats(sb);
    g.scaling_a = OperandScaling::tile_1x128;
    g.scaling_b = b_blocks ? OperandScaling::block_128x128 : OperandScaling::tile_1x128;
    backend->gemm(g);
    const double error = relative_error(out, exact);
    std::printf("%s: relative error %.4f\n", b_blocks ? "tiles x blocks" : "tiles x tiles", error);
    EXPECT_LT(error, 0.06);  // e4m3 (3 mantissa bits) on both sides: about 3.7%; a misplaced scale: >> 1
    g.fast_accumulation = true;
    EXPECT_THROW(backend->gemm(g), Error);
  }
}

}  // namespace
}  // namespace smelt
