// Causal grouped-query attention on the GPU: picks cuDNN's fused flash attention (bf16,
// attention_cudnn.cu) or the tiled kernels below (f32, and the fallback), and places the
// f32 scratch both need in the attention region of the workspace.
// The tiled kernels: one warp per query row (forward, dQ) or key row (dK, dV), online
// softmax, K/V read through the query head's group (no repeated K/V); deterministic.
#include <cstdio>
#include <map>

#include "cuda/attention_cudnn.h"

namespace smelt::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxPerLane = 8;  // head dim up to 256


struct Layout {
  int64_t batch, seq_len, heads, kv_heads, head_dim;
  __device__ int64_t q_index(int64_t b, int64_t t, int64_t h) const { return ((b * seq_len + t) * heads + h) * head_dim; }
  __device__ int64_t kv_index(int64_t b, int64_t t, int64_t g) const {
    return ((b * seq_len + t) * kv_heads + g) * head_dim;
  }
  __device__ int64_t lse_index(int64_t b, int64_t h, int64_t t) const { return (b * heads + h) * seq_len + t; }
};

template <typename T>
__device__ __forceinline__ void load_row(const T* row, int lane, int64_t head_dim, float (&values)[kMaxPerLane]) {
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    values[e] = d < head_dim ? load_float(row, d) : 0.0f;
  }
}

template <typename T>
__device__ __forceinline__ float dot_row(const float (&values)[kMaxPerLane], const T* row, int lane, int64_t head_dim) {
  float sum = 0;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < head_dim) sum += values[e] * load_float(row, d);
  }
  return warp_sum(sum);
}

// One warp per (b, h, query t): out and lse.
template <typename T>
__global__ void attention_forward_rows(const T* q, const T* k, const T* v, T* out, float* lse, Layout L, float scale) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= L.batch * L.heads * L.seq_len) return;
  const int64_t t = row % L.seq_len, h = (row / L.seq_len) % L.heads, b = row / (L.seq_len * L.heads);
  const int64_t group = h / (L.heads / L.kv_heads);
  float query[kMaxPerLane], accumulator[kMaxPerLane];
  load_row(q + L.q_index(b, t, h), lane, L.head_dim, query);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) accumulator[e] = 0;
  float maximum = -INFINITY, total = 0;
  for (int64_t j = 0; j <= t; ++j) {
    const float score = scale * dot_row(query, k + L.kv_index(b, j, group), lane, L.head_dim);
    const float new_maximum = fmaxf(maximum, score);
    const float correction = expf(maximum - new_maximum), weight = expf(score - new_maximum);
    total = total * correction + weight;
    const T* value = v + L.kv_index(b, j, group);
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int64_t d = lane + 32 * e;
      if (d < L.head_dim) accumulator[e] = accumulator[e] * correction + weight * load_float(value, d);
    }
    maximum = new_maximum;
  }
  T* output = out + L.q_index(b, t, h);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < L.head_dim) store_float(output, d, accumulator[e] / total);
  }
  if (lane == 0) lse[L.lse_index(b, h, t)] = maximum + logf(total);
}

// delta[b, h, t] = sum_d dO * O
template <typename T>
__global__ void attention_output_dot(const T* out, const T* grad_out, float* delta, Layout L) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= L.batch * L.heads * L.seq_len) return;
  const int64_t t = row % L.seq_len, h = (row / L.seq_len) % L.heads, b = row / (L.seq_len * L.heads);
  float values[kMaxPerLane];
  load_row(grad_out + L.q_index(b, t, h), lane, L.head_dim, values);
  const float sum = dot_row(values, out + L.q_index(b, t, h), lane, L.head_dim);
  if (lane == 0) delta[L.lse_index(b, h, t)] = sum;
}

