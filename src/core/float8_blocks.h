// Block-scaled float8 (DeepSeek-V3's recipe, smelt's `blockwise`): where each scale of a
// 1x128-tile or 128x128-block scaled operand lives, and the rule that turns a block's amax into
// its scale and its elements into codes. One header for host C++ and CUDA device code, so the CPU
// emulation and the CUDA kernels index and round alike.
//
// An operand is K-major, (rows, cols) with cols = K. Its scales are dequantisation factors
// (value ~= code * scale), the convention cuBLASLt's VEC128_32F / BLK128x128_32F modes read
// directly: scale = max(amax, 1e-12) / float8_max, code = float8(value / scale).
//   tile_1x128:    one scale per row and 128 consecutive columns; stored column-major, the
//                  rows of one column tile contiguous: scale[(c / 128) * rows + r].
//   block_128x128: one scale per 128x128 block; stored row-major with the column-block count
//                  padded to a multiple of 4: scale[(r / 128) * ld + c / 128],
//                  ld = round_up(ceil(cols / 128), 4). Padding entries are never read or written.
// Partial tiles and blocks at the edges are allowed (ceil division).
#pragma once
#include <cstdint>

#include "core/numerics.h"

namespace smelt {

constexpr int64_t kFloat8BlockSize = 128;

SMELT_HOST_DEVICE SMELT_FORCE_INLINE int64_t float8_block_count(int64_t n) {
  return (n + kFloat8BlockSize - 1) / kFloat8BlockSize;
}

// 1x128 tiles.
SMELT_HOST_DEVICE SMELT_FORCE_INLINE int64_t tile_scale_count(int64_t rows, int64_t cols) {
  return rows * float8_block_count(cols);
}
SMELT_HOST_DEVICE SMELT_FORCE_INLINE int64_t tile_scale_index(int64_t r, int64_t c, int64_t rows) {
  return (c / kFloat8BlockSize) * rows + r;
}

// 128x128 blocks.
SMELT_HOST_DEVICE SMELT_FORCE_INLINE int64_t block_scale_stride(int64_t cols) {
  return (float8_block_count(cols) + 3) / 4 * 4;
}
SMELT_HOST_DEVICE SMELT_FORCE_INLINE int64_t block_scale_count(int64_t rows, int64_t cols) {
  return float8_block_count(rows) * block_scale_stride(cols);
}
SMELT_HOST_DEVICE SMELT_FORCE_INLINE int64_t block_scale_index(int64_t r, int64_t c, int64_t cols) {
  return (r / kFloat8BlockSize) * block_scale_stride(cols) + c / kFloat8BlockSize;
}

// The dequantisation scale of a block with this amax: max(amax, 1e-12) / float8_max, divided in
// float32 (IEEE, on both backends). NaN amax gives NaN; infinite amax gives infinity (every code
// of the block is then 0 or NaN, as the tensorwise rule gives for an infinite amax).
SMELT_HOST_DEVICE SMELT_FORCE_INLINE float block_dequantization_scale(float amax, Float8Format format) {
  if (amax != amax) return amax;
  const float floored = amax > float(kAmaxFloor) ? amax : float(kAmaxFloor);
  return floored / float8_max(format);
}

// The code of one element of a block with dequantisation scale `scale` (saturating).
SMELT_HOST_DEVICE SMELT_FORCE_INLINE uint8_t block_quantize(float value, float scale, Float8Format format) {
  return float_to_float8(value / scale, format);
}

}  // namespace smelt
