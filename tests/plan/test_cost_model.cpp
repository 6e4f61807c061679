// The cost model: GEMM steps run at the GEMM ceiling, recompute costs time, fp8 GEMMs are
// faster, FSDP communication is counted, and calibrated timings replace the roofline.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "core/random.h"
#include "plan/cost_model.h"
#include "support/fresh_random.h"

namespace smelt {
namespace {

ModelConfig proxy(int64_t layers) {
  ModelSection section;
  section.flavor = "llama3_8b";
  section.n_layers = layers;
  return make_model_config(section, 0);
}

PlanOptions options(const std::string& policy) {
  PlanOptions o;
  o.shape = {1, 8192};
  o.compute_dtype = DType::bf16;
  o.policy = parse_checkpoint_policy(policy);
  return o;
}

TEST(CostModel, LargeGemmRunsAtTheCeiling) {
  const ModelConfig model = proxy(2);
  const CostModel cost(h200_ceilings());
  const PlanOptions o = options("none");
  const double flops = forward_op_flops(ForwardOp::gate_proj, model, o.shape);
  const double seconds = cost.forward_op_seconds(ForwardOp::gate_proj, model, o);
  EXPECT_NEAR(seconds, flops / 700e12 + 5e-6, 1e-9);
  // Element-wise ops are bandwidth-bound: the norm reads (N, D) and writes (N, D) + (N) f32.
  const double norm = cost.forward_op_seconds(ForwardOp::attn_norm, model, o);
  EXPECT_NEAR(norm, (2.0 * 8192 * 4096 * 2 + 8192 * 4) / 3.3e12 + 5e-6, 1e-9);
}

TEST(CostModel, RecomputeCostsTimeAndFloat8Saves) {
  const ModelConfig model = proxy(4);
  const CostModel bf16(h200_ceilings()), fp8(h200_ceilings(), true);
  const PlanTime none = bf16.predict(build_step_plan(model, options("none")));
  const PlanTime op = bf16.predict(build_step_plan(model, options("selective-op")));
  const PlanTime full = bf16.predict(build_step_plan(model, options("full")));
  EXPECT_EQ(none.recompute_seconds, 0);
  EXPECT_LT(none.seconds, op.seconds);
  EXPECT_LT(op.seconds, full.seconds);
  EXPECT_NEAR(full.seconds - none.seconds, full.recompute_seconds, 1e-9);
  EXPECT_LT(fp8.predict(build_step_plan(model, options("none"))).seconds, none.seconds);
  // The proxy's predicted throughput is in the range BENCHMARKS.md's reference reaches (29-37k tokens/s).
  const PlanTime proxy_time = bf16.predict(build_step_plan(proxy(8), options("selective-op")));
  EXPECT_GT(proxy_time.tokens_per_second, 25000);
  EXPECT_LT(proxy_time.tokens_per_second, 50000);
}

TEST(CostModel, ShardingAddsCommunication) {
  const ModelConfig model = proxy(4);
  const CostModel cost(h200_ceilings());
  PlanOptions sharded = options("selective-op");
  sharded.shard_degree = 8;
  const PlanTime single = cost.predict(build_step_plan(model, options("selective-op")));
  const PlanTime eight = cost.predict(build_step_plan(model, sharded));
  EXPECT_EQ(single.communication_seconds, 0);
  EXPECT_GT(eight.communication_seconds, 0);
  EXPECT_GE(eight.exposed_communication_seconds, 0);
  EXPECT_LE(eight.exposed_communication_seconds, eight.communication_seconds);
  // The optimizer touches an eighth of the state.
  EXPECT_LT(eight.compute_seconds, single.compute_seconds);
}

TEST(CostModel, CalibratedTimingsReplaceTheRoofline) {
  const ModelConfig model = proxy(3);
  const PlanOptions o = options("full");
  const StepPlan plan = build_step_plan(model, o);
  OpTimingCache cache;
  Random random(testing_support::fresh(11));
  const double measured = 1e-3 * (1 + static_cast<double>(random.below(1000)) / 1000);
  cache.set("NVIDIA H200", "forward attention.wq", shape_timing_key(model, o, false), measured);
  const CostModel plain(h200_ceilings()), calibrated(h200_ceilings(), false, &cache);
  const PlanTime before = plain.predict(plan), after = calibrated.predict(plan);
  // wq runs once forward and once in recompute per block.
  EXPECT_EQ(after.calibrated_steps, 6);
  const double roofline = plain.forward_op_seconds(ForwardOp::q_proj, model, o);
  EXPECT_NEAR(after.seconds - before.seconds, 6 * (measured - roofline), 1e-9);
  // Another GPU's or shape's timings are not used.
  OpTimingCache other;
  other.set("NVIDIA H100 80GB HBM3", "forward attention.wq", shape_timing_key(model, o, false), measured);
  other.set("NVIDIA H200", "forward attention.wq", shape_timing_key(model, o, true), measured);
  EXPECT_EQ(CostModel(h200_ceilings(), false, &other).predict(plan).calibrated_steps, 0);
}

TEST(OpTimingCache, SavesLoadsAndRejectsBadFiles) {
  const std::string path = ::testing::TempDir() + "/smelt_op_timings.json";
  OpTimingCache cache;
  cache.set("NVIDIA H200", "backward attention.sdpa", "batch=1 seq=8192", 2.67e-3);
  cache.set("NVIDIA H200", "forward feed_forward.w1", "batch=1 seq=8192", 0.7e-3);
  cache.save(path);
  OpTimingCache loaded = OpTimingCache::load(path);
  EXPECT_EQ(loaded.size(), 2u);
  EXPECT_DOUBLE_EQ(*loaded.find("NVIDIA H200", "backward attention.sdpa", "batch=1 seq=8192"), 2.67e-3);
  EXPECT_FALSE(loaded.find("NVIDIA H200", "backward attention.sdpa", "batch=2 seq=8192").has_value());
  for (const char* bad : {"{\"format\": \"smelt-op-timings\", \"version\": 1, \"entries\": [{\"gpu\": \"x\"}]}",
                          "{\"format\": \"other\", \"version\": 1, \"entries\": []}", "not json",
                          "{\"format\": \"smelt-op-timings\", \"version\": 1, \"entries\": [{\"gpu\": \"g\", \"op\": \"o\", "
                          "\"shape\": \"s\", \"seconds\": -1}]}"}) {
    std::ofstream(path) << bad;
    try {
      OpTimingCache::load(path);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::input);
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    }
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace smelt
