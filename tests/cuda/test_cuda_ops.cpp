// Every element-wise, normalisation, reduction, optimizer and GEMM op of the CUDA backend
// against the CPU reference on fresh seeded random inputs, in f32 and bf16, outputs
// poisoned with NaN before the kernels run.
#include <tuple>

#include "cuda_test_support.h"

namespace smelt::test {
namespace {

const DType kActivationTypes[] = {DType::f32, DType::bf16};

class CudaOps : public CudaOpsTest {};

TEST_F(CudaOps, GemmMatchesCpuForEveryLayoutAndDtype) {
  const int64_t M = 96, K = 80, N = 112;
  uint64_t seed = 100;
  for (DType in : kActivationTypes)
    for (DType out_type : {in, DType::f32})
      for (int layout = 0; layout < 3; ++layout)
        for (int mode = 0; mode < 3; ++mode) {  // 0 plain, 1 addend, 2 accumulate
          const bool transpose_a = layout == 2, transpose_b = layout == 1;
          HostTensor a = random_tensor(in, transpose_a ? Shape{K, M} : Shape{M, K}, ++seed);
          HostTensor b = random_tensor(in, transpose_b ? Shape{N, K} : Shape{K, N}, ++seed);
          HostTensor addend = random_tensor(out_type, Shape{M, N}, ++seed);
          HostTensor want = mode == 2 ? addend : nan_tensor(out_type, Shape{M, N});
          GemmArgs cpu_args = gemm_args(a.view, transpose_a, b.view, transpose_b, want.view);
          if (mode == 1) cpu_args.addend = addend.view;
          cpu_args.accumulate = mode == 2;
          cpu_->gemm(cpu_args);

          TensorView out = mode == 2 ? upload(addend) : poisoned(out_type, Shape{M, N});
          GemmArgs args = gemm_args(upload(a), transpose_a, upload(b), transpose_b, out);
          if (mode == 1) args.addend = upload(addend);
          args.accumulate = mode == 2;
          cuda_->gemm(args);
          expect_close(want, download(out), tolerance_for(in),
                       "gemm " + std::string(dtype_name(in)) + "->" + std::string(dtype_name(out_type)) + " layout " +
                           std::to_string(layout) + " mode " + std::to_string(mode));
        }
}

// GEMM autotuning (CudaBackendOptions::gemm_autotune): the tuned kernels match the CPU (a plain
// call, then an accumulating one of the same shape), and two backends of one process pick the same
// kernels, so their outputs agree bit for bit. The shapes are this test's own.
TEST_F(CudaOps, GemmAutotuneMatchesCpuAndBackendsOfOneProcessAgree) {
  CudaBackendOptions options;
  options.gemm_autotune = true;
  WorkspaceShape shape;
  shape.tokens = 1024;
  shape.max_rows = shape.max_inner = shape.max_cols = 1024;
  shape.compute_dtype = DType::bf16;
  struct Tuned {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Arena> arena;
  };
  auto make = [&] {
    Tuned t{make_cuda_backend(options), nullptr};
    const size_t bytes = t.backend->workspace_bytes(shape);
    t.arena = std::make_unique<Arena>(t.backend->memory(), bytes);
    t.backend->set_workspace(t.arena->view(0, DType::f32, Shape{int64_t(bytes / 4)}));
    return t;
  };
  Tuned first = make(), second = make();
  const int64_t M = 1000, K = 520, N = 776;
  HostTensor a = random_tensor(DType::bf16, Shape{M, K}, 500), b = random_tensor(DType::bf16, Shape{N, K}, 501);
  HostTensor want = nan_tensor(DType::f32, Shape{M, N});
  cpu_->gemm(gemm_args(a.view, false, b.view, true, want.view));
  TensorView d_a = upload(a), d_b = upload(b);
  std::vector<HostTensor> outputs;
  for (Tuned* tuned : {&first, &second}) {
    TensorView out = poisoned(DType::f32, Shape{M, N});
    cuda_->synchronize();  // the fixture's stream filled it; the tuned backend runs on its own
    tuned->backend->gemm(gemm_args(d_a, false, d_b, true, out));
    tuned->backend->synchronize();
    expect_close(want, download(out), tolerance_for(DType::bf16), "autotuned gemm");
    outputs.push_back(download(out));
    GemmArgs again = gemm_args(d_a, false, d_b, true, out);
    again.accumulate = true;  // out += a b^T with the shape's tuned kernel
    tuned->backend->gemm(again);
    tuned->backend->synchronize();
    HostTensor twice = want;
    for (int64_t i = 0; i < twice.numel(); ++i) twice.set(i, 2 * want.get(i));
    expect_close(twice, download(out), tolerance_for(DType::bf16), "autotuned accumulating gemm");
  }
  expect_bits_equal(outputs[0], outputs[1], "two autotuning backends of one process");
}

TEST_F(CudaOps, EmbeddingForwardAndBackwardMatchCpu) {
  const int64_t count = 300, vocabulary = 97, dim = 64;
  for (DType dtype : kActivationTypes) {
    HostTensor tokens = random_ids(Shape{count}, 1, int32_t(vocabulary));
    HostTensor table = random_tensor(dtype, Shape{vocabulary, dim}, 2);
    HostTensor grad_out = random_tensor(dtype, Shape{count, dim}, 3);
    HostTensor want_out = nan_tensor(dtype, Shape{count, dim}), want_grad = nan_tensor(DType::f32, Shape{vocabulary, dim});
    cpu_->embedding_forward({tokens.view, table.view, want_out.view});
    cpu_->embedding_backward({tokens.view, grad_out.view, want_grad.view});
    TensorView device_tokens = upload(tokens);
    TensorView out = poisoned(dtype, Shape{count, dim}), grad = poisoned(DType::f32, Shape{vocabulary, dim});
    cuda_->embedding_forward({device_tokens, upload(table), out});
    cuda_->embedding_backward({device_tokens, upload(grad_out), grad});
    expect_bits_equal(want_out, download(out), "embedding forward " + std::string(dtype_name(dtype)));
    expect_close(want_grad, download(grad), 1e-5, "embedding backward " + std::string(dtype_name(dtype)));
    // Gradient accumulation: a second microbatch's rows added to the table gradient, not zeroed first.
    HostTensor more_tokens = random_ids(Shape{count}, 4, int32_t(vocabulary));
    HostTensor more_grad = random_tensor(dtype, Shape{count, dim}, 5);
    cpu_->embedding_backward({more_tokens.view, more_grad.view, want_grad.view, true});
    cuda_->embedding_backward({upload(more_tokens), upload(more_grad), grad, true});
    expect_close(want_grad, download(grad), 1e-5, "embedding backward, accumulated " + std::string(dtype_name(dtype)));
  }
}

// The 16-byte vector path (dim 320 and 2056: the backward in one pass over chunks of rows, a
// 16-byte column group per thread; dim 16376: 1024 threads, two groups for most; dim 16392: too
// wide for one pass, a block per row and a second read for the weight gradient) and the
// element-wise one (dim 99: not a multiple of 8). The amax each pass takes of what it stores (float8 fusion "full") equals, bit for bit, a
// standalone amax pass over its output.
// 1100 rows make chunks of several rows (and a shorter last one) in the one-pass backward; the wide
// rows take 257, as the arena holds one case at a time.
TEST_F(CudaOps, RmsNormForwardAndBackwardMatchCpu) {
  for (int64_t dim : {int64_t(320), int64_t(2056), int64_t(16376), int64_t(16392), int64_t(99)})
  for (DType dtype : kActivationTypes)
    for (bool accumulate : {false, true}) {
      rewind_arena();  // each case's tensors are its own
      const int64_t rows = dim > 4096 ? 257 : 1100;
      SCOPED_TRACE("dim " + std::to_string(dim) + ", rows " + std::to_string(rows));
      HostTensor x = random_tensor(dtype, Shape{rows, dim}, 10), weight = random_tensor(dtype, Shape{dim}, 11);
      HostTensor grad_out = random_tensor(dtype, Shape{rows, dim}, 12), prior = random_tensor(dtype, Shape{rows, dim}, 13);
      HostTensor out = nan_tensor(dtype, Shape{rows, dim}), rstd = nan_tensor(DType::f32, Shape{rows});
      HostTensor grad_input = accumulate ? prior : nan_tensor(dtype, Shape{rows, dim});
      // accumulate: both gradients added to what is there (the weight's as gradient accumulation does).
      const HostTensor prior_weight_grad = random_tensor(DType::f32, Shape{dim}, 14);
      HostTensor grad_weight = accumulate ? prior_weight_grad : nan_tensor(DType::f32, Shape{dim});
      cpu_->rmsnorm_forward({x.view, weight.view, out.view, rstd.view, 1e-5f});
      cpu_->rmsnorm_backward(
          {x.view, weight.view, rstd.view, grad_out.view, grad_input.view, accumulate, grad_weight.view, accumulate});

      TensorView dx = upload(x), dweight = upload(weight);
      TensorView d_out = poisoned(dtype, Shape{rows, dim}), d_rstd = poisoned(DType::f32, Shape{rows});
      TensorView d_grad_input = accumulate ? upload(prior) : poisoned(dtype, Shape{rows, dim});
      TensorView d_grad_weight = accumulate ? upload(prior_weight_grad) : poisoned(DType::f32, Shape{dim});
      TensorView out_amax = poisoned(DType::f32, Shape{1}), grad_amax = poisoned(DType::f32, Shape{1});
      cuda_->rmsnorm_forward({dx, dweight, d_out, d_rstd, 1e-5f, out_amax});
      RmsNormBackwardArgs backward{dx, dweight, d_rstd, upload(grad_out), d_grad_input, accumulate, d_grad_weight,
                                   accumulate};
      backward.amax = grad_amax;
      cuda_->rmsnorm_backward(backward);
      const std::string name = "rmsnorm " + std::string(dtype_name(dtype)) + (accumulate ? " accumulate" : "");
      for (const auto& [fused, tensor] : {std::pair{out_amax, d_out}, std::pair{grad_amax, d_grad_input}}) {
        TensorView standalone = poisoned(DType::f32, Shape{1});
        AmaxArgs a;
        a.x = tensor;
        a.amax = standalone;
        cuda_->amax(a);
        const HostTensor want = download(standalone);
        EXPECT_GT(want.get(0), 0.0);
        expect_bits_equal(want, download(fused), name + " fused amax");
      }
      expect_close(out, download(d_out), elementwise_tolerance(dtype), name + " out");
      expect_close(rstd, download(d_rstd), 1e-5, name + " rstd");
      expect_close(grad_input, download(d_grad_input), elementwise_tolerance(dtype) * 2, name + " grad_input");
      expect_close(grad_weight, download(d_grad_weight), 1e-4, name + " grad_weight");
    }
}

// Head dimension 32 takes the 16-byte path (pairs in fours), 12 the pair-by-pair one.
TEST_F(CudaOps, RopeForwardAndInverseMatchCpu) {
  const int64_t seq_len = 24, batch = 3, heads = 4;
  for (int64_t head_dim : {int64_t(32), int64_t(12)}) {
  SCOPED_TRACE("head_dim " + std::to_string(head_dim));
  HostTensor frequencies(DType::f32, Shape{seq_len, head_dim / 2, 2});
  for (int64_t t = 0; t < seq_len; ++t)
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const double angle = t * std::pow(10000.0, -2.0 * i / head_dim);
      frequencies.set((t * head_dim / 2 + i) * 2, std::cos(angle));
      frequencies.set((t * head_dim / 2 + i) * 2 + 1, std::sin(angle));
    }
  TensorView device_frequencies = upload(frequencies);
  for (DType dtype : kActivationTypes)
    for (bool inverse : {false, true}) {
      HostTensor x = random_tensor(dtype, Shape{batch * seq_len, heads, head_dim}, 20 + inverse);
      TensorView device_x = upload(x);
      cpu_->rope({x.view, frequencies.view, seq_len, inverse});
      cuda_->rope({device_x, device_frequencies, seq_len, inverse});
      expect_close(x, download(device_x), elementwise_tolerance(dtype),
                   "rope " + std::string(dtype_name(dtype)) + (inverse ? " inverse" : ""));
    }
  }
}

// Both the 16-byte vector path (129 x 200) and the element-wise one (7 x 13: not a multiple of 8).
// The amax SwiGLU takes of what it stores (fusion "full") equals, bit for bit, a standalone amax
// pass over its outputs.
TEST_F(CudaOps, SwigluForwardAndBackwardMatchCpu) {
  for (const Shape& shape : {Shape{129, 200}, Shape{7, 13}})
    for (DType dtype : kActivationTypes) {
      const std::string name = "swiglu " + std::string(dtype_name(dtype)) + " (" + std::to_string(shape[0]) + ", " +
                               std::to_string(shape[1]) + ")";
      SCOPED_TRACE(name);
      HostTensor gate = random_tensor(dtype, shape, 30, 2.0), up = random_tensor(dtype, shape, 31);
      HostTensor grad_out = random_tensor(dtype, shape, 32);
      HostTensor out = nan_tensor(dtype, shape), grad_gate = nan_tensor(dtype, shape), grad_up = nan_tensor(dtype, shape);
      cpu_->swiglu_forward({gate.view, up.view, out.view});
      cpu_->swiglu_backward({gate.view, up.view, grad_out.view, grad_gate.view, grad_up.view});
      TensorView d_gate = upload(gate), d_up = upload(up);
      TensorView d_out = poisoned(dtype, shape), d_grad_gate = poisoned(dtype, shape), d_grad_up = poisoned(dtype, shape);
      const Shape one{1};
      TensorView amax = poisoned(DType::f32, one), amax_gate = poisoned(DType::f32, one);
      TensorView amax_up = poisoned(DType::f32, one);
      cuda_->swiglu_forward({d_gate, d_up, d_out, amax});
      cuda_->swiglu_backward({d_gate, d_up, upload(grad_out), d_grad_gate, d_grad_up, amax_gate, amax_up});
      expect_close(out, download(d_out), elementwise_tolerance(dtype), name + " out");
      expect_close(grad_gate, download(d_grad_gate), elementwise_tolerance(dtype), name + " grad_gate");
      expect_close(grad_up, download(d_grad_up), elementwise_tolerance(dtype), name + " grad_up");
      for (const auto& [fused, tensor, what] : {std::tuple{amax, d_out, "amax of out"},
                                                std::tuple{amax_gate, d_grad_gate, "amax of grad_gate"},
                                                std::tuple{amax_up, d_grad_up, "amax of grad_up"}}) {
        TensorView standalone = poisoned(DType::f32, one);
        AmaxArgs a;
        a.x = tensor;
        a.amax = standalone;
        cuda_->amax(a);
        const HostTensor want = download(standalone);
        EXPECT_GT(want.get(0), 0.0) << what;
        expect_bits_equal(want, download(fused), what);
      }
    }
}

// Logits f32 (gradient f32 or bf16) or bf16 (the output head's bf16 GEMM; gradient bf16), the
// gradient separate or written over the logits.
// Vocabulary 1000 takes the 16-byte vector path, 999 the element-wise one.
TEST_F(CudaOps, CrossEntropyMatchesCpuWithIgnoredRowsAndAliasing) {
  const int64_t rows = 33;
  for (int64_t vocabulary : {int64_t(1000), int64_t(999)})
  for (DType logit_type : kActivationTypes)
    for (DType gradient_type : kActivationTypes)
      for (bool alias : {false, true}) {
        if (logit_type == DType::bf16 && gradient_type != DType::bf16) continue;
        if (alias && gradient_type != logit_type) continue;
        HostTensor logits = random_tensor(logit_type, Shape{rows, vocabulary}, 40, 3.0);
        HostTensor targets = random_ids(Shape{rows}, 41, int32_t(vocabulary));
        targets.view.as<int32_t>()[5] = -1;  // ignored row
        HostTensor losses = nan_tensor(DType::f32, Shape{rows});
        HostTensor grad = nan_tensor(gradient_type, Shape{rows, vocabulary});
        HostTensor cpu_logits = logits;
        cpu_->cross_entropy({cpu_logits.view, targets.view, losses.view, alias ? cpu_logits.view : grad.view, 0.03f});
        TensorView d_logits = upload(logits);
        TensorView d_losses = poisoned(DType::f32, Shape{rows});
        TensorView d_grad = alias ? d_logits : poisoned(gradient_type, Shape{rows, vocabulary});
        cuda_->cross_entropy({d_logits, upload(targets), d_losses, d_grad, 0.03f});
        const std::string name = "cross_entropy V" + std::to_string(vocabulary) + " logits " +
                                 std::string(dtype_name(logit_type)) + " grad " +
                                 std::string(dtype_name(gradient_type)) + (alias ? " aliased" : "");
        expect_close(losses, download(d_losses), 1e-5, name + " losses");
        expect_close(alias ? cpu_logits : grad, download(d_grad), elementwise_tolerance(gradient_type), name + " grad");
      }
}

TEST_F(CudaOps, ReductionsMatchCpuAndRepeatBitForBit) {
  for (DType dtype : kActivationTypes) {
    HostTensor x = random_tensor(dtype, Shape{100003}, 50);
    HostTensor sum = nan_tensor(DType::f32, Shape{1}), average = nan_tensor(DType::f32, Shape{1});
    sum.set(0, 2.5);
    cpu_->sum_squares({x.view, sum.view, true});
    cpu_->mean({x.view, average.view});
    TensorView d_x = upload(x);
    HostTensor start(DType::f32, Shape{1});
    start.set(0, 2.5);
    TensorView d_sum = upload(start), d_average = poisoned(DType::f32, Shape{1});
    cuda_->sum_squares({d_x, d_sum, true});
    cuda_->mean({d_x, d_average});
    const std::string name = "reductions " + std::string(dtype_name(dtype));
    expect_close(sum, download(d_sum), 1e-6, name + " sum_squares");
    expect_close(average, download(d_average), 1e-5, name + " mean");
    HostTensor first = download(d_average);
    cuda_->mean({d_x, d_average});
    expect_bits_equal(first, download(d_average), name + " mean repeated");
    // Two more inputs (the gradient norm over the f32 gradients, the embedding's own buffer and
    // the block linears' bf16 one): the third always bf16, as the linears' gradients are.
    HostTensor y = random_tensor(dtype, Shape{70001}, 51), z = random_tensor(DType::bf16, Shape{33333}, 52);
    HostTensor all = nan_tensor(DType::f32, Shape{1});
    SumSquaresArgs cpu_three{x.view, all.view};
    cpu_three.also = {y.view, z.view};
    cpu_->sum_squares(cpu_three);
    TensorView d_all = poisoned(DType::f32, Shape{1});
    SumSquaresArgs cuda_three{d_x, d_all};
    cuda_three.also = {upload(y), upload(z)};
    cuda_->sum_squares(cuda_three);
    expect_close(all, download(d_all), 1e-6, name + " sum_squares of three inputs");
    const double only_x = double(download(d_sum).get(0)) - 2.5;  // d_sum started at 2.5
    const double y_squares = double(sum_of_squares(y).get(0)), z_squares = double(sum_of_squares(z).get(0));
    EXPECT_GT(y_squares, 1.0);
    EXPECT_GT(z_squares, 1.0);
    EXPECT_NEAR(double(download(d_all).get(0)), only_x + y_squares + z_squares, 1e-5 * (only_x + y_squares + z_squares))
        << name << ": each input counts once";
  }
}

TEST_F(CudaOps, AdamwMatchesCpuWithAndWithoutClipping) {
  const int64_t count = 50000;
  for (float max_norm : {0.0f, 1.0f}) {
    HostTensor params = random_tensor(DType::f32, Shape{count}, 60), grads = random_tensor(DType::f32, Shape{count}, 61);
    HostTensor exp_avg = random_tensor(DType::f32, Shape{count}, 62, 0.1), exp_avg_sq = random_second_moment(count, 63);
    const HostTensor sum_squares = sum_of_squares(grads);
    TensorView d_params = upload(params), d_grads = upload(grads), d_m = upload(exp_avg), d_v = upload(exp_avg_sq);
    AdamwArgs args{params.view, grads.view, exp_avg.view, exp_avg_sq.view, sum_squares.view};
    args.lr = 3e-3f;
    args.weight_decay = 0.1f;
    args.max_norm = max_norm;
    args.step = 7;
    cpu_->adamw(args);
    AdamwArgs device_args = args;
    device_args.params = d_params;
    device_args.grads = d_grads;
    device_args.exp_avg = d_m;
    device_args.exp_avg_sq = d_v;
    device_args.grad_sum_squares = upload(sum_squares);
    cuda_->adamw(device_args);
    const std::string name = max_norm > 0 ? "adamw clipped" : "adamw";
    expect_close(params, download(d_params), 1e-6, name + " params");
    expect_bits_equal(grads, download(d_grads), name + " grads (read only)");
    expect_close(exp_avg, download(d_m), 1e-6, name + " exp_avg");
    expect_close(exp_avg_sq, download(d_v), 1e-6, name + " exp_avg_sq");
  }
}

TEST_F(CudaOps, ConvertRoundsLikeCpu) {
  HostTensor source = random_tensor(DType::f32, Shape{4097}, 70, 100.0);
  HostTensor want(DType::bf16, Shape{4097}), back(DType::f32, Shape{4097});
  cpu_->convert({source.view, want.view});
  cpu_->convert({want.view, back.view});
  TensorView d_bf16 = poisoned(DType::bf16, Shape{4097}), d_back = poisoned(DType::f32, Shape{4097});
  cuda_->convert({upload(source), d_bf16});
  cuda_->convert({d_bf16, d_back});
  expect_bits_equal(want, download(d_bf16), "convert f32 -> bf16");
  expect_bits_equal(back, download(d_back), "convert bf16 -> f32");
  // Accumulate (a received gradient shard added to the shard): f32 and bf16 sources into f32.
  for (DType dtype : kActivationTypes) {
    const HostTensor shard = random_tensor(DType::f32, Shape{4097}, 71), received = random_tensor(dtype, Shape{4097}, 72);
    HostTensor sum = shard;
    cpu_->convert({received.view, sum.view, true});
    TensorView d_sum = upload(shard);
    cuda_->convert({upload(received), d_sum, true});
    expect_bits_equal(sum, download(d_sum), "convert accumulate " + std::string(dtype_name(dtype)) + " -> f32");
  }
}

TEST_F(CudaOps, Float8OpsAreBitExactAgainstCpu) {
  const int64_t rows = 37, cols = 300;
  for (DType source_type : kActivationTypes)
    for (DType float8 : {DType::e4m3, DType::e5m2})
      for (bool rowwise : {false, true}) {
        HostTensor x = random_tensor(source_type, Shape{rows, cols}, 80, 5.0);
        const Shape stat_shape = rowwise ? Shape{rows} : Shape{1};
        HostTensor amax = nan_tensor(DType::f32, stat_shape), scale(DType::f32, stat_shape);
        cpu_->amax({x.view, amax.view, rowwise});
        for (int64_t i = 0; i < scale.numel(); ++i)
          scale.set(i, amax_to_scale(float(amax.get(i)), float8 == DType::e4m3 ? Float8Format::e4m3 : Float8Format::e5m2, false));
        HostTensor quantized(float8, Shape{rows, cols}), restored = nan_tensor(source_type, Shape{rows, cols});
        cpu_->quantize({x.view, quantized.view, scale.view, rowwise});
        cpu_->dequantize({quantized.view, restored.view, scale.view, rowwise});

        TensorView d_x = upload(x), d_scale = upload(scale);
        TensorView d_amax = poisoned(DType::f32, stat_shape), d_quantized = poisoned(float8, Shape{rows, cols});
        TensorView d_restored = poisoned(source_type, Shape{rows, cols});
        cuda_->amax({d_x, d_amax, rowwise});
        cuda_->quantize({d_x, d_quantized, d_scale, rowwise});
        cuda_->dequantize({d_quantized, d_restored, d_scale, rowwise});
        const std::string name = std::string(dtype_name(source_type)) + "->" + std::string(dtype_name(float8)) +
                                 (rowwise ? " rowwise" : " tensorwise");
        expect_bits_equal(amax, download(d_amax), "amax " + name);
        expect_bits_equal(quantized, download(d_quantized), "quantize " + name);
        expect_bits_equal(restored, download(d_restored), "dequantize " + name);
      }
}

}  // namespace
}  // namespace smelt::test
