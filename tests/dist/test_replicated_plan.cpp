// Plain data parallel, HSDP and float8 all-gather plans: their collective steps (an all-reduce of
// every unit's gradients after its backward; after its reduce-scatter for HSDP; the float8 amax
// all-reduce and e4m3 gathers), their buffers and bytes, the e4m3 bytes a gather really carries,
// and the refusal of degrees that do not multiply to the number of ranks.
#include <gtest/gtest.h>

#include <cmath>

#include "core/numerics.h"
#include "dist/sharded_fixture.h"
#include "plan/plan_report.h"
#include "plan/shard_layout.h"

namespace smelt {
namespace {

StepPlan plan_with(const ModelConfig& model, const testing::ShardedCase& c, int64_t world) {
  auto backend = make_cpu_backend();
  return build_step_plan(model, testing::sharded_plan_options(model, c, 2, world, *backend));
}

int count(const StepPlan& plan, StepKind kind) {
  int n = 0;
  for (const Step& s : plan.steps) n += s.kind == kind;
  return n;
}

// Index of the last step that writes gradients of `unit` (the unit's blocks' backward, or the head / embedding).
int last_gradient_step(const StepPlan& plan, int unit, int layers) {
  int last = -1;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    const bool mine = (s.kind == StepKind::layer_backward && unit == 1 + s.layer) ||
                      (s.kind == StepKind::final_norm_backward && unit == layers + 1) ||
                      (s.kind == StepKind::embedding_backward && unit == 0);
    if (mine) last = static_cast<int>(i);
  }
  return last;
}

TEST(DataParallelPlan, EveryUnitIsAllReducedRightAfterItsBackwardAndNothingIsGathered) {
  const ModelConfig model = testing::small_model(3);
  for (const DType reduce : {DType::f32, DType::bf16}) {
    testing::ShardedCase c{.policy = "selective-op", .compute = DType::f32, .reduce = reduce};
    c.replicate = 4;
    const StepPlan plan = plan_with(model, c, 4);
    EXPECT_TRUE(plan.replicated());
    EXPECT_FALSE(plan.sharded());
    EXPECT_EQ(count(plan, StepKind::all_gather), 0);
    EXPECT_EQ(count(plan, StepKind::reduce_scatter), 0);
    EXPECT_EQ(count(plan, StepKind::all_reduce_gradient_norm), 0) << "replicas hold the same gradients: no sum over ranks";
    EXPECT_EQ(count(plan, StepKind::all_reduce_loss), 1);
    EXPECT_EQ(count(plan, StepKind::all_reduce_gradients), model.n_layers + 2);
    // Whole-model buffers on every rank.
    EXPECT_EQ(plan.buffers[static_cast<size_t>(plan.parameters)].shape.numel(), ParameterLayout(model).total());
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      const Step& s = plan.steps[i];
      if (s.kind != StepKind::all_reduce_gradients) continue;
      EXPECT_EQ(static_cast<int>(i), last_gradient_step(plan, s.unit, static_cast<int>(model.n_layers)) + 1)
          << s.name() << ": expected right after the unit's last gradient step";
    }
    // f32: in place, no buffers; bf16: two bf16 copies of the largest unit, counted in the memory plan.
    const size_t communication = plan.bytes_of(BufferClass::communication);
    if (reduce == DType::f32) {
      EXPECT_EQ(communication, 0u);
    } else {
      ASSERT_GE(plan.reduce_send[0], 0);
      EXPECT_EQ(plan.buffers[static_cast<size_t>(plan.reduce_send[0])].dtype, DType::bf16);
      EXPECT_GE(plan.buffers[static_cast<size_t>(plan.reduce_send[0])].shape.numel(),
                ShardLayout(ParameterLayout(model), 1).unit(0).length);
      EXPECT_GT(communication, 0u);
    }
    const CommunicationVolume v = communication_volume(plan);
    EXPECT_EQ(v.all_gather_bytes, 0);
    EXPECT_GE(v.all_reduce_bytes, static_cast<double>(ParameterLayout(model).total()) * double(dtype_size(reduce)));
    const std::string text = format_plan(plan, true);
    EXPECT_NE(text.find("4 ranks = 4 replica(s) x 1 shard(s)"), std::string::npos) << text;
    EXPECT_NE(text.find("all-reduce gradients layers.2 (replicas)"), std::string::npos) << text;
  }
}

