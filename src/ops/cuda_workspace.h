// The CUDA backend's workspace size as plain arithmetic, so `smelt plan` on a machine without a GPU
// (or a build without CUDA) predicts the same arena the GPU run allocates. The CUDA backend sizes
// its workspace with these functions; nothing here needs the CUDA toolkit.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/backend.h"

namespace smelt {

// Layout: [cuBLASLt workspace][reduction scratch][attention region].
constexpr size_t kCudaGemmWorkspaceBytes = size_t(32) << 20;
constexpr size_t kCudaReduceScratchBytes = size_t(8) << 20;
// cuDNN's backward plan asks for about one f32 (B, H, T, Dh) buffer of its own (measured on an
// H200 with cuDNN 9: 128 MiB + 256 bytes at B1 H32 T8192 Dh128); reserved, plus this margin.
constexpr size_t kCudnnPlanMarginBytes = size_t(32) << 20;

// The widest rows whose RMSNorm backward runs in one pass over x and dy (src/cuda/rmsnorm.cu: up to
// 1024 threads, two 16-byte column groups each); wider rows read them again for the weight
// gradient. The cost model counts the same.
constexpr int64_t kCudaRmsNormOnePassMaxDim = 16384;

constexpr size_t cuda_workspace_align(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The attention region: softmax statistics per query row; with bf16 (cuDNN), the f32 dQ
// accumulator and the plan's own workspace (one more f32 (B, H, T, Dh)) plus the margin.
inline size_t cuda_attention_workspace_bytes(const WorkspaceShape& shape) {
  const size_t rows = size_t(shape.batch) * size_t(shape.heads) * size_t(shape.seq_len);
  size_t bytes = cuda_workspace_align(rows * sizeof(float));
  if (shape.compute_dtype == DType::bf16)
    bytes += 2 * cuda_workspace_align(rows * size_t(shape.head_dim) * sizeof(float)) + kCudnnPlanMarginBytes;
  return bytes;
}

// What the attention forward (and the backward without planned scratch) finds in the workspace
// when the backward's scratch is planned apart: the statistics rows and the forward plan's margin.
inline size_t cuda_attention_forward_region_bytes(const WorkspaceShape& shape) {
  const size_t rows = size_t(shape.batch) * size_t(shape.heads) * size_t(shape.seq_len);
  return cuda_workspace_align(rows * sizeof(float)) + (shape.compute_dtype == DType::bf16 ? kCudnnPlanMarginBytes : 0);
}

inline size_t cuda_workspace_bytes(const WorkspaceShape& shape) {
  return kCudaGemmWorkspaceBytes + kCudaReduceScratchBytes +
         (shape.attention_backward_planned ? cuda_attention_forward_region_bytes(shape)
                                           : cuda_attention_workspace_bytes(shape));
}

}  // namespace smelt
