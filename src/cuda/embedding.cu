// Token embedding on the GPU: forward gathers table rows; backward scatters the output
// gradient into an f32 table gradient (atomic adds: summation order may vary run to run).
#include "cuda/cuda_common.cuh"

namespace smelt::cuda {
namespace {

// out[n, :] = table[tokens[n], :]; an out-of-range token writes NaN so the bug is visible.
template <typename T>
__global__ void embedding_gather(const int32_t* tokens, const T* table, T* out, int64_t count, int64_t dim,
                                 int64_t vocabulary) {
  const int64_t total = count * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / dim, d = i % dim;
    const int32_t token = tokens[n];
    const float value = (token >= 0 && token < vocabulary) ? load_float(table, token * dim + d) : NAN;
    store_float(out, i, value);
  }
}

template <typename T>
__global__ void embedding_scatter(const int32_t* tokens, const T* grad_out, float* grad_table, int64_t count,
                                  int64_t dim, int64_t vocabulary) {
  const int64_t total = count * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / dim, d = i % dim;
    const int32_t token = tokens[n];
    if (token >= 0 && token < vocabulary) atomicAdd(grad_table + token * dim + d, load_float(grad_out, i));
  }
}

}  // namespace

void embedding_forward(CudaContext& context, const EmbeddingForwardArgs& args) {
  const char* op = "embedding_forward";
  expect_device(args.tokens, op, "tokens");
  expect_device(args.table, op, "table");
  expect_device(args.out, op, "out");
  expect_dtype(args.tokens, DType::i32, op, "tokens");
  const int64_t count = args.tokens.numel(), dim = args.table.cols();
  expect_numel(args.out, count * dim, op, "out");
  dispatch_activation(args.table.dtype, op, [&](auto element) {
    using T = decltype(element);
    expect_dtype(args.out, args.table.dtype, op, "out");
    embedding_gather<T><<<grid_for(count * dim, 256, context.multiprocessors), 256, 0, context.stream>>>(
        args.tokens.as<int32_t>(), args.table.as<T>(), args.out.as<T>(), count, dim, args.table.rows());
    SMELT_CUDA_LAUNCH_CHECK("embedding_gather");
  });
}

void embedding_backward(CudaContext& context, const EmbeddingBackwardArgs& args) {
  const char* op = "embedding_backward";
  expect_device(args.tokens, op, "tokens");
  expect_device(args.grad_out, op, "grad_out");
  expect_device(args.grad_table, op, "grad_table");
  expect_dtype(args.tokens, DType::i32, op, "tokens");
  expect_dtype(args.grad_table, DType::f32, op, "grad_table");
  const int64_t count = args.tokens.numel(), dim = args.grad_table.cols();
  expect_numel(args.grad_out, count * dim, op, "grad_out");
  SMELT_CUDA_CHECK(cudaMemsetAsync(args.grad_table.data, 0, args.grad_table.bytes(), context.stream));
  dispatch_activation(args.grad_out.dtype, op, [&](auto element) {
    using T = decltype(element);
    embedding_scatter<T><<<grid_for(count * dim, 256, context.multiprocessors), 256, 0, context.stream>>>(
        args.tokens.as<int32_t>(), args.grad_out.as<T>(), args.grad_table.as<float>(), count, dim,
        args.grad_table.rows());
    SMELT_CUDA_LAUNCH_CHECK("embedding_scatter");
  });
}

}  // namespace smelt::cuda
