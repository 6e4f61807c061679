// Reductions on the GPU: sum of squares (gradient norm) and mean (loss), in double over a
// fixed grid whose per-block partials one block then sums in order: deterministic, and
// no host round-trip (the result stays on the device).
#include <array>
#include <cstdint>
#include <type_traits>

#include "cuda/cuda_common.cuh"

namespace smelt::cuda {
namespace {

constexpr int kBlocks = 1056;  // fixed, so the summation order depends only on the element count
constexpr int kThreads = 256;

__device__ __forceinline__ double warp_sum_double(double value) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ __forceinline__ double block_sum_double(double value, double* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  value = warp_sum_double(value);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : 0.0;
  return warp_sum_double(value);
}

enum class Term : uint8_t { value, square };

// partials[block] = sum over the block's grid-stride elements of term(x).
template <typename T, Term term>
__global__ void reduce_partials(const T* x, int64_t count, double* partials) {
  __shared__ double shared[32];
  double sum = 0;
  int64_t first_scalar = 0;
  if constexpr (std::is_same_v<T, float>) {
    // 16-byte loads keep enough bytes in flight to run at memory bandwidth; each group of
    // four is combined in double, so the result matches the scalar order's precision.
    if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
      const int64_t quads = count / 4;
      const float4* x4 = reinterpret_cast<const float4*>(x);
      for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < quads; i += int64_t(gridDim.x) * blockDim.x) {
        const float4 v = x4[i];
        if (term == Term::square)
          sum += double(v.x) * v.x + double(v.y) * v.y + double(v.z) * v.z + double(v.w) * v.w;
        else
          sum += double(v.x) + double(v.y) + double(v.z) + double(v.w);
      }
      first_scalar = quads * 4;
    }
  } else {
    // bf16 (the block linears' weight gradients): eight elements per 16-byte load, each group of
    // eight combined in double like the f32 path's four.
    if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
      const int64_t octets = count / 8;
      const uint4* x8 = reinterpret_cast<const uint4*>(x);
      for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < octets; i += int64_t(gridDim.x) * blockDim.x) {
        const uint4 v = x8[i];
        double group = 0;
        for (const unsigned word : {v.x, v.y, v.z, v.w}) {
          const double low = __uint_as_float(word << 16), high = __uint_as_float(word & 0xffff0000u);
          group += term == Term::square ? low * low + high * high : low + high;
        }
        sum += group;
      }
      first_scalar = octets * 8;
    }
  }
  for (int64_t i = first_scalar + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double v = load_float(x, i);
    sum += term == Term::square ? v * v : v;
  }
  sum = block_sum_double(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// out[0] = (accumulate ? out[0] : 0) + sum(partials) * multiplier; one block.
__global__ void reduce_finish(const double* partials, int count, float* out, double multiplier, bool accumulate) {
  __shared__ double shared[32];
  double sum = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  sum = block_sum_double(sum, shared);
  if (threadIdx.x == 0) out[0] = float(sum * multiplier + (accumulate ? double(out[0]) : 0.0));
}

// x and every slot of SumSquaresArgs::also.
constexpr int kMaxInputs = 1 + int(std::tuple_size_v<decltype(SumSquaresArgs::also)>);

// The partials of each non-empty input (x first, then the ones whose terms join x's before the
// one rounding) into the reduce scratch, then out[0] from them.
template <Term term>
void reduce(CudaContext& context, const std::array<TensorView, kMaxInputs>& inputs_in_order, const TensorView& out,
            double multiplier, bool accumulate, const char* op) {
  expect_device(inputs_in_order[0], op, "x");
  for (size_t i = 1; i < inputs_in_order.size(); ++i)
    if (!inputs_in_order[i].empty()) expect_device(inputs_in_order[i], op, "also");
  expect_device(out, op, "out");
  expect_dtype(out, DType::f32, op, "out");
  expect_numel(out, 1, op, "out");
  context.require_workspace(op);
  auto* partials = reinterpret_cast<double*>(context.reduce_scratch());
  static_assert(kMaxInputs * kBlocks * sizeof(double) <= kReduceScratchBytes,
                "the reduce scratch holds every input's partials");
  int inputs = 0;
  for (const TensorView& input : inputs_in_order) {
    if (input.empty()) continue;
    dispatch_activation(input.dtype, op, [&](auto element) {
      using T = decltype(element);
      reduce_partials<T, term><<<kBlocks, kThreads, 0, context.stream>>>(input.as<T>(), input.numel(),
                                                                         partials + inputs * kBlocks);
      SMELT_CUDA_LAUNCH_CHECK("reduce_partials");
    });
    ++inputs;
  }
  reduce_finish<<<1, kThreads, 0, context.stream>>>(partials, inputs * kBlocks, out.as<float>(), multiplier, accumulate);
  SMELT_CUDA_LAUNCH_CHECK("reduce_finish");
}

}  // namespace

void sum_squares(CudaContext& context, const SumSquaresArgs& args) {
  reduce<Term::square>(context, {args.x, args.also[0], args.also[1]}, args.out, 1.0, args.accumulate, "sum_squares");
}

void mean(CudaContext& context, const MeanArgs& args) {
  if (args.x.numel() == 0)
    fail(ErrorKind::internal, "cuda mean: expected at least one element, found " + args.x.str() +
                                  "; skip empty reductions");
  reduce<Term::value>(context, {args.x, TensorView{}, TensorView{}}, args.out, args.weight / double(args.x.numel()), args.accumulate, "mean");
}

}  // namespace smelt::cuda
