// Training with the smaller compute copy (no bf16 copy of the embedding or of float8 linears; the
// output projection's cast per step by the output head) against the same plan widened back to a
// persistent bf16 copy of every parameter, as plans were before, and against the plan whose
// output projection's copy is persistent (PlanOptions::persistent_output_copy, written by AdamW):
// bf16 and float8 runs give the same losses, gradient norms, weights and optimizer state, bit
// for bit; and the copy always holds the rounded master weights of the parameters that have one.
#include <gtest/gtest.h>

#include <cstring>

#include "core/numerics.h"
#include "model/model_fixture.h"

namespace smelt {
namespace {

using testing::TinyRun;
using testing::tiny_model;
using testing::Trajectory;

// The plan as it was before the copy shrank: compute_weights a bf16 copy of every parameter (the
// embedding gathered from it, AdamW writing all of it), the arena packed again. The runs stay, each
// copied where it lies in the flat layout, so every gradient stays where the plan put it.
void widen_compute_copy(TinyRun& run) {
  StepPlan& plan = run.plan;
  ASSERT_GE(plan.compute_weights, 0);
  ASSERT_FALSE(plan.compute_copy_ranges.empty());
  for (ParameterRun& r : plan.compute_copy_ranges) {
    r.copy_offset = r.begin;
    r.amax_slot = -1;
  }
  plan.float8_weight_amax = -1;  // no run of its own per float8 weight: the cast takes its amax
  plan.output_weight = -1;  // the output head reads the persistent copy (its own buffer stays, unused)
  auto& buffer = plan.buffers[size_t(plan.compute_weights)];
  const int64_t total = ParameterLayout(plan.model).total();
  buffer.shape = Shape{total};
  buffer.request.bytes = size_t(total) * dtype_size(buffer.dtype);
  run.repack(run.buffer_requests());
}

void use_float8(TinyRun& run, Float8Recipe recipe) {
  run.use_float8(recipe, {"output", "layers.1.feed_forward.w2"});  // one block linear stays bf16
}

// Every parameter with a copy: the copy holds its master weights rounded to bf16.
void expect_copy_is_the_rounded_master(TinyRun& run, const std::string& when) {
  const TensorView copy = run.executor->view(run.plan.compute_weights);
  const TensorView master = run.executor->view(run.plan.parameters);
  int64_t checked = 0;
  for (const auto& p : run.executor->layout().parameters()) {
    const int64_t at = run.plan.compute_copy_offset(p);
    if (at < 0) continue;
    for (int64_t i = 0; i < p.numel(); ++i, ++checked)
      ASSERT_EQ(copy.as<uint16_t>()[at + i], float_to_bf16(master.as<float>()[p.offset + i]))
          << when << ": " << p.name << " element " << i;
  }
  EXPECT_EQ(checked > 0, true) << when;
}

enum class Copy { smaller, persistent_output, widened };

Trajectory train(Float8Recipe recipe, Copy copy) {
  TinyRun run(tiny_model(2), DType::bf16, "selective-op", 2, 8);
  if (recipe != Float8Recipe::none) use_float8(run, recipe);
  if (copy == Copy::persistent_output) {
    PlanOptions options = run.plan.options;
    options.persistent_output_copy = true;
    run.replan(options);
    EXPECT_LT(run.plan.output_weight, 0) << "no per-step buffer";
    EXPECT_GE(run.plan.compute_copy_offset(run.executor->layout().output()), 0) << "the output in the copy";
  }
  if (copy == Copy::widened) widen_compute_copy(run);
  run.initialise(21);
  if (copy != Copy::widened) expect_copy_is_the_rounded_master(run, "after the load");
  OptimizerSettings optimizer;
  optimizer.lr = 2e-2f;
  optimizer.weight_decay = 0.1f;
  optimizer.max_norm = 0.5f;  // clipping active: the norms below are larger
  Trajectory t = testing::train_steps(run, optimizer, 6, 100);
  if (copy != Copy::widened) expect_copy_is_the_rounded_master(run, "after six steps");
  return t;
}

void expect_same_training(Float8Recipe recipe) {
  const Trajectory smaller = train(recipe, Copy::smaller);
  EXPECT_GT(smaller.norms.front(), 0.5) << "the clipping the test means to cover never happened";
  EXPECT_NE(smaller.losses.front(), smaller.losses.back()) << "training changed nothing; the test would prove nothing";
  for (Copy copy : {Copy::widened, Copy::persistent_output}) {
    SCOPED_TRACE(std::string(float8_recipe_name(recipe)) +
                 (copy == Copy::widened ? ", every parameter copied" : ", persistent output copy"));
    const Trajectory full = train(recipe, copy);
    ASSERT_EQ(smaller.losses.size(), full.losses.size());
    for (size_t i = 0; i < smaller.losses.size(); ++i) {
      EXPECT_EQ(smaller.losses[i], full.losses[i]) << "loss of step " << i + 1;
      EXPECT_EQ(smaller.norms[i], full.norms[i]) << "gradient norm of step " << i + 1;
    }
    EXPECT_EQ(0, std::memcmp(smaller.parameters.data(), full.parameters.data(), smaller.parameters.size() * sizeof(float)))
        << "master weights";
    EXPECT_EQ(0, std::memcmp(smaller.exp_avg.data(), full.exp_avg.data(), smaller.exp_avg.size() * sizeof(float)))
        << "exp_avg";
    EXPECT_EQ(0, std::memcmp(smaller.exp_avg_sq.data(), full.exp_avg_sq.data(), smaller.exp_avg_sq.size() * sizeof(float)))
        << "exp_avg_sq";
  }
}

TEST(ComputeCopyTraining, Bf16RunEqualsTheWiderCopies) { expect_same_training(Float8Recipe::none); }

TEST(ComputeCopyTraining, Float8TensorwiseRunEqualsTheWiderCopies) { expect_same_training(Float8Recipe::tensorwise); }

TEST(ComputeCopyTraining, Float8RowwiseRunEqualsTheWiderCopies) { expect_same_training(Float8Recipe::rowwise); }

// The smaller copy really is smaller: no embedding, no float8 linears.
TEST(ComputeCopyTraining, CopySkipsTheEmbeddingAndFloat8Linears) {
  TinyRun run(tiny_model(2), DType::bf16, "none", 2, 8);
  use_float8(run, Float8Recipe::tensorwise);
  const auto& layout = run.executor->layout();
  EXPECT_EQ(run.plan.compute_copy_offset(layout.embedding()), -1);
  EXPECT_EQ(run.plan.compute_copy_offset(layout.layer(0, LayerWeight::wq)), -1);
  EXPECT_EQ(run.plan.compute_copy_offset(layout.layer(1, LayerWeight::w1)), -1);
  EXPECT_GE(run.plan.compute_copy_offset(layout.layer(1, LayerWeight::w2)), 0) << "filtered: stays bf16";
  EXPECT_GE(run.plan.compute_copy_offset(layout.layer(0, LayerWeight::ffn_norm)), 0);
  EXPECT_EQ(run.plan.compute_copy_offset(layout.output()), -1) << "cast per step into output_weight";
  EXPECT_GE(run.plan.output_weight, 0);
  EXPECT_GE(run.plan.compute_copy_offset(layout.final_norm()), 0);
}

}  // namespace
}  // namespace smelt
