// Causal grouped-query attention of the CUDA backend (cuDNN fused flash attention and the
// tiled kernels) against the CPU reference, forward (out, lse) and backward (dQ, dK, dV).
#include "cuda_test_support.h"

namespace smelt::test {
namespace {

struct AttentionCase {
  int64_t batch, seq_len, heads, kv_heads, head_dim;
  DType dtype;
  CudaAttention implementation;
};

std::string describe(const AttentionCase& c) {
  const char* name = c.implementation == CudaAttention::cudnn ? "cudnn" : c.implementation == CudaAttention::tiled ? "tiled" : "automatic";
  return std::string(name) + " " + std::string(dtype_name(c.dtype)) + " B" + std::to_string(c.batch) + " T" +
         std::to_string(c.seq_len) + " H" + std::to_string(c.heads) + " KV" + std::to_string(c.kv_heads) + " Dh" +
         std::to_string(c.head_dim);
}

class CudaAttentionTest : public CudaOpsTest {
 protected:
  void check(const AttentionCase& c, uint64_t seed) {
    static_cast<CudaBackend*>(cuda_.get())->set_attention(c.implementation);
    const Shape q_shape{c.batch, c.seq_len, c.heads, c.head_dim}, kv_shape{c.batch, c.seq_len, c.kv_heads, c.head_dim};
    const Shape lse_shape{c.batch, c.heads, c.seq_len};
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    HostTensor q = random_tensor(c.dtype, q_shape, seed), k = random_tensor(c.dtype, kv_shape, seed + 1);
    HostTensor v = random_tensor(c.dtype, kv_shape, seed + 2), grad_out = random_tensor(c.dtype, q_shape, seed + 3);
    HostTensor out = nan_tensor(c.dtype, q_shape), lse = nan_tensor(DType::f32, lse_shape);
    HostTensor grad_q = nan_tensor(c.dtype, q_shape), grad_k = nan_tensor(c.dtype, kv_shape), grad_v = nan_tensor(c.dtype, kv_shape);
    cpu_->attention_forward({q.view, k.view, v.view, out.view, lse.view, scale});
    cpu_->attention_backward({q.view, k.view, v.view, out.view, lse.view, grad_out.view, grad_q.view, grad_k.view, grad_v.view, scale});

    TensorView d_q = upload(q), d_k = upload(k), d_v = upload(v), d_grad_out = upload(grad_out);
    TensorView d_out = poisoned(c.dtype, q_shape), d_lse = poisoned(DType::f32, lse_shape);
    TensorView d_grad_q = poisoned(c.dtype, q_shape), d_grad_k = poisoned(c.dtype, kv_shape), d_grad_v = poisoned(c.dtype, kv_shape);
    cuda_->attention_forward({d_q, d_k, d_v, d_out, d_lse, scale});
    cuda_->attention_backward({d_q, d_k, d_v, d_out, d_lse, d_grad_out, d_grad_q, d_grad_k, d_grad_v, scale});
    const std::string name = describe(c);
    // bf16: inputs and outputs rounded to bf16 (cuDNN also rounds P and dS to bf16 before its matmuls).
    const double tolerance = c.dtype == DType::bf16 ? 1e-2 : 1e-4;
    expect_close(out, download(d_out), tolerance, name + " out");
    expect_close(lse, download(d_lse), 1e-4, name + " lse");
    expect_close(grad_q, download(d_grad_q), tolerance, name + " grad_q");
    expect_close(grad_k, download(d_grad_k), tolerance, name + " grad_k");
    expect_close(grad_v, download(d_grad_v), tolerance, name + " grad_v");
  }
};

TEST_F(CudaAttentionTest, TiledKernelsMatchCpu) {
  check({2, 40, 4, 2, 32, DType::f32, CudaAttention::tiled}, 1);
  check({1, 33, 6, 3, 64, DType::f32, CudaAttention::tiled}, 2);
  check({2, 40, 4, 1, 64, DType::bf16, CudaAttention::tiled}, 3);
}

TEST_F(CudaAttentionTest, CudnnFlashAttentionMatchesCpu) {
  check({2, 128, 4, 2, 64, DType::bf16, CudaAttention::cudnn}, 10);
  check({1, 256, 8, 2, 128, DType::bf16, CudaAttention::cudnn}, 11);
  check({1, 64, 4, 4, 128, DType::bf16, CudaAttention::cudnn}, 12);
}

TEST_F(CudaAttentionTest, AutomaticPicksAWorkingImplementation) {
  check({2, 96, 4, 2, 128, DType::bf16, CudaAttention::automatic}, 20);
  check({1, 48, 4, 2, 64, DType::f32, CudaAttention::automatic}, 21);
}

}  // namespace
}  // namespace smelt::test
