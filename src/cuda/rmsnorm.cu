// RMSNorm on the GPU: one block per row for the forward, 8 elements per thread through 16-byte
// loads and stores where the row allows it (one element per thread otherwise), with the optional
// amax of what they store reduced in the same pass (float8 fusion). The backward sums the weight
// gradient over fixed chunks of rows (partials in the reduction scratch, then summed per column in
// a fixed order), so it is deterministic; with vector access it does so in the same pass as the
// input gradient, a block per chunk, reading x and dy once.
#include <algorithm>

#include "cuda/cuda_common.cuh"
#include "cuda/vector_access.cuh"

namespace smelt::cuda {
namespace {

constexpr int kThreads = 256;

// out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps); one block per row.
template <typename T, bool Vectorized>
__global__ void rmsnorm_forward_rows(const T* input, const T* weight, T* out, float* rstd, int64_t dim, float eps,
                                     uint32_t* amax_bits) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* x = input + row * dim;
  T* y = out + row * dim;
  float sum = 0;
  if (Vectorized) {
    for (int64_t v = threadIdx.x; v < dim / kVector; v += blockDim.x) {
      float a[kVector];
      load_vector(x + v * kVector, a);
#pragma unroll
      for (int i = 0; i < kVector; ++i) sum += a[i] * a[i];
    }
  } else {
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      const float v = load_float(x, d);
      sum += v * v;
    }
  }
  sum = block_sum(sum, shared);
  const float inverse = 1.0f / sqrtf(sum / float(dim) + eps);
  if (threadIdx.x == 0) rstd[row] = inverse;
  uint32_t maximum = 0;
  if (Vectorized) {
    for (int64_t v = threadIdx.x; v < dim / kVector; v += blockDim.x) {
      float a[kVector], w[kVector], o[kVector];
      load_vector(x + v * kVector, a);
      load_vector(weight + v * kVector, w);
#pragma unroll
      for (int i = 0; i < kVector; ++i) {
        o[i] = a[i] * inverse * w[i];
        maximum = max(maximum, magnitude_bits(stored_value(o[i], y)));
      }
      store_vector(y + v * kVector, o);
    }
  } else {
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      const float o = load_float(x, d) * inverse * load_float(weight, d);
      store_float(y, d, o);
      maximum = max(maximum, magnitude_bits(stored_value(o, y)));
    }
  }
  publish_max(amax_bits, maximum);
}

// The backward's arithmetic on one 16-byte column group (kVector columns at x, weight, dy, dx),
// shared by both backward kernels so they round alike: the group's terms of x . (w * dy), added
// to dot in column order ...
template <typename T>
__device__ __forceinline__ void add_group_dot(const T* x, const T* weight, const T* dy, float& dot) {
  float a[kVector], w[kVector], g[kVector];
  load_vector(x, a);
  load_vector(weight, w);
  load_vector(dy, g);
#pragma unroll
  for (int i = 0; i < kVector; ++i) dot += a[i] * w[i] * g[i];
}

// ... and its input gradient inverse * (w * dy - x * correction), added to dx when accumulate,
// stored, its amax taken into `maximum`; x and dy as loaded are left in a and g (the weight
// gradient's terms).
template <typename T>
__device__ __forceinline__ void store_group_gradient(const T* x, const T* weight, const T* dy, T* dx, float inverse,
                                                     float correction, bool accumulate, uint32_t& maximum,
                                                     float (&a)[kVector], float (&g)[kVector]) {
  float w[kVector], o[kVector];
  load_vector(x, a);
  load_vector(weight, w);
  load_vector(dy, g);
  if (accumulate) load_vector(dx, o);
#pragma unroll
  for (int i = 0; i < kVector; ++i) {
    float value = inverse * (w[i] * g[i] - a[i] * correction);
    if (accumulate) value += o[i];
    o[i] = value;
    maximum = max(maximum, magnitude_bits(stored_value(value, dx)));
  }
  store_vector(dx, o);
}

