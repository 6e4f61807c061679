// CPU reference of block-scaled float8 (the blockwise recipe): quantisation into 1x128 tiles or
// 128x128 blocks and dequantisation back, plain loops over tiles with core/float8_blocks.h's
// indexing and rounding, which the CUDA kernels share.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/float8_blocks.h"
#include "core/numerics.h"
#include "cpu/fp8.h"
#include "cpu/fp8_elements.h"

namespace smelt::cpu {
namespace {

[[noreturn]] void reject(const std::string& op, const std::string& message) {
  fail(ErrorKind::internal, "cpu::" + op + ": " + message);
}

void require(bool condition, const std::string& op, const std::string& message) {
  if (!condition) reject(op, message);
}

// max |x| over [r0, r1) x [c0, c1); NaN sticks (as cpu::amax).
float region_amax(const TensorView& x, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t cols = x.cols();
  float maximum = 0.0f;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const float magnitude = std::fabs(load_float(x, r * cols + c));
      if (std::isnan(magnitude) || magnitude > maximum) maximum = magnitude;
    }
  return maximum;
}

void check_output(const TensorView& dst, const TensorView& scale, int64_t rows, int64_t cols, int64_t scale_count,
                  const char* name) {
  const std::string op = "quantize_blocks";
  require(dst.device == Device::cpu && scale.device == Device::cpu, op,
          std::string(name) + " and its scale must live on the CPU, found " + dst.str() + " and " + scale.str());
  require(is_float8(dst.dtype), op, std::string(name) + " must be e4m3 or e5m2, found " + dst.str());
  require(dst.rows() == rows && dst.cols() == cols, op,
          std::string(name) + " must be (" + std::to_string(rows) + ", " + std::to_string(cols) + "), found " +
              dst.str());
  require(scale.dtype == DType::f32 && scale.numel() == scale_count, op,
          std::string(name) + "'s scale must be f32 of " + std::to_string(scale_count) +
              " values (core/float8_blocks.h), found " + scale.str());
}

}  // namespace

int64_t block_scaled_scale_count(OperandScaling scaling, int64_t rows, int64_t cols) {
  if (scaling == OperandScaling::tile_1x128) return tile_scale_count(rows, cols);
  if (scaling == OperandScaling::block_128x128) return block_scale_count(rows, cols);
  reject("block_scaled_scale_count", "expected tile_1x128 or block_128x128 scaling");
}

void quantize_blocks(const BlockQuantizeArgs& args) {
  const std::string op = "quantize_blocks";
  require(!args.src.empty() && args.src.device == Device::cpu, op, "src must be a view onto CPU memory, found " + args.src.str());
  require(args.src.dtype == DType::f32 || args.src.dtype == DType::bf16 || args.src.dtype == DType::f64, op,
          "src must be f32, bf16 or f64, found " + args.src.str());
  require(!args.dst.empty() || !args.dst_transposed.empty(), op, "expected dst or dst_transposed to write, found neither");
  const int64_t rows = args.src.rows(), cols = args.src.cols();
  const int64_t row_blocks = float8_block_count(rows), col_blocks = float8_block_count(cols);
  if (!args.dst.empty())
    check_output(args.dst, args.scale, rows, cols,
                 args.weight_blocks ? block_scale_count(rows, cols) : tile_scale_count(rows, cols), "dst");
  if (!args.dst_transposed.empty())
    check_output(args.dst_transposed, args.scale_transposed, cols, rows,
                 args.weight_blocks ? block_scale_count(cols, rows) : tile_scale_count(cols, rows), "dst_transposed");

  auto quantize_region = [&](const TensorView& dst, float* scale_out, int64_t scale_index, bool transposed, int64_t r0,
                             int64_t r1, int64_t c0, int64_t c1) {
    const Float8Format format = float8_format(dst.dtype);
    const float scale = block_dequantization_scale(region_amax(args.src, r0, r1, c0, c1), format);
    scale_out[scale_index] = scale;
    auto* codes = dst.as<uint8_t>();
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c)
        codes[transposed ? c * rows + r : r * cols + c] = block_quantize(load_float(args.src, r * cols + c), scale, format);
  };

  if (args.weight_blocks) {  // both outputs: the same 128x128 regions of src
    for (int64_t br = 0; br < row_blocks; ++br)
      for (int64_t bc = 0; bc < col_blocks; ++bc) {
        const int64_t r0 = br * kFloat8BlockSize, r1 = std::min(rows, r0 + kFloat8BlockSize);
        const int64_t c0 = bc * kFloat8BlockSize, c1 = std::min(cols, c0 + kFloat8BlockSize);
        if (!args.dst.empty())
          quantize_region(args.dst, args.scale.as<float>(), block_scale_index(r0, c0, cols), false, r0, r1, c0, c1);
        if (!args.dst_transposed.empty())
          quantize_region(args.dst_transposed, args.scale_transposed.as<float>(), block_scale_index(c0, r0, rows), true,
                          r0, r1, c0, c1);
      }
    return;
  }
  // Activations: dst's tiles are 1x128 along src's rows; dst_transposed's are 128x1 columns of src.
  if (!args.dst.empty())
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t bc = 0; bc < col_blocks; ++bc) {
        const int64_t c0 = bc * kFloat8BlockSize, c1 = std::min(cols, c0 + kFloat8BlockSize);
        quantize_region(args.dst, args.scale.as<float>(), tile_scale_index(r, c0, rows), false, r, r + 1, c0, c1);
      }
  if (!args.dst_transposed.empty())
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t br = 0; br < row_blocks; ++br) {
        const int64_t r0 = br * kFloat8BlockSize, r1 = std::min(rows, r0 + kFloat8BlockSize);
        quantize_region(args.dst_transposed, args.scale_transposed.as<float>(), tile_scale_index(c, r0, cols), true, r0,
                        r1, c, c + 1);
      }
}

void dequantize_blocks(const TensorView& src, const TensorView& scale, OperandScaling scaling, float* dst) {
  const std::string op = "dequantize_blocks";
  require(is_float8(src.dtype) && src.device == Device::cpu, op, "src must be e4m3 or e5m2 on the CPU, found " + src.str());
  const int64_t rows = src.rows(), cols = src.cols();
  require(scale.dtype == DType::f32 && scale.numel() == block_scaled_scale_count(scaling, rows, cols), op,
          "scale must be f32 of " + std::to_string(block_scaled_scale_count(scaling, rows, cols)) + " values for " +
              src.str() + ", found " + scale.str());
  const Float8Format format = float8_format(src.dtype);
  const auto* codes = src.as<const uint8_t>();
  const float* scales = scale.as<const float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t s = scaling == OperandScaling::tile_1x128 ? tile_scale_index(r, c, rows) : block_scale_index(r, c, cols);
      dst[r * cols + c] = float8_to_float(codes[r * cols + c], format) * scales[s];
    }
}

}  // namespace smelt::cpu
