// Float8 ops on the GPU: amax (tensorwise or per row), quantize to e4m3/e5m2 with a scale,
// dequantize back. Element rounding is core/numerics.h's, so results are bit-identical to
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
  expect_scale(args.amax, rows, args.rowwise, op, "amax");
  dispatch_activation(args.x.dtype, op, [&](auto element) {
    using T = decltype(element);
    auto* bits = args.amax.as<uint32_t>();
    if (args.rowwise) {
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
  expect_scale(args.scale, rows, args.rowwise, op, "scale");
  dispatch_activation(args.src.dtype, op, [&](auto element) {
    using T = decltype(element);
    quantize_elements<T><<<grid_for(count, 256, context.multiprocessors), 256, 0, context.stream>>>(
        args.src.as<T>(), args.dst.as<uint8_t>(), args.scale.as<float>(), count, cols, args.rowwise, format);
    SMELT_CUDA_LAUNCH_CHECK("quantize_elements");
  });
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
