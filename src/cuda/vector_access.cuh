// Device helpers shared by element-wise kernels: 16-byte loads and stores of 8 activations
// (bf16 or f32) as floats, and maxima of magnitudes as unsigned float bits (the order amax uses).
#pragma once
#include "cuda/cuda_common.cuh"

namespace smelt::cuda {

// |x| as float bits: for non-negative floats the unsigned order is the numeric order, and
// every NaN sorts above infinity, so an unsigned max propagates NaN as the CPU loop does.
__device__ __forceinline__ uint32_t magnitude_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

__device__ __forceinline__ uint32_t warp_max_bits(uint32_t value) {
  for (int offset = 16; offset > 0; offset >>= 1) value = max(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Block-wide maximum of one value per thread (blockDim.x a multiple of 32, at most 1024); the
// result is valid in thread 0.
__device__ __forceinline__ uint32_t block_max_bits(uint32_t value) {
  __shared__ uint32_t shared[32];
  value = warp_max_bits(value);
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = value;
  __syncthreads();
  if (threadIdx.x < 32) {
    value = threadIdx.x < (blockDim.x >> 5) ? shared[threadIdx.x] : 0;
    value = warp_max_bits(value);
  }
  return value;
}

// Adds each block's maximum into *bits (skipped when null; every thread of the block calls it).
__device__ __forceinline__ void publish_max(uint32_t* bits, uint32_t maximum) {
  if (!bits) return;
  maximum = block_max_bits(maximum);
  if (threadIdx.x == 0) atomicMax(bits, maximum);
}

// The amax output as bits to atomicMax into, zeroed on the stream first; null when not asked for.
inline uint32_t* amax_target(CudaContext& context, const TensorView& amax, const char* op, const char* name) {
  if (amax.empty()) return nullptr;
  expect_device(amax, op, name);
  expect_dtype(amax, DType::f32, op, name);
  expect_numel(amax, 1, op, name);
  SMELT_CUDA_CHECK(cudaMemsetAsync(amax.data, 0, sizeof(float), context.stream));
  return amax.as<uint32_t>();
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- 16-byte loads and stores -----------------------------------------------------------------

constexpr int kVector = 8;  // elements per vector load: one 16-byte load of bf16, two of f32

__device__ __forceinline__ void load_vector(const __nv_bfloat16* p, float (&out)[kVector]) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);  // the lower half is the earlier element
    out[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ void load_vector(const float* p, float (&out)[kVector]) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// Rounds 8 floats to bf16 (round to nearest even, as store_float) into one 16-byte store.
__device__ __forceinline__ void store_vector(__nv_bfloat16* p, const float (&in)[kVector]) {
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t low = __bfloat16_as_ushort(__float2bfloat16_rn(in[2 * i]));
    const uint32_t high = __bfloat16_as_ushort(__float2bfloat16_rn(in[2 * i + 1]));
    words[i] = low | high << 16;  // the lower half is the earlier element
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
}

__device__ __forceinline__ void store_vector(float* p, const float (&in)[kVector]) {
  *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(in[4], in[5], in[6], in[7]);
}

// The value an activation of type T holds after store_float(v): what an amax over it reads.
__device__ __forceinline__ float stored_value(float v, const float*) { return v; }
__device__ __forceinline__ float stored_value(float v, const __nv_bfloat16*) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

}  // namespace smelt::cuda
