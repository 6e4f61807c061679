// Microbenchmark: the float8 conversion passes of one Llama-3 8B layer, through the CUDA backend,
// as the step runs them, with the bytes each moves and the bandwidth that makes:
//   weights (f32 master -> float8 W, and W^T for rowwise, after the optimizer), per recipe: the
//   whole cast as quantize_weight runs it, and for rowwise its amax pass and cast pass apart;
//   activations (bf16, M tokens): the amax pass and the cast of x into x and x^T, tensorwise and
//   rowwise (a scale per row of x and per row of x^T).
// Each line sums the layer's seven linears; "per step" multiplies by --layers.
// Usage: cast_bench [--tokens M] [--layers L] [--repeats N]
#include <string>

#include "bench_support.cuh"
#include "core/arena.h"
#include "cuda/cuda_backend.h"
#include "model/fp8_linear.h"

using namespace smelt;

namespace {

struct Linear { const char* name; int64_t in, out; };
constexpr Linear kLinears[] = {{"wq", 4096, 4096},  {"wk", 4096, 1024},  {"wv", 4096, 1024}, {"wo", 4096, 4096},
                               {"w1", 4096, 14336}, {"w3", 4096, 14336}, {"w2", 14336, 4096}};

struct Timed {
  double milliseconds = 0, bytes = 0;
  void add(double ms, double b) { milliseconds += ms, bytes += b; }
};

void report(const char* what, const Timed& t, int layers) {
  std::printf("%-44s %8.3f ms per layer, %7.2f ms per step, %6.2f GB, %6.0f GB/s\n", what, t.milliseconds,
              t.milliseconds * layers, t.bytes * 1e-9, t.bytes / t.milliseconds * 1e-6);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 8192;
  int layers = 8, repeats = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--tokens" && i + 1 < argc) tokens = std::atoll(argv[++i]);
    else if (flag == "--layers" && i + 1 < argc) layers = std::atoi(argv[++i]);
    else if (flag == "--repeats" && i + 1 < argc) repeats = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: cast_bench [--tokens M] [--layers L] [--repeats N]\n");
      return 2;
    }
  }
  if (tokens <= 0 || tokens % 16 != 0 || layers <= 0 || repeats <= 0) {
    std::fprintf(stderr, "cast_bench: --tokens must be a positive multiple of 16, --layers and --repeats positive\n");
    return 2;
  }
  if (cuda_device_count() == 0) {
    std::printf("cast_bench: no CUDA device, skipped\n");
    return 0;
  }
  try {
    CudaBackend backend;
    auto stream = static_cast<cudaStream_t>(backend.stream());
    const int64_t max_weight = 4096 * 14336, max_side = std::max<int64_t>(tokens, 14336);
    const int64_t max_activation = tokens * 14336;
    const auto bytes = bench::padded_bytes;
    Arena arena(backend.memory(), bytes(max_weight, DType::f32) + bytes(2 * max_weight, DType::e4m3) +
                                      bytes(max_activation, DType::bf16) + bytes(2 * max_activation, DType::e4m3) +
                                      4 * bytes(max_side, DType::f32) + bytes(4 * max_side, DType::f32));
    bench::ArenaCarver carver(arena);
    const TensorView master = carver.take(Shape{max_weight}, DType::f32);
    const TensorView weight_codes = carver.take(Shape{2 * max_weight}, DType::e4m3);
    const TensorView activation = carver.take(Shape{max_activation}, DType::bf16);
    const TensorView activation_codes = carver.take(Shape{2 * max_activation}, DType::e4m3);
    const TensorView amax = carver.take(Shape{max_side}, DType::f32);
    const TensorView amax_transposed = carver.take(Shape{max_side}, DType::f32);
    const TensorView scale = carver.take(Shape{max_side}, DType::f32);
    const TensorView scale_transposed = carver.take(Shape{max_side}, DType::f32);
    const TensorView weight_scales = carver.take(Shape{4 * max_side}, DType::f32);
    bench::randomize(master, 11, 0.02f, stream);
    bench::randomize(activation, 12, 2.0f, stream);
    auto shaped = [](const TensorView& all, DType t, Shape s) { return TensorView(all.data, t, s, Device::cuda); };
    auto time = [&](const std::function<void()>& body) { return bench::median_milliseconds(body, stream, 3, repeats); };

    // Weights: f32 master (out, in) -> W (out, in) and W^T (in, out), one byte each.
    for (Float8Recipe recipe : {Float8Recipe::tensorwise, Float8Recipe::rowwise}) {
      const bool rowwise = recipe == Float8Recipe::rowwise;
      Timed whole, amax_pass, cast_pass, ready;
      for (const Linear& l : kLinears) {
        const TensorView w = shaped(master, DType::f32, Shape{l.out, l.in});
        // Tensorwise keeps W only by default (its W^T is W's codes transposed where used).
        const Float8Weight copy = float8_weight_views(recipe, l.out, l.in, weight_codes, weight_scales, rowwise);
        const double n = double(l.in) * l.out, written = rowwise ? 2 : 1;
        whole.add(time([&] { quantize_weight(backend, recipe, w, copy, amax, amax_transposed); }), n * (4 + 4 + written));
        if (!rowwise) {  // what the step runs: AdamW took the amax, the cast alone remains
          const TensorView one = shaped(amax, DType::f32, Shape{1});
          ready.add(time([&] { quantize_weight(backend, recipe, w, copy, amax, amax_transposed, one); }), n * (4 + 1));
          continue;
        }
        AmaxArgs a;
        a.x = w;
        a.amax = shaped(amax, DType::f32, Shape{l.out});
        a.rowwise = true;
        a.column_amax = shaped(amax_transposed, DType::f32, Shape{l.in});
        amax_pass.add(time([&] { backend.amax(a); }), n * 4);
        QuantizeArgs q;
        q.src = w;
        q.dst = copy.rows.values;
        q.scale = copy.rows.scale;
        q.amax = a.amax;
        q.rowwise = true;
        q.round_scale_to_power_of_two = true;
        q.dst_transposed = copy.transposed.values;
        q.amax_transposed = a.column_amax;
        q.scale_transposed = copy.transposed.scale;
        cast_pass.add(time([&] { backend.quantize(q); }), n * (4 + 2));
      }
      if (!rowwise) {
        report("weights tensorwise: amax + cast to W", whole, layers);
        report("weights tensorwise: cast to W (amax ready)", ready, layers);
      } else {
        report("weights rowwise: amax + cast to W, W^T", whole, layers);
        report("weights rowwise: amax of rows and columns", amax_pass, layers);
        report("weights rowwise: cast to W, W^T", cast_pass, layers);
      }
    }

    // Activations: x (tokens, in) bf16 -> x (tokens, in) and x^T (in, tokens), e4m3, for the
    // linears' distinct inputs (wq/wk/wv share x, w1/w3 share theirs): in = 4096 three times
    // (attention norm, wo's input, FFN norm) and 14336 once (w2's).
    const int64_t inputs[] = {4096, 4096, 4096, 14336};
    for (bool rowwise : {false, true}) {
      Timed amax_pass, cast_pass;
      for (int64_t in : inputs) {
        const TensorView x = shaped(activation, DType::bf16, Shape{tokens, in});
        const double n = double(tokens) * in;
        AmaxArgs a;
        a.x = x;
        a.rowwise = rowwise;
        a.amax = shaped(amax, DType::f32, Shape{rowwise ? tokens : 1});
        if (rowwise) a.column_amax = shaped(amax_transposed, DType::f32, Shape{in});
        amax_pass.add(time([&] { backend.amax(a); }), n * 2);
        QuantizeArgs q;
        q.src = x;
        q.dst = shaped(activation_codes, DType::e4m3, Shape{tokens, in});
        q.scale = shaped(scale, DType::f32, Shape{rowwise ? tokens : 1});
        q.amax = a.amax;
        q.rowwise = rowwise;
        q.round_scale_to_power_of_two = rowwise;
        q.dst_transposed = TensorView(static_cast<uint8_t*>(activation_codes.data) + tokens * in, DType::e4m3,
                                      Shape{in, tokens}, Device::cuda);
        q.amax_transposed = rowwise ? a.column_amax : a.amax;
        q.scale_transposed = shaped(scale_transposed, DType::f32, Shape{rowwise ? in : 1});
        cast_pass.add(time([&] { backend.quantize(q); }), n * (2 + 2));
      }
      report(rowwise ? "activations rowwise: amax of rows and columns" : "activations tensorwise: amax", amax_pass,
             layers);
      report(rowwise ? "activations rowwise: cast to x, x^T" : "activations tensorwise: cast to x, x^T", cast_pass,
             layers);
    }
    bench::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cast_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
