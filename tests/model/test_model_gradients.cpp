// The whole model's gradients: against float64 finite differences, and
// bit-identical across checkpointing policies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/numerics.h"
#include "model_fixture.h"
#include "support/fresh_random.h"

namespace smelt {
namespace {

using testing::TinyRun;
using testing::tiny_model;

TEST(ModelGradients, MatchFiniteDifferencesInFloat64) {
  ModelConfig model = tiny_model(2);
  TinyRun run(model, DType::f64, "none", 2, 5);
  run.initialise(3);
  run.load_random_batch(4);
  run.forward_backward();
  TensorView params = run.executor->view(run.plan.parameters);
  TensorView grads = run.executor->view(run.plan.gradients);
  ASSERT_EQ(params.dtype, DType::f64);
  std::vector<double> analytic(grads.as<double>(), grads.as<double>() + grads.numel());

  // A few coordinates of every parameter tensor.
  Random random(testing_support::fresh(11));
  int checked = 0;
  for (const auto& p : run.executor->layout().parameters()) {
    for (int k = 0; k < 4; ++k) {
      const int64_t index = p.offset + static_cast<int64_t>(random.below(static_cast<uint64_t>(p.numel())));
      double& w = params.as<double>()[index];
      const double saved = w, h = 1e-5;
      w = saved + h;
      const double plus = run.loss_only();
      w = saved - h;
      const double minus = run.loss_only();
      w = saved;
      const double numeric = (plus - minus) / (2 * h);
      const double a = analytic[static_cast<size_t>(index)];
      EXPECT_NEAR(a, numeric, 1e-7 + 1e-5 * std::fabs(numeric)) << p.name << " element " << index - p.offset;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * (3 + kLayerWeightCount * 2));  // embedding, final norm, output + 2 blocks
  // The gradient is not trivially zero.
  double norm = 0;
  for (double g : analytic) norm += g * g;
  EXPECT_GT(norm, 1e-6);
}


void expect_policies_bit_identical(DType compute) {
  ModelConfig model = tiny_model(4);
  std::vector<uint8_t> reference;
  double reference_loss = 0;
  for (const char* policy : {"none", "full", "selective-op", "selective-layer:2", "selective-layer:3"}) {
    TinyRun run(model, compute, policy, 2, 7, 4);
    run.initialise(21);
    run.load_random_batch(22);
    // Poison the gradients: a policy that forgot to write one cannot match.
    run.poison_gradients(0x7f);
    run.forward_backward();
    auto bytes = run.gradient_bytes();
    const double loss = run.executor->loss();
    if (reference.empty()) {
      reference = bytes;
      reference_loss = loss;
      continue;
    }
    EXPECT_EQ(loss, reference_loss) << policy;
    EXPECT_TRUE(bytes == reference) << policy << ": gradients differ from policy none";
  }
}

TEST(ModelGradients, BitIdenticalAcrossPoliciesFloat32) { expect_policies_bit_identical(DType::f32); }
TEST(ModelGradients, BitIdenticalAcrossPoliciesBfloat16) { expect_policies_bit_identical(DType::bf16); }

TEST(ModelGradients, Bfloat16TracksFloat32) {
  ModelConfig model = tiny_model(2);
  TinyRun wide(model, DType::f32, "none", 2, 8);
  TinyRun narrow(model, DType::bf16, "selective-op", 2, 8);
  for (TinyRun* run : {&wide, &narrow}) {
    run->initialise(5);
    run->load_random_batch(6);
    run->forward_backward();
  }
  EXPECT_NEAR(narrow.executor->loss(), wide.executor->loss(), 0.02 * std::fabs(wide.executor->loss()));
  double dot = 0, na = 0, nb = 0;
  for (const auto& p : wide.executor->layout().parameters())  // each gradient wherever its plan keeps it
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double a = wide.gradient(p, i), b = narrow.gradient(p, i);
      dot += a * b;
      na += a * a;
      nb += b * b;
    }
  EXPECT_GT(na, 1e-8);
  EXPECT_GT(dot / std::sqrt(na * nb), 0.999);  // same direction to bf16 precision
}

TEST(Executor, AllocatesOnlyTheArenaAcrossSteps) {
  ModelConfig model = tiny_model(2);
  TinyRun run(model, DType::bf16, "selective-op", 2, 6);
  run.initialise(1);
  const int64_t after_setup = run.backend->memory().allocation_count();
  EXPECT_EQ(after_setup, 1);  // the arena, and nothing else
  OptimizerSettings optimizer;
  optimizer.lr = 1e-3f;
  optimizer.weight_decay = 0.1f;
  optimizer.max_norm = 1.0f;
  for (int step = 1; step <= 5; ++step) {
    run.load_random_batch(static_cast<uint64_t>(step));
    optimizer.step = step;
    run.executor->run(optimizer);
    EXPECT_TRUE(std::isfinite(run.executor->loss()));
  }
  EXPECT_EQ(run.backend->memory().allocation_count(), after_setup);
}

TEST(Executor, TrainingStepsReduceTheLossOnAFixedBatch) {
  ModelConfig model = tiny_model(2);
  TinyRun run(model, DType::f32, "full", 2, 8);
  run.initialise(9);
  run.load_random_batch(10);
  OptimizerSettings optimizer;
  optimizer.lr = 3e-3f;
  optimizer.max_norm = 1.0f;
  double first = 0, last = 0;
  for (int step = 1; step <= 60; ++step) {
    optimizer.step = step;
    run.executor->run(optimizer);
    if (step == 1) first = run.executor->loss();
    last = run.executor->loss();
  }
  // Memorising one batch of random tokens: the loss must fall well below its start.
  EXPECT_LT(last, 0.5 * first);
}

}  // namespace
}  // namespace smelt

namespace smelt {
namespace {

TEST(Executor, OptimizerKeepsTheBf16CopyEqualToTheRoundedMasterWeights) {
  testing::TinyRun run(testing::tiny_model(2), DType::bf16, "none", 2, 6);
  run.initialise(31);
  TensorView copy = run.executor->view(run.plan.compute_weights);
  std::memset(copy.data, 0xff, copy.bytes());  // poison: NaN bf16 everywhere
  OptimizerSettings optimizer;
  optimizer.lr = 1e-2f;
  optimizer.max_norm = 1.0f;
  optimizer.step = 1;
  run.load_random_batch(32);
  // The load converted the master weights once; poison again, then one step must rewrite every element.
  std::memset(copy.data, 0xff, copy.bytes());
  run.executor->run_gradients(optimizer);
  run.executor->run_update(optimizer);
  TensorView master = run.executor->view(run.plan.parameters);
  // The copy holds every parameter but the embedding (gathered from the master) and the output
  // projection (cast by the output head), packed in order.
  ASSERT_FALSE(run.plan.compute_copy_ranges.empty());
  int64_t written = 0;
  for (const auto& range : run.plan.compute_copy_ranges) {
    if (!range.copied()) continue;
    for (int64_t i = 0; i < range.count; ++i, ++written)
      ASSERT_EQ(copy.as<uint16_t>()[range.copy_offset + i], float_to_bf16(master.as<float>()[range.begin + i]))
          << "element " << range.begin + i;
  }
  EXPECT_EQ(written, copy.numel());
  const auto& layout = run.executor->layout();
  EXPECT_EQ(written, layout.output().offset - layout.parameters()[1].offset);
}

}  // namespace
}  // namespace smelt
