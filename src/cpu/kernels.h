// The CPU reference kernels, one free function per op (files named like the
// CUDA ones: gemm.cpp, rmsnorm.cpp, ...). Plain loops, OpenBLAS for GEMM, OpenMP
// over independent outputs only, so results are bitwise independent of threads.
#pragma once
#include <cstddef>

#include "ops/backend.h"
#include "ops/op_args.h"

namespace smelt::cpu {

// Scratch the GEMM needs for bf16/float8 operands (converted to f32): a, b and
// the f32 product. Sized from WorkspaceShape with M = rows of op(a) and out
// (max_rows), K = the inner dimension (max_inner), N = cols of out (max_cols).
size_t gemm_workspace_bytes(const WorkspaceShape& shape);
void gemm(const GemmArgs& args, TensorView workspace);

void embedding_forward(const EmbeddingForwardArgs& args);
void embedding_backward(const EmbeddingBackwardArgs& args);

void rmsnorm_forward(const RmsNormForwardArgs& args);
void rmsnorm_backward(const RmsNormBackwardArgs& args);

void rope(const RopeArgs& args);

// One scores row and the dK/dV accumulators per (batch, head) task.
size_t attention_workspace_bytes(const WorkspaceShape& shape);
void attention_forward(const AttentionForwardArgs& args, TensorView workspace);
void attention_backward(const AttentionBackwardArgs& args, TensorView workspace);

void swiglu_forward(const SwigluForwardArgs& args);
void swiglu_backward(const SwigluBackwardArgs& args);

void cross_entropy(const CrossEntropyArgs& args);

void sum_squares(const SumSquaresArgs& args);
void mean(const MeanArgs& args);

// Applies torch.optim.AdamW's update to the gradients scaled by the clip factor; the gradient
// buffer is read, never written.
void adamw(const AdamwArgs& args);

}  // namespace smelt::cpu
