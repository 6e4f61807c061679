// AdamW, sum of squares and mean on the CPU: several AdamW steps against a
// scalar re-implementation in double (clipping on and off), and deterministic
// reductions.
#include <gtest/gtest.h>
#include <omp.h>

#include "cpu/finite_difference.h"

namespace smelt::test {
namespace {

constexpr int64_t kCount = 1037;

struct ScalarAdamw {
  std::vector<double> params, exp_avg, exp_avg_sq;

  // torch.nn.utils.clip_grad_norm_ then torch.optim.AdamW, written out per element.
  void step(std::vector<double>& grads, const AdamwArgs& h) {
    double sum_squares = 0;
    for (double g : grads) sum_squares += g * g;
    if (h.max_norm > 0) {
      const double clip = std::min(1.0, double(h.max_norm) / (std::sqrt(sum_squares) + 1e-6));
      for (double& g : grads) g *= clip;
    }
    const double lr = h.lr, beta1 = h.beta1, beta2 = h.beta2;
    const double bias_correction1 = 1 - std::pow(beta1, double(h.step));
    const double bias_correction2 = 1 - std::pow(beta2, double(h.step));
    for (size_t i = 0; i < params.size(); ++i) {
      params[i] *= 1 - lr * double(h.weight_decay);
      exp_avg[i] = beta1 * exp_avg[i] + (1 - beta1) * grads[i];
      exp_avg_sq[i] = beta2 * exp_avg_sq[i] + (1 - beta2) * grads[i] * grads[i];
      const double denominator = std::sqrt(exp_avg_sq[i]) / std::sqrt(bias_correction2) + double(h.eps);
      params[i] -= lr / bias_correction1 * exp_avg[i] / denominator;
    }
  }
};

void run_steps(DType dtype, float max_norm, double tolerance) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " max_norm " + std::to_string(max_norm));
  BackendFixture backend;
  const Shape shape{kCount};
  ScalarAdamw reference{random_values(kCount, 1), std::vector<double>(kCount, 0.0), std::vector<double>(kCount, 0.0)};
  Buffer params(reference.params, dtype, shape), exp_avg(reference.exp_avg, dtype, shape);
  Buffer exp_avg_sq(reference.exp_avg_sq, dtype, shape), sum_squares(dtype, Shape{1});
  reference.params = params.values();
  bool clipped = false;
  for (int64_t step = 1; step <= 5; ++step) {
    auto grad_values = rounded(random_values(kCount, 100 + step, -0.2 * double(step), 0.2 * double(step)), dtype);
    Buffer grads(grad_values, dtype, shape);
    backend->sum_squares(SumSquaresArgs{grads.view(), sum_squares.view()});
    AdamwArgs args;
    args.params = params.view();
    args.grads = grads.view();
    args.exp_avg = exp_avg.view();
    args.exp_avg_sq = exp_avg_sq.view();
    args.grad_sum_squares = sum_squares.view();
    args.lr = 1e-2f;
    args.weight_decay = 0.1f;
    args.max_norm = max_norm;
    args.step = step;
    backend->adamw(args);
    double norm = 0;
    for (double g : grad_values) norm += g * g;
    clipped = clipped || (max_norm > 0 && std::sqrt(norm) > max_norm);
    reference.step(grad_values, args);
    expect_close(grads.values(), grad_values, tolerance, "gradients after clipping");
    expect_close(params.values(), reference.params, tolerance, "params");
    expect_close(exp_avg.values(), reference.exp_avg, tolerance, "exp_avg");
    expect_close(exp_avg_sq.values(), reference.exp_avg_sq, tolerance, "exp_avg_sq");
  }
  if (max_norm > 0) {
    EXPECT_TRUE(clipped) << "the clipping case never clipped; the test would prove nothing";
  }
}

TEST(Adamw, MatchesScalarReferenceWithoutClipping) {
  run_steps(DType::f64, 0.0f, 1e-12);
  run_steps(DType::f32, 0.0f, 1e-5);
}

TEST(Adamw, MatchesScalarReferenceWithClipping) {
  run_steps(DType::f64, 3.0f, 1e-12);
  run_steps(DType::f32, 3.0f, 1e-5);
}

TEST(Reduce, SumSquaresAndMeanMatchAndIgnoreThreads) {
  BackendFixture backend;
  const int64_t count = 100003;
  const auto values = random_values(count, 41);
  Buffer x(values, DType::f32, Shape{count}), out(DType::f32, Shape{1}), mean_out(DType::f32, Shape{1});
  const auto stored = x.values();
  double expected_sum = 0, expected_mean = 0;
  for (double v : stored) {
    expected_sum += v * v;
    expected_mean += v;
  }
  expected_mean /= double(count);
  const int saved = omp_get_max_threads();
  std::vector<float> sums, means;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    out.poison();
    backend->sum_squares(SumSquaresArgs{x.view(), out.view()});
    backend->mean(MeanArgs{x.view(), mean_out.view()});
    sums.push_back(float(out.get(0)));
    means.push_back(float(mean_out.get(0)));
  }
  omp_set_num_threads(saved);
  EXPECT_NEAR(sums[0], expected_sum, 1e-6 * expected_sum);
  EXPECT_NEAR(means[0], expected_mean, 1e-6);
  for (size_t i = 1; i < sums.size(); ++i) {
    EXPECT_EQ(sums[i], sums[0]);
    EXPECT_EQ(means[i], means[0]);
  }
  backend->sum_squares(SumSquaresArgs{x.view(), out.view(), true});  // accumulate: twice the sum
  EXPECT_NEAR(out.get(0), 2 * expected_sum, 2e-6 * expected_sum);
}

}  // namespace
}  // namespace smelt::test
