// Token embedding on the GPU: forward gathers table rows (an f32 table into a bf16 output rounds
// each element once, as core/numerics.h does); backward sums the output gradient rows of each
// token into an f32 table gradient in position order (deterministic, no atomics).
#include "core/numerics.h"
#include "cuda/cuda_common.cuh"

namespace smelt::cuda {
namespace {

// Rounds to the output: bf16 with core/numerics.h's rounding (the bits the optimizer's bf16 copy
// of the table would hold), f32 as is.
__device__ __forceinline__ void store_rounded(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_rounded(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __ushort_as_bfloat16(float_to_bf16(v));
}

// out[n, :] = table[tokens[n], :]; an out-of-range token writes NaN so the bug is visible.
// Table: out's type, or float with a bf16 out.
template <typename Table, typename T>
__global__ void embedding_gather(const int32_t* tokens, const Table* table, T* out, int64_t count, int64_t dim,
                                 int64_t vocabulary) {
  const int64_t total = count * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / dim, d = i % dim;
    const int32_t token = tokens[n];
    const float value = (token >= 0 && token < vocabulary) ? load_float(table, token * dim + d) : NAN;
    store_rounded(out, i, value);
  }
}

// Backward, deterministic: block n handles position n's token only if n is its first occurrence;
// it then adds the gradient rows of every occurrence into the token's table row in position
// order, each thread owning whole columns (the order core/numerics.h's CPU twin sums in, so the
// two backends agree bit for bit). No atomics: the same inputs give the same bits every run.
template <typename T>
__global__ void embedding_accumulate_rows(const int32_t* tokens, const T* grad_out, float* grad_table, int64_t count,
                                          int64_t dim, int64_t vocabulary) {
  __shared__ int32_t matches[256];
  __shared__ int warp_counts[8];
  const int64_t first = blockIdx.x;
  const int32_t token = tokens[first];
  if (token < 0 || token >= vocabulary) return;
  // An earlier occurrence owns the row.
  bool earlier = false;
  for (int64_t m = threadIdx.x; m < first && !earlier; m += blockDim.x) earlier = tokens[m] == token;
  if (__syncthreads_or(earlier)) return;
  float* row = grad_table + token * dim;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t base = first; base < count; base += blockDim.x) {
    // The occurrences in this chunk of positions, in position order (a ballot per warp, then the warps in order).
    const int64_t m = base + threadIdx.x;
    const bool match = m < count && tokens[m] == token;
    const unsigned ballot = __ballot_sync(0xffffffffu, match);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int offset = 0, total = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
      if (w < warp) offset += warp_counts[w];
      total += warp_counts[w];
    }
    if (match) matches[offset + __popc(ballot & ((1u << lane) - 1u))] = static_cast<int32_t>(m);
    __syncthreads();
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      float sum = row[d];
      for (int k = 0; k < total; ++k) sum += load_float(grad_out, static_cast<int64_t>(matches[k]) * dim + d);
      row[d] = sum;
    }
    __syncthreads();  // matches and warp_counts are rewritten by the next chunk
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
  if (args.table.dtype == DType::f32 && args.out.dtype == DType::bf16) {  // the f32 master rows, rounded
    embedding_gather<float, __nv_bfloat16><<<grid_for(count * dim, 256, context.multiprocessors), 256, 0,
                                             context.stream>>>(args.tokens.as<int32_t>(), args.table.as<float>(),
                                                               args.out.as<__nv_bfloat16>(), count, dim,
                                                               args.table.rows());
    SMELT_CUDA_LAUNCH_CHECK("embedding_gather");
    return;
  }
  dispatch_activation(args.table.dtype, op, [&](auto element) {
    using T = decltype(element);
    expect_dtype(args.out, args.table.dtype, op, "out");
    embedding_gather<T, T><<<grid_for(count * dim, 256, context.multiprocessors), 256, 0, context.stream>>>(
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
  if (!args.accumulate)  // gradient accumulation: later microbatches add to the rows
    SMELT_CUDA_CHECK(cudaMemsetAsync(args.grad_table.data, 0, args.grad_table.bytes(), context.stream));
  dispatch_activation(args.grad_out.dtype, op, [&](auto element) {
    using T = decltype(element);
    // One block per position (those that are not a token's first occurrence return at once).
    embedding_accumulate_rows<T><<<static_cast<unsigned>(count), 256, 0, context.stream>>>(
        args.tokens.as<int32_t>(), args.grad_out.as<T>(), args.grad_table.as<float>(), count, dim,
        args.grad_table.rows());
    SMELT_CUDA_LAUNCH_CHECK("embedding_accumulate_rows");
  });
}

}  // namespace smelt::cuda
