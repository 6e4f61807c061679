// Float8 ops on the GPU: amax (tensorwise, per row, per column, or rows and columns in one pass),
// scale from amax, quantize to e4m3/e5m2 (scale read, or computed from amax inside the cast;
// row-major, transposed, or both from one read) and dequantize. Element rounding is
// core/numerics.h's, so results are bit-identical to the CPU reference.
#include "core/numerics.h"
#include "cuda/cuda_common.cuh"
#include "cuda/vector_access.cuh"

namespace smelt::cuda {
namespace {

// 16 codes as one 16-byte store.
__device__ __forceinline__ void store_codes(uint8_t* p, const uint8_t (&codes)[16]) {
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    words[i] = uint32_t(codes[4 * i]) | uint32_t(codes[4 * i + 1]) << 8 | uint32_t(codes[4 * i + 2]) << 16 |
               uint32_t(codes[4 * i + 3]) << 24;
  *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
}

// The codes of 16 values times `scale` as one 16-byte store, bit-identical to float_to_float8 on
// each. Without a NaN among them (the usual case) pairs go through the two-element hardware
// conversion (cvt.rn.satfinite ...x2: rounding and saturation as float_to_float8, infinities to
// the largest finite value), far fewer instructions than one element at a time, which the casts
// were short of (the bf16 cast + transpose ran 39% faster); a NaN takes float_to_float8 for all
// 16, as the pair conversion does not keep a NaN's sign.
__device__ __forceinline__ void store_scaled_codes(uint8_t* p, const float (&values)[16], float scale,
                                                   Float8Format format) {
  float scaled[16];
  uint32_t largest = 0;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    scaled[j] = values[j] * scale;
    largest = max(largest, magnitude_bits(scaled[j]));
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (largest <= numerics_detail::kFloatInfinityBits) {
    const __nv_fp8_interpretation_t kind = format == Float8Format::e4m3 ? __NV_E4M3 : __NV_E5M2;
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // the lower byte of each pair is the earlier element
      const uint32_t low = __nv_cvt_float2_to_fp8x2(make_float2(scaled[4 * i], scaled[4 * i + 1]), __NV_SATFINITE, kind);
      const uint32_t high =
          __nv_cvt_float2_to_fp8x2(make_float2(scaled[4 * i + 2], scaled[4 * i + 3]), __NV_SATFINITE, kind);
      words[i] = low | high << 16;
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
    return;
  }
#endif
  uint8_t codes[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) codes[j] = float_to_float8(scaled[j], format);
  store_codes(p, codes);
}

// ---- amax ------------------------------------------------------------------------------------

// Tensorwise: amax[0] must be 0 before the launch (memset); one atomicMax per block. Vector
// loads over the first count - count % 8 elements, the tail by the first block.
template <typename T, bool Vectorized>
__global__ void amax_tensor(const T* x, int64_t count, uint32_t* amax_bits) {
  uint32_t maximum = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (Vectorized) {
    const int64_t vectors = count / kVector;
    for (int64_t v = first; v < vectors; v += stride) {
      float values[kVector];
      load_vector(x + v * kVector, values);
#pragma unroll
      for (int i = 0; i < kVector; ++i) maximum = max(maximum, magnitude_bits(values[i]));
    }
    if (blockIdx.x == 0)
      for (int64_t i = vectors * kVector + threadIdx.x; i < count; i += blockDim.x)
        maximum = max(maximum, magnitude_bits(load_float(x, i)));
  } else {
    for (int64_t i = first; i < count; i += stride) maximum = max(maximum, magnitude_bits(load_float(x, i)));
  }
  maximum = block_max_bits(maximum);
  if (threadIdx.x == 0) atomicMax(amax_bits, maximum);
}

// Rowwise: one block per row (no atomics, no memset).
template <typename T, bool Vectorized>
__global__ void amax_rows(const T* x, int64_t cols, uint32_t* amax_bits) {
  const T* row = x + int64_t(blockIdx.x) * cols;
  uint32_t maximum = 0;
  if (Vectorized) {
    for (int64_t c = int64_t(threadIdx.x) * kVector; c < cols; c += int64_t(blockDim.x) * kVector) {
      float values[kVector];
      load_vector(row + c, values);
#pragma unroll
      for (int i = 0; i < kVector; ++i) maximum = max(maximum, magnitude_bits(values[i]));
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) maximum = max(maximum, magnitude_bits(load_float(row, c)));
  }
  maximum = block_max_bits(maximum);
  if (threadIdx.x == 0) amax_bits[blockIdx.x] = maximum;
}

// Per row and per column from one read, over tiles of 64 rows x 256 * Vectors columns: block
// (32, 8), each thread Vectors x 8 columns (256 apart) of 8 rows. Row maxima reduce across the
// warp, column maxima across the block's 8 warps; one atomicMax per row and per column of the tile.
// Vectors = 2 halves the row reductions per element, which wide bf16 activations are short of
// (8192 x 14336: 2.6 -> 3.2 TB/s); it needs vector loads, cols a multiple of its 512 columns and
// enough tiles to fill the GPU. Both outputs must be zeroed before the launch; either may be null.
constexpr int kStripRows = 64, kStripColumns = 256;

template <typename T, bool Vectorized, int Vectors>
__global__ void amax_rows_and_columns(const T* x, int64_t rows, int64_t cols, uint32_t* row_bits,
                                      uint32_t* column_bits) {
  constexpr int kTileColumns = kStripColumns * Vectors;
  __shared__ uint32_t column_partial[8][kTileColumns];
  const int64_t tile_column0 = int64_t(blockIdx.x) * kTileColumns;
  const int64_t row0 = int64_t(blockIdx.y) * kStripRows;
  uint32_t column_maximum[Vectors][kVector] = {};
  for (int i = 0; i < kStripRows / 8; ++i) {
    const int64_t r = row0 + threadIdx.y + 8 * i;
    if (r >= rows) break;  // rows are uniform across the warp
    uint32_t row_maximum = 0;
#pragma unroll
    for (int v = 0; v < Vectors; ++v) {
      const int64_t column0 = tile_column0 + v * kStripColumns + threadIdx.x * kVector;
      float values[kVector];
      // Vectors > 1 needs cols a multiple of the tile's columns: no bounds check between the loads.
      if (Vectorized && (Vectors > 1 || column0 < cols)) {
        load_vector(x + r * cols + column0, values);
      } else {
#pragma unroll
        for (int j = 0; j < kVector; ++j) values[j] = column0 + j < cols ? load_float(x, r * cols + column0 + j) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kVector; ++j) {
        const uint32_t bits = magnitude_bits(values[j]);
        row_maximum = max(row_maximum, bits);
        column_maximum[v][j] = max(column_maximum[v][j], bits);
      }
    }
    row_maximum = warp_max_bits(row_maximum);
    if (row_bits && threadIdx.x == 0) atomicMax(row_bits + r, row_maximum);
  }
#pragma unroll
  for (int v = 0; v < Vectors; ++v)
#pragma unroll
    for (int j = 0; j < kVector; ++j)
      column_partial[threadIdx.y][v * kStripColumns + threadIdx.x * kVector + j] = column_maximum[v][j];
  __syncthreads();
  if (!column_bits) return;
  for (int c = threadIdx.y * 32 + threadIdx.x; c < kTileColumns; c += 256) {
    uint32_t maximum = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) maximum = max(maximum, column_partial[k][c]);
    const int64_t column = tile_column0 + c;
    if (column < cols) atomicMax(column_bits + column, maximum);
  }
}

// ---- quantize --------------------------------------------------------------------------------

// Where one output's scales come from: given (`scale`), or computed from `amax` in the kernel
// and written to `scale_out` by the thread that owns index 0 of its row (or of the tensor).
struct ScaleSource {
  const float* scale = nullptr;
  const float* amax = nullptr;
  float* scale_out = nullptr;
  Float8Format format = Float8Format::e4m3;
  bool rowwise = false, power_of_two = false;