TEST(HsdpPlan, EachReduceScatterIsFollowedByTheShardsAllReduceOverReplicas) {
  const ModelConfig model = testing::small_model(2);
  testing::ShardedCase c{.policy = "none", .compute = DType::bf16, .reduce = DType::bf16};
  c.replicate = 2;
  const StepPlan plan = plan_with(model, c, 4);
  EXPECT_TRUE(plan.sharded() && plan.replicated());
  EXPECT_EQ(plan.options.shard_degree, 2);
  EXPECT_EQ(plan.world_size(), 4);
  EXPECT_EQ(count(plan, StepKind::reduce_scatter), model.n_layers + 2);
  EXPECT_EQ(count(plan, StepKind::all_reduce_gradients), model.n_layers + 2);
  EXPECT_EQ(count(plan, StepKind::all_reduce_gradient_norm), 1);
  for (size_t i = 0; i < plan.steps.size(); ++i)
    if (plan.steps[i].kind == StepKind::reduce_scatter) {
      ASSERT_LT(i + 1, plan.steps.size());
      EXPECT_EQ(plan.steps[i + 1].kind, StepKind::all_reduce_gradients) << plan.steps[i].name();
      EXPECT_EQ(plan.steps[i + 1].unit, plan.steps[i].unit);
    }
  // Shards of 1/2 of the model (the shard degree), not 1/4.
  EXPECT_EQ(plan.local_parameter_count(), ShardLayout(ParameterLayout(model), 2).local_total());
  const CommunicationVolume v = communication_volume(plan);
  EXPECT_NEAR(v.all_reduce_bytes * 2, v.reduce_scatter_bytes, 1e-9 * v.reduce_scatter_bytes + 64)
      << "each rank all-reduces its shard (half a unit) of what it reduce-scattered";
  const std::string text = format_plan(plan, false);
  EXPECT_NE(text.find("4 ranks = 2 replica(s) x 2 shard(s) (HSDP"), std::string::npos) << text;
}

TEST(Float8AllGatherPlan, BlocksAreGatheredInE4m3WithOneAmaxAllReduce) {
  const ModelConfig model = testing::small_model(2);
  testing::ShardedCase c{.policy = "selective-op", .compute = DType::bf16, .float8 = Float8Recipe::tensorwise};
  c.float8_all_gather = true;
  const StepPlan plan = plan_with(model, c, 2);
  ASSERT_TRUE(plan.float8_gathered());
  EXPECT_EQ(count(plan, StepKind::all_reduce_float8_amax), 1) << "one small collective for every weight's amax";
  EXPECT_EQ(plan.steps[0].kind, StepKind::float8_shard_amax);
  EXPECT_EQ(plan.steps[2].kind, StepKind::float8_shard_cast);
  for (int slot = 0; slot < 2; ++slot)
    EXPECT_EQ(plan.buffers[static_cast<size_t>(plan.float8_gather[static_cast<size_t>(slot)])].dtype, DType::e4m3);
  EXPECT_EQ(plan.buffers[static_cast<size_t>(plan.float8_shards)].dtype, DType::e4m3);
  const CommunicationVolume v = communication_volume(plan);
  EXPECT_EQ(v.gather_dtype, DType::e4m3);
  c.float8_all_gather = false;
  const StepPlan bf16 = plan_with(model, c, 2);
  EXPECT_FALSE(bf16.float8_gathered());
  const CommunicationVolume w = communication_volume(bf16);
  EXPECT_EQ(w.gather_dtype, DType::bf16) << "without the float8 gather the metrics must not claim e4m3";
  EXPECT_LT(v.all_gather_bytes, w.all_gather_bytes);
  // Other recipes gather in bf16 whatever the option says.
  c.float8 = Float8Recipe::rowwise;
  c.float8_all_gather = true;
  EXPECT_FALSE(plan_with(model, c, 2).float8_gathered());
}

