// Rotary position embedding on the GPU, in place: each pair (2i, 2i+1) of every head vector
// rotated by the angle of (row % seq_len, i); inverse rotates back. Four pairs per thread through
// 16-byte loads and stores when a head's pairs come in fours (one pair per thread otherwise).
#include "cuda/cuda_common.cuh"
#include "cuda/vector_access.cuh"

namespace smelt::cuda {
namespace {

// x: (tokens, heads, Dh); frequencies: (seq_len, Dh/2, 2) cos, sin.
template <typename T>
__global__ void rope_rotate_pairs(T* x, const float* frequencies, int64_t tokens, int64_t heads, int64_t half,
                                  int64_t seq_len, float direction) {
  const int64_t pairs = tokens * heads * half;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < pairs; p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = p % half, token = p / (heads * half);
    const float* angle = frequencies + ((token % seq_len) * half + i) * 2;
    const float c = angle[0], s = direction * angle[1];
    const float x0 = load_float(x, 2 * p), x1 = load_float(x, 2 * p + 1);
    store_float(x, 2 * p, x0 * c - x1 * s);
    store_float(x, 2 * p + 1, x0 * s + x1 * c);
  }
}

// Pairs [4v, 4v + 4) per step (half a multiple of 4: the four share a head and a token).
template <typename T>
__global__ void rope_rotate_quads(T* x, const float* frequencies, int64_t tokens, int64_t heads, int64_t half,
                                  int64_t seq_len, float direction) {
  const int64_t quads = tokens * heads * half / 4;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < quads; v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = 4 * v, i = p % half, token = p / (heads * half);
    const float4* angle = reinterpret_cast<const float4*>(frequencies + ((token % seq_len) * half + i) * 2);
    const float4 first = angle[0], second = angle[1];
    const float table[8] = {first.x, first.y, first.z, first.w, second.x, second.y, second.z, second.w};
    float e[kVector];
    load_vector(x + 2 * p, e);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float c = table[2 * k], s = direction * table[2 * k + 1];
      const float x0 = e[2 * k], x1 = e[2 * k + 1];
      e[2 * k] = x0 * c - x1 * s;
      e[2 * k + 1] = x0 * s + x1 * c;
    }
    store_vector(x + 2 * p, e);
  }
}

}  // namespace

void rope(CudaContext& context, const RopeArgs& args) {
  const char* op = "rope";
  expect_device(args.x, op, "x");
  expect_device(args.frequencies, op, "frequencies");
  expect_dtype(args.frequencies, DType::f32, op, "frequencies");
  if (args.seq_len <= 0 || args.frequencies.numel() % (2 * args.seq_len) != 0)
    fail(ErrorKind::internal, "cuda rope: expected frequencies of (seq_len, Dh/2, 2) with seq_len " +
                                  std::to_string(args.seq_len) + " > 0, found " + args.frequencies.str() +
                                  "; pass the table built for this sequence length");
  const int64_t half = args.frequencies.numel() / (2 * args.seq_len), head_dim = 2 * half;
  const int rank = args.x.shape.rank;
  const int64_t per_token = rank >= 3 ? args.x.shape[rank - 2] * args.x.shape[rank - 1] : args.x.cols();
  if ((rank >= 3 && args.x.shape[rank - 1] != head_dim) || per_token % head_dim != 0)
    fail(ErrorKind::internal, "cuda rope: expected x of (N, heads, " + std::to_string(head_dim) +
                                  ") matching the frequency table " + args.frequencies.str() + ", found " +
                                  args.x.str() + "; pass the table built for this head dimension");
  const int64_t tokens = args.x.numel() / per_token, heads = per_token / head_dim;
  dispatch_activation(args.x.dtype, op, [&](auto element) {
    using T = decltype(element);
    const float direction = args.inverse ? -1.0f : 1.0f;
    if (half % 4 == 0 && aligned16(args.x.data) && aligned16(args.frequencies.data)) {
      rope_rotate_quads<T><<<grid_for(tokens * heads * half / 4, 256, context.multiprocessors), 256, 0, context.stream>>>(
          args.x.as<T>(), args.frequencies.as<float>(), tokens, heads, half, args.seq_len, direction);
      SMELT_CUDA_LAUNCH_CHECK("rope_rotate_quads");
      return;
    }
    rope_rotate_pairs<T><<<grid_for(tokens * heads * half, 256, context.multiprocessors), 256, 0, context.stream>>>(
        args.x.as<T>(), args.frequencies.as<float>(), tokens, heads, half, args.seq_len, direction);
    SMELT_CUDA_LAUNCH_CHECK("rope_rotate_pairs");
  });
}

}  // namespace smelt::cuda