// One warp per query row: dQ = scale * sum_j P_ij (dO_i . V_j - delta_i) K_j
template <typename T>
__global__ void attention_grad_query_rows(const T* q, const T* k, const T* v, const T* grad_out, const float* lse,
                                          const float* delta, T* grad_q, Layout L, float scale) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= L.batch * L.heads * L.seq_len) return;
  const int64_t t = row % L.seq_len, h = (row / L.seq_len) % L.heads, b = row / (L.seq_len * L.heads);
  const int64_t group = h / (L.heads / L.kv_heads);
  float query[kMaxPerLane], gradient[kMaxPerLane], accumulator[kMaxPerLane];
  load_row(q + L.q_index(b, t, h), lane, L.head_dim, query);
  load_row(grad_out + L.q_index(b, t, h), lane, L.head_dim, gradient);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) accumulator[e] = 0;
  const float row_lse = lse[L.lse_index(b, h, t)], row_delta = delta[L.lse_index(b, h, t)];
  for (int64_t j = 0; j <= t; ++j) {
    const T* key = k + L.kv_index(b, j, group);
    const float probability = expf(scale * dot_row(query, key, lane, L.head_dim) - row_lse);
    const float grad_score = probability * (dot_row(gradient, v + L.kv_index(b, j, group), lane, L.head_dim) - row_delta);
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int64_t d = lane + 32 * e;
      if (d < L.head_dim) accumulator[e] += grad_score * load_float(key, d);
    }
  }
  T* output = grad_q + L.q_index(b, t, h);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < L.head_dim) store_float(output, d, scale * accumulator[e]);
  }
}

