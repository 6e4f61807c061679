// Shared by the microbenchmarks: random device data (never zeros), CUDA-event timing with
// warm-up and the median of repeats, and a one-line result format.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "core/arena.h"
#include "core/tensor.h"

namespace smelt::bench {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "bench: %s failed: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// Uniform values in [-scale, scale) from a hash of the index and seed.
__global__ void fill_random(void* data, DType dtype, int64_t count, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ (seed * 0x9E3779B9u) ^ uint32_t(i >> 32);
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    const float value = scale * (float(x) * 2.3283064e-10f * 2.0f - 1.0f);
    if (dtype == DType::bf16) static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16(value);
    else static_cast<float*>(data)[i] = value;
  }
}

inline void randomize(const TensorView& view, uint32_t seed, float scale, cudaStream_t stream) {
  fill_random<<<1024, 256, 0, stream>>>(view.data, view.dtype, view.numel(), seed, scale);
  check(cudaGetLastError(), "fill_random");
}

// Bytes of `count` elements of `dtype`, rounded up to 256 so that views carved one after
// another each start 256-byte aligned.
inline size_t padded_bytes(int64_t count, DType dtype) {
  return (size_t(count) * dtype_size(dtype) + 255) / 256 * 256;
}

// Hands out consecutive views of an arena, each padded_bytes long; `used()` is where the next one
// (or the backend's workspace) starts.
class ArenaCarver {
 public:
  explicit ArenaCarver(const Arena& arena) : arena_(arena) {}
  TensorView take(Shape shape, DType dtype) {
    TensorView view = arena_.view(offset_, dtype, shape);
    offset_ += padded_bytes(shape.numel(), dtype);
    return view;
  }
  size_t used() const { return offset_; }

 private:
  const Arena& arena_;
  size_t offset_ = 0;
};

// Median milliseconds of `repeats` timed runs after `warmup` untimed ones.
inline double median_milliseconds(const std::function<void()>& body, cudaStream_t stream, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) body();
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> times;
  for (int i = 0; i < repeats; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    body();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float milliseconds = 0;
    check(cudaEventElapsedTime(&milliseconds, start, stop), "cudaEventElapsedTime");
    times.push_back(milliseconds);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace smelt::bench
