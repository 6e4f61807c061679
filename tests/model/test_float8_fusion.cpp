// [float8] fusion = "full" with tensorwise scaling: SwiGLU takes the amax of its output (w2's x)
// and of its gradients (w1's and w3's dy) in the same pass, and those casts skip their amax pass.
// AdamW takes the amax of every float8 weight it updates, and the weight cast skips its amax pass.
// Training is bit-identical to fusion = "linear" under every policy; the amax passes really go
// (three per block and one per float8 weight and step fewer); the other recipes are untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/numerics.h"
#include "model/model_fixture.h"
#include "model/recording_backend.h"
#include "support/fresh_random.h"

namespace smelt {
namespace {

using testing::RecordingBackend;
using testing::TinyRun;
using testing::tiny_model;

constexpr int kSteps = 3;
constexpr int64_t kLayers = 2;

struct Trajectory {
  std::vector<double> losses, norms;
  std::vector<float> parameters;
  int64_t amax_calls = 0;
  bool producer_amax = false, weight_amax = false;
  int64_t float8_linears = 0;
};

Trajectory train(Float8Recipe recipe, const std::string& policy, bool fused) {
  TinyRun run(tiny_model(kLayers), DType::bf16, policy, 2, 8);
  auto recording = std::make_unique<RecordingBackend>();
  RecordingBackend* backend = recording.get();
  PlanOptions options = run.plan.options;
  options.float8.recipe = recipe;
  options.float8.fuse_amax_into_producers = fused;
  run.executor.reset();
  run.backend = std::move(recording);
  run.replan(options);
  run.initialise(29);
  OptimizerSettings optimizer;
  optimizer.lr = 2e-2f;
  optimizer.max_norm = 0.5f;
  Trajectory t;
  backend->amax_calls = 0;
  for (int step = 1; step <= kSteps; ++step) {
    run.load_random_batch(uint64_t(40 + step));
    optimizer.step = step;
    run.executor->run(optimizer);
    t.losses.push_back(run.executor->loss());
    t.norms.push_back(run.executor->gradient_norm());
  }
  t.parameters.resize(size_t(run.executor->layout().total()));
  run.executor->read_parameters(t.parameters.data());
  t.amax_calls = backend->amax_calls;
  t.producer_amax = run.plan.float8_producer_amax >= 0;
  t.weight_amax = run.plan.float8_weight_amax >= 0;
  for (const auto& layer : run.plan.layers)
    for (bool float8 : layer.float8) t.float8_linears += float8 ? 1 : 0;
  return t;
}

TEST(Float8Fusion, TensorwiseSwigluAmaxSameTrainingEveryPolicyAndFewerAmaxPasses) {
  for (const char* policy : {"none", "selective-op", "full"}) {
    SCOPED_TRACE(policy);
    const Trajectory fused = train(Float8Recipe::tensorwise, policy, true);
    const Trajectory linear = train(Float8Recipe::tensorwise, policy, false);
    EXPECT_TRUE(fused.producer_amax);
    EXPECT_FALSE(linear.producer_amax);
    EXPECT_TRUE(fused.weight_amax);
    EXPECT_FALSE(linear.weight_amax);
    ASSERT_GT(fused.float8_linears, 0);
    for (size_t i = 0; i < fused.losses.size(); ++i) {
      EXPECT_EQ(fused.losses[i], linear.losses[i]) << "loss of step " << i + 1;
      EXPECT_EQ(fused.norms[i], linear.norms[i]) << "gradient norm of step " << i + 1;
    }
    EXPECT_NE(fused.losses.front(), fused.losses.back()) << "training changed nothing";
    EXPECT_EQ(0, std::memcmp(fused.parameters.data(), linear.parameters.data(), fused.parameters.size() * sizeof(float)));
    // Per block and step: w2's forward cast and w1's and w3's dy casts (SwiGLU), the QKV and FFN
    // input casts (the norms; wk, wv and w3 take x from the linear before them either way) and wo's dy
    // cast (the FFN norm's backward); per float8 weight and step, its cast (AdamW). Recomputed
    // linears cast again, so policies that recompute save more.
    ASSERT_EQ(fused.float8_linears, 7 * kLayers) << "the counts below assume every block linear in float8";
    const int64_t saved = linear.amax_calls - fused.amax_calls, per_step = 6 * kLayers + fused.float8_linears;
    if (std::string(policy) == "none") {
      EXPECT_EQ(saved, per_step * kSteps);
    } else {
      EXPECT_GT(saved, per_step * kSteps);
    }
  }
}

TEST(Float8Fusion, OtherRecipesTakeNoProducerAmax) {
  for (Float8Recipe recipe : {Float8Recipe::rowwise, Float8Recipe::blockwise}) {
    SCOPED_TRACE(std::string(float8_recipe_name(recipe)));
    const Trajectory fused = train(recipe, "none", true), linear = train(recipe, "none", false);
    EXPECT_FALSE(fused.producer_amax);
    EXPECT_FALSE(fused.weight_amax);
    EXPECT_EQ(fused.amax_calls, linear.amax_calls);
    EXPECT_EQ(fused.losses, linear.losses);
  }
}

// The CPU SwiGLU's amax outputs are the amax of what it stores, NaN included.
TEST(Float8Fusion, SwigluAmaxIsTheAmaxOfItsStoredOutputs) {
  auto backend = make_cpu_backend();
  const int64_t rows = 6, cols = 10, n = rows * cols;
  std::vector<uint16_t> gate(n), up(n), dy(n), out(n), dgate(n), dup(n);
  Random random(testing_support::fresh(3), 1);
  for (int64_t i = 0; i < n; ++i) {
    gate[size_t(i)] = float_to_bf16(float(2.0 * random.normal()));
    up[size_t(i)] = float_to_bf16(float(random.normal()));
    dy[size_t(i)] = float_to_bf16(float(1e-3 * random.normal()));
  }
  auto bf16 = [&](std::vector<uint16_t>& v) { return TensorView(v.data(), DType::bf16, Shape{rows, cols}); };
  float amax = -1, amax_gate = -1, amax_up = -1;
  auto scalar = [](float& f) { return TensorView(&f, DType::f32, Shape{1}); };
  backend->swiglu_forward({bf16(gate), bf16(up), bf16(out), scalar(amax)});
  backend->swiglu_backward({bf16(gate), bf16(up), bf16(dy), bf16(dgate), bf16(dup), scalar(amax_gate), scalar(amax_up)});
  auto largest = [](const std::vector<uint16_t>& v) {
    float m = 0;
    for (uint16_t x : v) m = std::max(m, std::fabs(bf16_to_float(x)));
    return m;
  };
  EXPECT_GT(amax, 0.0f);
  EXPECT_EQ(amax, largest(out));
  EXPECT_EQ(amax_gate, largest(dgate));
  EXPECT_EQ(amax_up, largest(dup));
  up[7] = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  backend->swiglu_forward({bf16(gate), bf16(up), bf16(out), scalar(amax)});
  EXPECT_TRUE(std::isnan(amax));
}

// The CPU RMSNorm's amax outputs (forward: its output; backward: the input gradient as stored,
// after the add) are the amax of what it stores, NaN included.
TEST(Float8Fusion, RmsNormAmaxIsTheAmaxOfItsStoredOutputs) {
  auto backend = make_cpu_backend();
  const int64_t rows = 5, cols = 24, n = rows * cols;
  std::vector<uint16_t> x(n), weight(cols), out(n), dy(n), dx(n);
  std::vector<float> rstd(rows), grad_weight(cols);
  Random random(testing_support::fresh(4), 1);
  for (int64_t i = 0; i < n; ++i) {
    x[size_t(i)] = float_to_bf16(float(3.0 * random.normal()));
    dy[size_t(i)] = float_to_bf16(float(random.normal()));
    dx[size_t(i)] = float_to_bf16(float(0.5 * random.normal()));  // accumulated into
  }
  for (int64_t c = 0; c < cols; ++c) weight[size_t(c)] = float_to_bf16(float(1.0 + 0.3 * random.normal()));
  auto bf16 = [](std::vector<uint16_t>& v, Shape s) { return TensorView(v.data(), DType::bf16, s); };
  auto f32 = [](std::vector<float>& v) { return TensorView(v.data(), DType::f32, Shape{int64_t(v.size())}); };
  float amax = -1, grad_amax = -1;
  auto scalar = [](float& f) { return TensorView(&f, DType::f32, Shape{1}); };
  const Shape shape{rows, cols};
  backend->rmsnorm_forward({bf16(x, shape), bf16(weight, Shape{cols}), bf16(out, shape), f32(rstd), 1e-5f, scalar(amax)});
  RmsNormBackwardArgs backward{bf16(x, shape), bf16(weight, Shape{cols}), f32(rstd), bf16(dy, shape), bf16(dx, shape),
                               true, f32(grad_weight)};
  backward.amax = scalar(grad_amax);
  backend->rmsnorm_backward(backward);
  auto largest = [](const std::vector<uint16_t>& v) {
    float m = 0;
    for (uint16_t value : v) m = std::max(m, std::fabs(bf16_to_float(value)));
    return m;
  };
  EXPECT_GT(amax, 0.0f);
  EXPECT_EQ(amax, largest(out));
  EXPECT_GT(grad_amax, 0.0f);
  EXPECT_EQ(grad_amax, largest(dx));
  x[9] = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  backend->rmsnorm_forward({bf16(x, shape), bf16(weight, Shape{cols}), bf16(out, shape), f32(rstd), 1e-5f, scalar(amax)});
  EXPECT_TRUE(std::isnan(amax));
}

}  // namespace
}  // namespace smelt