  __device__ __forceinline__ float get(int64_t index) const {
    const int64_t i = rowwise ? index : 0;
    return amax ? amax_to_scale(amax[i], format, power_of_two) : scale[i];
  }
  // Writes the computed scale; `owner` is true for exactly one thread per scale.
  __device__ __forceinline__ void publish(int64_t index, float value, bool owner) const {
    if (scale_out && owner) scale_out[rowwise ? index : 0] = value;
  }
};

// Row-major cast, 16 elements per thread (two vector loads, one 16-byte store). Needs count a
// multiple of 16 (cols too when rowwise) and 16-byte aligned pointers.
template <typename T>
__global__ void quantize_vectorized(const T* src, uint8_t* dst, int64_t count, int64_t cols, ScaleSource source) {
  for (int64_t chunk = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; chunk * 16 < count;
       chunk += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = chunk * 16, row = i / cols;
    const float scale = source.get(row);
    source.publish(row, scale, source.rowwise ? i % cols == 0 : i == 0);
    float values[16];
    load_vector(src + i, *reinterpret_cast<float(*)[kVector]>(values));
    load_vector(src + i + kVector, *reinterpret_cast<float(*)[kVector]>(values + kVector));
    store_scaled_codes(dst + i, values, scale, source.format);
  }
}

// Any shape: one element per thread.
template <typename T>
__global__ void quantize_elements(const T* src, uint8_t* dst, int64_t count, int64_t cols, ScaleSource source) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols;
    const float scale = source.get(row);
    source.publish(row, scale, source.rowwise ? i % cols == 0 : i == 0);
    dst[i] = float_to_float8(load_float(src, i) * scale, source.format);
  }
}

