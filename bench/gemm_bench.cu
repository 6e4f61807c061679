// Microbenchmark: bf16 GEMMs of the Llama-3 8B linear layers (M = 8192 tokens) through the
// CUDA backend's cuBLASLt path: forward (x W^T), grad-input (dy W), grad-weight (dy^T x, f32 out).
// Usage: gemm_bench [--tokens M] [--repeats N]
#include <string>

#include "bench_support.cuh"
#include "core/arena.h"
#include "cuda/cuda_backend.h"

using namespace smelt;

int main(int argc, char** argv) {
  int64_t tokens = 8192;
  int repeats = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--tokens" && i + 1 < argc) tokens = std::atoll(argv[++i]);
    else if (flag == "--repeats" && i + 1 < argc) repeats = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: gemm_bench [--tokens M] [--repeats N]\n");
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::printf("gemm_bench: no CUDA device, skipped\n");
    return 0;
  }
  try {
    CudaBackend backend;
    auto stream = static_cast<cudaStream_t>(backend.stream());
    struct Layer { const char* name; int64_t in, out; };
    const Layer layers[] = {{"qkv", 4096, 6144}, {"attn_out", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}};
    const int64_t max_in = 14336, max_out = 28672;
    auto bytes = [](int64_t n, DType t) { return (size_t(n) * dtype_size(t) + 255) / 256 * 256; };
    const size_t workspace = backend.workspace_bytes(WorkspaceShape{});
    Arena arena(backend.memory(), bytes(tokens * max_in, DType::bf16) * 2 + bytes(tokens * max_out, DType::bf16) +
                                      bytes(max_in * max_out, DType::bf16) + bytes(max_in * max_out, DType::f32) + workspace);
    size_t offset = 0;
    auto take = [&](Shape s, DType t) {
      TensorView view = arena.view(offset, t, s);
      offset += bytes(s.numel(), t);
      return view;
    };
    TensorView x_all = take(Shape{tokens * max_in}, DType::bf16), dx_all = take(Shape{tokens * max_in}, DType::bf16);
    TensorView y_all = take(Shape{tokens * max_out}, DType::bf16), w_all = take(Shape{max_in * max_out}, DType::bf16);
    TensorView dw_all = take(Shape{max_in * max_out}, DType::f32);
    backend.set_workspace(arena.view(offset, DType::f32, Shape{int64_t(workspace / 4)}));
    bench::randomize(x_all, 1, 1.0f, stream);
    bench::randomize(y_all, 2, 1.0f, stream);
    bench::randomize(w_all, 3, 0.02f, stream);
    for (const Layer& layer : layers) {
      TensorView x(x_all.data, DType::bf16, Shape{tokens, layer.in}, Device::cuda);
      TensorView dx(dx_all.data, DType::bf16, Shape{tokens, layer.in}, Device::cuda);
      TensorView y(y_all.data, DType::bf16, Shape{tokens, layer.out}, Device::cuda);
      TensorView w(w_all.data, DType::bf16, Shape{layer.out, layer.in}, Device::cuda);
      TensorView dw(dw_all.data, DType::f32, Shape{layer.out, layer.in}, Device::cuda);
      const double flops = 2.0 * tokens * layer.in * layer.out;
      GemmArgs forward{x, false, w, true, y, {}, false, {}, {}};
      GemmArgs grad_input{y, false, w, false, dx, {}, false, {}, {}};
      GemmArgs grad_weight{y, true, x, false, dw, {}, false, {}, {}};
      const double f = bench::median_milliseconds([&] { backend.gemm(forward); }, stream, 3, repeats);
      const double g = bench::median_milliseconds([&] { backend.gemm(grad_input); }, stream, 3, repeats);
      const double h = bench::median_milliseconds([&] { backend.gemm(grad_weight); }, stream, 3, repeats);
      std::printf("gemm %-8s M%lld K%lld N%lld: forward %.1f, grad-input %.1f, grad-weight %.1f TFLOPS\n", layer.name,
                  (long long)tokens, (long long)layer.in, (long long)layer.out, flops / f * 1e-9, flops / g * 1e-9,
                  flops / h * 1e-9);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gemm_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
