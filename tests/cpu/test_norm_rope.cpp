// RMSNorm, RoPE and the token embedding on the CPU: forward against the formula,
// backward against central finite differences in f64, f32/bf16 against f64,
// and bitwise independence of the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include "cpu/finite_difference.h"

namespace smelt::test {
namespace {

constexpr int64_t kRows = 13, kDim = 11;
constexpr float kEps = 1e-5f;

struct RmsNormRun {
  Buffer input, weight, out, rstd;
};

RmsNormRun rmsnorm_forward(Backend& backend, const std::vector<double>& x, const std::vector<double>& w, DType dtype) {
  const DType stat = dtype == DType::f64 ? DType::f64 : DType::f32;
  RmsNormRun run{Buffer(x, dtype, Shape{kRows, kDim}), Buffer(w, dtype, Shape{kDim}), Buffer(dtype, Shape{kRows, kDim}),
                 Buffer(stat, Shape{kRows})};
  backend.rmsnorm_forward(RmsNormForwardArgs{run.input.view(), run.weight.view(), run.out.view(), run.rstd.view(), kEps});
  return run;
}

TEST(RmsNorm, ForwardMatchesFormula) {
  BackendFixture backend;
  const auto x = random_values(kRows * kDim, 1), w = random_values(kDim, 2, 0.5, 1.5);
  auto run = rmsnorm_forward(*backend, x, w, DType::f64);
  std::vector<double> expected(kRows * kDim), expected_rstd(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    double sum = 0;
    for (int64_t d = 0; d < kDim; ++d) sum += x[r * kDim + d] * x[r * kDim + d];
    expected_rstd[r] = 1.0 / std::sqrt(sum / kDim + double(kEps));
    for (int64_t d = 0; d < kDim; ++d) expected[r * kDim + d] = x[r * kDim + d] * expected_rstd[r] * w[d];
  }
  expect_close(run.out.values(), expected, 1e-13, "out");
  expect_close(run.rstd.values(), expected_rstd, 1e-13, "rstd");
}

struct RmsNormGradients {
  std::vector<double> grad_input, grad_weight;
};

RmsNormGradients rmsnorm_gradients(Backend& backend, const std::vector<double>& x, const std::vector<double>& w,
                                   const std::vector<double>& grad_out, DType dtype) {
  auto run = rmsnorm_forward(backend, x, w, dtype);
  Buffer dy(grad_out, dtype, Shape{kRows, kDim}), dx(dtype, Shape{kRows, kDim});
  Buffer dw(dtype == DType::f64 ? DType::f64 : DType::f32, Shape{kDim});
  backend.rmsnorm_backward(RmsNormBackwardArgs{run.input.view(), run.weight.view(), run.rstd.view(), dy.view(), dx.view(),
                                               false, dw.view()});
  return {dx.values(), dw.values()};
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  BackendFixture backend;
  auto x = random_values(kRows * kDim, 3), w = random_values(kDim, 4, 0.5, 1.5);
  const auto weights = random_values(kRows * kDim, 5);
  auto loss = [&] { return weighted_sum(weights, rmsnorm_forward(*backend, x, w, DType::f64).out.values()); };
  const auto analytic = rmsnorm_gradients(*backend, x, w, weights, DType::f64);
  expect_close(analytic.grad_input, numeric_gradient(x, loss), 1e-6, "grad_input");
  expect_close(analytic.grad_weight, numeric_gradient(w, loss), 1e-6, "grad_weight");
}

TEST(RmsNorm, BackwardAccumulatesIntoGradInput) {
  BackendFixture backend;
  const auto x = random_values(kRows * kDim, 6), w = random_values(kDim, 7), dy_values = random_values(kRows * kDim, 8);
  const auto previous = random_values(kRows * kDim, 9);
  const auto fresh = rmsnorm_gradients(*backend, x, w, dy_values, DType::f64);
  auto run = rmsnorm_forward(*backend, x, w, DType::f64);
  Buffer dy(dy_values, DType::f64, Shape{kRows, kDim}), dx(previous, DType::f64, Shape{kRows, kDim});
  Buffer dw(DType::f64, Shape{kDim});
  backend->rmsnorm_backward(RmsNormBackwardArgs{run.input.view(), run.weight.view(), run.rstd.view(), dy.view(),
                                                dx.view(), true, dw.view()});
  std::vector<double> expected(previous);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += fresh.grad_input[i];
  expect_close(dx.values(), expected, 1e-13, "accumulated grad_input");
}

TEST(RmsNorm, LowerPrecisionsTrackF64) {
  BackendFixture backend;
  const auto x = random_values(kRows * kDim, 10), w = random_values(kDim, 11, 0.5, 1.5);
  const auto dy = random_values(kRows * kDim, 12);
  for (auto [dtype, tolerance] : {std::pair{DType::f32, 1e-5}, std::pair{DType::bf16, 2e-2}}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    // The f64 reference of the inputs as the dtype holds them (the kernel's error, not its inputs').
    const auto held_x = rounded(x, dtype), held_w = rounded(w, dtype), held_dy = rounded(dy, dtype);
    const auto reference_out = rmsnorm_forward(*backend, held_x, held_w, DType::f64).out.values();
    const auto reference = rmsnorm_gradients(*backend, held_x, held_w, held_dy, DType::f64);
    expect_close(rmsnorm_forward(*backend, x, w, dtype).out.values(), reference_out, tolerance, "out");
    const auto low = rmsnorm_gradients(*backend, x, w, dy, dtype);
    if (dtype == DType::f32) {
      expect_close(low.grad_input, reference.grad_input, tolerance, "grad_input", 5e-2);
      expect_close(low.grad_weight, reference.grad_weight, tolerance, "grad_weight", 5e-2);
    } else {
      // The input gradient subtracts a row's projection and the weight gradient sums over rows:
      // elements near zero carry the error of the terms they sum, so bf16 compares as wholes.
      expect_close_normwise(low.grad_input, reference.grad_input, 1e-2, "grad_input");
      expect_close_normwise(low.grad_weight, reference.grad_weight, 1e-2, "grad_weight");
    }
  }
}

TEST(RmsNorm, BackwardIsBitwiseIndependentOfThreads) {
  BackendFixture backend;
  const int64_t rows = 301, dim = 200;  // more rows and columns than one block
  const auto x = random_values(rows * dim, 13), w = random_values(dim, 14), dy_values = random_values(rows * dim, 15);
  Buffer input(x, DType::f32, Shape{rows, dim}), weight(w, DType::f32, Shape{dim}), out(DType::f32, Shape{rows, dim});
  Buffer rstd(DType::f32, Shape{rows}), dy(dy_values, DType::f32, Shape{rows, dim});
  backend->rmsnorm_forward(RmsNormForwardArgs{input.view(), weight.view(), out.view(), rstd.view(), kEps});
  std::vector<std::vector<unsigned char>> results;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3, 2}) {
    omp_set_num_threads(threads);
    Buffer dx(DType::f32, Shape{rows, dim}), dw(DType::f32, Shape{dim});
    backend->rmsnorm_backward(
        RmsNormBackwardArgs{input.view(), weight.view(), rstd.view(), dy.view(), dx.view(), false, dw.view()});
    auto bits = dx.bits();
    auto weight_bits = dw.bits();
    bits.insert(bits.end(), weight_bits.begin(), weight_bits.end());
    results.push_back(bits);
  }
  omp_set_num_threads(saved);
  for (size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[i], results[0]) << "run " << i;
}