// Cast + transpose over 64 x 64 tiles, 256 threads: each thread reads 16 consecutive elements
// of one src row (and writes them to `dst` row-major when asked, 16-byte store), then 16
// consecutive src rows of one column from shared memory into a 16-byte store of dst_transposed
// (cols, rows). Needs rows and cols multiples of 16 and 16-byte aligned pointers.
constexpr int kCastTile = 64;

template <typename T>
__global__ void quantize_tile(const T* src, int64_t rows, int64_t cols, uint8_t* dst, ScaleSource row_source,
                              uint8_t* dst_transposed, ScaleSource column_source) {
  __shared__ float tile[kCastTile][kCastTile + 1];
  const int64_t row0 = int64_t(blockIdx.y) * kCastTile, column0 = int64_t(blockIdx.x) * kCastTile;
  {
    const int r = threadIdx.x / 4, c = (threadIdx.x % 4) * 16;
    const int64_t row = row0 + r, column = column0 + c;
    if (row < rows && column < cols) {
      float values[16];
      load_vector(src + row * cols + column, *reinterpret_cast<float(*)[kVector]>(values));
      load_vector(src + row * cols + column + kVector, *reinterpret_cast<float(*)[kVector]>(values + kVector));
#pragma unroll
      for (int j = 0; j < 16; ++j) tile[r][c + j] = values[j];
      if (dst) {
        const float scale = row_source.get(row);
        row_source.publish(row, scale, row_source.rowwise ? column == 0 : row == 0 && column == 0);
        store_scaled_codes(dst + row * cols + column, values, scale, row_source.format);
      }
    }
  }
  __syncthreads();
  const int c = threadIdx.x % kCastTile, r = (threadIdx.x / kCastTile) * 16;
  const int64_t row = row0 + r, column = column0 + c;
  if (row >= rows || column >= cols) return;
  const float scale = column_source.get(column);
  column_source.publish(column, scale, column_source.rowwise ? row == 0 : row == 0 && column == 0);
  float values[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) values[j] = tile[r + j][c];
  store_scaled_codes(dst_transposed + column * rows + row, values, scale, column_source.format);
}