// grad_input = rstd * (w * dy - x * rstd^2 * mean(x * w * dy)), optionally added to.
template <typename T, bool Vectorized>
__global__ void rmsnorm_backward_rows(const T* input, const T* weight, const float* rstd, const T* grad_out,
                                      T* grad_input, int64_t dim, bool accumulate, uint32_t* amax_bits) {
  __shared__ float shared[32];
  const int64_t offset = int64_t(blockIdx.x) * dim;
  const T *x = input + offset, *dy = grad_out + offset;
  T* dx = grad_input + offset;
  float dot = 0;
  if (Vectorized) {
    for (int64_t v = threadIdx.x; v < dim / kVector; v += blockDim.x)
      add_group_dot(x + v * kVector, weight + v * kVector, dy + v * kVector, dot);
  } else {
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dot += load_float(x, d) * load_float(weight, d) * load_float(dy, d);
  }
  dot = block_sum(dot, shared);
  const float inverse = rstd[blockIdx.x];
  const float correction = inverse * inverse * dot / float(dim);
  uint32_t maximum = 0;
  if (Vectorized) {
    for (int64_t v = threadIdx.x; v < dim / kVector; v += blockDim.x) {
      float a[kVector], g[kVector];
      store_group_gradient(x + v * kVector, weight + v * kVector, dy + v * kVector, dx + v * kVector, inverse,
                           correction, accumulate, maximum, a, g);
    }
  } else {
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      float value = inverse * (load_float(weight, d) * load_float(dy, d) - load_float(x, d) * correction);
      if (accumulate) value += load_float(dx, d);
      store_float(dx, d, value);
      maximum = max(maximum, magnitude_bits(stored_value(value, dx)));
    }
  }
  publish_max(amax_bits, maximum);
}

// partials[chunk, d] = sum over the chunk's rows of dy * x * rstd (rows in order); a thread sums
// one column, or 8 neighbouring ones through 16-byte loads (the same order per column).
template <typename T, bool Vectorized>
__global__ void rmsnorm_weight_partials(const T* input, const float* rstd, const T* grad_out, float* partials,
                                        int64_t rows, int64_t dim, int64_t rows_per_chunk) {
  const int64_t thread = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t first = blockIdx.y * rows_per_chunk, last = min(rows, first + rows_per_chunk);
  if (Vectorized) {
    const int64_t d = thread * kVector;
    if (d >= dim) return;
    float sum[kVector] = {};
    for (int64_t r = first; r < last; ++r) {
      float g[kVector], a[kVector];
      load_vector(grad_out + r * dim + d, g);
      load_vector(input + r * dim + d, a);
      const float inverse = rstd[r];
#pragma unroll
      for (int i = 0; i < kVector; ++i) sum[i] += g[i] * a[i] * inverse;
    }
    store_vector(partials + blockIdx.y * dim + d, sum);
    return;
  }
  const int64_t d = thread;
  if (d >= dim) return;
  float sum = 0;
  for (int64_t r = first; r < last; ++r) sum += load_float(grad_out, r * dim + d) * load_float(input, r * dim + d) * rstd[r];
  partials[blockIdx.y * dim + d] = sum;
}

// The input gradient as rmsnorm_backward_rows (the same arithmetic in the same order), for the
// rows of one chunk in order, and the chunk's weight-gradient partials as rmsnorm_weight_partials,
// summed in registers from the same loads: x and dy are read from memory once. Each thread owns
// Vectors 16-byte column groups (threadIdx.x + j * blockDim.x); rows up to Vectors * 8 * blockDim.x.
template <typename T, int Vectors>
__global__ void __launch_bounds__(1024) rmsnorm_backward_chunks(const T* input, const T* weight, const float* rstd, const T* grad_out,
                                        T* grad_input, float* partials, int64_t rows, int64_t dim,
                                        int64_t rows_per_chunk, bool accumulate, uint32_t* amax_bits) {
  __shared__ float shared[32];
  const int64_t groups = dim / kVector;
  const int64_t first = blockIdx.x * rows_per_chunk, last = min(rows, first + rows_per_chunk);
  float sum[Vectors][kVector] = {};
  uint32_t maximum = 0;
  for (int64_t r = first; r < last; ++r) {
    const int64_t offset = r * dim;
    const T *x = input + offset, *dy = grad_out + offset;
    T* dx = grad_input + offset;
    float dot = 0;
#pragma unroll
    for (int j = 0; j < Vectors; ++j) {
      const int64_t v = threadIdx.x + int64_t(j) * blockDim.x;
      if (v >= groups) break;
      add_group_dot(x + v * kVector, weight + v * kVector, dy + v * kVector, dot);
    }
    dot = block_sum(dot, shared);
    const float inverse = rstd[r];
    const float correction = inverse * inverse * dot / float(dim);
#pragma unroll
    for (int j = 0; j < Vectors; ++j) {
      const int64_t v = threadIdx.x + int64_t(j) * blockDim.x;
      if (v >= groups) break;
      float a[kVector], g[kVector];
      store_group_gradient(x + v * kVector, weight + v * kVector, dy + v * kVector, dx + v * kVector, inverse,
                           correction, accumulate, maximum, a, g);
#pragma unroll
      for (int i = 0; i < kVector; ++i) sum[j][i] += g[i] * a[i] * inverse;
    }
  }
#pragma unroll
  for (int j = 0; j < Vectors; ++j) {
    const int64_t v = threadIdx.x + int64_t(j) * blockDim.x;
    if (v < groups) store_vector(partials + blockIdx.x * dim + v * kVector, sum[j]);
  }
  publish_max(amax_bits, maximum);
}