// ---- RoPE ----

constexpr int64_t kSeq = 5, kBatch = 2, kHeads = 3, kHeadDim = 6;

std::vector<double> rope_table() {
  std::vector<double> table(kSeq * kHeadDim);  // (T, Dh/2, 2)
  for (int64_t t = 0; t < kSeq; ++t)
    for (int64_t i = 0; i < kHeadDim / 2; ++i) {
      const double angle = double(t) * std::pow(100.0, -2.0 * double(i) / kHeadDim);
      table[(t * kHeadDim / 2 + i) * 2] = std::cos(angle);
      table[(t * kHeadDim / 2 + i) * 2 + 1] = std::sin(angle);
    }
  return table;
}

std::vector<double> apply_rope(Backend& backend, const std::vector<double>& x, DType dtype, bool inverse,
                               DType table_dtype = DType::f64) {
  Buffer buffer(x, dtype, Shape{kBatch * kSeq, kHeads, kHeadDim});
  Buffer table(rope_table(), table_dtype, Shape{kSeq, kHeadDim / 2, 2});
  backend.rope(RopeArgs{buffer.view(), table.view(), kSeq, inverse});
  return buffer.values();
}

TEST(Rope, ForwardMatchesRotationFormula) {
  BackendFixture backend;
  const auto x = random_values(kBatch * kSeq * kHeads * kHeadDim, 21);
  const auto table = rope_table();
  // The rotation of x as stored in `dtype`, in double.
  auto reference = [&](DType dtype) {
    const auto stored = rounded(x, dtype);
    std::vector<double> expected(x.size());
    for (int64_t row = 0; row < kBatch * kSeq; ++row)
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t i = 0; i < kHeadDim / 2; ++i) {
          const int64_t base = (row * kHeads + h) * kHeadDim + 2 * i, angle = ((row % kSeq) * kHeadDim / 2 + i) * 2;
          const double c = table[angle], s = table[angle + 1];
          expected[base] = stored[base] * c - stored[base + 1] * s;
          expected[base + 1] = stored[base] * s + stored[base + 1] * c;
        }
    return expected;
  };
  expect_close(apply_rope(*backend, x, DType::f64, false), reference(DType::f64), 1e-14, "rotated");
  expect_close(apply_rope(*backend, apply_rope(*backend, x, DType::f64, false), DType::f64, true), x, 1e-13,
               "inverse of rotated");
  expect_close(apply_rope(*backend, x, DType::f32, false, DType::f32), reference(DType::f32), 1e-5, "f32");
  expect_close(apply_rope(*backend, x, DType::bf16, false, DType::f32), reference(DType::bf16), 1e-2, "bf16");
}

