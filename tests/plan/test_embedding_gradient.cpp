// The embedding's gradient in a buffer of its own (separate_embedding_gradient): live from the
// embedding's backward to the optimizer, so the forward and the rest of the backward run without
// its (vocabulary x dim) f32; placed over memory the activations have left; and planned only where
// nothing needs it across steps or passes.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/memory_plan.h"
#include "plan/step_plan.h"
#include "support/model_shapes.h"

namespace smelt {
namespace {

PlanOptions proxy_options(Float8Recipe recipe, const char* policy) {
  PlanOptions o;
  o.shape = {1, 8192};
  o.compute_dtype = DType::bf16;
  o.policy = parse_checkpoint_policy(policy);
  o.loss_chunk_tokens = 8192;
  o.linear_grad_dtype = DType::bf16;
  o.float8.recipe = recipe;
  o.float8.filter_fqns = {"output"};
  return o;
}

int step_index(const StepPlan& plan, StepKind kind) {
  for (size_t i = 0; i < plan.steps.size(); ++i)
    if (plan.steps[i].kind == kind) return int(i);
  return -1;
}

// The same plan with the embedding's gradient held for the whole step, as in a plan that keeps it
// with the other gradients, packed again.
MemoryPlan packed_with_whole_step_embedding_gradient(const StepPlan& plan) {
  std::vector<BufferRequest> requests;
  for (const auto& b : plan.buffers) requests.push_back(b.request);
  requests[size_t(plan.embedding_gradient)].first_step = 0;
  requests[size_t(plan.embedding_gradient)].last_step = int(plan.steps.size()) - 1;
  return pack_buffers(requests, int(plan.steps.size()));
}

TEST(EmbeddingGradient, IsLiveOnlyFromItsBackwardToTheOptimizerAndTakesNoPeakMemory) {
  const ModelConfig model = testing_support::llama3_8b_layers(2);
  const ParameterLayout layout(model);
  for (Float8Recipe recipe : {Float8Recipe::none, Float8Recipe::tensorwise}) {
    for (const char* policy : {"none", "selective-op", "full"}) {
      SCOPED_TRACE(std::string(float8_recipe_name(recipe)) + ", " + policy);
      const StepPlan plan = build_step_plan(model, proxy_options(recipe, policy));
      ASSERT_GE(plan.embedding_gradient, 0);
      const auto& buffer = plan.buffers[size_t(plan.embedding_gradient)];
      EXPECT_EQ(buffer.dtype, DType::f32);
      EXPECT_EQ(buffer.request.kind, BufferClass::gradients);
      EXPECT_EQ(buffer.shape.numel(), layout.parameters()[1].offset) << "the embedding's padded run";
      EXPECT_EQ(plan.gradient_place(layout.embedding()).buffer, plan.embedding_gradient);
      EXPECT_EQ(buffer.request.first_step, step_index(plan, StepKind::embedding_backward));
      EXPECT_EQ(buffer.request.last_step, step_index(plan, StepKind::optimizer));
      // The shared f32 gradients no longer hold it.
      EXPECT_LT(plan.buffers[size_t(plan.gradients)].request.bytes, buffer.request.bytes);
      // The peak (the output head here) is before it: the step's memory is one embedding gradient
      // smaller than with the gradient held throughout, and the buffer sits over memory an
      // activation of the forward or backward had.
      EXPECT_LT(plan.memory.peak_step, buffer.request.first_step);
      const MemoryPlan whole = packed_with_whole_step_embedding_gradient(plan);
      EXPECT_EQ(whole.peak_live_bytes, plan.memory.peak_live_bytes + buffer.request.bytes);
      EXPECT_LE(plan.memory.arena_bytes + buffer.request.bytes, whole.arena_bytes + (whole.arena_bytes >> 10));
      const size_t begin = plan.memory.offsets[size_t(plan.embedding_gradient)], end = begin + buffer.request.bytes;
      bool over_an_activation = false;
      for (size_t b = 0; b < plan.buffers.size(); ++b) {
        const auto& other = plan.buffers[b].request;
        const size_t at = plan.memory.offsets[b];
        if (other.last_step < buffer.request.first_step && at < end && begin < at + other.bytes)
          over_an_activation = over_an_activation || other.kind == BufferClass::activations ||
                               other.kind == BufferClass::recompute || other.kind == BufferClass::activation_gradients;
      }
      EXPECT_TRUE(over_an_activation);
    }
  }
}

TEST(EmbeddingGradient, StaysWithTheOtherGradientsWhereItMustOutliveThePass) {
  const ModelConfig model = testing_support::llama3_8b_layers(1);
  const ParameterLayout layout(model);
  auto expect_shared = [&](PlanOptions o, const std::string& why) {
    SCOPED_TRACE(why);
    EXPECT_FALSE(separate_embedding_gradient(o));
    const StepPlan plan = build_step_plan(model, o);
    EXPECT_LT(plan.embedding_gradient, 0);
    if (plan.options.forward_only) return;
    if (!plan.sharded()) {
      EXPECT_EQ(plan.gradient_place(layout.embedding()).buffer, plan.gradients);
      EXPECT_EQ(plan.gradient_place(layout.embedding()).offset, 0);
    }
    EXPECT_EQ(plan.buffers[size_t(plan.gradients)].request.first_step, 0) << "persistent";
  };
  PlanOptions accumulated = proxy_options(Float8Recipe::none, "selective-op");
  accumulated.microbatches = 2;
  expect_shared(accumulated, "gradient accumulation adds each pass's rows to it");
  PlanOptions replicated = proxy_options(Float8Recipe::none, "selective-op");
  replicated.replicate_degree = 2;
  expect_shared(replicated, "replicas all-reduce the gradients unit by unit");
  PlanOptions sharded = proxy_options(Float8Recipe::none, "selective-op");
  sharded.shard_single_rank = true;
  expect_shared(sharded, "sharded plans reduce-scatter it");
  PlanOptions f32 = proxy_options(Float8Recipe::none, "selective-op");
  f32.compute_dtype = DType::f32;
  expect_shared(f32, "f32 compute: one gradient buffer laid out like the parameters");
  PlanOptions eval = proxy_options(Float8Recipe::none, "none");
  eval.forward_only = true;
  expect_shared(eval, "forward only: no gradients");
  // And bf16 with f32 linear gradients does split it off.
  PlanOptions f32_linear = proxy_options(Float8Recipe::none, "selective-op");
  f32_linear.linear_grad_dtype = DType::f32;
  EXPECT_TRUE(separate_embedding_gradient(f32_linear));
  EXPECT_GE(build_step_plan(model, f32_linear).embedding_gradient, 0);
}

}  // namespace
}  // namespace smelt