// out[d] (+)= sum over chunks of partials[chunk, d], in a fixed order: block (32 columns, kSlices
// slices); slice s sums chunks s, s + kSlices, ... and the slices are added in order; accumulate
// (gradient accumulation) then adds the total to what out holds.
constexpr int kSlices = 32;
__global__ void sum_partial_columns(const float* partials, float* out, int64_t chunks, int64_t dim, bool accumulate) {
  __shared__ float slices[kSlices][33];
  const int64_t d = blockIdx.x * int64_t(32) + threadIdx.x;
  float sum = 0;
  if (d < dim)
    for (int64_t c = threadIdx.y; c < chunks; c += kSlices) sum += partials[c * dim + d];
  slices[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || d >= dim) return;
  float total = 0;
  for (int s = 0; s < kSlices; ++s) total += slices[s][threadIdx.x];
  out[d] = accumulate ? out[d] + total : total;
}

}  // namespace

void rmsnorm_forward(CudaContext& context, const RmsNormForwardArgs& args) {
  const char* op = "rmsnorm_forward";
  for (const TensorView* t : {&args.input, &args.weight, &args.out, &args.rstd}) expect_device(*t, op, "argument");
  const int64_t rows = args.input.rows(), dim = args.input.cols();
  expect_numel(args.weight, dim, op, "weight");
  expect_numel(args.out, rows * dim, op, "out");
  expect_numel(args.rstd, rows, op, "rstd");
  expect_dtype(args.rstd, DType::f32, op, "rstd");
  uint32_t* amax_bits = amax_target(context, args.amax, op, "amax");
  if (rows == 0) return;
  const bool vectorized = dim % kVector == 0 && aligned16(args.input.data) && aligned16(args.weight.data) &&
                          aligned16(args.out.data);
  dispatch_activation(args.input.dtype, op, [&](auto element) {
    using T = decltype(element);
    expect_dtype(args.weight, args.input.dtype, op, "weight");
    expect_dtype(args.out, args.input.dtype, op, "out");
    auto kernel = vectorized ? rmsnorm_forward_rows<T, true> : rmsnorm_forward_rows<T, false>;
    kernel<<<unsigned(rows), kThreads, 0, context.stream>>>(args.input.as<T>(), args.weight.as<T>(), args.out.as<T>(),
                                                            args.rstd.as<float>(), dim, args.eps, amax_bits);
    SMELT_CUDA_LAUNCH_CHECK("rmsnorm_forward_rows");
  });
}

