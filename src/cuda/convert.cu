// Element-wise dtype conversion (f32 <-> bf16, same-dtype copy, or added into f32) and fill on the GPU; the
// bfloat16 rounding is core/numerics.h's, so both backends round identically.
#include "core/numerics.h"
#include "cuda/cuda_common.cuh"

namespace smelt::cuda {
namespace {

__global__ void convert_float_to_bf16(const float* src, uint16_t* dst, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = float_to_bf16(src[i]);
}

__global__ void convert_bf16_to_float(const uint16_t* src, float* dst, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = bf16_to_float(src[i]);
}

// dst += src (widened to f32).
template <typename Source>
__global__ void add_into_float(const Source* src, float* dst, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] += load_float(src, i);
}

template <typename Bits>
__global__ void fill_bits(Bits* dst, Bits bits, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = bits;
}

}  // namespace

void convert(CudaContext& context, const ConvertArgs& args) {
  const char* op = "convert";
  expect_device(args.src, op, "src");
  expect_device(args.dst, op, "dst");
  const int64_t count = args.src.numel();
  expect_numel(args.dst, count, op, "dst");
  const unsigned grid = grid_for(count, 256, context.multiprocessors);
  if (args.accumulate) {  // gradient accumulation: a received shard added to the f32 shard
    if (args.dst.dtype != DType::f32 || args.src.data == args.dst.data)
      fail(ErrorKind::internal, "cuda convert: accumulate adds src into another f32 dst, found " + args.src.str() +
                                    " -> " + args.dst.str() + "; gradients are accumulated in f32");
    dispatch_activation(args.src.dtype, op, [&](auto element) {
      using T = decltype(element);
      add_into_float<T><<<grid, 256, 0, context.stream>>>(args.src.as<T>(), args.dst.as<float>(), count);
      SMELT_CUDA_LAUNCH_CHECK("add_into_float");
    });
    return;
  }
  if (args.src.dtype == args.dst.dtype) {
    if (args.src.data != args.dst.data)
      SMELT_CUDA_CHECK(cudaMemcpyAsync(args.dst.data, args.src.data, args.src.bytes(), cudaMemcpyDeviceToDevice,
                                       context.stream));
  } else if (args.src.dtype == DType::f32 && args.dst.dtype == DType::bf16) {
    convert_float_to_bf16<<<grid, 256, 0, context.stream>>>(args.src.as<float>(), args.dst.as<uint16_t>(), count);
    SMELT_CUDA_LAUNCH_CHECK("convert_float_to_bf16");
  } else if (args.src.dtype == DType::bf16 && args.dst.dtype == DType::f32) {
    convert_bf16_to_float<<<grid, 256, 0, context.stream>>>(args.src.as<uint16_t>(), args.dst.as<float>(), count);
    SMELT_CUDA_LAUNCH_CHECK("convert_bf16_to_float");
  } else {
    fail(ErrorKind::internal, "cuda convert: converts between f32 and bf16 only, found " + args.src.str() + " -> " +
                                  args.dst.str() + "; f64 is CPU only, and float8 needs quantize / dequantize");
  }
}

void fill(CudaContext& context, TensorView destination, float value) {
  expect_device(destination, "fill", "dst");
  const int64_t count = destination.numel();
  const unsigned grid = grid_for(count, 256, context.multiprocessors);
  switch (destination.dtype) {
    case DType::f32: {
      uint32_t bits;
      memcpy(&bits, &value, sizeof bits);
      fill_bits<uint32_t><<<grid, 256, 0, context.stream>>>(destination.as<uint32_t>(), bits, count);
      break;
    }
    case DType::i32:
      fill_bits<uint32_t><<<grid, 256, 0, context.stream>>>(destination.as<uint32_t>(),
                                                            uint32_t(int32_t(value)), count);
      break;
    case DType::bf16:
      fill_bits<uint16_t><<<grid, 256, 0, context.stream>>>(destination.as<uint16_t>(), float_to_bf16(value), count);
      break;
    case DType::e4m3:
      fill_bits<uint8_t><<<grid, 256, 0, context.stream>>>(destination.as<uint8_t>(), float_to_e4m3(value), count);
      break;
    case DType::e5m2:
      fill_bits<uint8_t><<<grid, 256, 0, context.stream>>>(destination.as<uint8_t>(), float_to_e5m2(value), count);
      break;
    default:
      fail(ErrorKind::internal, "cuda fill: expected an f32, bf16, i32 or float8 view, found " + destination.str() +
                                    "; f64 is CPU only");
  }
  SMELT_CUDA_LAUNCH_CHECK("fill_bits");
}

}  // namespace smelt::cuda
