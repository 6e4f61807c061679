// CUDA block-scaled float8 (the blockwise recipe) against the CPU reference: quantize_blocks bit
// for bit (codes and every scale the layout uses), for activations (1x128 tiles, each output alone
// and both) and weights (128x128 blocks); and GEMMs on block-scaled operands within stated
// tolerances, in the pairings the recipe runs, with the unsupported set-ups rejected.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/float8_blocks.h"
#include "core/numerics.h"
#include "cuda_test_support.h"
#include "support/fresh_random.h"

namespace smelt::test {
namespace {

Float8Format format_of(DType dtype) { return dtype == DType::e4m3 ? Float8Format::e4m3 : Float8Format::e5m2; }

// Random (rows, cols) values scaled by 2^(tile term + block term): the tile term (-4..4) changes
// per row and per 128-column tile, the block term (-3..3) per 128x128 block, so neighbouring 1x128
// tiles and 128x128 blocks get scales that differ by powers of two and a scale read from the wrong
// index shows. Row 3 and column 5 are zero (the amax floor); `nan` puts one NaN at (7, 9).
HostTensor block_source(DType dtype, int64_t rows, int64_t cols, uint64_t seed, bool nan = false) {
  HostTensor x(dtype, Shape{rows, cols});
  Random random(testing_support::fresh(seed));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int tile_term = int((r * 5 + (c / 128) * 3) % 9) - 4;
      const int block_term = int(((r / 128) * 3 + (c / 128) * 5) % 7) - 3;
      const double value = r == 3 || c == 5 ? 0.0 : std::ldexp(random.normal(), tile_term + block_term);
      x.set(r * cols + c, value);
    }
  if (nan) x.set(7 * cols + 9, std::numeric_limits<double>::quiet_NaN());
  return x;
}

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// The scales of a (rows, cols) output compared bit for bit at every index its layout uses (a
// block layout's padding entries are never written).
void expect_scales_equal(const HostTensor& want, const HostTensor& got, int64_t rows, int64_t cols, bool blocks,
                         const std::string& what) {
  ASSERT_EQ(want.numel(), got.numel()) << what;
  const float* w = want.view.as<const float>();
  const float* g = got.view.as<const float>();
  int64_t mismatches = 0, first = -1;
  auto check = [&](int64_t index) {
    if (bits_of(w[index]) == bits_of(g[index])) return;
    if (mismatches++ == 0) first = index;
  };
  if (blocks) {
    for (int64_t br = 0; br < float8_block_count(rows); ++br)
      for (int64_t bc = 0; bc < float8_block_count(cols); ++bc)
        check(block_scale_index(br * kFloat8BlockSize, bc * kFloat8BlockSize, cols));
  } else {
    for (int64_t i = 0; i < want.numel(); ++i) check(i);
  }
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " scales differ in bits; first at index " << first
                           << " (want " << (first >= 0 ? w[first] : 0.0f) << ", got " << (first >= 0 ? g[first] : 0.0f)
                           << ")";
}

// Independent of both backends: every element of src, dequantised from `codes` as code * scale
// with the scale at the index core/float8_blocks.h gives, is within float8 rounding of the source
// (half an ulp of the format relative, or half its smallest subnormal times the scale). A scale
// written to the wrong index, or as a quantisation factor, fails this even when both backends agree.
// Elements of NaN tiles are skipped.
void expect_dequantizes_to_source(const HostTensor& x, const HostTensor& codes, const HostTensor& scales,
                                  bool transposed, bool blocks, const std::string& what) {
  const int64_t rows = x.view.rows(), cols = x.view.cols();
  const int64_t out_rows = transposed ? cols : rows, out_cols = transposed ? rows : cols;
  const Float8Format format = format_of(codes.view.dtype);
  const double relative = format == Float8Format::e4m3 ? 0x1p-4 : 0x1p-3;
  const double subnormal = format == Float8Format::e4m3 ? 0x1p-10 : 0x1p-17;
  const auto* code = codes.view.as<const uint8_t>();
  const float* scale = scales.view.as<const float>();
  int64_t bad = 0, checked = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t orow = transposed ? c : r, ocol = transposed ? r : c;
      const float s = scale[blocks ? block_scale_index(orow, ocol, out_cols) : tile_scale_index(orow, ocol, out_rows)];
      const double source = x.get(r * cols + c);
      if (std::isnan(s) || std::isnan(source)) continue;
      const double restored = double(float8_to_float(code[orow * out_cols + ocol], format)) * s;
      const double allowed = (std::fabs(source) * relative + double(s) * subnormal) * 1.001;
      ++checked;
      if (!(std::fabs(restored - source) <= allowed) && bad++ == 0)
        ADD_FAILURE() << what << ": element (" << r << ", " << c << ") = " << source << " restores to " << restored
                      << " (scale " << s << ")";
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << checked << " elements do not restore to their source";
  EXPECT_GT(checked, 0) << what;
}

class CudaFloat8Blocks : public CudaOpsTest {};

// Shapes: whole tiles, partial tiles at both edges (with and without the vector paths: cols % 8,
// rows % 16), a partial last row tile on the 16-byte transposed stores.
struct BlockShape {
  int64_t rows, cols;
};
const BlockShape kBlockShapes[] = {{256, 384}, {200, 136}, {130, 257}, {144, 200}};

struct QuantizeMode {
  bool weights, dst, transposed;
  const char* what;
};
const QuantizeMode kQuantizeModes[] = {{false, true, true, "activations, both outputs"},
                                       {false, true, false, "activations, dst only"},
                                       {false, false, true, "activations, dst^T only"},
                                       {true, true, true, "weights, both outputs"}};

struct FormatPair {
  DType dst, transposed;
};
const FormatPair kFormatPairs[] = {{DType::e4m3, DType::e4m3}, {DType::e5m2, DType::e5m2}, {DType::e4m3, DType::e5m2}};

TEST_F(CudaFloat8Blocks, QuantizeBlocksMatchesCpuBitForBit) {
  uint64_t seed = 11;
  for (const BlockShape shape : kBlockShapes)
    for (DType source : {DType::f32, DType::bf16})
      for (const FormatPair formats : kFormatPairs)
        for (const QuantizeMode mode : kQuantizeModes)
          for (bool nan : {false, true}) {
            const size_t arena_mark = used_;
            const int64_t rows = shape.rows, cols = shape.cols;
            const std::string what = std::string(mode.what) + ", " + std::string(dtype_name(source)) + " (" +
                                     std::to_string(rows) + ", " + std::to_string(cols) + ") -> " +
                                     std::string(dtype_name(formats.dst)) + " / " +
                                     std::string(dtype_name(formats.transposed)) + (nan ? ", one NaN" : "");
            const HostTensor x = block_source(source, rows, cols, seed++, nan);
            const int64_t scale_count = mode.weights ? block_scale_count(rows, cols) : tile_scale_count(rows, cols);
            const int64_t scale_count_t = mode.weights ? block_scale_count(cols, rows) : tile_scale_count(cols, rows);

            HostTensor dst(formats.dst, Shape{rows, cols}), dst_t(formats.transposed, Shape{cols, rows});
            HostTensor scale = nan_tensor(DType::f32, Shape{scale_count});
            HostTensor scale_t = nan_tensor(DType::f32, Shape{scale_count_t});
            BlockQuantizeArgs want;
            want.src = x.view;
            want.weight_blocks = mode.weights;
            if (mode.dst) want.dst = dst.view, want.scale = scale.view;
            if (mode.transposed) want.dst_transposed = dst_t.view, want.scale_transposed = scale_t.view;
            cpu_->quantize_blocks(want);

            BlockQuantizeArgs got;
            got.src = upload(x);
            got.weight_blocks = mode.weights;
            if (mode.dst) {
              got.dst = poisoned(formats.dst, Shape{rows, cols});
              got.scale = poisoned(DType::f32, Shape{scale_count});
            }
            if (mode.transposed) {
              got.dst_transposed = poisoned(formats.transposed, Shape{cols, rows});
              got.scale_transposed = poisoned(DType::f32, Shape{scale_count_t});
            }
            cuda_->quantize_blocks(got);

            if (mode.dst) {
              const HostTensor codes = download(got.dst), scales = download(got.scale);
              expect_bits_equal(dst, codes, what + ": dst");
              expect_scales_equal(scale, scales, rows, cols, mode.weights, what + ": scale");
              expect_dequantizes_to_source(x, codes, scales, false, mode.weights, what + ": dst");
              if (nan) {  // the NaN's tile (or block) carries a NaN scale
                const int64_t index = mode.weights ? block_scale_index(7, 9, cols) : tile_scale_index(7, 9, rows);
                EXPECT_TRUE(std::isnan(scales.view.as<const float>()[index])) << what << ": NaN did not propagate";
              }
            }
            if (mode.transposed) {
              const HostTensor codes = download(got.dst_transposed), scales = download(got.scale_transposed);
              expect_bits_equal(dst_t, codes, what + ": dst^T");
              expect_scales_equal(scale_t, scales, cols, rows, mode.weights, what + ": scale^T");
              expect_dequantizes_to_source(x, codes, scales, true, mode.weights, what + ": dst^T");
              if (nan) {
                const int64_t index = mode.weights ? block_scale_index(9, 7, rows) : tile_scale_index(9, 7, cols);
                EXPECT_TRUE(std::isnan(scales.view.as<const float>()[index])) << what << ": NaN did not propagate";
              }
            }
            used_ = arena_mark;  // the next case reuses this case's device buffers
          }
}

// ---- GEMMs on block-scaled operands ----------------------------------------------------------

// A K-major (rows, K) float8 operand quantised on the CPU: codes and scales, fed to both backends.
struct BlockOperand {
  HostTensor codes, scale;
};

BlockOperand quantize_operand(Backend& cpu, const HostTensor& source, OperandScaling scaling, DType format) {
  const int64_t rows = source.view.rows(), cols = source.view.cols();
  const bool blocks = scaling == OperandScaling::block_128x128;
  BlockOperand operand{HostTensor(format, Shape{rows, cols}),
                       nan_tensor(DType::f32, Shape{blocks ? block_scale_count(rows, cols) : tile_scale_count(rows, cols)})};
  BlockQuantizeArgs args;
  args.src = source.view;
  args.dst = operand.codes.view;
  args.scale = operand.scale.view;
  args.weight_blocks = blocks;
  cpu.quantize_blocks(args);
  return operand;
}

struct Pairing {
  OperandScaling scaling_a;
  DType a;
  OperandScaling scaling_b;
  DType b;
  const char* what;
};
// The blockwise recipe's GEMMs (a @ b^T): forward x @ W^T, grad-input dy @ W (W^T quantised in its
// own blocks), grad-weight dy^T @ x^T (both in 1x128 tiles along the tokens), and blocks on a.
const Pairing kPairings[] = {
    {OperandScaling::tile_1x128, DType::e4m3, OperandScaling::block_128x128, DType::e4m3, "forward (a tiles, b blocks)"},
    {OperandScaling::tile_1x128, DType::e5m2, OperandScaling::block_128x128, DType::e4m3,
     "grad-input (a e5m2 tiles, b blocks)"},
    {OperandScaling::tile_1x128, DType::e5m2, OperandScaling::tile_1x128, DType::e4m3,
     "grad-weight (a e5m2 tiles, b tiles)"},
    {OperandScaling::block_128x128, DType::e4m3, OperandScaling::tile_1x128, DType::e4m3, "a blocks, b tiles"}};

struct GemmShape {
  int64_t m, n, k;
};
// K = 384: three column blocks, the 128x128 scale stride padded to four.
const GemmShape kGemmShapes[] = {{256, 384, 512}, {256, 384, 384}};

// Norm-wise relative error within `norm_tolerance`, and every element within
// `element_tolerance` * max |want| (the output's scale); NaN anywhere fails.
void expect_gemm_close(const HostTensor& want, const HostTensor& got, double norm_tolerance, double element_tolerance,
                       const std::string& what) {
  expect_close(want, got, norm_tolerance, what);
  double largest = 0, worst = 0;
  int64_t worst_index = 0;
  for (int64_t i = 0; i < want.numel(); ++i) largest = std::max(largest, std::fabs(want.get(i)));
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double difference = std::fabs(got.get(i) - want.get(i));
    if (!(difference <= worst)) worst = difference, worst_index = i;
  }
  EXPECT_LE(worst, element_tolerance * largest)
      << what << ": element " << worst_index << " is off by " << worst << " (want " << want.get(worst_index)
      << ", got " << got.get(worst_index) << "), above " << element_tolerance << " * max |out| = " << largest;
}