// Cast + transpose for any shape: dst (cols, rows) through a 32 x 32 shared tile, one element per thread.
constexpr int kTile = 32;

template <typename T>
__global__ void quantize_transposed(const T* src, uint8_t* dst, int64_t rows, int64_t cols, ScaleSource source) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t column0 = int64_t(blockIdx.x) * kTile, row0 = int64_t(blockIdx.y) * kTile;
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t r = row0 + i, c = column0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = load_float(src, r * cols + c);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t c = column0 + i, r = row0 + threadIdx.x;  // dst row c, dst column r
    if (r >= rows || c >= cols) continue;
    const float scale = source.get(c);
    source.publish(c, scale, source.rowwise ? r == 0 : r == 0 && c == 0);
    dst[c * rows + r] = float_to_float8(tile[threadIdx.x][i] * scale, source.format);
  }
}

// Byte transpose over 64 x 64 tiles, 256 threads: each thread loads 16 bytes of one src row into
// shared memory, then gathers 16 bytes of one src column (a dst row) into a 16-byte store. Needs
// rows and cols multiples of 16 and 16-byte aligned pointers.
__global__ void transpose_tile(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kCastTile][kCastTile + 4];
  const int64_t row0 = int64_t(blockIdx.y) * kCastTile, column0 = int64_t(blockIdx.x) * kCastTile;
  {
    const int r = threadIdx.x / 4, c = (threadIdx.x % 4) * 16;
    const int64_t row = row0 + r, column = column0 + c;
    if (row < rows && column < cols) {
      const uint4 chunk = *reinterpret_cast<const uint4*>(src + row * cols + column);
      const auto* bytes = reinterpret_cast<const uint8_t*>(&chunk);
#pragma unroll
      for (int j = 0; j < 16; ++j) tile[r][c + j] = bytes[j];
    }
  }
  __syncthreads();
  const int c = threadIdx.x % kCastTile, r = (threadIdx.x / kCastTile) * 16;
  const int64_t row = row0 + r, column = column0 + c;
  if (row >= rows || column >= cols) return;
  uint8_t codes[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) codes[j] = tile[r + j][c];
  store_codes(dst + column * rows + row, codes);
}

// Byte transpose for any shape, one element per thread through a 32 x 32 tile.
__global__ void transpose_elements(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t column0 = int64_t(blockIdx.x) * kTile, row0 = int64_t(blockIdx.y) * kTile;
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t r = row0 + i, c = column0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t c = column0 + i, r = row0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][i];
  }
}

__global__ void scales_from_amax(const float* amax, float* scale, int64_t count, Float8Format format, bool power_of_two) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count) scale[i] = amax_to_scale(amax[i], format, power_of_two);
}

template <typename T>
__global__ void dequantize_elements(const uint8_t* src, T* dst, const float* scale, int64_t count, int64_t cols,
                                    bool rowwise, Float8Format format) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float s = scale[rowwise ? i / cols : 0];
    store_float(dst, i, float8_to_float(src[i], format) / s);
  }
}

Float8Format format_of(DType dtype, const char* op) {
  if (dtype == DType::e4m3) return Float8Format::e4m3;
  if (dtype == DType::e5m2) return Float8Format::e5m2;
  fail(ErrorKind::internal, std::string("cuda ") + op + ": expected an e4m3 or e5m2 tensor, found " +
                                std::string(dtype_name(dtype)) + "; pass the float8 side of the conversion");
}

void expect_scale(const TensorView& scale, int64_t rows, bool rowwise, const char* op, const char* name) {
  expect_device(scale, op, name);
  expect_dtype(scale, DType::f32, op, name);
  expect_numel(scale, rowwise ? rows : 1, op, name);
}

