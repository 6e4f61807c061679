// Training with the embedding's gradient in its own buffer (live from its backward to the
// optimizer, over memory the activations had) against the same plan with that buffer held for
// the whole step: the same losses, gradient norms, weights and AdamW moments, bit for bit, in bf16
// and float8 plans and with bf16 or f32 linear gradients, so no step reads it before the
// embedding's backward writes it and nothing overwrites it before the optimizer.
#include <gtest/gtest.h>

#include <cstring>

#include "model/model_fixture.h"

namespace smelt {
namespace {

using testing::TinyRun;
using testing::tiny_model;
using testing::Trajectory;

void hold_embedding_gradient_whole_step(TinyRun& run) {
  ASSERT_GE(run.plan.embedding_gradient, 0);
  std::vector<BufferRequest> requests = run.buffer_requests();
  requests[size_t(run.plan.embedding_gradient)].first_step = 0;
  requests[size_t(run.plan.embedding_gradient)].last_step = int(run.plan.steps.size()) - 1;
  run.repack(requests);
}

Trajectory train(Float8Recipe recipe, DType linear_grads, bool whole_step) {
  TinyRun run(tiny_model(2), DType::bf16, "selective-op", 2, 8);
  PlanOptions options = run.plan.options;
  options.float8.recipe = recipe;
  options.float8.filter_fqns = {"output"};
  options.linear_grad_dtype = linear_grads;
  run.replan(options);
  EXPECT_GE(run.plan.embedding_gradient, 0);
  if (whole_step) hold_embedding_gradient_whole_step(run);
  // Every buffer that is not held across steps starts as NaN (all bits set): what the arena held
  // before must never reach the gradients.
  for (size_t b = 0; b < run.plan.buffers.size(); ++b) {
    const BufferRequest& r = run.plan.buffers[b].request;
    if (r.first_step == 0 && r.last_step == int(run.plan.steps.size()) - 1) continue;
    const TensorView v = run.executor->view(int(b));
    std::memset(v.data, 0xff, v.bytes());
  }
  run.initialise(31);
  OptimizerSettings optimizer;
  optimizer.lr = 2e-2f;
  optimizer.weight_decay = 0.1f;
  optimizer.max_norm = 0.5f;  // clipping active: the norm's every bit reaches the weights
  return testing::train_steps(run, optimizer, 5, 300);
}

TEST(EmbeddingGradientTraining, MatchesTheWholeStepBufferBitForBit) {
  for (Float8Recipe recipe : {Float8Recipe::none, Float8Recipe::tensorwise, Float8Recipe::rowwise}) {
    for (DType linear_grads : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(std::string(float8_recipe_name(recipe)) + ", linear gradients " + std::string(dtype_name(linear_grads)));
      const Trajectory split = train(recipe, linear_grads, false), whole = train(recipe, linear_grads, true);
      ASSERT_EQ(split.losses.size(), 5u);
      EXPECT_EQ(split.losses, whole.losses);
      EXPECT_EQ(split.norms, whole.norms);
      for (double norm : split.norms) EXPECT_GT(norm, 0.5) << "clipping active";
      EXPECT_EQ(split.parameters, whole.parameters);
      EXPECT_EQ(split.exp_avg, whole.exp_avg);
      EXPECT_EQ(split.exp_avg_sq, whole.exp_avg_sq);
    }
  }
}

}  // namespace
}  // namespace smelt