GemmArgs block_gemm_args(const Pairing& pairing, TensorView a, TensorView scale_a, TensorView b, TensorView scale_b,
                         TensorView out) {
  GemmArgs args = gemm_args(a, false, b, true, out);
  args.scale_a = scale_a;
  args.scaling_a = pairing.scaling_a;
  args.scale_b = scale_b;
  args.scaling_b = pairing.scaling_b;
  return args;
}

TEST_F(CudaFloat8Blocks, BlockScaledGemmsMatchCpu) {
  uint64_t seed = 301;
  for (const GemmShape shape : kGemmShapes)
    for (const Pairing& pairing : kPairings)
      for (DType out_dtype : {DType::bf16, DType::f32}) {
        const size_t arena_mark = used_;
        const std::string what = std::string(pairing.what) + ", M " + std::to_string(shape.m) + " N " +
                                 std::to_string(shape.n) + " K " + std::to_string(shape.k) + " -> " +
                                 std::string(dtype_name(out_dtype));
        const HostTensor a_source = block_source(DType::bf16, shape.m, shape.k, seed++);
        const HostTensor b_source = block_source(DType::bf16, shape.n, shape.k, seed++);
        const BlockOperand a = quantize_operand(*cpu_, a_source, pairing.scaling_a, pairing.a);
        const BlockOperand b = quantize_operand(*cpu_, b_source, pairing.scaling_b, pairing.b);

        HostTensor want = nan_tensor(out_dtype, Shape{shape.m, shape.n});
        cpu_->gemm(block_gemm_args(pairing, a.codes.view, a.scale.view, b.codes.view, b.scale.view, want.view));
        const TensorView out = poisoned(out_dtype, Shape{shape.m, shape.n});
        cuda_->gemm(block_gemm_args(pairing, upload(a.codes), upload(a.scale), upload(b.codes), upload(b.scale), out));

        // Both sides multiply the same codes by the same scales; they differ in summation order
        // (and the tensor cores' accumulation), plus bf16's rounding of the output.
        const bool bf16 = out_dtype == DType::bf16;
        expect_gemm_close(want, download(out), bf16 ? 1e-2 : 1e-3, bf16 ? 1e-2 : 2e-3, what);
        used_ = arena_mark;
      }
}

