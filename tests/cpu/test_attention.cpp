// Causal GQA attention on the CPU: forward against a full-softmax reference,
// backward against central finite differences in f64, f32/bf16 against f64,
// and bitwise equality across runs and thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include "cpu/finite_difference.h"

namespace smelt::test {
namespace {

constexpr int64_t kBatch = 2, kSeq = 7, kHeads = 4, kKvHeads = 2, kHeadDim = 8;
constexpr int64_t kQueryCount = kBatch * kSeq * kHeads * kHeadDim, kKvCount = kBatch * kSeq * kKvHeads * kHeadDim;

WorkspaceShape attention_workspace() {
  WorkspaceShape shape;
  shape.batch = kBatch;
  shape.seq_len = kSeq;
  shape.tokens = kBatch * kSeq;
  shape.heads = kHeads;
  shape.kv_heads = kKvHeads;
  shape.head_dim = kHeadDim;
  shape.compute_dtype = DType::f64;
  return shape;
}

float attention_scale() { return float(1.0 / std::sqrt(double(kHeadDim))); }

struct Inputs {
  std::vector<double> q, k, v;
};

Inputs random_inputs(uint64_t seed) {
  return {random_values(kQueryCount, seed, -2, 2), random_values(kKvCount, seed + 1, -2, 2),
          random_values(kKvCount, seed + 2)};
}

// Reference: the full masked score matrix per (batch, head), softmax, times V.
void reference_attention(const Inputs& in, std::vector<double>& out, std::vector<double>& lse) {
  out.assign(kQueryCount, 0.0);
  lse.assign(kBatch * kHeads * kSeq, 0.0);
  const double scale = attention_scale();
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t g = h / (kHeads / kKvHeads);
      std::vector<double> scores(kSeq * kSeq, -INFINITY);
      for (int64_t i = 0; i < kSeq; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < kHeadDim; ++d)
            s += in.q[((b * kSeq + i) * kHeads + h) * kHeadDim + d] * in.k[((b * kSeq + j) * kKvHeads + g) * kHeadDim + d];
          scores[i * kSeq + j] = s * scale;
        }
      for (int64_t i = 0; i < kSeq; ++i) {
        double total = 0;
        for (int64_t j = 0; j < kSeq; ++j) total += std::exp(scores[i * kSeq + j]);
        lse[(b * kHeads + h) * kSeq + i] = std::log(total);
        for (int64_t j = 0; j < kSeq; ++j)
          for (int64_t d = 0; d < kHeadDim; ++d)
            out[((b * kSeq + i) * kHeads + h) * kHeadDim + d] +=
                std::exp(scores[i * kSeq + j]) / total * in.v[((b * kSeq + j) * kKvHeads + g) * kHeadDim + d];
      }
    }
}

struct Forward {
  Buffer q, k, v, out, lse;
};

Forward run_forward(Backend& backend, const Inputs& in, DType dtype) {
  Forward f{Buffer(in.q, dtype, Shape{kBatch, kSeq, kHeads, kHeadDim}),
            Buffer(in.k, dtype, Shape{kBatch, kSeq, kKvHeads, kHeadDim}),
            Buffer(in.v, dtype, Shape{kBatch, kSeq, kKvHeads, kHeadDim}),
            Buffer(dtype, Shape{kBatch, kSeq, kHeads, kHeadDim}),
            Buffer(dtype == DType::f64 ? DType::f64 : DType::f32, Shape{kBatch, kHeads, kSeq})};
  backend.attention_forward(
      AttentionForwardArgs{f.q.view(), f.k.view(), f.v.view(), f.out.view(), f.lse.view(), attention_scale()});
  return f;
}

struct Gradients {
  Buffer grad_q, grad_k, grad_v;
};

Gradients run_backward(Backend& backend, Forward& f, const std::vector<double>& grad_out_values, DType dtype) {
  Buffer grad_out(grad_out_values, dtype, Shape{kBatch, kSeq, kHeads, kHeadDim});
  Gradients g{Buffer(dtype, f.q.shape), Buffer(dtype, f.k.shape), Buffer(dtype, f.k.shape)};
  AttentionBackwardArgs args;
  args.q = f.q.view();
  args.k = f.k.view();
  args.v = f.v.view();
  args.out = f.out.view();
  args.lse = f.lse.view();
  args.grad_out = grad_out.view();
  args.grad_q = g.grad_q.view();
  args.grad_k = g.grad_k.view();
  args.grad_v = g.grad_v.view();
  args.scale = attention_scale();
  backend.attention_backward(args);
  return g;
}

