// Inputs kept for the backward as float8 x^T (Float8Options::save_inputs_in_float8): the forward
// writes the grad-weight GEMM's x^T beside x, and the backward reads it instead of casting x again.
// Training is bit-identical to keeping x in bf16, for every recipe, policy and keep-set; the plan
// keeps in float8 exactly the activations only float8 linears read in the backward, frees their
// bf16 buffers after the forward, and needs less memory for it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "model/model_fixture.h"
#include "support/model_shapes.h"

namespace smelt {
namespace {

using testing::TinyRun;
using testing::tiny_model;

constexpr int kSteps = 4;
constexpr int64_t kLayers = 2;

struct Trajectory : testing::Trajectory {
  int saved = 0;  // activations kept as float8 x^T, over all blocks
};

PlanOptions options_for(Float8Recipe recipe, const std::string& policy, const std::vector<std::string>& filter,
                        const std::vector<KeepSet>& keep_sets, bool save_in_float8) {
  TinyRun run(tiny_model(kLayers), DType::bf16, policy, 2, 8);
  PlanOptions options = run.plan.options;
  options.float8.recipe = recipe;
  options.float8.filter_fqns = filter;
  options.float8.save_inputs_in_float8 = save_in_float8;
  options.keep_sets = keep_sets;
  return options;
}

Trajectory train(const PlanOptions& options) {
  TinyRun run(tiny_model(kLayers), DType::bf16, "none", 2, 8);
  run.replan(options);
  run.initialise(71);
  OptimizerSettings optimizer;
  optimizer.lr = 2e-2f;
  optimizer.weight_decay = 0.1f;
  optimizer.max_norm = 0.5f;
  Trajectory t;
  static_cast<testing::Trajectory&>(t) = testing::train_steps(run, optimizer, kSteps, 500);
  for (const auto& lb : run.plan.layers)
    t.saved += int(std::count_if(lb.float8_saved.begin(), lb.float8_saved.end(), [](int id) { return id >= 0; }));
  return t;
}

// Trains with inputs kept as float8 x^T and in bf16; expects the same bits. Returns the first.
Trajectory expect_same_training(Float8Recipe recipe, const std::string& policy,
                                const std::vector<std::string>& filter = {"output"},
                                const std::vector<KeepSet>& keep_sets = {}) {
  SCOPED_TRACE(std::string(float8_recipe_name(recipe)) + ", " + policy);
  const Trajectory saved = train(options_for(recipe, policy, filter, keep_sets, true));
  const Trajectory bf16 = train(options_for(recipe, policy, filter, keep_sets, false));
  EXPECT_EQ(bf16.saved, 0) << "saving in float8 switched off, yet the plan keeps float8 inputs";
  for (size_t i = 0; i < saved.losses.size(); ++i) {
    EXPECT_EQ(saved.losses[i], bf16.losses[i]) << "loss of step " << i + 1;
    EXPECT_EQ(saved.norms[i], bf16.norms[i]) << "gradient norm of step " << i + 1;
  }
  EXPECT_NE(saved.losses.front(), saved.losses.back()) << "training changed nothing; the test would prove nothing";
  EXPECT_EQ(0, std::memcmp(saved.parameters.data(), bf16.parameters.data(), saved.parameters.size() * sizeof(float)))
      << "master weights";
  EXPECT_EQ(0, std::memcmp(saved.exp_avg.data(), bf16.exp_avg.data(), saved.exp_avg.size() * sizeof(float)))
      << "exp_avg";
  EXPECT_EQ(0, std::memcmp(saved.exp_avg_sq.data(), bf16.exp_avg_sq.data(), saved.exp_avg_sq.size() * sizeof(float)))
      << "exp_avg_sq";
  return saved;
}

TEST(Float8SavedInputs, SameTrainingAsCastingInTheBackwardEveryRecipeAndPolicy) {
  // Per block kept whole: the two norms' outputs and SwiGLU's (attention's output is also read by
  // attention's backward). selective-op and full recompute them, so nothing is kept in float8.
  const int per_block = 3;
  for (Float8Recipe recipe : {Float8Recipe::tensorwise, Float8Recipe::rowwise, Float8Recipe::blockwise}) {
    EXPECT_EQ(expect_same_training(recipe, "none").saved, per_block * kLayers);
    EXPECT_EQ(expect_same_training(recipe, "selective-layer:2").saved, per_block * 1);  // block 1 recomputed
    EXPECT_EQ(expect_same_training(recipe, "selective-op").saved, 0);
    EXPECT_EQ(expect_same_training(recipe, "full").saved, 0);
  }
  // The grad-weight GEMM in bf16 reads x itself.
  EXPECT_EQ(expect_same_training(Float8Recipe::rowwise_with_gw_hp, "none").saved, 0);
}

KeepSet all_but(std::initializer_list<Activation> dropped) {
  KeepSet kept = needed_by_backward();
  for (Activation a : dropped) kept[size_t(a)] = false;
  return kept;
}

bool saved(const StepPlan& plan, int64_t layer, Activation a) {
  return plan.layers[size_t(layer)].float8_saved[size_t(a)] >= 0;
}

TEST(Float8SavedInputs, KeptInFloat8OnlyWhereOnlyFloat8LinearsReadThem) {
  using A = Activation;
  {  // Layer 1's wk in bf16 reads the attention norm's output: that block keeps it in bf16.
    TinyRun run(tiny_model(kLayers), DType::bf16, "none", 2, 8);
    run.replan(options_for(Float8Recipe::tensorwise, "none", {"output", "layers.1.attention.wk"}, {}, true));
    EXPECT_TRUE(saved(run.plan, 0, A::attn_norm_out));
    EXPECT_FALSE(saved(run.plan, 1, A::attn_norm_out));
    EXPECT_TRUE(saved(run.plan, 1, A::ffn_norm_out));
    EXPECT_TRUE(saved(run.plan, 1, A::swiglu_out));
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      EXPECT_FALSE(saved(run.plan, layer, A::attn_out)) << "attention's backward reads it too";
      EXPECT_FALSE(saved(run.plan, layer, A::gate));
      EXPECT_FALSE(saved(run.plan, layer, A::layer_input));
    }
  }
  {  // Block 0 recomputes its attention norm (rstd dropped), which writes the norm's output; block
     // 1 recomputes wq, which reads it: neither keeps it in float8. Both keep the FFN's.
    const std::vector<KeepSet> sets = {all_but({A::attn_rstd}), all_but({A::query})};
    TinyRun run(tiny_model(kLayers), DType::bf16, "none", 2, 8);
    run.replan(options_for(Float8Recipe::rowwise, "none", {"output"}, sets, true));
    EXPECT_TRUE(run.plan.layers[0].recomputed[size_t(ForwardOp::attn_norm)]);
    EXPECT_TRUE(run.plan.layers[1].recomputed[size_t(ForwardOp::q_proj)]);
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      EXPECT_FALSE(saved(run.plan, layer, A::attn_norm_out)) << layer;
      EXPECT_TRUE(saved(run.plan, layer, A::ffn_norm_out)) << layer;
      EXPECT_TRUE(saved(run.plan, layer, A::swiglu_out)) << layer;
    }
  }
}

