// The block linears' weight gradients kept in bf16 (PlanOptions::linear_grad_dtype): one backward
// gives every other gradient bit for bit as the plan with f32 gradients does, and each linear's
// (the output projection's too when the head runs in one loss chunk) the f32 one rounded to bf16; the gradient norm covers both buffers; training follows the f32
// gradients' run to within what the rounding explains, in bf16 and with float8 linears.
#include <gtest/gtest.h>

#include <cmath>

#include "core/numerics.h"
#include "model/model_fixture.h"

namespace smelt {
namespace {

using testing::TinyRun;
using testing::tiny_model;

bool block_linear(size_t index, const ModelConfig& model) {
  const int64_t block = static_cast<int64_t>(index) - 1;
  if (index == 0 || block >= model.n_layers * kLayerWeightCount) return false;
  const auto weight = static_cast<LayerWeight>(block % kLayerWeightCount);
  return weight != LayerWeight::attn_norm && weight != LayerWeight::ffn_norm;
}


// A bf16 run of two blocks (16 tokens), planned again with `recipe` and f32 or bf16 linear
// gradients; a loss chunk of 16 tokens puts the output projection's gradient in bf16 too.
struct Bf16Run : TinyRun {
  Bf16Run(Float8Recipe recipe, bool low, int64_t loss_chunk = 3)
      : TinyRun(tiny_model(2), DType::bf16, "selective-op", 2, 8, loss_chunk) {
    PlanOptions options = plan.options;
    options.float8.recipe = recipe;
    options.float8.filter_fqns = {"output"};
    options.linear_grad_dtype = low ? DType::bf16 : DType::f32;
    replan(options);
  }
};

void expect_rounded_linear_gradients(Float8Recipe recipe, int64_t loss_chunk = 3) {
  SCOPED_TRACE(std::string(float8_recipe_name(recipe)) + ", loss chunk " + std::to_string(loss_chunk));
  Bf16Run wide(recipe, false, loss_chunk), low(recipe, true, loss_chunk);
  const bool output_rounded = loss_chunk >= 16;
  ASSERT_LT(wide.plan.linear_gradients, 0);
  ASSERT_GE(low.plan.linear_gradients, 0);
  for (Bf16Run* run : {&wide, &low}) {
    run->initialise(31);
    run->load_random_batch(32);
    run->forward_backward();
  }
  const ParameterLayout& layout = wide.executor->layout();
  const ModelConfig& model = wide.plan.model;
  int64_t linear = 0, exact = 0, other = 0;
  double sum_squares = 0;
  for (size_t index = 0; index < layout.parameters().size(); ++index) {
    const ParameterInfo& p = layout.parameters()[index];
    const bool is_linear = block_linear(index, model) || (output_rounded && index + 1 == layout.parameters().size());
    ASSERT_EQ(low.plan.gradient_place(p).buffer == low.plan.linear_gradients, is_linear) << p.name;
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double want = wide.gradient(p, i), got = low.gradient(p, i);
      sum_squares += got * got;
      if (!is_linear) {
        ASSERT_EQ(float(got), float(want)) << p.name << " element " << i << ": not a linear, so not rounded";
        ++other;
        continue;
      }
      ++linear;
      // The GEMM rounds its f32 accumulator to bf16 once; the f32 plan's value rounded to bf16
      // matches it but for a double rounding at a tie (one bf16 step apart at most).
      const double rounded = bf16_to_float(float_to_bf16(float(want)));
      if (got == rounded) {
        ++exact;
      } else {
        ASSERT_LE(std::fabs(got - want), std::ldexp(std::fabs(want), -8)) << p.name << " element " << i;
      }
    }
  }
  EXPECT_GT(linear, 0);
  EXPECT_GT(other, 0);
  EXPECT_GE(double(exact), 0.999 * double(linear)) << "linear gradients equal to the f32 ones rounded to bf16";
  EXPECT_GT(sum_squares, 1e-6) << "the gradients are not trivially zero";
  // The gradient norm step sums both buffers.
  OptimizerSettings unused;
  for (const Step& step : low.plan.steps)
    if (step.kind == StepKind::gradient_norm) low.executor->run_step(step, unused);
  EXPECT_NEAR(low.executor->gradient_norm(), std::sqrt(sum_squares), 1e-5 * std::sqrt(sum_squares));
}

TEST(Bf16LinearGradients, AreTheF32OnesRoundedAndEveryOtherGradientIsUnchanged) {
  expect_rounded_linear_gradients(Float8Recipe::none);
}

TEST(Bf16LinearGradients, OneLossChunkRoundsTheOutputProjectionsToo) {
  expect_rounded_linear_gradients(Float8Recipe::none, 16);
  expect_rounded_linear_gradients(Float8Recipe::tensorwise, 16);
}

TEST(Bf16LinearGradients, Float8GradWeightGemmsRoundLikewise) {
  expect_rounded_linear_gradients(Float8Recipe::tensorwise);
  expect_rounded_linear_gradients(Float8Recipe::rowwise);
}

// Eight steps with clipping: losses within 1% of the f32 gradients' run at every step (the
// rounding is 2^-9 relative per element), gradient norms within 1%, and training still trains.
TEST(Bf16LinearGradients, TrainingFollowsTheF32GradientsRun) {
  for (Float8Recipe recipe : {Float8Recipe::none, Float8Recipe::tensorwise}) {
    SCOPED_TRACE(std::string(float8_recipe_name(recipe)));
    Bf16Run wide(recipe, false), low(recipe, true);
    OptimizerSettings optimizer;
    optimizer.lr = 1e-2f;
    optimizer.weight_decay = 0.1f;
    optimizer.max_norm = 0.5f;
    wide.initialise(41);
    low.initialise(41);
    const testing::Trajectory a = testing::train_steps(wide, optimizer, 8, 200);
    const testing::Trajectory b = testing::train_steps(low, optimizer, 8, 200);
    for (size_t i = 0; i < a.losses.size(); ++i) {
      EXPECT_NEAR(b.losses[i], a.losses[i], 1e-2 * a.losses[i]) << "loss of step " << i + 1;
      EXPECT_NEAR(b.norms[i], a.norms[i], 1e-2 * a.norms[i]) << "gradient norm of step " << i + 1;
    }
    EXPECT_GT(b.norms.front(), optimizer.max_norm) << "the clipping the test means to cover never happened";
    EXPECT_NE(b.losses.front(), b.losses.back()) << "training changed nothing";
  }
}

}  // namespace
}  // namespace smelt