// One warp per key row (b, group, j): dV = sum P^T dO, dK = scale * sum dS^T Q over the group's heads.
template <typename T>
__global__ void attention_grad_key_rows(const T* q, const T* k, const T* v, const T* grad_out, const float* lse,
                                        const float* delta, T* grad_k, T* grad_v, Layout L, float scale) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= L.batch * L.kv_heads * L.seq_len) return;
  const int64_t j = row % L.seq_len, group = (row / L.seq_len) % L.kv_heads, b = row / (L.seq_len * L.kv_heads);
  const int64_t group_size = L.heads / L.kv_heads;
  float key[kMaxPerLane], value[kMaxPerLane], grad_key[kMaxPerLane], grad_value[kMaxPerLane];
  load_row(k + L.kv_index(b, j, group), lane, L.head_dim, key);
  load_row(v + L.kv_index(b, j, group), lane, L.head_dim, value);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) grad_key[e] = grad_value[e] = 0;
  for (int64_t h = group * group_size; h < (group + 1) * group_size; ++h) {
    for (int64_t t = j; t < L.seq_len; ++t) {
      const T* query = q + L.q_index(b, t, h);
      const T* gradient = grad_out + L.q_index(b, t, h);
      const float probability = expf(scale * dot_row(key, query, lane, L.head_dim) - lse[L.lse_index(b, h, t)]);
      const float grad_score = probability * (dot_row(value, gradient, lane, L.head_dim) - delta[L.lse_index(b, h, t)]);
#pragma unroll
      for (int e = 0; e < kMaxPerLane; ++e) {
        const int64_t d = lane + 32 * e;
        if (d < L.head_dim) {
          grad_value[e] += probability * load_float(gradient, d);
          grad_key[e] += grad_score * load_float(query, d);
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < L.head_dim) {
      store_float(grad_k + L.kv_index(b, j, group), d, scale * grad_key[e]);
      store_float(grad_v + L.kv_index(b, j, group), d, grad_value[e]);
    }
  }
}

struct CachedForward {
  AttentionPlan plan;
  AttentionForwardUids uids;
};
struct CachedBackward {
  AttentionPlan plan;
  AttentionBackwardUids uids;
};

class AttentionCache final : public OpCache {
 public:
  std::map<AttentionShape, CachedForward> forward;
  std::map<AttentionShape, CachedBackward> backward;
  std::map<AttentionShape, bool> cudnn_failed;  // automatic mode falls back to the tiled kernels
};

Layout check_shapes(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const TensorView& lse, const char* op) {
  for (const TensorView* t : {&q, &k, &v, &out, &lse}) expect_device(*t, op, "q/k/v/out/lse");
  if (q.shape.rank != 4 || k.shape.rank != 4)
    fail(ErrorKind::internal, std::string("cuda ") + op + ": expected q (B, T, H, Dh) and k (B, T, KV, Dh), found " +
                                  q.str() + " and " + k.str() + "; reshape them to rank 4");
  Layout L{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  if (k.shape[0] != L.batch || k.shape[1] != L.seq_len || k.shape[3] != L.head_dim || L.kv_heads <= 0 ||
      L.heads % L.kv_heads != 0 || L.head_dim > 32 * kMaxPerLane)
    fail(ErrorKind::internal, std::string("cuda ") + op + ": expected k (B, T, KV, Dh) with H a multiple of KV and " +
                                  "Dh <= 256, found q " + q.str() + " and k " + k.str());
  expect_numel(v, k.numel(), op, "v");
  expect_numel(out, q.numel(), op, "out");
  expect_numel(lse, L.batch * L.heads * L.seq_len, op, "lse");
  expect_dtype(lse, DType::f32, op, "lse");
  for (const TensorView* t : {&k, &v, &out}) expect_dtype(*t, q.dtype, op, "k/v/out");
  return L;
}

AttentionShape shape_of(const Layout& L) { return {L.batch, L.seq_len, L.heads, L.kv_heads, L.head_dim}; }

// Whether to run cuDNN for this call; builds (and caches) the plan on first use.
template <typename Cached, typename Build>
Cached* cudnn_plan(CudaContext& context, std::map<AttentionShape, Cached>& plans, const Layout& L, DType dtype,
                   AttentionImplementation implementation, Build build) {
  if (implementation == AttentionImplementation::tiled) return nullptr;
  const bool supported = dtype == DType::bf16 && L.head_dim % 8 == 0 && L.head_dim <= 256;
  if (!supported) {
    if (implementation == AttentionImplementation::cudnn)
      fail(ErrorKind::internal, "cuda attention: cuDNN runs bf16 with a head dim multiple of 8 (<= 256), found " +
                                    std::string(dtype_name(dtype)) + " with head dim " + std::to_string(L.head_dim) +
                                    "; use the automatic or tiled implementation");
    return nullptr;
  }
  auto& cache = *static_cast<AttentionCache*>(context.attention_cache);
  const AttentionShape shape = shape_of(L);
  auto found = plans.find(shape);
  if (found != plans.end()) return &found->second;
  if (implementation == AttentionImplementation::automatic && cache.cudnn_failed.count(shape)) return nullptr;
  try {
    Cached cached;
    cached.plan = build(shape, cached.uids);
    return &plans.emplace(shape, std::move(cached)).first->second;
  } catch (const Error& error) {
    if (implementation == AttentionImplementation::cudnn) throw;
    cache.cudnn_failed[shape] = true;
    std::fprintf(stderr, "smelt: warning: cuDNN attention unavailable for this shape, using the tiled kernels: %s\n",
                 error.what());
    return nullptr;
  }
}

// The attention scratch of one call: the planned view when given, else the workspace's region.
struct Region {
  char* data = nullptr;
  size_t bytes = 0;
};

Region region_of(const CudaContext& context, const TensorView& scratch) {
  if (!scratch.empty()) return {static_cast<char*>(scratch.data), scratch.bytes()};
  return {context.attention_region(), context.attention_region_bytes()};
}

void require_region(const Region& region, size_t need, const char* op) {
  if (region.bytes < need)
    fail(ErrorKind::internal, std::string("cuda ") + op + ": expected at least " + std::to_string(need) +
                                  " bytes of attention scratch, found " + std::to_string(region.bytes) +
                                  "; size the workspace with workspace_bytes() (and planned scratch with "
                                  "attention_backward_scratch_bytes()) for the largest attention shape");
}

}  // namespace

std::unique_ptr<OpCache> make_attention_cache() { return std::make_unique<AttentionCache>(); }


void attention_forward(CudaContext& context, const AttentionForwardArgs& args, AttentionImplementation implementation) {
  const char* op = "attention_forward";
  const Layout L = check_shapes(args.q, args.k, args.v, args.out, args.lse, op);
  context.require_workspace(op);
  auto& cache = *static_cast<AttentionCache*>(context.attention_cache);
  auto* cached = cudnn_plan(context, cache.forward, L, args.q.dtype, implementation,
                            [&](const AttentionShape& shape, AttentionForwardUids& uids) {
                              return build_cudnn_forward(context.cudnn, shape, uids);
                            });
  if (cached) {
    require_region(region_of(context, TensorView()), cached->plan.workspace_bytes, op);
    float scale = args.scale, negative_infinity = -INFINITY;
    const auto& u = cached->uids;
    execute_cudnn_plan(context.cudnn, cached->plan, {u.q, u.k, u.v, u.out, u.lse, u.scale, u.negative_infinity},
                       {args.q.data, args.k.data, args.v.data, args.out.data, args.lse.data, &scale, &negative_infinity},
                       context.attention_region());
    return;
  }
  const int64_t rows = L.batch * L.heads * L.seq_len;
  const unsigned blocks = unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  dispatch_activation(args.q.dtype, op, [&](auto element) {
    using T = decltype(element);
    attention_forward_rows<T><<<blocks, 32 * kWarpsPerBlock, 0, context.stream>>>(
        args.q.as<T>(), args.k.as<T>(), args.v.as<T>(), args.out.as<T>(), args.lse.as<float>(), L, args.scale);
    SMELT_CUDA_LAUNCH_CHECK("attention_forward_rows");
  });
}

void attention_backward(CudaContext& context, const AttentionBackwardArgs& args, AttentionImplementation implementation) {
  const char* op = "attention_backward";
  const Layout L = check_shapes(args.q, args.k, args.v, args.out, args.lse, op);
  for (const TensorView* t : {&args.grad_out, &args.grad_q, &args.grad_k, &args.grad_v}) {
    expect_device(*t, op, "grad_out/grad_q/grad_k/grad_v");
    expect_dtype(*t, args.q.dtype, op, "grad_out/grad_q/grad_k/grad_v");
  }
  expect_numel(args.grad_out, args.q.numel(), op, "grad_out");
  expect_numel(args.grad_q, args.q.numel(), op, "grad_q");
  expect_numel(args.grad_k, args.k.numel(), op, "grad_k");
  expect_numel(args.grad_v, args.k.numel(), op, "grad_v");
  context.require_workspace(op);
  auto& cache = *static_cast<AttentionCache*>(context.attention_cache);
  const int64_t rows = L.batch * L.heads * L.seq_len;
  const size_t row_bytes = cuda_workspace_align(size_t(rows) * sizeof(float));
  auto* cached = cudnn_plan(context, cache.backward, L, args.q.dtype, implementation,
                            [&](const AttentionShape& shape, AttentionBackwardUids& uids) {
                              return build_cudnn_backward(context.cudnn, shape, uids);
                            });
  if (cached) {
    const size_t accumulator_bytes = cuda_workspace_align(size_t(rows * L.head_dim) * sizeof(float));
    const Region scratch = region_of(context, args.scratch);
    require_region(scratch, row_bytes + accumulator_bytes + cached->plan.workspace_bytes, op);
    char* region = scratch.data;
    float scale = args.scale, negative_infinity = -INFINITY, one = 1.0f;
    const auto& u = cached->uids;
    execute_cudnn_plan(context.cudnn, cached->plan,
                       {u.q, u.k, u.v, u.out, u.grad_out, u.lse, u.grad_q, u.grad_k, u.grad_v, u.scale,
                        u.negative_infinity, u.one, u.softmax_sum, u.grad_q_accumulator},
                       {args.q.data, args.k.data, args.v.data, args.out.data, args.grad_out.data, args.lse.data,
                        args.grad_q.data, args.grad_k.data, args.grad_v.data, &scale, &negative_infinity, &one, region,
                        region + row_bytes},
                       region + row_bytes + accumulator_bytes);
    return;
  }
  const Region scratch = region_of(context, args.scratch);
  require_region(scratch, row_bytes, op);
  auto* delta = reinterpret_cast<float*>(scratch.data);
  const unsigned query_blocks = unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const int64_t key_rows = L.batch * L.kv_heads * L.seq_len;
  const unsigned key_blocks = unsigned((key_rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  dispatch_activation(args.q.dtype, op, [&](auto element) {
    using T = decltype(element);
    attention_output_dot<T><<<query_blocks, 32 * kWarpsPerBlock, 0, context.stream>>>(
        args.out.as<T>(), args.grad_out.as<T>(), delta, L);
    SMELT_CUDA_LAUNCH_CHECK("attention_output_dot");
    attention_grad_query_rows<T><<<query_blocks, 32 * kWarpsPerBlock, 0, context.stream>>>(
        args.q.as<T>(), args.k.as<T>(), args.v.as<T>(), args.grad_out.as<T>(), args.lse.as<float>(), delta,
        args.grad_q.as<T>(), L, args.scale);
    SMELT_CUDA_LAUNCH_CHECK("attention_grad_query_rows");
    attention_grad_key_rows<T><<<key_blocks, 32 * kWarpsPerBlock, 0, context.stream>>>(
        args.q.as<T>(), args.k.as<T>(), args.v.as<T>(), args.grad_out.as<T>(), args.lse.as<float>(), delta,
        args.grad_k.as<T>(), args.grad_v.as<T>(), L, args.scale);
    SMELT_CUDA_LAUNCH_CHECK("attention_grad_key_rows");
  });
}

}  // namespace smelt::cuda