void rmsnorm_backward(CudaContext& context, const RmsNormBackwardArgs& args) {
  const char* op = "rmsnorm_backward";
  for (const TensorView* t : {&args.input, &args.weight, &args.rstd, &args.grad_out, &args.grad_input, &args.grad_weight})
    expect_device(*t, op, "argument");
  context.require_workspace(op);
  const int64_t rows = args.input.rows(), dim = args.input.cols();
  expect_numel(args.weight, dim, op, "weight");
  expect_numel(args.rstd, rows, op, "rstd");
  expect_numel(args.grad_out, rows * dim, op, "grad_out");
  expect_numel(args.grad_input, rows * dim, op, "grad_input");
  expect_numel(args.grad_weight, dim, op, "grad_weight");
  expect_dtype(args.rstd, DType::f32, op, "rstd");
  expect_dtype(args.grad_weight, DType::f32, op, "grad_weight");
  const int64_t max_chunks = int64_t(kReduceScratchBytes / sizeof(float)) / dim;
  if (max_chunks < 1)
    fail(ErrorKind::internal, "cuda rmsnorm_backward: dimension " + std::to_string(dim) +
                                  " exceeds the reduction scratch; expected at most " +
                                  std::to_string(kReduceScratchBytes / sizeof(float)) + " columns");
  const bool vectorized = dim % kVector == 0 && aligned16(args.input.data) && aligned16(args.weight.data) &&
                          aligned16(args.grad_out.data) && aligned16(args.grad_input.data);
  // One pass (a block per chunk, about four per multiprocessor; a thread per 16-byte column group,
  // up to 1024 threads, two groups per thread beyond) for rows up to kCudaRmsNormOnePassMaxDim;
  // else a block per row for the input gradient and a second read for the weight's. (With 256
  // threads and two groups each, 8B's rows ran the one pass no faster than the two.)
  static_assert(kCudaRmsNormOnePassMaxDim == 1024 * 2 * kVector, "one pass: 1024 threads of two column groups");
  const int64_t groups = dim / kVector;
  const int64_t chunk_threads = std::min<int64_t>(1024, (groups + 31) / 32 * 32);
  const int64_t groups_per_thread = (groups + chunk_threads - 1) / chunk_threads;
  const bool one_pass = vectorized && dim <= kCudaRmsNormOnePassMaxDim;
  const int64_t chunk_target = one_pass ? 4 * int64_t(context.multiprocessors > 0 ? context.multiprocessors : 132) : 128;
  const int64_t chunks = std::min<int64_t>({max_chunks, chunk_target, rows});
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const int64_t used_chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  uint32_t* amax_bits = amax_target(context, args.amax, op, "amax");
  if (rows == 0) {  // no rows: a zero weight gradient (nothing to add when accumulating)
    if (!args.accumulate_weight)
      SMELT_CUDA_CHECK(cudaMemsetAsync(args.grad_weight.data, 0, size_t(dim) * sizeof(float), context.stream));
    return;
  }
  dispatch_activation(args.input.dtype, op, [&](auto element) {
    using T = decltype(element);
    for (const TensorView* t : {&args.weight, &args.grad_out, &args.grad_input}) expect_dtype(*t, args.input.dtype, op, "activation");
    const dim3 sum_grid(unsigned((dim + 31) / 32)), sum_block(32, kSlices);
    if (one_pass) {
      auto kernel = groups_per_thread <= 1 ? rmsnorm_backward_chunks<T, 1> : rmsnorm_backward_chunks<T, 2>;
      kernel<<<unsigned(used_chunks), unsigned(chunk_threads), 0, context.stream>>>(
          args.input.as<T>(), args.weight.as<T>(), args.rstd.as<float>(), args.grad_out.as<T>(), args.grad_input.as<T>(),
          context.reduce_scratch(), rows, dim, rows_per_chunk, args.accumulate, amax_bits);
      SMELT_CUDA_LAUNCH_CHECK("rmsnorm_backward_chunks");
      sum_partial_columns<<<sum_grid, sum_block, 0, context.stream>>>(context.reduce_scratch(),
                                                                      args.grad_weight.as<float>(), used_chunks, dim,
                                                                      args.accumulate_weight);
      SMELT_CUDA_LAUNCH_CHECK("sum_partial_columns");
      return;
    }
    auto kernel = vectorized ? rmsnorm_backward_rows<T, true> : rmsnorm_backward_rows<T, false>;
    kernel<<<unsigned(rows), kThreads, 0, context.stream>>>(args.input.as<T>(), args.weight.as<T>(),
                                                            args.rstd.as<float>(), args.grad_out.as<T>(),
                                                            args.grad_input.as<T>(), dim, args.accumulate, amax_bits);
    SMELT_CUDA_LAUNCH_CHECK("rmsnorm_backward_rows");
    const int64_t columns_per_thread = vectorized ? kVector : 1;
    const int64_t threads = (dim + columns_per_thread - 1) / columns_per_thread;
    const dim3 grid(unsigned((threads + kThreads - 1) / kThreads), unsigned(used_chunks));
    auto partials = vectorized ? rmsnorm_weight_partials<T, true> : rmsnorm_weight_partials<T, false>;
    partials<<<grid, kThreads, 0, context.stream>>>(args.input.as<T>(), args.rstd.as<float>(), args.grad_out.as<T>(),
                                                    context.reduce_scratch(), rows, dim, rows_per_chunk);
    SMELT_CUDA_LAUNCH_CHECK("rmsnorm_weight_partials");
    sum_partial_columns<<<sum_grid, sum_block, 0, context.stream>>>(context.reduce_scratch(),
                                                                    args.grad_weight.as<float>(), used_chunks, dim,
                                                                      args.accumulate_weight);
    SMELT_CUDA_LAUNCH_CHECK("sum_partial_columns");
  });
}

}  // namespace smelt::cuda