TEST(Rope, InverseIsTheBackward) {
  BackendFixture backend;
  auto x = random_values(kBatch * kSeq * kHeads * kHeadDim, 22);
  const auto weights = random_values(x.size(), 23);
  auto loss = [&] { return weighted_sum(weights, apply_rope(*backend, x, DType::f64, false)); };
  expect_close(apply_rope(*backend, weights, DType::f64, true), numeric_gradient(x, loss), 1e-6, "grad x");
}

// ---- Embedding ----

TEST(Embedding, ForwardGathersAndBackwardMatchesFiniteDifferences) {
  BackendFixture backend;
  const int64_t vocabulary = 9, dim = 7, tokens = 17;
  const auto ids = random_ids(tokens, 31, 0, int32_t(vocabulary - 2));  // some rows never used
  auto table_values = random_values(vocabulary * dim, 32);
  const auto weights = random_values(tokens * dim, 33);
  auto forward = [&](DType dtype) {
    Buffer table(table_values, dtype, Shape{vocabulary, dim}), out(dtype, Shape{tokens, dim});
    std::vector<int32_t> token_ids(ids);
    backend->embedding_forward(
        EmbeddingForwardArgs{TensorView(token_ids.data(), DType::i32, Shape{tokens}), table.view(), out.view()});
    return out.values();
  };
  const auto out = forward(DType::f64);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t d = 0; d < dim; ++d) ASSERT_EQ(out[t * dim + d], table_values[ids[t] * dim + d]);

  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    std::vector<int32_t> token_ids(ids);
    Buffer grad_out(weights, dtype, Shape{tokens, dim});
    Buffer grad_table(dtype == DType::f64 ? DType::f64 : DType::f32, Shape{vocabulary, dim});
    backend->embedding_backward(EmbeddingBackwardArgs{TensorView(token_ids.data(), DType::i32, Shape{tokens}),
                                                      grad_out.view(), grad_table.view()});
    const auto stored_weights = rounded(weights, dtype);  // the gradient as the op sees it
    auto loss = [&] { return weighted_sum(stored_weights, forward(DType::f64)); };
    const double tolerance = dtype == DType::f64 ? 1e-6 : dtype == DType::f32 ? 1e-5 : 1e-2;
    expect_close(grad_table.values(), numeric_gradient(table_values, loss), tolerance, "grad_table");
  }
  std::vector<int32_t> bad(ids);
  bad[3] = int32_t(vocabulary);
  Buffer table(table_values, DType::f32, Shape{vocabulary, dim}), out32(DType::f32, Shape{tokens, dim});
  EXPECT_THROW(backend->embedding_forward(
                   EmbeddingForwardArgs{TensorView(bad.data(), DType::i32, Shape{tokens}), table.view(), out32.view()}),
               Error);
}

// The bf16 forward of an unsharded plan reads the f32 master table: each element rounded once,
// the bits a bf16 copy of the table (what the optimizer used to keep) would give.
TEST(Embedding, ForwardFromAnF32TableEqualsGatheringItsBf16Copy) {
  BackendFixture backend;
  const int64_t vocabulary = 37, dim = 24, tokens = 53;
  std::vector<int32_t> ids = random_ids(tokens, 41, 0, int32_t(vocabulary - 1));
  const auto table_values = random_values(vocabulary * dim, 42, -3.0, 3.0);
  const TensorView token_view(ids.data(), DType::i32, Shape{tokens});
  Buffer master(table_values, DType::f32, Shape{vocabulary, dim}), copy(DType::bf16, Shape{vocabulary, dim});
  backend->convert(ConvertArgs{master.view(), copy.view()});  // the bf16 copy, as the optimizer wrote it
  Buffer from_master(DType::bf16, Shape{tokens, dim}), from_copy(DType::bf16, Shape{tokens, dim});
  backend->embedding_forward(EmbeddingForwardArgs{token_view, master.view(), from_master.view()});
  backend->embedding_forward(EmbeddingForwardArgs{token_view, copy.view(), from_copy.view()});
  EXPECT_EQ(from_master.bits(), from_copy.bits());
  int64_t rounded_away = 0;  // the table's values are not all bf16 already: the rounding is exercised
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t d = 0; d < dim; ++d) {
      const float value = float(table_values[size_t(ids[size_t(t)] * dim + d)]);
      ASSERT_EQ(from_master.get(t * dim + d), double(bf16_to_float(float_to_bf16(value)))) << t << ", " << d;
      rounded_away += double(value) != from_master.get(t * dim + d);
    }
  EXPECT_GT(rounded_away, tokens * dim / 2);
  // Other mixed dtypes stay errors.
  Buffer wide(table_values, DType::f64, Shape{vocabulary, dim});
  EXPECT_THROW(backend->embedding_forward(EmbeddingForwardArgs{token_view, wide.view(), from_master.view()}), Error);
  Buffer narrow_out(DType::f32, Shape{tokens, dim});
  EXPECT_THROW(backend->embedding_forward(EmbeddingForwardArgs{token_view, copy.view(), narrow_out.view()}), Error);
}

}  // namespace
}  // namespace smelt::test
