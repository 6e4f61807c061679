// Scratch and temporaries that live only where they are used: the attention backward's planned
// scratch (one buffer per block, live in that block's backward attention step alone), the float8
// scratch split into a forward and a recompute-and-backward buffer (neither live across the output
// head), the logits' gradient written over the logits, and the SwiGLU gradients in the gate and up
// buffers.
#include <gtest/gtest.h>

#include "plan/step_plan.h"
#include "support/model_shapes.h"

namespace smelt {
namespace {

ModelConfig small_model(int64_t layers) {
  ModelConfig model = testing_support::llama3_8b_layers(layers);
  model.vocab_size = 512;
  model.dim = 128;
  model.n_heads = 4;
  model.n_kv_heads = 2;
  model.ffn_dim = 384;
  return model;
}

PlanOptions options(const char* policy, Float8Recipe recipe, size_t attention_scratch) {
  PlanOptions o;
  o.shape = {2, 64};
  o.compute_dtype = DType::bf16;
  o.policy = parse_checkpoint_policy(policy);
  o.loss_chunk_tokens = 32;
  o.float8.recipe = recipe;
  o.attention_backward_scratch_bytes = attention_scratch;
  return o;
}

int output_head_step(const StepPlan& plan) {
  for (size_t s = 0; s < plan.steps.size(); ++s)
    if (plan.steps[s].kind == StepKind::output_head) return static_cast<int>(s);
  return -1;
}

TEST(StepScratch, AttentionBackwardScratchLivesInItsOwnStepOnly) {
  const ModelConfig model = small_model(3);
  const size_t bytes = (size_t(3) << 20) + 7;
  for (const char* policy : {"none", "selective-op", "full"}) {
    SCOPED_TRACE(policy);
    const StepPlan plan = build_step_plan(model, options(policy, Float8Recipe::none, bytes));
    for (int64_t i = 0; i < model.n_layers; ++i) {
      const int id = plan.layers[size_t(i)].attention_scratch;
      ASSERT_GE(id, 0) << "block " << i;
      const BufferRequest& r = plan.buffers[size_t(id)].request;
      EXPECT_GE(r.bytes, bytes);
      EXPECT_EQ(r.first_step, r.last_step) << r.name;
      const Step& step = plan.steps[size_t(r.first_step)];
      EXPECT_EQ(step.kind, StepKind::layer_backward) << r.name;
      EXPECT_EQ(step.layer, i);
      EXPECT_EQ(static_cast<BackwardOp>(step.op), BackwardOp::attention) << r.name;
    }
    // Without planned scratch the workspace holds it: no buffers, and a plan otherwise the same.
    const StepPlan plain = build_step_plan(model, options(policy, Float8Recipe::none, 0));
    EXPECT_LT(plain.layers[0].attention_scratch, 0);
    EXPECT_EQ(plain.buffers.size() + size_t(model.n_layers), plan.buffers.size());
    EXPECT_EQ(plain.steps.size(), plan.steps.size());
  }
}

TEST(StepScratch, Float8ScratchIsNotLiveAcrossTheOutputHead) {
  const ModelConfig model = small_model(2);
  for (Float8Recipe recipe : {Float8Recipe::tensorwise, Float8Recipe::rowwise})
    for (const char* policy : {"none", "selective-op", "full"}) {
      SCOPED_TRACE(std::string(policy) + " " + std::string(float8_recipe_name(recipe)));
      const StepPlan plan = build_step_plan(model, options(policy, recipe, 0));
      ASSERT_GE(plan.float8_scratch, 0);
      ASSERT_GE(plan.float8_scratch_backward, 0);
      const int head = output_head_step(plan);
      ASSERT_GE(head, 0);
      const BufferRequest& forward = plan.buffers[size_t(plan.float8_scratch)].request;
      const BufferRequest& backward = plan.buffers[size_t(plan.float8_scratch_backward)].request;
      EXPECT_LT(forward.last_step, head);
      EXPECT_GT(backward.first_step, head);
      EXPECT_EQ(plan.steps[size_t(forward.first_step)].kind, StepKind::layer_forward);
      EXPECT_EQ(plan.steps[size_t(backward.last_step)].kind, StepKind::layer_backward);
      EXPECT_EQ(forward.bytes, backward.bytes);
    }
}

TEST(StepScratch, GradientsReuseTheBuffersTheyReplace) {
  const ModelConfig model = small_model(2);
  for (const char* policy : {"none", "selective-op", "full"}) {
    SCOPED_TRACE(policy);
    const StepPlan plan = build_step_plan(model, options(policy, Float8Recipe::none, 0));
    EXPECT_EQ(plan.grad_logits, plan.logits);
    EXPECT_EQ(plan.buffers[size_t(plan.logits)].dtype, DType::bf16) << "logits in the compute dtype";
    for (const LayerBuffers& lb : plan.layers) {
      EXPECT_EQ(lb.gradient[static_cast<int>(Gradient::gate)], lb.backward[static_cast<int>(Activation::gate)]);
      EXPECT_EQ(lb.gradient[static_cast<int>(Gradient::up)], lb.backward[static_cast<int>(Activation::up)]);
      EXPECT_NE(lb.gradient[static_cast<int>(Gradient::swiglu_out)], lb.backward[static_cast<int>(Activation::swiglu_out)]);
    }
  }
}

}  // namespace
}  // namespace smelt