TEST(Attention, ForwardMatchesFullSoftmaxReference) {
  BackendFixture backend(attention_workspace());
  const auto in = random_inputs(1);
  std::vector<double> expected_out, expected_lse;
  reference_attention(in, expected_out, expected_lse);
  auto f = run_forward(*backend, in, DType::f64);
  expect_close(f.out.values(), expected_out, 1e-12, "out");
  expect_close(f.lse.values(), expected_lse, 1e-12, "lse");
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  BackendFixture backend(attention_workspace());
  auto in = random_inputs(2);
  const auto weights = random_values(kQueryCount, 5);
  auto loss = [&] { return weighted_sum(weights, run_forward(*backend, in, DType::f64).out.values()); };
  auto f = run_forward(*backend, in, DType::f64);
  auto g = run_backward(*backend, f, weights, DType::f64);
  // 1e-5: central differences of this loss carry about 1e-8 of rounding noise, which an element
  // near zero sees whole (1e-6 failed about one fresh draw in 500).
  expect_close(g.grad_q.values(), numeric_gradient(in.q, loss), 1e-5, "grad_q");
  expect_close(g.grad_k.values(), numeric_gradient(in.k, loss), 1e-5, "grad_k");
  expect_close(g.grad_v.values(), numeric_gradient(in.v, loss), 1e-5, "grad_v");
}

TEST(Attention, LowerPrecisionsTrackF64) {
  WorkspaceShape shape = attention_workspace();
  BackendFixture backend(shape);
  const auto in = random_inputs(3);
  const auto grad_out = random_values(kQueryCount, 6);
  for (auto [dtype, tolerance] : {std::pair{DType::f32, 1e-5}, std::pair{DType::bf16, 3e-2}}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    // The f64 reference sees the inputs as the dtype holds them, so what is compared is the
    // kernel's arithmetic in that dtype, not the rounding of its inputs.
    const Inputs held{rounded(in.q, dtype), rounded(in.k, dtype), rounded(in.v, dtype)};
    const std::vector<double> held_grad_out = rounded(grad_out, dtype);
    auto reference = run_forward(*backend, held, DType::f64);
    auto reference_grads = run_backward(*backend, reference, held_grad_out, DType::f64);
    auto f = run_forward(*backend, in, dtype);
    expect_close(f.out.values(), reference.out.values(), tolerance, "out", 5e-2);
    expect_close(f.lse.values(), reference.lse.values(), tolerance, "lse", 5e-2);
    auto g = run_backward(*backend, f, grad_out, dtype);
    if (dtype == DType::f32) {  // 1e-4: the same cancellation, at f32's precision
      expect_close(g.grad_q.values(), reference_grads.grad_q.values(), 1e-4, "grad_q", 5e-2);
      expect_close(g.grad_k.values(), reference_grads.grad_k.values(), 1e-4, "grad_k", 5e-2);
      expect_close(g.grad_v.values(), reference_grads.grad_v.values(), 1e-4, "grad_v", 5e-2);
    } else {
      // bf16 probabilities and their gradients cancel in dQ and dK: an element near zero carries
      // the error of the terms it sums, so the gradients are compared as wholes (over 1,000 fresh
      // draws the largest norm-wise error seen was 4.6e-3).
      expect_close_normwise(g.grad_q.values(), reference_grads.grad_q.values(), 1e-2, "grad_q");
      expect_close_normwise(g.grad_k.values(), reference_grads.grad_k.values(), 1e-2, "grad_k");
      expect_close_normwise(g.grad_v.values(), reference_grads.grad_v.values(), 1e-2, "grad_v");
    }
  }
}

TEST(Attention, BackwardIsBitwiseIndependentOfRunsAndThreads) {
  BackendFixture backend(attention_workspace());
  const auto in = random_inputs(4);
  const auto grad_out = random_values(kQueryCount, 7);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<unsigned char>> results;
  for (DType dtype : {DType::f32, DType::bf16}) {
    results.clear();
    for (int threads : {1, 2, 3, 2}) {
      omp_set_num_threads(threads);
      auto f = run_forward(*backend, in, dtype);
      auto g = run_backward(*backend, f, grad_out, dtype);
      std::vector<unsigned char> bits = f.out.bits();
      for (const Buffer* b : {&f.lse, &g.grad_q, &g.grad_k, &g.grad_v}) {
        auto more = b->bits();
        bits.insert(bits.end(), more.begin(), more.end());
      }
      results.push_back(bits);
    }
    for (size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[i], results[0]) << dtype_name(dtype) << " run " << i;
  }
  omp_set_num_threads(saved);
}

TEST(Attention, RejectsTooSmallWorkspaceAndBadHeads) {
  auto backend = make_cpu_backend();
  std::vector<double> tiny(8);
  backend->set_workspace(TensorView(tiny.data(), DType::f64, Shape{8}));
  EXPECT_THROW(run_forward(*backend, random_inputs(8), DType::f64), Error);
  BackendFixture sized(attention_workspace());
  Buffer q(random_values(kQueryCount, 9), DType::f64, Shape{kBatch, kSeq, kHeads, kHeadDim});
  Buffer k(random_values(kBatch * kSeq * 3 * kHeadDim, 10), DType::f64, Shape{kBatch, kSeq, 3, kHeadDim});
  Buffer out(DType::f64, q.shape), lse(DType::f64, Shape{kBatch, kHeads, kSeq});
  EXPECT_THROW(sized->attention_forward(AttentionForwardArgs{q.view(), k.view(), k.view(), out.view(), lse.view(), 1.0f}),
               Error);
}

}  // namespace
}  // namespace smelt::test
