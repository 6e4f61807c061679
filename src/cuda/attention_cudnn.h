// cuDNN fused flash attention (backend graph API): the plans and the tensor ids of the
// forward and backward graphs, built per shape by attention_cudnn.cu.
#pragma once
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "cuda/cuda_common.cuh"

namespace smelt::cuda {

struct AttentionShape {
  int64_t batch = 0, seq_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
  auto tie() const { return std::tie(batch, seq_len, heads, kv_heads, head_dim); }
  bool operator<(const AttentionShape& other) const { return tie() < other.tie(); }
};

// A finalized execution plan (owns a cuDNN descriptor) and the workspace it needs.
struct AttentionPlan {
  std::shared_ptr<void> plan;
  size_t workspace_bytes = 0;
};

struct AttentionForwardUids {
  int64_t q = 0, k = 0, v = 0, out = 0, lse = 0, scale = 0, negative_infinity = 0;
};

struct AttentionBackwardUids {
  int64_t q = 0, k = 0, v = 0, out = 0, grad_out = 0, lse = 0, grad_q = 0, grad_k = 0, grad_v = 0;
  int64_t scale = 0, negative_infinity = 0, one = 0;
  int64_t softmax_sum = 0, grad_q_accumulator = 0;  // f32 tensors the caller places in its workspace
};

// Throw Error(device) when cuDNN rejects the graph or no engine builds.
AttentionPlan build_cudnn_forward(cudnnHandle_t handle, const AttentionShape& shape, AttentionForwardUids& uids);
AttentionPlan build_cudnn_backward(cudnnHandle_t handle, const AttentionShape& shape, AttentionBackwardUids& uids);

// Runs a plan on the handle's stream; `pointers[i]` is the data of tensor `uids[i]`
// (host pointers for the by-value scalars).
void execute_cudnn_plan(cudnnHandle_t handle, const AttentionPlan& plan, const std::vector<int64_t>& uids,
                        const std::vector<void*>& pointers, void* workspace);

}  // namespace smelt::cuda
