// RMSNorm on the GPU: one block per row for the forward and the input gradient; the
// weight gradient sums rows in fixed chunks (partials in the reduction scratch), so it is
// deterministic.
#include <algorithm>

#include "cuda/cuda_common.cuh"

namespace smelt::cuda {
namespace {

constexpr int kThreads = 256;

// out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps); one block per row.
template <typename T>
__global__ void rmsnorm_forward_rows(const T* input, const T* weight, T* out, float* rstd, int64_t dim, float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* x = input + row * dim;
  float sum = 0;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    const float v = load_float(x, d);
    sum += v * v;
  }
  sum = block_sum(sum, shared);
  const float inverse = 1.0f / sqrtf(sum / float(dim) + eps);
  if (threadIdx.x == 0) rstd[row] = inverse;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x)
    store_float(out + row * dim, d, load_float(x, d) * inverse * load_float(weight, d));
}

// grad_input = rstd * (w * dy - x * rstd^2 * mean(x * w * dy)), optionally added to.
template <typename T>
__global__ void rmsnorm_backward_rows(const T* input, const T* weight, const float* rstd, const T* grad_out,
                                      T* grad_input, int64_t dim, bool accumulate) {
  __shared__ float shared[32];
  const int64_t offset = int64_t(blockIdx.x) * dim;
  float dot = 0;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x)
    dot += load_float(input, offset + d) * load_float(weight, d) * load_float(grad_out, offset + d);
  dot = block_sum(dot, shared);
  const float inverse = rstd[blockIdx.x];
  const float correction = inverse * inverse * dot / float(dim);
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float value = inverse * (load_float(weight, d) * load_float(grad_out, offset + d) -
                             load_float(input, offset + d) * correction);
    if (accumulate) value += load_float(grad_input, offset + d);
    store_float(grad_input, offset + d, value);
  }
}

// partials[chunk, d] = sum over the chunk's rows of dy * x * rstd (rows in order).
template <typename T>
__global__ void rmsnorm_weight_partials(const T* input, const float* rstd, const T* grad_out, float* partials,
                                        int64_t rows, int64_t dim, int64_t rows_per_chunk) {
  const int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (d >= dim) return;
  const int64_t first = blockIdx.y * rows_per_chunk, last = min(rows, first + rows_per_chunk);
  float sum = 0;
  for (int64_t r = first; r < last; ++r) sum += load_float(grad_out, r * dim + d) * load_float(input, r * dim + d) * rstd[r];
  partials[blockIdx.y * dim + d] = sum;
}

__global__ void sum_partial_columns(const float* partials, float* out, int64_t chunks, int64_t dim) {
  const int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (d >= dim) return;
  float sum = 0;
  for (int64_t c = 0; c < chunks; ++c) sum += partials[c * dim + d];
  out[d] = sum;
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
  dispatch_activation(args.input.dtype, op, [&](auto element) {
    using T = decltype(element);
    expect_dtype(args.weight, args.input.dtype, op, "weight");
    expect_dtype(args.out, args.input.dtype, op, "out");
    rmsnorm_forward_rows<T><<<unsigned(rows), kThreads, 0, context.stream>>>(
        args.input.as<T>(), args.weight.as<T>(), args.out.as<T>(), args.rstd.as<float>(), dim, args.eps);
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
  const int64_t chunks = std::min<int64_t>({max_chunks, 128, rows});
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const int64_t used_chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  dispatch_activation(args.input.dtype, op, [&](auto element) {
    using T = decltype(element);
    for (const TensorView* t : {&args.weight, &args.grad_out, &args.grad_input}) expect_dtype(*t, args.input.dtype, op, "activation");
    rmsnorm_backward_rows<T><<<unsigned(rows), kThreads, 0, context.stream>>>(
        args.input.as<T>(), args.weight.as<T>(), args.rstd.as<float>(), args.grad_out.as<T>(), args.grad_input.as<T>(),
        dim, args.accumulate);
    SMELT_CUDA_LAUNCH_CHECK("rmsnorm_backward_rows");
    const dim3 grid(unsigned((dim + kThreads - 1) / kThreads), unsigned(used_chunks));
    rmsnorm_weight_partials<T><<<grid, kThreads, 0, context.stream>>>(args.input.as<T>(), args.rstd.as<float>(),
                                                                       args.grad_out.as<T>(), context.reduce_scratch(),
                                                                       rows, dim, rows_per_chunk);
    SMELT_CUDA_LAUNCH_CHECK("rmsnorm_weight_partials");
    sum_partial_columns<<<unsigned((dim + kThreads - 1) / kThreads), kThreads, 0, context.stream>>>(
        context.reduce_scratch(), args.grad_weight.as<float>(), used_chunks, dim);
    SMELT_CUDA_LAUNCH_CHECK("sum_partial_columns");
  });
}

}  // namespace smelt::cuda