// The message of the Error `call` throws ("" when it throws none).
template <typename Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST_F(CudaFloat8Blocks, BlockScaledGemmRejectsWhatCublasCannotRun) {
  const int64_t m = 128, n = 256, k = 256;
  const BlockOperand a_tiles = quantize_operand(*cpu_, block_source(DType::bf16, m, k, 7), OperandScaling::tile_1x128, DType::e4m3);
  const BlockOperand a_blocks =
      quantize_operand(*cpu_, block_source(DType::bf16, m, k, 7), OperandScaling::block_128x128, DType::e4m3);
  const BlockOperand b_blocks =
      quantize_operand(*cpu_, block_source(DType::bf16, n, k, 8), OperandScaling::block_128x128, DType::e4m3);
  const TensorView out = poisoned(DType::bf16, Shape{m, n});
  const Pairing forward = kPairings[0];

  // Fast accumulation: cuBLASLt has no block-scaled kernel with it.
  GemmArgs fast = block_gemm_args(forward, upload(a_tiles.codes), upload(a_tiles.scale), upload(b_blocks.codes),
                                  upload(b_blocks.scale), out);
  fast.fast_accumulation = true;
  EXPECT_THROW(cuda_->gemm(fast), Error);
  EXPECT_NE(error_of([&] { cuda_->gemm(fast); }).find("fast_accumulation"), std::string::npos)
      << error_of([&] { cuda_->gemm(fast); });

  // 128x128 blocks on both operands.
  const Pairing both_blocks{OperandScaling::block_128x128, DType::e4m3, OperandScaling::block_128x128, DType::e4m3,
                            "blocks on both"};
  const GemmArgs blocks = block_gemm_args(both_blocks, upload(a_blocks.codes), upload(a_blocks.scale),
                                          upload(b_blocks.codes), upload(b_blocks.scale), out);
  EXPECT_THROW(cuda_->gemm(blocks), Error);
  EXPECT_NE(error_of([&] { cuda_->gemm(blocks); }).find("block_128x128"), std::string::npos);

  // A block scaling next to a tensorwise one.
  GemmArgs mixed = fast;
  mixed.fast_accumulation = false;
  mixed.scaling_a = OperandScaling::tensorwise;
  mixed.scale_a = upload(nan_tensor(DType::f32, Shape{1}));
  EXPECT_THROW(cuda_->gemm(mixed), Error);

  // A scale vector of the wrong size for its layout (tiles counted as blocks).
  GemmArgs short_scale = fast;
  short_scale.fast_accumulation = false;
  short_scale.scale_b = upload(a_tiles.scale);  // m * ceil(k / 128) floats, not b's block count
  EXPECT_THROW(cuda_->gemm(short_scale), Error);
}

}  // namespace
}  // namespace smelt::test