TEST(Float8SavedInputs, SameTrainingWithKeepSetsThatRecomputeAroundThem) {
  using A = Activation;
  const std::vector<KeepSet> sets = {all_but({A::attn_rstd, A::swiglu_out}), all_but({A::query, A::up})};
  for (Float8Recipe recipe : {Float8Recipe::tensorwise, Float8Recipe::rowwise, Float8Recipe::blockwise})
    EXPECT_GT(expect_same_training(recipe, "none", {"output", "layers.0.feed_forward.w2"}, sets).saved, 0);
}

// The step index of block `layer`'s first backward (or recompute) step.
int first_backward_step(const StepPlan& plan, int64_t layer) {
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const Step& step = plan.steps[s];
    if ((step.kind == StepKind::layer_backward || step.kind == StepKind::layer_recompute) && step.layer == layer)
      return int(s);
  }
  return -1;
}

TEST(Float8SavedInputs, TheBf16InputLivesOnlyInTheForwardAndTheFloat8CopyUntilItsBackward) {
  TinyRun run(tiny_model(kLayers), DType::bf16, "none", 2, 8);
  run.replan(options_for(Float8Recipe::blockwise, "none", {"output"}, {}, true));
  const StepPlan& plan = run.plan;
  int checked = 0;
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    const auto& lb = plan.layers[size_t(layer)];
    const int backward = first_backward_step(plan, layer);
    ASSERT_GT(backward, 0);
    for (int a = 0; a < kActivationCount; ++a) {
      if (lb.float8_saved[size_t(a)] < 0) continue;
      SCOPED_TRACE(std::string(activation_name(Activation(a))) + " of block " + std::to_string(layer));
      const BufferRequest& bf16 = plan.buffers[size_t(lb.forward[size_t(a)])].request;
      const BufferRequest& float8 = plan.buffers[size_t(lb.float8_saved[size_t(a)])].request;
      EXPECT_LT(bf16.last_step, backward);
      EXPECT_EQ(float8.first_step, bf16.first_step + 1) << "written by the first linear reading x, after its producer";
      EXPECT_GE(float8.last_step, backward);
      // x^T bytes and one scale per 128-token tile of each of its rows.
      const int64_t in = plan.buffers[size_t(lb.forward[size_t(a)])].shape[1], tokens = 16;
      EXPECT_EQ(int64_t(float8.bytes), float8_saved_input_bytes(Float8Recipe::blockwise, in, tokens));
      EXPECT_LT(float8.bytes, bf16.bytes);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * kLayers);
}

// At a size where it matters (8B's widths, 2048 tokens, 4 blocks, AC none): the arena shrinks
// by what the three inputs per block lose: half their bf16 bytes, less their scales and what the
// packing of the other buffers around them gives back (a few per cent).
TEST(Float8SavedInputs, SavesHalfTheBytesOfTheInputsItKeeps) {
  const ModelConfig model = testing_support::llama3_8b_layers(4);
  for (Float8Recipe recipe : {Float8Recipe::tensorwise, Float8Recipe::rowwise, Float8Recipe::blockwise}) {
    SCOPED_TRACE(std::string(float8_recipe_name(recipe)));
    PlanOptions options;
    options.shape = {1, 2048};
    options.compute_dtype = DType::bf16;
    options.float8.recipe = recipe;
    const StepPlan saved = build_step_plan(model, options);
    options.float8.save_inputs_in_float8 = false;
    const StepPlan bf16 = build_step_plan(model, options);
    const double tokens = 2048, expected = double(model.n_layers) * tokens * double(2 * model.dim + model.ffn_dim);
    const double smaller = double(bf16.memory.arena_bytes) - double(saved.memory.arena_bytes);
    EXPECT_GT(smaller, 0.95 * expected);
    EXPECT_LT(smaller, 1.0 * expected);
  }
}

}  // namespace
}  // namespace smelt
