// CPU GEMM against a plain triple loop in double: every transpose combination,
// addend / alias / accumulate, f32 and bf16 operands, float8 with scales, shape errors.
#include <gtest/gtest.h>

#include "cpu/finite_difference.h"

namespace smelt::test {
namespace {

constexpr int64_t kM = 5, kK = 7, kN = 6;

// op(a) @ op(b) in double from the stored row-major values.
std::vector<double> reference_product(const std::vector<double>& a, bool transpose_a, const std::vector<double>& b,
                                      bool transpose_b, int64_t m, int64_t k, int64_t n) {
  std::vector<double> out(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p)
        sum += (transpose_a ? a[p * m + i] : a[i * k + p]) * (transpose_b ? b[j * k + p] : b[p * n + j]);
      out[i * n + j] = sum;
    }
  return out;
}

// The arguments of out = op(a) @ op(b) (+ addend).
GemmArgs product(TensorView a, bool transpose_a, TensorView b, bool transpose_b, TensorView out,
                 TensorView addend = TensorView()) {
  GemmArgs args;
  args.a = a;
  args.transpose_a = transpose_a;
  args.b = b;
  args.transpose_b = transpose_b;
  args.out = out;
  args.addend = addend;
  return args;
}

Shape stored(bool transpose, int64_t rows, int64_t cols) { return transpose ? Shape{cols, rows} : Shape{rows, cols}; }

WorkspaceShape gemm_workspace() {
  WorkspaceShape shape;
  shape.max_rows = kM;
  shape.max_inner = kK;
  shape.max_cols = kN;
  return shape;
}

struct Case {
  bool transpose_a, transpose_b;
};

class GemmTransposes : public ::testing::TestWithParam<Case> {};

TEST_P(GemmTransposes, MatchesTripleLoopInEveryDtype) {
  const Case c = GetParam();
  BackendFixture backend(gemm_workspace());
  const auto a_values = random_values(kM * kK, 11), b_values = random_values(kK * kN, 12);
  struct Precision {
    DType in, out;
    double tolerance;
  };
  for (Precision p : {Precision{DType::f64, DType::f64, 1e-13}, Precision{DType::f32, DType::f32, 1e-5},
                      Precision{DType::bf16, DType::f32, 1e-5}, Precision{DType::bf16, DType::bf16, 1e-2}}) {
    SCOPED_TRACE(std::string(dtype_name(p.in)) + " -> " + std::string(dtype_name(p.out)));
    Buffer a(a_values, p.in, stored(c.transpose_a, kM, kK)), b(b_values, p.in, stored(c.transpose_b, kK, kN));
    Buffer out(p.out, Shape{kM, kN});
    backend->gemm(product(a.view(), c.transpose_a, b.view(), c.transpose_b, out.view()));
    // The reference sees the operands as rounded to the input dtype.
    auto expected = reference_product(a.values(), c.transpose_a, b.values(), c.transpose_b, kM, kK, kN);
    expect_close(out.values(), expected, p.tolerance, "out");
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmTransposes,
                         ::testing::Values(Case{false, false}, Case{false, true}, Case{true, false}, Case{true, true}));

TEST(Gemm, AddendAliasAndAccumulate) {
  BackendFixture backend(gemm_workspace());
  const auto a_values = random_values(kM * kK, 21), b_values = random_values(kK * kN, 22);
  const auto addend_values = random_values(kM * kN, 23);
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const DType out_dtype = dtype;
    const double tolerance = dtype == DType::f64 ? 1e-13 : dtype == DType::f32 ? 1e-5 : 1e-2;
    Buffer a(a_values, dtype, Shape{kK, kM}), b(b_values, dtype, Shape{kK, kN});
    Buffer addend(addend_values, out_dtype, Shape{kM, kN});
    auto expected = reference_product(a.values(), true, b.values(), false, kM, kK, kN);
    for (int64_t i = 0; i < kM * kN; ++i) expected[i] += addend.get(i);

    Buffer out(out_dtype, Shape{kM, kN});  // separate addend
    backend->gemm(product(a.view(), true, b.view(), false, out.view(), addend.view()));
    expect_close(out.values(), expected, tolerance, "separate addend");

    Buffer aliased(addend_values, out_dtype, Shape{kM, kN});  // addend is out
    backend->gemm(product(a.view(), true, b.view(), false, aliased.view(), aliased.view()));
    expect_close(aliased.values(), expected, tolerance, "aliased addend");

    Buffer accumulated(addend_values, out_dtype, Shape{kM, kN});
    GemmArgs args = product(a.view(), true, b.view(), false, accumulated.view());
    args.accumulate = true;
    backend->gemm(args);
    expect_close(accumulated.values(), expected, tolerance, "accumulate");
  }
  // bf16 operands into an f32 weight gradient, accumulated.
  Buffer a(a_values, DType::bf16, Shape{kK, kM}), b(b_values, DType::bf16, Shape{kK, kN});
  Buffer grad(addend_values, DType::f32, Shape{kM, kN});
  auto expected = reference_product(a.values(), true, b.values(), false, kM, kK, kN);
  for (int64_t i = 0; i < kM * kN; ++i) expected[i] += grad.get(i);
  GemmArgs args = product(a.view(), true, b.view(), false, grad.view());
  args.accumulate = true;
  backend->gemm(args);
  expect_close(grad.values(), expected, 1e-5, "bf16 -> f32 accumulate");
}

// Float8 operands: the reference decodes every code and divides by its scale, in double.
TEST(Gemm, Float8TensorwiseAndRowwiseScales) {
  BackendFixture backend(gemm_workspace());
  const auto a_values = random_values(kM * kK, 31, -3, 3), b_values = random_values(kN * kK, 32, -0.02, 0.02);
  for (OperandScaling scaling : {OperandScaling::tensorwise, OperandScaling::rowwise}) {
    SCOPED_TRACE(scaling == OperandScaling::rowwise ? "rowwise" : "tensorwise");
    const bool rowwise = scaling == OperandScaling::rowwise;
    // a (M, K) e4m3; b stored (N, K) e4m3 and transposed, as in a linear layer's forward.
    std::vector<double> scale_a_values(rowwise ? kM : 1), scale_b_values(rowwise ? kN : 1);
    for (size_t i = 0; i < scale_a_values.size(); ++i) scale_a_values[i] = 448.0 / (3.0 + 0.25 * double(i));
    for (size_t i = 0; i < scale_b_values.size(); ++i) scale_b_values[i] = 448.0 / (0.02 + 0.001 * double(i));
    std::vector<uint8_t> a_codes(kM * kK), b_codes(kN * kK);
    std::vector<double> a_dequantized(kM * kK), b_dequantized(kN * kK);
    for (int64_t i = 0; i < kM * kK; ++i) {
      const double scale = scale_a_values[rowwise ? i / kK : 0];
      a_codes[i] = float_to_e4m3(float(a_values[i] * scale));
      a_dequantized[i] = double(e4m3_to_float(a_codes[i])) / scale;
    }
    for (int64_t i = 0; i < kN * kK; ++i) {
      const double scale = scale_b_values[rowwise ? i / kK : 0];
      b_codes[i] = float_to_e4m3(float(b_values[i] * scale));
      b_dequantized[i] = double(e4m3_to_float(b_codes[i])) / scale;
    }
    Buffer scale_a(scale_a_values, DType::f32, Shape{int64_t(scale_a_values.size())});
    Buffer scale_b(scale_b_values, DType::f32, Shape{int64_t(scale_b_values.size())});
    // The reference uses the f32 scales the kernel reads.
    for (int64_t i = 0; i < kM * kK; ++i) a_dequantized[i] = e4m3_to_float(a_codes[i]) / scale_a.get(rowwise ? i / kK : 0);
    for (int64_t i = 0; i < kN * kK; ++i) b_dequantized[i] = e4m3_to_float(b_codes[i]) / scale_b.get(rowwise ? i / kK : 0);
    const auto expected = reference_product(a_dequantized, false, b_dequantized, true, kM, kK, kN);

    for (DType out_dtype : {DType::f32, DType::bf16}) {
      Buffer out(out_dtype, Shape{kM, kN});
      GemmArgs args = product(TensorView(a_codes.data(), DType::e4m3, Shape{kM, kK}), false,
                              TensorView(b_codes.data(), DType::e4m3, Shape{kN, kK}), true, out.view());
      args.scale_a = scale_a.view();
      args.scale_b = scale_b.view();
      args.scaling_a = args.scaling_b = scaling;
      backend->gemm(args);
      expect_close(out.values(), expected, out_dtype == DType::f32 ? 1e-5 : 1e-2, "float8 out");
    }
  }
}

TEST(Gemm, RejectsMismatchedShapesNamingBoth) {
  BackendFixture backend(gemm_workspace());
  Buffer a(random_values(kM * kK, 41), DType::f32, Shape{kM, kK});
  Buffer b(random_values((kK + 1) * kN, 42), DType::f32, Shape{kK + 1, kN});
  Buffer out(DType::f32, Shape{kM, kN});
  try {
    backend->gemm(product(a.view(), false, b.view(), false, out.view()));
    FAIL() << "expected a shape error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("f32(5, 7)"), std::string::npos) << message;
    EXPECT_NE(message.find("f32(8, 6)"), std::string::npos) << message;
  }
  Buffer wide_out(DType::f32, Shape{kM, kN + 1});
  Buffer b_ok(random_values(kK * kN, 43), DType::f32, Shape{kK, kN});
  EXPECT_THROW(backend->gemm(product(a.view(), false, b_ok.view(), false, wide_out.view())), Error);
}

TEST(Gemm, RejectsTooSmallWorkspaceForBf16) {
  auto backend = make_cpu_backend();
  std::vector<float> tiny(4);
  backend->set_workspace(TensorView(tiny.data(), DType::f32, Shape{4}));
  Buffer a(random_values(kM * kK, 51), DType::bf16, Shape{kM, kK});
  Buffer b(random_values(kK * kN, 52), DType::bf16, Shape{kK, kN});
  Buffer out(DType::f32, Shape{kM, kN});
  EXPECT_THROW(backend->gemm(product(a.view(), false, b.view(), false, out.view())), Error);
}

}  // namespace
}  // namespace smelt::test
