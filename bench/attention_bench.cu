// Microbenchmark: causal bf16 attention, forward and backward, through the CUDA backend
// (cuDNN fused flash attention by default). Default shape B1 H32 KV8 T8192 Dh128.
// TFLOPS count the causal half: 4*B*H*T^2*Dh/2 forward, 2.5x that backward.
// Usage: attention_bench [--tiled] [--seq T] [--batch B] [--heads H] [--kv-heads KV] [--head-dim D] [--repeats N]
#include <cstring>
#include <string>

#include "bench_support.cuh"
#include "core/arena.h"
#include "cuda/cuda_backend.h"

using namespace smelt;

int main(int argc, char** argv) {
  int64_t batch = 1, seq_len = 8192, heads = 32, kv_heads = 8, head_dim = 128;
  int repeats = 20;
  CudaAttention implementation = CudaAttention::cudnn;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--tiled") implementation = CudaAttention::tiled;
    else if (flag == "--seq" && i + 1 < argc) seq_len = std::atoll(argv[++i]);
    else if (flag == "--batch" && i + 1 < argc) batch = std::atoll(argv[++i]);
    else if (flag == "--heads" && i + 1 < argc) heads = std::atoll(argv[++i]);
    else if (flag == "--kv-heads" && i + 1 < argc) kv_heads = std::atoll(argv[++i]);
    else if (flag == "--head-dim" && i + 1 < argc) head_dim = std::atoll(argv[++i]);
    else if (flag == "--repeats" && i + 1 < argc) repeats = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: attention_bench [--tiled] [--seq T] [--batch B] [--heads H] [--kv-heads KV] [--head-dim D] [--repeats N]\n");
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::printf("attention_bench: no CUDA device, skipped\n");
    return 0;
  }
  try {
    CudaBackendOptions options;
    options.attention = implementation;
    CudaBackend backend(options);
    auto stream = static_cast<cudaStream_t>(backend.stream());
    const DType dtype = DType::bf16;
    const Shape q_shape{batch, seq_len, heads, head_dim}, kv_shape{batch, seq_len, kv_heads, head_dim};
    const Shape lse_shape{batch, heads, seq_len};
    WorkspaceShape workspace_shape;
    workspace_shape.batch = batch;
    workspace_shape.seq_len = seq_len;
    workspace_shape.heads = heads;
    workspace_shape.kv_heads = kv_heads;
    workspace_shape.head_dim = head_dim;
    workspace_shape.compute_dtype = dtype;
    const size_t workspace = backend.workspace_bytes(workspace_shape);
    const size_t tensors = 4 * bench::padded_bytes(q_shape.numel(), dtype) +
                           4 * bench::padded_bytes(kv_shape.numel(), dtype) +
                           bench::padded_bytes(lse_shape.numel(), DType::f32);
    Arena arena(backend.memory(), tensors + workspace);
    bench::ArenaCarver carver(arena);
    TensorView q = carver.take(q_shape, dtype), out = carver.take(q_shape, dtype);
    TensorView grad_out = carver.take(q_shape, dtype), grad_q = carver.take(q_shape, dtype);
    TensorView k = carver.take(kv_shape, dtype), v = carver.take(kv_shape, dtype);
    TensorView grad_k = carver.take(kv_shape, dtype), grad_v = carver.take(kv_shape, dtype);
    TensorView lse = carver.take(lse_shape, DType::f32);
    backend.set_workspace(arena.view(carver.used(), DType::f32, Shape{int64_t(workspace / 4)}));
    bench::randomize(q, 1, 1.0f, stream);
    bench::randomize(k, 2, 1.0f, stream);
    bench::randomize(v, 3, 1.0f, stream);
    bench::randomize(grad_out, 4, 1.0f, stream);
    const float scale = 1.0f / std::sqrt(float(head_dim));
    const AttentionForwardArgs forward{q, k, v, out, lse, scale};
    const AttentionBackwardArgs backward{q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v, scale};
    const int warmup = implementation == CudaAttention::tiled ? 1 : 3;
    if (implementation == CudaAttention::tiled) repeats = std::min(repeats, 3);
    const double forward_ms = bench::median_milliseconds([&] { backend.attention_forward(forward); }, stream, warmup, repeats);
    const double backward_ms = bench::median_milliseconds([&] { backend.attention_backward(backward); }, stream, warmup, repeats);
    const double forward_flops = 4.0 * batch * heads * double(seq_len) * seq_len * head_dim / 2;
    const double backward_flops = 2.5 * forward_flops;
    std::printf("attention %s bf16 B%lld H%lld KV%lld T%lld Dh%lld: forward %.3f ms %.1f TFLOPS, backward %.3f ms %.1f TFLOPS\n",
                implementation == CudaAttention::tiled ? "tiled" : "cudnn", (long long)batch, (long long)heads,
                (long long)kv_heads, (long long)seq_len, (long long)head_dim, forward_ms,
                forward_flops / forward_ms * 1e-9, backward_ms, backward_flops / backward_ms * 1e-9);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "attention_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
