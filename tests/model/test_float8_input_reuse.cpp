// Float8 linears that read the same input in consecutive steps (wq, wk, wv; w1, w3) quantise it
// once: training with the reuse gives the same losses, gradient norms, weights and optimizer
// state, bit for bit, as every linear quantising its own input, for each recipe and
// checkpointing policy, with linears filtered to bf16 in between; and the reuse really happens,
// as often as the layer graph allows.
#include <gtest/gtest.h>

#include <cstring>

#include "model/model_fixture.h"

namespace smelt {
namespace {

using testing::TinyRun;
using testing::tiny_model;

struct Trajectory : testing::Trajectory {
  int64_t reused = 0;
};

constexpr int kSteps = 4;

Trajectory train(Float8Recipe recipe, const std::string& policy, const std::vector<std::string>& filter, bool reuse,
                 bool save_in_float8) {
  TinyRun run(tiny_model(2), DType::bf16, policy, 2, 8);
  PlanOptions options = run.plan.options;
  options.float8.recipe = recipe;
  options.float8.filter_fqns = filter;
  options.float8.save_inputs_in_float8 = save_in_float8;
  run.replan(options);
  run.executor->share_float8_inputs(reuse);
  run.initialise(33);
  OptimizerSettings optimizer;
  optimizer.lr = 2e-2f;
  optimizer.weight_decay = 0.1f;
  optimizer.max_norm = 0.5f;
  Trajectory t;
  static_cast<testing::Trajectory&>(t) = testing::train_steps(run, optimizer, kSteps, 300);
  t.reused = run.executor->float8_inputs_reused();
  return t;
}

// Returns the number of quantisations the shared run skipped.
// With `save_in_float8` (the default) x^T is kept from the forward wherever the plan allows, so
// the backward has fewer casts to share.
int64_t expect_same_training(Float8Recipe recipe, const std::string& policy, const std::vector<std::string>& filter,
                             bool save_in_float8 = true) {
  SCOPED_TRACE(std::string(float8_recipe_name(recipe)) + ", " + policy + (save_in_float8 ? "" : ", x kept in bf16"));
  const Trajectory shared = train(recipe, policy, filter, true, save_in_float8),
                   own = train(recipe, policy, filter, false, save_in_float8);
  EXPECT_EQ(own.reused, 0) << "reuse switched off, yet quantisations were skipped";
  for (size_t i = 0; i < shared.losses.size(); ++i) {
    EXPECT_EQ(shared.losses[i], own.losses[i]) << "loss of step " << i + 1;
    EXPECT_EQ(shared.norms[i], own.norms[i]) << "gradient norm of step " << i + 1;
  }
  EXPECT_NE(shared.losses.front(), shared.losses.back()) << "training changed nothing; the test would prove nothing";
  EXPECT_EQ(0, std::memcmp(shared.parameters.data(), own.parameters.data(), shared.parameters.size() * sizeof(float)))
      << "master weights";
  EXPECT_EQ(0, std::memcmp(shared.exp_avg.data(), own.exp_avg.data(), shared.exp_avg.size() * sizeof(float)))
      << "exp_avg";
  EXPECT_EQ(0, std::memcmp(shared.exp_avg_sq.data(), own.exp_avg_sq.data(), shared.exp_avg_sq.size() * sizeof(float)))
      << "exp_avg_sq";
  return shared.reused;
}

const std::vector<std::string> kOutputOnly = {"output"};
// Layer 1's wk in bf16: its wv no longer follows a float8 linear on the same input.
const std::vector<std::string> kLayer1KeyInBf16 = {"output", "layers.1.attention.wk"};

TEST(Float8InputReuse, TensorwiseSameTrainingEveryPolicy) {
  for (const char* policy : {"none", "selective-op", "full"})
    EXPECT_GT(expect_same_training(Float8Recipe::tensorwise, policy, kLayer1KeyInBf16), 0) << policy;
}

TEST(Float8InputReuse, RowwiseSameTrainingEveryPolicy) {
  for (const char* policy : {"none", "selective-op", "full"})
    EXPECT_GT(expect_same_training(Float8Recipe::rowwise, policy, kOutputOnly), 0) << policy;
}

TEST(Float8InputReuse, BlockwiseSameTrainingEveryPolicy) {
  for (const char* policy : {"none", "selective-op", "full"})
    EXPECT_GT(expect_same_training(Float8Recipe::blockwise, policy, kLayer1KeyInBf16), 0) << policy;
}

TEST(Float8InputReuse, RowwiseWithHighPrecisionGradWeightSameTraining) {
  EXPECT_GT(expect_same_training(Float8Recipe::rowwise_with_gw_hp, "selective-op", kLayer1KeyInBf16), 0);
}

// Without recomputation, per block and step: forward, wk and wv take wq's x and w3 takes w1's;
// backward, with inputs kept in bf16, the same three take x^T (none when the grad-weight GEMM is in
// bf16). A bf16 wk breaks the chain of its block: wv quantises again. With inputs kept as float8
// x^T the backward casts none of them, except the attention norm's output of the block whose wk
// is in bf16 (kept in bf16, so wq and wv cast it, and wv cannot take wq's).
TEST(Float8InputReuse, ReusesAsOftenAsTheLayerGraphAllows) {
  const bool bf16_inputs = false;
  EXPECT_EQ(expect_same_training(Float8Recipe::tensorwise, "none", kOutputOnly, bf16_inputs), kSteps * (6 + 6));
  EXPECT_EQ(expect_same_training(Float8Recipe::tensorwise, "none", kLayer1KeyInBf16, bf16_inputs), kSteps * (4 + 4));
  EXPECT_EQ(expect_same_training(Float8Recipe::rowwise, "none", kLayer1KeyInBf16, bf16_inputs), kSteps * (4 + 4));
  EXPECT_EQ(expect_same_training(Float8Recipe::blockwise, "none", kOutputOnly, bf16_inputs), kSteps * (6 + 6));
  EXPECT_EQ(expect_same_training(Float8Recipe::rowwise_with_gw_hp, "none", kLayer1KeyInBf16, bf16_inputs),
            kSteps * (4 + 0));
  EXPECT_EQ(expect_same_training(Float8Recipe::tensorwise, "none", kOutputOnly), kSteps * (6 + 0));
  EXPECT_EQ(expect_same_training(Float8Recipe::rowwise, "none", kLayer1KeyInBf16), kSteps * (4 + 0));
  EXPECT_EQ(expect_same_training(Float8Recipe::blockwise, "none", kOutputOnly), kSteps * (6 + 0));
}

}  // namespace
}  // namespace smelt
