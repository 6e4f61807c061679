// Float8 ops on the GPU: amax (tensorwise, per row or per column), scale from amax, quantize to
// e4m3/e5m2 with a scale (optionally transposed, for K-major GEMM operands), dequantize back. Element rounding is core/numerics.h's, so results are bit-identical to
// the CPU reference.
#include "core/numerics.h"
#include "cuda/cuda_common.cuh"

namespace smelt::cuda {
namespace {

// |x| as float bits: for non-negative floats the unsigned order is the numeric order, and
// every NaN sorts above infinity, so an unsigned max propagates NaN as the CPU loop does.
__device__ __forceinline__ uint32_t magnitude_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

__device__ __forceinline__ uint32_t warp_max_bits(uint32_t value) {
  for (int offset = 16; offset > 0; offset >>= 1) value = max(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Tensorwise: amax[0] must be 0 before the launch (memset); one atomicMax per block.
template <typename T>
__global__ void amax_tensor(const T* x, int64_t count, uint32_t* amax_bits) {
  __shared__ uint32_t shared[32];
  uint32_t maximum = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    maximum = max(maximum, magnitude_bits(load_float(x, i)));
  maximum = warp_max_bits(maximum);
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = maximum;
  __syncthreads();
  if (threadIdx.x < 32) {
    maximum = threadIdx.x < (blockDim.x >> 5) ? shared[threadIdx.x] : 0;
    maximum = warp_max_bits(maximum);
    if (threadIdx.x == 0) atomicMax(amax_bits, maximum);
  }
}

// Rowwise: one block per row.
template <typename T>
__global__ void amax_rows(const T* x, int64_t cols, uint32_t* amax_bits) {
  __shared__ uint32_t shared[32];
  const T* row = x + int64_t(blockIdx.x) * cols;
  uint32_t maximum = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) maximum = max(maximum, magnitude_bits(load_float(row, c)));
  maximum = warp_max_bits(maximum);
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = maximum;
  __syncthreads();
  if (threadIdx.x < 32) {
    maximum = threadIdx.x < (blockDim.x >> 5) ? shared[threadIdx.x] : 0;
    maximum = warp_max_bits(maximum);
    if (threadIdx.x == 0) amax_bits[blockIdx.x] = maximum;
  }
}

// Rowwise over x^T: one thread per column of x (adjacent threads read adjacent columns).
template <typename T>
__global__ void amax_columns(const T* x, int64_t rows, int64_t cols, uint32_t* amax_bits) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  uint32_t maximum = 0;
  for (int64_t r = 0; r < rows; ++r) maximum = max(maximum, magnitude_bits(load_float(x, r * cols + c)));
  amax_bits[c] = maximum;
}

constexpr int kTile = 32;

// dst (cols, rows) = quantised src^T through a shared-memory tile, so reads and writes are
// both coalesced; a rowwise scale is one per dst row (per src column).
template <typename T>
__global__ void quantize_transposed(const T* src, uint8_t* dst, const float* scale, int64_t rows, int64_t cols,
                                    bool rowwise, Float8Format format) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t column0 = int64_t(blockIdx.x) * kTile, row0 = int64_t(blockIdx.y) * kTile;
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t r = row0 + i, c = column0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = load_float(src, r * cols + c);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t c = column0 + i, r = row0 + threadIdx.x;  // dst row c, dst column r
    if (r < rows && c < cols) dst[c * rows + r] = float_to_float8(tile[threadIdx.x][i] * scale[rowwise ? c : 0], format);
  }
}

__global__ void scales_from_amax(const float* amax, float* scale, int64_t count, Float8Format format, bool power_of_two) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count) scale[i] = amax_to_scale(amax[i], format, power_of_two);
}

template <typename T>
__global__ void quantize_elements(const T* src, uint8_t* dst, const float* scale, int64_t count, int64_t cols,
                                  bool rowwise, Float8Format format) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float s = scale[rowwise ? i / cols : 0];
    dst[i] = float_to_float8(load_float(src, i) * s, format);
  }
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

}  // namespace

void amax(CudaContext& context, const AmaxArgs& args) {
  const char* op = "amax";
  expect_device(args.x, op, "x");
  const int64_t rows = args.x.rows(), cols = args.x.cols();
  const bool by_column = args.rowwise && args.transpose;
  expect_scale(args.amax, by_column ? cols : rows, args.rowwise, op, "amax");
  dispatch_activation(args.x.dtype, op, [&](auto element) {
    using T = decltype(element);
    auto* bits = args.amax.as<uint32_t>();
    if (by_column) {
      amax_columns<T><<<unsigned((cols + 255) / 256), 256, 0, context.stream>>>(args.x.as<T>(), rows, cols, bits);
    } else if (args.rowwise) {
      amax_rows<T><<<unsigned(rows), 256, 0, context.stream>>>(args.x.as<T>(), cols, bits);
    } else {
      SMELT_CUDA_CHECK(cudaMemsetAsync(bits, 0, sizeof(uint32_t), context.stream));
      amax_tensor<T><<<grid_for(args.x.numel(), 256, context.multiprocessors), 256, 0, context.stream>>>(
          args.x.as<T>(), args.x.numel(), bits);
    }
    SMELT_CUDA_LAUNCH_CHECK("amax");
  });
}

void quantize(CudaContext& context, const QuantizeArgs& args) {
  const char* op = "quantize";
  expect_device(args.src, op, "src");
  expect_device(args.dst, op, "dst");
  const Float8Format format = format_of(args.dst.dtype, op);
  const int64_t count = args.src.numel(), rows = args.src.rows(), cols = args.src.cols();
  expect_numel(args.dst, count, op, "dst");
  expect_scale(args.scale, args.transpose ? cols : rows, args.rowwise, op, "scale");
  if (args.transpose && (args.dst.rows() != cols || args.dst.cols() != rows))
    fail(ErrorKind::internal, "cuda quantize: expected dst of src transposed, (" + std::to_string(cols) + ", " +
                                  std::to_string(rows) + "), found " + args.dst.str() + "; pass a (cols, rows) view");
  dispatch_activation(args.src.dtype, op, [&](auto element) {
    using T = decltype(element);
    if (args.transpose) {
      const dim3 grid(unsigned((cols + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile)), block(kTile, 8);
      quantize_transposed<T><<<grid, block, 0, context.stream>>>(args.src.as<T>(), args.dst.as<uint8_t>(),
                                                                 args.scale.as<float>(), rows, cols, args.rowwise, format);
      SMELT_CUDA_LAUNCH_CHECK("quantize_transposed");
      return;
    }
    quantize_elements<T><<<grid_for(count, 256, context.multiprocessors), 256, 0, context.stream>>>(
        args.src.as<T>(), args.dst.as<uint8_t>(), args.scale.as<float>(), count, cols, args.rowwise, format);
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
