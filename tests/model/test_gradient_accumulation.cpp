// Gradient accumulation: a step of two microbatches leaves the mean of the two microbatches'
// gradients and losses, for every gradient the model writes (linears in each precision and
// recipe, norms, embedding, output projection), under recomputation too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/numerics.h"
#include "model/model_fixture.h"

namespace smelt {
namespace {

using testing::TinyRun;

// Every parameter's gradient, in layout order, widened to float.
std::vector<float> read_gradients(const TinyRun& run) {
  std::vector<float> all(static_cast<size_t>(run.executor->layout().total()), 0.0f);
  for (const ParameterInfo& info : run.executor->layout().parameters()) {
    const StepPlan::GradientPlace place = run.plan.gradient_place(info);
    const TensorView buffer = run.executor->view(place.buffer);
    for (int64_t i = 0; i < info.numel(); ++i) {
      const int64_t at = place.offset + i;
      float value = 0;
      switch (buffer.dtype) {
        case DType::f32: value = buffer.as<float>()[at]; break;
        case DType::f64: value = static_cast<float>(buffer.as<double>()[at]); break;
        case DType::bf16: value = bf16_to_float(buffer.as<uint16_t>()[at]); break;
        default: ADD_FAILURE() << "gradient buffer of dtype " << dtype_name(buffer.dtype);
      }
      all[static_cast<size_t>(info.offset + i)] = value;
    }
  }
  return all;
}

struct Case {
  std::string name;
  DType compute;
  std::string policy;
  Float8Recipe recipe;
};

void PrintTo(const Case& c, std::ostream* out) { *out << c.name; }

class GradientAccumulation : public ::testing::TestWithParam<Case> {};

// Reference: each microbatch alone in a one-microbatch plan (its gradient the microbatch's mean).
// Accumulated: the same two microbatches in a plan of two; the step's gradient must be the mean
// of the two, its loss the mean of their losses, its gradient norm that of the mean.
TEST_P(GradientAccumulation, TwoMicrobatchesLeaveTheMeanOfTheirGradients) {
  const Case c = GetParam();
  const ModelConfig model = testing::debug_model(32, 2, 48, 29);
  TinyRun single(model, c.compute, c.policy, 2, 8, 5);
  TinyRun accumulated(model, c.compute, c.policy, 2, 8, 5);
  PlanOptions options = single.plan.options;
  options.float8.recipe = c.recipe;
  options.float8.filter_fqns = {"output"};
  options.float8.fuse_amax_into_producers = c.recipe == Float8Recipe::tensorwise;
  single.replan(options);
  options.microbatches = 2;
  accumulated.replan(options);
  EXPECT_EQ(accumulated.plan.linear_gradients, -1) << "accumulated gradients stay in the master dtype";

  std::vector<std::vector<float>> gradients;
  std::vector<double> losses;
  for (uint64_t microbatch = 0; microbatch < 2; ++microbatch) {
    single.initialise(11);
    single.load_random_batch(20 + microbatch);
    single.forward_backward();
    gradients.push_back(read_gradients(single));
    losses.push_back(single.executor->loss());
  }
  accumulated.initialise(11);
  OptimizerSettings unused;
  for (int64_t microbatch = 0; microbatch < 2; ++microbatch) {
    accumulated.load_random_batch(20 + static_cast<uint64_t>(microbatch));
    accumulated.executor->run_microbatch(unused, microbatch);
  }
  const std::vector<float> got = read_gradients(accumulated);

  float largest = 0;
  for (size_t i = 0; i < got.size(); ++i) largest = std::max(largest, std::fabs(gradients[0][i] + gradients[1][i]));
  ASSERT_GT(largest, 0.0f);
  double sum_squares = 0, different = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = 0.5 * (double(gradients[0][i]) + double(gradients[1][i]));
    ASSERT_TRUE(std::isfinite(got[i])) << "gradient " << i;
    ASSERT_NEAR(got[i], want, 2e-6 * largest + 1e-6 * std::fabs(want)) << "gradient element " << i << " of " << got.size();
    sum_squares += double(got[i]) * got[i];
    different = std::max(different, std::fabs(double(gradients[0][i]) - gradients[1][i]));
  }
  EXPECT_GT(different, 1e-3 * largest) << "the microbatches' gradients must differ for the test to see an overwrite";
  EXPECT_NEAR(accumulated.executor->loss(), 0.5 * (losses[0] + losses[1]), 1e-6 * std::fabs(losses[0]));
  EXPECT_NEAR(accumulated.executor->gradient_norm(), std::sqrt(sum_squares), 1e-5 * std::sqrt(sum_squares));
}

INSTANTIATE_TEST_SUITE_P(
    PrecisionsAndRecipes, GradientAccumulation,
    ::testing::Values(Case{"f32_none", DType::f32, "none", Float8Recipe::none},
                      Case{"bf16_selective_op", DType::bf16, "selective-op", Float8Recipe::none},
                      Case{"bf16_tensorwise_full", DType::bf16, "full", Float8Recipe::tensorwise},
                      Case{"bf16_rowwise_selective_op", DType::bf16, "selective-op", Float8Recipe::rowwise},
                      Case{"bf16_rowwise_with_gw_hp", DType::bf16, "none", Float8Recipe::rowwise_with_gw_hp}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The loss of a validation pass is that pass's mean, whatever the plan's microbatches; the step's
// is the mean of its microbatches'.
TEST(GradientAccumulationLoss, ValidationReadsOnePassWholeAndTrainingWeighsEachMicrobatch) {
  const ModelConfig model = testing::tiny_model();
  TinyRun single(model, DType::f32, "none", 2, 4);
  TinyRun accumulated(model, DType::f32, "none", 2, 4);
  PlanOptions options = accumulated.plan.options;
  options.microbatches = 3;
  accumulated.replan(options);
  single.initialise(5);
  accumulated.initialise(5);
  single.load_random_batch(8);
  accumulated.load_random_batch(8);
  const double alone = single.loss_only();
  EXPECT_GT(alone, 0.0);
  EXPECT_NEAR(accumulated.loss_only(), alone, 1e-6 * alone);
  OptimizerSettings unused;
  std::vector<double> each;
  for (int64_t microbatch = 0; microbatch < 3; ++microbatch) {
    single.load_random_batch(30 + static_cast<uint64_t>(microbatch));
    each.push_back(single.loss_only());
    accumulated.load_random_batch(30 + static_cast<uint64_t>(microbatch));
    accumulated.executor->run_microbatch(unused, microbatch);
  }
  EXPECT_NEAR(accumulated.executor->loss(), (each[0] + each[1] + each[2]) / 3, 1e-6 * each[0]);
}

TEST(GradientAccumulationLoss, APlanOfSeveralMicrobatchesRefusesAOnePassStep) {
  TinyRun run(testing::tiny_model(), DType::f32, "none", 1, 4);
  PlanOptions options = run.plan.options;
  options.microbatches = 2;
  run.replan(options);
  run.initialise(3);
  OptimizerSettings unused;
  EXPECT_THROW(run.executor->run_gradients(unused), Error);
  EXPECT_THROW(run.executor->run(unused), Error);
  EXPECT_THROW(run.executor->run_microbatch(unused, 2), Error);
  EXPECT_THROW(run.executor->run_microbatch(unused, -1), Error);
}

}  // namespace
}  // namespace smelt