// The scale source of one quantize output, checked: `amax` (computed, written to `scale`) or `scale`.
ScaleSource scale_source(const TensorView& amax, const TensorView& scale, int64_t rows, bool rowwise, DType dst,
                         bool power_of_two, const char* op, const char* name) {
  expect_scale(scale, rows, rowwise, op, name);
  ScaleSource source;
  source.format = format_of(dst, op);
  source.rowwise = rowwise;
  source.power_of_two = power_of_two;
  if (amax.empty()) {
    source.scale = scale.as<float>();
    return source;
  }
  expect_scale(amax, rows, rowwise, op, name);
  if (amax.data == scale.data)
    fail(ErrorKind::internal, std::string("cuda quantize: the amax and the ") + name +
                                  " it is turned into share memory; pass a separate scale view (other threads still "
                                  "read the amax while one writes the scale)");
  source.amax = amax.as<float>();
  source.scale_out = scale.as<float>();
  return source;
}

}  // namespace

void amax(CudaContext& context, const AmaxArgs& args) {
  const char* op = "amax";
  expect_device(args.x, op, "x");
  const int64_t rows = args.x.rows(), cols = args.x.cols();
  const bool by_column = args.rowwise && args.transpose;
  if (args.amax.empty() && args.column_amax.empty())
    fail(ErrorKind::internal, "cuda amax: expected amax or column_amax to write, found neither");
  if (!args.amax.empty()) expect_scale(args.amax, by_column ? cols : rows, args.rowwise, op, "amax");
  if (!args.column_amax.empty()) expect_scale(args.column_amax, cols, true, op, "column_amax");
  if (rows == 0 || cols == 0) return;
  // Which outputs the rows-and-columns kernel writes (null: not asked for).
  uint32_t* row_bits = nullptr;
  uint32_t* column_bits = args.column_amax.empty() ? nullptr : args.column_amax.as<uint32_t>();
  if (by_column) column_bits = args.amax.as<uint32_t>();
  else if (args.rowwise && column_bits) row_bits = args.amax.as<uint32_t>();
  const bool vectorized = aligned16(args.x.data) && cols % kVector == 0;
  dispatch_activation(args.x.dtype, op, [&](auto element) {
    using T = decltype(element);
    const T* x = args.x.as<T>();
    if (!args.amax.empty() && !args.rowwise) {  // tensorwise (a column amax, if asked, below)
      auto* bits = args.amax.as<uint32_t>();
      SMELT_CUDA_CHECK(cudaMemsetAsync(bits, 0, sizeof(uint32_t), context.stream));
      const unsigned grid = grid_for((args.x.numel() + kVector - 1) / kVector, 256, context.multiprocessors);
      if (aligned16(args.x.data)) amax_tensor<T, true><<<grid, 256, 0, context.stream>>>(x, args.x.numel(), bits);
      else amax_tensor<T, false><<<grid, 256, 0, context.stream>>>(x, args.x.numel(), bits);
      SMELT_CUDA_LAUNCH_CHECK("amax_tensor");
    } else if (args.rowwise && !by_column && !column_bits) {  // rows only: a block per row
      auto* bits = args.amax.as<uint32_t>();
      if (vectorized) amax_rows<T, true><<<unsigned(rows), 256, 0, context.stream>>>(x, cols, bits);
      else amax_rows<T, false><<<unsigned(rows), 256, 0, context.stream>>>(x, cols, bits);
      SMELT_CUDA_LAUNCH_CHECK("amax_rows");
    }
    if (!column_bits) return;
    if (row_bits) SMELT_CUDA_CHECK(cudaMemsetAsync(row_bits, 0, size_t(rows) * sizeof(uint32_t), context.stream));
    SMELT_CUDA_CHECK(cudaMemsetAsync(column_bits, 0, size_t(cols) * sizeof(uint32_t), context.stream));
    const int64_t row_tiles = (rows + kStripRows - 1) / kStripRows;
    const dim3 block(32, 8);
    // Two vectors per thread where the wider tiles still make four blocks per multiprocessor.
    if (vectorized && cols % (2 * kStripColumns) == 0 &&
        cols / (2 * kStripColumns) * row_tiles >= 4 * int64_t(context.multiprocessors)) {
      const dim3 grid(unsigned(cols / (2 * kStripColumns)), unsigned(row_tiles));
      amax_rows_and_columns<T, true, 2><<<grid, block, 0, context.stream>>>(x, rows, cols, row_bits, column_bits);
    } else {
      const dim3 grid(unsigned((cols + kStripColumns - 1) / kStripColumns), unsigned(row_tiles));
      if (vectorized)
        amax_rows_and_columns<T, true, 1><<<grid, block, 0, context.stream>>>(x, rows, cols, row_bits, column_bits);
      else
        amax_rows_and_columns<T, false, 1><<<grid, block, 0, context.stream>>>(x, rows, cols, row_bits, column_bits);
    }
    SMELT_CUDA_LAUNCH_CHECK("amax_rows_and_columns");
  });
}

