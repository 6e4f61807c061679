// Microbenchmark: the GEMMs of the Llama-3 8B linear layers (M = 8192 tokens) and of the output
// head's loss chunks, through the CUDA backend's cuBLASLt path, as the model runs them:
//   forward (x W^T), grad-input (dy W), grad-weight (dy^T x, f32 out);
//   --float8: tensorwise, as the recipe casts them (forward e4m3 x e4m3 with fast accumulation;
//   grad-input e5m2 dy x e4m3 W^T and grad-weight e5m2 dy^T x e4m3 x^T without), the casts
//   themselves not timed;
//   the output head (bf16): logits of one chunk, d hidden (K = vocabulary) and d W_out with and
//   without accumulating into the f32 gradient (the chunks after the first accumulate).
// Usage: gemm_bench [--tokens M] [--chunk C] [--vocab V] [--float8] [--repeats N]
#include <string>

#include "bench_support.cuh"
#include "core/arena.h"
#include "cuda/cuda_backend.h"
#include "model/fp8_linear.h"

using namespace smelt;

namespace {

double tflops(double flops, double milliseconds) { return flops / milliseconds * 1e-9; }

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 8192, chunk = 2048, vocab = 128256;
  int repeats = 20;
  bool float8 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--tokens" && i + 1 < argc) tokens = std::atoll(argv[++i]);
    else if (flag == "--chunk" && i + 1 < argc) chunk = std::atoll(argv[++i]);
    else if (flag == "--vocab" && i + 1 < argc) vocab = std::atoll(argv[++i]);
    else if (flag == "--repeats" && i + 1 < argc) repeats = std::atoi(argv[++i]);
    else if (flag == "--float8") float8 = true;
    else {
      std::fprintf(stderr, "usage: gemm_bench [--tokens M] [--chunk C] [--vocab V] [--float8] [--repeats N]\n");
      return 2;
    }
  }
  if (tokens <= 0 || chunk <= 0 || vocab <= 0 || repeats <= 0) {
    std::fprintf(stderr, "gemm_bench: --tokens, --chunk, --vocab and --repeats must be positive\n");
    return 2;
  }
  if (cuda_device_count() == 0) {
    std::printf("gemm_bench: no CUDA device, skipped\n");
    return 0;
  }
  try {
    CudaBackend backend;
    auto stream = static_cast<cudaStream_t>(backend.stream());
    struct Layer { const char* name; int64_t in, out; };
    // The model's linears, and the fused QKV projection for comparison (the model runs wq, wk, wv).
    const Layer layers[] = {{"wq", 4096, 4096},  {"wk", 4096, 1024},  {"wv", 4096, 1024},     {"wo", 4096, 4096},
                            {"w1", 4096, 14336}, {"w3", 4096, 14336}, {"w2", 14336, 4096}, {"qkv*", 4096, 6144}};
    const int64_t max_in = 14336, max_out = 14336, dim = 4096;
    const int64_t max_rows = std::max(tokens, chunk);
    const int64_t max_activation = std::max(tokens * std::max(max_in, max_out), chunk * vocab);
    const int64_t max_weight = std::max(max_in * max_out, vocab * dim);
    const auto bytes = bench::padded_bytes;
    const size_t workspace = backend.workspace_bytes(WorkspaceShape{});
    // bf16: x, dx, y (or logits), W; f32: dW; float8: copies of x, x^T, dy, dy^T, W, W^T, scales.
    const size_t float8_bytes = float8 ? 6 * bytes(max_activation, DType::e4m3) + 12 * bytes(8, DType::f32) : 0;
    Arena arena(backend.memory(), bytes(max_rows * max_in, DType::bf16) * 2 + bytes(max_activation, DType::bf16) +
                                      bytes(max_weight, DType::bf16) + bytes(max_weight, DType::f32) + float8_bytes +
                                      workspace);
    bench::ArenaCarver carver(arena);
    TensorView x_all = carver.take(Shape{max_rows * max_in}, DType::bf16);
    TensorView dx_all = carver.take(Shape{max_rows * max_in}, DType::bf16);
    TensorView y_all = carver.take(Shape{max_activation}, DType::bf16);
    TensorView w_all = carver.take(Shape{max_weight}, DType::bf16);
    TensorView dw_all = carver.take(Shape{max_weight}, DType::f32);
    struct Float8Buffers { TensorView values, amax, scale; };
    Float8Buffers f8[6];
    if (float8)
      for (auto& b : f8)
        b = {carver.take(Shape{max_activation}, DType::e4m3), carver.take(Shape{8}, DType::f32),
             carver.take(Shape{8}, DType::f32)};
    backend.set_workspace(arena.view(carver.used(), DType::f32, Shape{int64_t(workspace / 4)}));
    bench::randomize(x_all, 1, 1.0f, stream);
    bench::randomize(y_all, 2, 1.0f, stream);
    bench::randomize(w_all, 3, 0.02f, stream);
    bench::randomize(dw_all, 4, 0.01f, stream);
    auto view = [](const TensorView& all, DType t, Shape s) { return TensorView(all.data, t, s, Device::cuda); };

    for (const Layer& layer : layers) {
      TensorView x = view(x_all, DType::bf16, Shape{tokens, layer.in});
      TensorView dx = view(dx_all, DType::bf16, Shape{tokens, layer.in});
      TensorView y = view(y_all, DType::bf16, Shape{tokens, layer.out});
      TensorView w = view(w_all, DType::bf16, Shape{layer.out, layer.in});
      TensorView dw = view(dw_all, DType::f32, Shape{layer.out, layer.in});
      const double flops = 2.0 * tokens * layer.in * layer.out;
      GemmArgs forward, grad_input, grad_weight;
      if (!float8) {
        forward = GemmArgs{x, false, w, true, y, {}, false, {}, {}};
        grad_input = GemmArgs{y, false, w, false, dx, {}, false, {}, {}};
        grad_weight = GemmArgs{y, true, x, false, dw, {}, false, {}, {}};
      } else {  // each operand cast once, as the tensorwise recipe casts it; a @ b^T on K-major copies
        auto cast = [&](const TensorView& source, bool transpose, LinearGemm gemm, bool operand_a, int slot) {
          const GemmCast c = float8_gemm_cast(Float8Recipe::tensorwise, gemm);
          return quantize_operand(backend, source, transpose, operand_a ? c.a : c.b,
                                  Float8Slot{f8[slot].values, f8[slot].amax, f8[slot].scale});
        };
        const QuantizedOperand qx = cast(x, false, LinearGemm::output, true, 0);
        const QuantizedOperand qw = cast(w, false, LinearGemm::output, false, 1);
        const QuantizedOperand qdy = cast(y, false, LinearGemm::grad_input, true, 2);
        const QuantizedOperand qwt = cast(w, true, LinearGemm::grad_input, false, 3);
        const QuantizedOperand qdyt = cast(y, true, LinearGemm::grad_weight, true, 4);
        const QuantizedOperand qxt = cast(x, true, LinearGemm::grad_weight, false, 5);
        auto gemm = [](const QuantizedOperand& a, const QuantizedOperand& b, LinearGemm which, const TensorView& out) {
          GemmArgs g;
          g.a = a.values;
          g.b = b.values;
          g.transpose_b = true;
          g.out = out;
          g.scale_a = a.scale;
          g.scale_b = b.scale;
          g.scaling_a = a.scaling;
          g.scaling_b = b.scaling;
          g.fast_accumulation = float8_gemm_cast(Float8Recipe::tensorwise, which).fast_accumulation;
          return g;
        };
        forward = gemm(qx, qw, LinearGemm::output, y);
        grad_input = gemm(qdy, qwt, LinearGemm::grad_input, dx);
        grad_weight = gemm(qdyt, qxt, LinearGemm::grad_weight, dw);
      }
      const double f = bench::median_milliseconds([&] { backend.gemm(forward); }, stream, 3, repeats);
      const double g = bench::median_milliseconds([&] { backend.gemm(grad_input); }, stream, 3, repeats);
      const double h = bench::median_milliseconds([&] { backend.gemm(grad_weight); }, stream, 3, repeats);
      std::printf("gemm %s %-5s M%lld K%lld N%lld: forward %.1f, grad-input %.1f, grad-weight %.1f TFLOPS (%.3f ms)\n",
                  float8 ? "fp8-tw" : "bf16", layer.name, (long long)tokens, (long long)layer.in, (long long)layer.out,
                  tflops(flops, f), tflops(flops, g), tflops(flops, h), f + g + h);
    }

    // The output head in bf16, one loss chunk: logits (C, V) = h (C, D) W^T; dh = dlogits W (K = V);
    // dW (V, D) (+)= dlogits^T h into f32 (K = C).
    TensorView hidden = view(x_all, DType::bf16, Shape{chunk, dim});
    TensorView grad_hidden = view(dx_all, DType::bf16, Shape{chunk, dim});
    TensorView logits = view(y_all, DType::bf16, Shape{chunk, vocab});
    TensorView weight = view(w_all, DType::bf16, Shape{vocab, dim});
    TensorView grad_weight = view(dw_all, DType::f32, Shape{vocab, dim});
    const double flops = 2.0 * chunk * dim * vocab;
    GemmArgs forward{hidden, false, weight, true, logits, {}, false, {}, {}};
    GemmArgs grad_input{logits, false, weight, false, grad_hidden, {}, false, {}, {}};
    GemmArgs first{logits, true, hidden, false, grad_weight, {}, false, {}, {}};
    GemmArgs later{logits, true, hidden, false, grad_weight, {}, true, {}, {}};
    const double f = bench::median_milliseconds([&] { backend.gemm(forward); }, stream, 3, repeats);
    const double g = bench::median_milliseconds([&] { backend.gemm(grad_input); }, stream, 3, repeats);
    const double h = bench::median_milliseconds([&] { backend.gemm(first); }, stream, 3, repeats);
    const double k = bench::median_milliseconds([&] { backend.gemm(later); }, stream, 3, repeats);
    std::printf("head bf16 chunk %lld V%lld D%lld: logits %.1f, grad-input %.1f, grad-weight %.1f, accumulating %.1f "
                "TFLOPS; %lld chunks %.2f ms\n",
                (long long)chunk, (long long)vocab, (long long)dim, tflops(flops, f), tflops(flops, g), tflops(flops, h),
                tflops(flops, k), (long long)((tokens + chunk - 1) / chunk),
                double((tokens + chunk - 1) / chunk) * (f + g + k) - k + h);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gemm_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