// After a step's gradients, the e4m3 gather buffer holds layers.0's weights (its backward's gather)
// as e4m3 bytes: decoded with the global scale they are the bf16 weights within e4m3's rounding,
// and every rank holds the same bytes.
TEST(Float8AllGather, TheGatherBufferCarriesE4m3BytesOfTheWeights) {
  const ModelConfig model = testing::small_model(2);
  testing::ShardedCase c{.policy = "none", .compute = DType::bf16, .float8 = Float8Recipe::tensorwise};
  c.float8_all_gather = true;
  const std::vector<float> initial = testing::initial_weights(model, 5);
  const testing::GlobalBatches batches = testing::random_batches(model, 2 * c.batch_per_rank * c.seq_len, 1, 7);
  std::vector<std::vector<uint8_t>> bytes(2);
  testing::run_ranks(2, [&](Communicator& communicator) {
    auto backend = make_cpu_backend();
    const StepPlan plan = build_step_plan(model, testing::sharded_plan_options(model, c, c.batch_per_rank, 2, *backend));
    Executor executor(plan, *backend, &communicator);
    executor.reset_optimizer_state();
    executor.load_parameters(initial.data());
    const size_t first = static_cast<size_t>(communicator.rank() * c.batch_per_rank * c.seq_len);
    executor.load_batch(batches.inputs[0].data() + first, batches.targets[0].data() + first);
    executor.run_gradients(testing::test_optimizer(1));
    int buffer = -1;
    for (const Step& s : plan.steps)
      if (s.kind == StepKind::all_gather && s.layer == 0) buffer = s.gathered_weights;  // the last: backward
    ASSERT_GE(buffer, 0);
    const TensorView gathered = executor.view(plan.float8_gather[buffer == plan.gather_current ? 0 : 1]);
    ASSERT_EQ(gathered.dtype, DType::e4m3);
    const TensorView scales = executor.view(plan.float8_gather_scales);
    const ParameterLayout layout(model);
    const ShardUnit& unit = executor.shard_layout()->unit(executor.shard_layout()->block_unit(0));
    const auto& wq = layout.layer(0, LayerWeight::wq);
    const float scale = scales.as<float>()[static_cast<int>(LayerWeight::wq)];
    float amax = 0;
    for (int64_t i = 0; i < wq.numel(); ++i) amax = std::max(amax, std::fabs(bf16_to_float(float_to_bf16(initial[wq.offset + i]))));
    EXPECT_NEAR(scale, 448.0f / amax, 1e-3f * scale) << "the scale comes from the whole weight's amax";
    const uint8_t* values = gathered.as<uint8_t>() + (wq.offset - unit.offset);
    int exact = 0;
    for (int64_t i = 0; i < wq.numel(); ++i) {
      const float weight = bf16_to_float(float_to_bf16(initial[wq.offset + i]));
      const float decoded = e4m3_to_float(values[i]) / scale;
      EXPECT_NEAR(decoded, weight, std::fabs(weight) / 16 + 1e-3f / scale) << "element " << i;
      exact += float_to_e4m3(weight * scale) == values[i];
    }
    EXPECT_EQ(exact, wq.numel()) << "the bytes are the e4m3 encoding of the scaled weight";
    bytes[static_cast<size_t>(communicator.rank())].assign(values, values + wq.numel());
  });
  EXPECT_EQ(bytes[0], bytes[1]);
}

TEST(DataParallelExecutor, DegreesThatDoNotMultiplyToTheWorldAreRefused) {
  const ModelConfig model = testing::small_model();
  testing::ShardedCase c;
  c.replicate = 2;
  auto backend = make_cpu_backend();
  PlanOptions o = testing::sharded_plan_options(model, c, 2, 4, *backend);  // 2 x 2
  const StepPlan plan = build_step_plan(model, o);
  LocalGroup three(3);
  try {
    Executor executor(plan, *backend, &three.communicator(0));
    FAIL() << "a plan for 2 x 2 ranks ran with 3";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("data_parallel_replicate_degree (2) = 4"), std::string::npos) << message;
    EXPECT_NE(message.find("3 ranks were started"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace smelt