void quantize(CudaContext& context, const QuantizeArgs& args) {
  const char* op = "quantize";
  expect_device(args.src, op, "src");
  expect_device(args.dst, op, "dst");
  const int64_t count = args.src.numel(), rows = args.src.rows(), cols = args.src.cols();
  expect_numel(args.dst, count, op, "dst");
  if (args.transpose && (args.dst.rows() != cols || args.dst.cols() != rows))
    fail(ErrorKind::internal, "cuda quantize: expected dst of src transposed, (" + std::to_string(cols) + ", " +
                                  std::to_string(rows) + "), found " + args.dst.str() + "; pass a (cols, rows) view");
  const ScaleSource dst_source = scale_source(args.amax, args.scale, args.transpose ? cols : rows, args.rowwise,
                                              args.dst.dtype, args.round_scale_to_power_of_two, op, "scale");
  // The row-major output and the transposed one (either may be absent).
  uint8_t* row_major = args.transpose ? nullptr : args.dst.as<uint8_t>();
  uint8_t* transposed = args.transpose ? args.dst.as<uint8_t>() : nullptr;
  ScaleSource row_source = dst_source, column_source = dst_source;
  if (!args.dst_transposed.empty()) {
    if (args.transpose)
      fail(ErrorKind::internal, "cuda quantize: dst_transposed needs transpose = false (dst is already transposed)");
    expect_device(args.dst_transposed, op, "dst_transposed");
    if (args.dst_transposed.rows() != cols || args.dst_transposed.cols() != rows)
      fail(ErrorKind::internal, "cuda quantize: expected dst_transposed of src transposed, (" + std::to_string(cols) +
                                    ", " + std::to_string(rows) + "), found " + args.dst_transposed.str());
    transposed = args.dst_transposed.as<uint8_t>();
    column_source = scale_source(args.amax_transposed, args.scale_transposed, cols, args.rowwise,
                                 args.dst_transposed.dtype, args.round_scale_to_power_of_two, op, "scale_transposed");
  }
  if (count == 0) return;
  const bool aligned = aligned16(args.src.data) && aligned16(row_major) && aligned16(transposed);
  dispatch_activation(args.src.dtype, op, [&](auto element) {
    using T = decltype(element);
    const T* src = args.src.as<T>();
    if (transposed) {
      if (aligned && rows % 16 == 0 && cols % 16 == 0) {
        const dim3 grid(unsigned((cols + kCastTile - 1) / kCastTile), unsigned((rows + kCastTile - 1) / kCastTile));
        quantize_tile<T><<<grid, 256, 0, context.stream>>>(src, rows, cols, row_major, row_source, transposed,
                                                           column_source);
        SMELT_CUDA_LAUNCH_CHECK("quantize_tile");
        return;
      }
      const dim3 grid(unsigned((cols + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile)), block(kTile, 8);
      quantize_transposed<T><<<grid, block, 0, context.stream>>>(src, transposed, rows, cols, column_source);
      SMELT_CUDA_LAUNCH_CHECK("quantize_transposed");
      if (!row_major) return;
    }
    if (aligned && count % 16 == 0 && (!args.rowwise || cols % 16 == 0)) {
      quantize_vectorized<T><<<grid_for(count / 16, 256, context.multiprocessors), 256, 0, context.stream>>>(
          src, row_major, count, cols, row_source);
      SMELT_CUDA_LAUNCH_CHECK("quantize_vectorized");
      return;
    }
    quantize_elements<T><<<grid_for(count, 256, context.multiprocessors), 256, 0, context.stream>>>(
        src, row_major, count, cols, row_source);
    SMELT_CUDA_LAUNCH_CHECK("quantize_elements");
  });
}

void scale_from_amax(CudaContext& context, const ScaleFromAmaxArgs& args) {
  const char* op = "scale_from_amax";
  expect_device(args.amax, op, "amax");
  expect_device(args.scale, op, "scale");
  expect_dtype(args.amax, DType::f32, op, "amax");
  expect_dtype(args.scale, DType::f32, op, "scale");
  const int64_t count = args.amax.numel();
  expect_numel(args.scale, count, op, "scale");
  const Float8Format format = format_of(args.format, op);
  scales_from_amax<<<unsigned((count + 255) / 256), 256, 0, context.stream>>>(
      args.amax.as<float>(), args.scale.as<float>(), count, format, args.round_to_power_of_two);
  SMELT_CUDA_LAUNCH_CHECK("scales_from_amax");
}

void transpose(CudaContext& context, const TransposeArgs& args) {
  const char* op = "transpose";
  expect_device(args.src, op, "src");
  expect_device(args.dst, op, "dst");
  format_of(args.src.dtype, op);
  const int64_t rows = args.src.rows(), cols = args.src.cols();
  if (args.dst.dtype != args.src.dtype || args.dst.rows() != cols || args.dst.cols() != rows)
    fail(ErrorKind::internal, "cuda transpose: expected dst of src transposed, " + std::string(dtype_name(args.src.dtype)) +
                                  " (" + std::to_string(cols) + ", " + std::to_string(rows) + "), found " + args.dst.str());
  if (rows == 0 || cols == 0) return;
  const uint8_t* src = args.src.as<uint8_t>();
  uint8_t* dst = args.dst.as<uint8_t>();
  if (aligned16(src) && aligned16(dst) && rows % 16 == 0 && cols % 16 == 0) {
    const dim3 grid(unsigned((cols + kCastTile - 1) / kCastTile), unsigned((rows + kCastTile - 1) / kCastTile));
    transpose_tile<<<grid, 256, 0, context.stream>>>(src, dst, rows, cols);
    SMELT_CUDA_LAUNCH_CHECK("transpose_tile");
    return;
  }
  const dim3 grid(unsigned((cols + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile)), block(kTile, 8);
  transpose_elements<<<grid, block, 0, context.stream>>>(src, dst, rows, cols);
  SMELT_CUDA_LAUNCH_CHECK("transpose_elements");
}

void dequantize(CudaContext& context, const DequantizeArgs& args) {
  const char* op = "dequantize";
  expect_device(args.src, op, "src");
  expect_device(args.dst, op, "dst");
  const Float8Format format = format_of(args.src.dtype, op);
  const int64_t count = args.src.numel(), rows = args.src.rows(), cols = args.src.cols();
  expect_numel(args.dst, count, op, "dst");
  expect_scale(args.scale, rows, args.rowwise, op, "scale");
  dispatch_activation(args.dst.dtype, op, [&](auto element) {
    using T = decltype(element);
    dequantize_elements<T><<<grid_for(count, 256, context.multiprocessors), 256, 0, context.stream>>>(
        args.src.as<uint8_t>(), args.dst.as<T>(), args.scale.as<float>(), count, cols, args.rowwise, format);
    SMELT_CUDA_LAUNCH_CHECK("dequantize_elements");
  });
}

}  // namespace smelt::cuda
