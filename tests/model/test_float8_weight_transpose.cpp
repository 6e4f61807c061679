// Tensorwise W^T made at each backward use by transposing W's codes (the default) instead of kept
// as a second float8 copy (float8.keep_transposed_weights): W and W^T share the one scale, so the
// transposed codes are exactly what the transposed cast writes. Training is bit-identical either
// way under every policy, the weight copies take half the bytes, and the other recipes, whose W^T
// has scales of its own, keep their copies whatever the switch says.
#include <gtest/gtest.h>

#include <cstring>

#include "model/model_fixture.h"
#include "support/model_shapes.h"

namespace smelt {
namespace {

using testing::TinyRun;
using testing::tiny_model;

constexpr int kSteps = 4;

struct Trajectory : testing::Trajectory {
  StepPlan plan;
};

Trajectory train(Float8Recipe recipe, const std::string& policy, bool keep_transposed) {
  TinyRun run(tiny_model(2), DType::bf16, policy, 2, 8);
  PlanOptions options = run.plan.options;
  options.float8.recipe = recipe;
  options.float8.filter_fqns = {"output", "layers.1.attention.wk"};
  options.float8.keep_transposed_weights = keep_transposed;
  run.replan(options);
  run.initialise(17);
  OptimizerSettings optimizer;
  optimizer.lr = 2e-2f;
  optimizer.weight_decay = 0.1f;
  optimizer.max_norm = 0.5f;
  Trajectory t;
  static_cast<testing::Trajectory&>(t) = testing::train_steps(run, optimizer, kSteps, 900);
  t.plan = run.plan;
  return t;
}

int64_t float8_parameters(const StepPlan& plan) {
  int64_t total = 0;
  for (const auto& lb : plan.layers)
    for (int w = 0; w < kLayerWeightCount; ++w)
      if (lb.float8[size_t(w)]) {
        const auto spec = layer_weight_spec(static_cast<LayerWeight>(w), plan.model);
        total += spec.dims[0] * spec.dims[1];
      }
  return total;
}

TEST(Float8WeightTranspose, TensorwiseSameTrainingWithWTransposedPerUseEveryPolicy) {
  for (const char* policy : {"none", "selective-op", "full"}) {
    SCOPED_TRACE(policy);
    const Trajectory per_use = train(Float8Recipe::tensorwise, policy, false);
    const Trajectory kept = train(Float8Recipe::tensorwise, policy, true);
    for (size_t i = 0; i < per_use.losses.size(); ++i) {
      EXPECT_EQ(per_use.losses[i], kept.losses[i]) << "loss of step " << i + 1;
      EXPECT_EQ(per_use.norms[i], kept.norms[i]) << "gradient norm of step " << i + 1;
    }
    EXPECT_NE(per_use.losses.front(), per_use.losses.back()) << "training changed nothing";
    EXPECT_EQ(0, std::memcmp(per_use.parameters.data(), kept.parameters.data(), per_use.parameters.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(per_use.exp_avg.data(), kept.exp_avg.data(), per_use.exp_avg.size() * sizeof(float)));
    // W alone against W and W^T (each linear 256-byte aligned).
    const int64_t parameters = float8_parameters(per_use.plan);
    EXPECT_GE(per_use.plan.float8_weight_layout.value_bytes, parameters);
    EXPECT_LT(per_use.plan.float8_weight_layout.value_bytes, parameters + 256 * 14);
    EXPECT_GE(kept.plan.float8_weight_layout.value_bytes, 2 * parameters);
    // The backward scratch gains one W^T slot, the size of the largest float8 weight.
    EXPECT_GT(per_use.plan.float8_sizes.weight_transposed, 0);
    EXPECT_EQ(kept.plan.float8_sizes.weight_transposed, 0);
  }
}

TEST(Float8WeightTranspose, OtherRecipesKeepTheirTransposedCopies) {
  for (Float8Recipe recipe : {Float8Recipe::rowwise, Float8Recipe::rowwise_with_gw_hp, Float8Recipe::blockwise}) {
    SCOPED_TRACE(std::string(float8_recipe_name(recipe)));
    Float8Options options;
    options.recipe = recipe;
    EXPECT_FALSE(float8_transposes_per_use(options));
    TinyRun run(tiny_model(2), DType::bf16, "none", 2, 8);
    PlanOptions plan_options = run.plan.options;
    plan_options.float8.recipe = recipe;
    run.replan(plan_options);
    EXPECT_GE(run.plan.float8_weight_layout.value_bytes, 2 * float8_parameters(run.plan));
    EXPECT_EQ(run.plan.float8_sizes.weight_transposed, 0);
  }
}

// At the proxy's size (8B widths, 8 blocks, 8192 tokens) the arena shrinks by the float8 linears'
// parameter count in bytes (less the W^T scratch slot, where it is live at the peak), under every
// policy.
TEST(Float8WeightTranspose, SavesAByteForEachFloat8ParameterOnTheProxy) {
  const ModelConfig model = testing_support::llama3_8b_layers(8);
  for (const char* policy : {"none", "selective-op", "full"}) {
    SCOPED_TRACE(policy);
    PlanOptions options;
    options.shape = {1, 8192};
    options.compute_dtype = DType::bf16;
    options.policy = parse_checkpoint_policy(policy);
    options.float8.recipe = Float8Recipe::tensorwise;
    const StepPlan per_use = build_step_plan(model, options);
    options.float8.keep_transposed_weights = true;
    const StepPlan kept = build_step_plan(model, options);
    const double parameters = double(float8_parameters(per_use));
    const double smaller = double(kept.memory.arena_bytes) - double(per_use.memory.arena_bytes);
    EXPECT_GT(smaller, 0.95 * parameters);
    EXPECT_LE(smaller, 1.0 * parameters);
  }
}

}  // namespace
}  // namespace smelt
