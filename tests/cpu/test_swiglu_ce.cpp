// SwiGLU and softmax cross-entropy on the CPU: forward against the formulas,
// gradients against central finite differences in f64, f32/bf16 against f64,
// ignored targets, and the gradient written over the logits.
#include <gtest/gtest.h>

#include "cpu/finite_difference.h"

namespace smelt::test {
namespace {

constexpr int64_t kRows = 6, kFfn = 13;

std::vector<double> swiglu(Backend& backend, const std::vector<double>& gate, const std::vector<double>& up, DType dtype) {
  Buffer g(gate, dtype, Shape{kRows, kFfn}), u(up, dtype, Shape{kRows, kFfn}), out(dtype, Shape{kRows, kFfn});
  backend.swiglu_forward(SwigluForwardArgs{g.view(), u.view(), out.view()});
  return out.values();
}

std::pair<std::vector<double>, std::vector<double>> swiglu_gradients(Backend& backend, const std::vector<double>& gate,
                                                                     const std::vector<double>& up,
                                                                     const std::vector<double>& grad_out, DType dtype) {
  const Shape shape{kRows, kFfn};
  Buffer g(gate, dtype, shape), u(up, dtype, shape), dy(grad_out, dtype, shape), dg(dtype, shape), du(dtype, shape);
  backend.swiglu_backward(SwigluBackwardArgs{g.view(), u.view(), dy.view(), dg.view(), du.view()});
  return {dg.values(), du.values()};
}

TEST(Swiglu, ForwardMatchesFormulaAndBackwardMatchesFiniteDifferences) {
  BackendFixture backend;
  auto gate = random_values(kRows * kFfn, 1, -4, 4), up = random_values(kRows * kFfn, 2);
  std::vector<double> expected(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) expected[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
  expect_close(swiglu(*backend, gate, up, DType::f64), expected, 1e-14, "out");

  const auto weights = random_values(gate.size(), 3);
  auto loss = [&] { return weighted_sum(weights, swiglu(*backend, gate, up, DType::f64)); };
  auto [grad_gate, grad_up] = swiglu_gradients(*backend, gate, up, weights, DType::f64);
  expect_close(grad_gate, numeric_gradient(gate, loss), 1e-6, "grad_gate");
  expect_close(grad_up, numeric_gradient(up, loss), 1e-6, "grad_up");

  for (auto [dtype, tolerance] : {std::pair{DType::f32, 1e-5}, std::pair{DType::bf16, 2e-2}}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    // The f64 reference of the inputs as the dtype holds them: each element's error is then the
    // kernel's own (one rounding of its result), not the rounding of its inputs, which near
    // grad_gate's zero crossing is larger than the value.
    const auto held_gate = rounded(gate, dtype), held_up = rounded(up, dtype), held_weights = rounded(weights, dtype);
    auto [held_grad_gate, held_grad_up] = swiglu_gradients(*backend, held_gate, held_up, held_weights, DType::f64);
    expect_close(swiglu(*backend, gate, up, dtype), swiglu(*backend, held_gate, held_up, DType::f64), tolerance, "out");
    auto [low_gate, low_up] = swiglu_gradients(*backend, gate, up, weights, dtype);
    expect_close(low_gate, held_grad_gate, tolerance, "grad_gate");
    expect_close(low_up, held_grad_up, tolerance, "grad_up");
  }
}

// ---- cross-entropy ----

constexpr int64_t kVocabulary = 19;

struct CrossEntropyResult {
  std::vector<double> losses, grad;
};

CrossEntropyResult cross_entropy(Backend& backend, const std::vector<double>& logits, std::vector<int32_t> targets,
                                 DType logit_dtype, DType grad_dtype, float grad_scale, bool in_place = false) {
  Buffer x(logits, logit_dtype, Shape{kRows, kVocabulary});
  Buffer losses(logit_dtype == DType::bf16 ? DType::f32 : logit_dtype, Shape{kRows});  // bf16 logits: f32 losses
  Buffer grad(grad_dtype, Shape{kRows, kVocabulary});
  TensorView grad_view = in_place ? x.view() : grad.view();
  backend.cross_entropy(CrossEntropyArgs{x.view(), TensorView(targets.data(), DType::i32, Shape{kRows}), losses.view(),
                                         grad_view, grad_scale});
  return {losses.values(), in_place ? x.values() : grad.values()};
}

TEST(CrossEntropy, LossMatchesLogSoftmaxAndGradientMatchesFiniteDifferences) {
  BackendFixture backend;
  auto logits = random_values(kRows * kVocabulary, 11, -30, 30);  // large logits exercise the max subtraction
  auto targets = random_ids(kRows, 12, 0, kVocabulary - 1);
  targets[2] = -1;  // ignored row
  const float grad_scale = 1.0f / 5.0f;
  const auto result = cross_entropy(*backend, logits, targets, DType::f64, DType::f64, grad_scale);
  for (int64_t r = 0; r < kRows; ++r) {
    double maximum = -INFINITY, total = 0;
    for (int64_t c = 0; c < kVocabulary; ++c) maximum = std::max(maximum, logits[r * kVocabulary + c]);
    for (int64_t c = 0; c < kVocabulary; ++c) total += std::exp(logits[r * kVocabulary + c] - maximum);
    const double expected = targets[r] < 0 ? 0.0 : maximum + std::log(total) - logits[r * kVocabulary + targets[r]];
    EXPECT_NEAR(result.losses[r], expected, 1e-12 * (1 + std::abs(expected))) << "row " << r;
  }
  for (int64_t c = 0; c < kVocabulary; ++c) EXPECT_EQ(result.grad[2 * kVocabulary + c], 0.0) << "ignored row";

  // Finite differences on moderate logits (large ones make the summed loss too coarse for a 1e-6 step).
  logits = random_values(kRows * kVocabulary, 13, -3, 3);
  const auto moderate = cross_entropy(*backend, logits, targets, DType::f64, DType::f64, grad_scale);
  auto loss = [&] {
    const auto losses = cross_entropy(*backend, logits, targets, DType::f64, DType::f64, grad_scale).losses;
    double sum = 0;
    for (double l : losses) sum += l;
    return sum * double(grad_scale);
  };
  expect_close(moderate.grad, numeric_gradient(logits, loss), 1e-6, "grad_logits");

  // In place over the logits gives the same gradient and losses.
  const auto in_place = cross_entropy(*backend, logits, targets, DType::f64, DType::f64, grad_scale, true);
  EXPECT_EQ(in_place.grad, moderate.grad);
  EXPECT_EQ(in_place.losses, moderate.losses);
}

// bf16 logits (what the output head's bf16 GEMM writes) are read in f32: the same losses and
// gradient, bit for bit, as f32 logits holding the same values, also with the gradient in place.
TEST(CrossEntropy, Bf16LogitsEqualF32LogitsOfTheSameValues) {
  BackendFixture backend;
  const auto logits = random_values(kRows * kVocabulary, 31, -8, 8);
  auto targets = random_ids(kRows, 32, 0, kVocabulary - 1);
  targets[1] = -1;
  const std::vector<double> rounded = Buffer(logits, DType::bf16, Shape{kRows, kVocabulary}).values();
  ASSERT_NE(rounded, logits) << "the test needs logits that bf16 rounds";
  const auto want = cross_entropy(*backend, rounded, targets, DType::f32, DType::bf16, 0.125f);
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "gradient over the logits" : "separate gradient");
    const auto got = cross_entropy(*backend, logits, targets, DType::bf16, DType::bf16, 0.125f, in_place);
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(got.grad, want.grad);
  }
}

TEST(CrossEntropy, F32AndBf16GradientsTrackF64) {
  BackendFixture backend;
  const auto logits = random_values(kRows * kVocabulary, 21, -5, 5);
  auto targets = random_ids(kRows, 22, 0, kVocabulary - 1);
  targets[0] = -100;
  const auto reference = cross_entropy(*backend, logits, targets, DType::f64, DType::f64, 0.25f);
  for (auto [grad_dtype, tolerance] : {std::pair{DType::f32, 1e-5}, std::pair{DType::bf16, 1e-2}}) {
    SCOPED_TRACE(std::string(dtype_name(grad_dtype)));
    const auto result = cross_entropy(*backend, logits, targets, DType::f32, grad_dtype, 0.25f);
    expect_close(result.losses, reference.losses, 1e-5, "losses");
    expect_close(result.grad, reference.grad, tolerance, "grad_logits");
  }
  const auto in_place = cross_entropy(*backend, logits, targets, DType::f32, DType::f32, 0.25f, true);
  expect_close(in_place.grad, reference.grad, 1e-5, "in-place f32 grad_logits");
}

TEST(CrossEntropy, RejectsTargetsOutsideTheVocabulary) {
  BackendFixture backend;
  auto targets = random_ids(kRows, 31, 0, kVocabulary - 1);
  targets[4] = kVocabulary;
  EXPECT_THROW(cross_entropy(*backend, random_values(kRows * kVocabulary, 32), targets, DType::f32, DType::f32, 1.0f),
               Error);
}

}  // namespace
}  // namespace smelt::test
