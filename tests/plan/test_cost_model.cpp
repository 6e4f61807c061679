// The cost model: GEMM steps run at the GEMM ceiling, attention at its head dim's rate, recompute
// costs time, fp8 GEMMs are faster and their casts counted where they happen, FSDP communication
// is counted, and calibrated timings replace the roofline.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/random.h"
#include "plan/cost_model.h"
#include "plan/plan_report.h"
#include "plan/shard_layout.h"
#include "support/fresh_random.h"
#include "support/model_shapes.h"

namespace smelt {
namespace {

ModelConfig proxy(int64_t layers) { return testing_support::llama3_8b_layers(layers); }

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

// Attention runs at the measured rates at head dims 128 and 64, forward and backward, and in
// between in 1 / head_dim: narrower heads are slower per FLOP. The planner's attention steps use it.
TEST(CostModel, AttentionIsSlowerPerFlopWithNarrowerHeads) {
  testing_support::FreshRandom random;
  DeviceCeilings c = h200_ceilings();
  c.attention_forward_flops = random.uniform(400e12, 700e12);
  c.attention_forward_flops_d64 = c.attention_forward_flops * random.uniform(0.5, 0.9);
  c.attention_backward_flops = random.uniform(300e12, 600e12);
  c.attention_backward_flops_d64 = c.attention_backward_flops * random.uniform(0.5, 0.9);
  for (const bool backward : {false, true}) {
    const double at_128 = backward ? c.attention_backward_flops : c.attention_forward_flops;
    const double at_64 = backward ? c.attention_backward_flops_d64 : c.attention_forward_flops_d64;
    EXPECT_NEAR(attention_flops(c, 128, backward), at_128, at_128 * 1e-12);
    EXPECT_NEAR(attention_flops(c, 64, backward), at_64, at_64 * 1e-12);
    // 96 sits halfway in 1 / head_dim between 128 (0) and 64 (1): a third of the way.
    EXPECT_NEAR(1 / attention_flops(c, 96, backward), 1 / at_128 + (1 / at_64 - 1 / at_128) / 3, 1e-27);
    EXPECT_LT(attention_flops(c, 32, backward), at_64);
    EXPECT_GT(attention_flops(c, 256, backward), at_128);
    EXPECT_LE(attention_flops(c, 1 << 20, backward), 2 * at_128 * (1 + 1e-12));  // wide heads: at most twice
  }
  // Same FLOPs, half the head width (twice the heads): the attention steps take longer.
  ModelSection wide_section, narrow_section;
  wide_section.flavor = narrow_section.flavor = "llama3_8b";
  wide_section.n_layers = narrow_section.n_layers = 1;
  narrow_section.n_heads = 64;
  narrow_section.n_kv_heads = 16;
  const ModelConfig wide = make_model_config(wide_section, 0), narrow = make_model_config(narrow_section, 0);
  ASSERT_EQ(narrow.head_dim(), 64);
  const PlanOptions o = options("none");
  const CostModel cost(c);
  const double wide_forward = cost.forward_op_seconds(ForwardOp::attention, wide, o);
  const double narrow_forward = cost.forward_op_seconds(ForwardOp::attention, narrow, o);
  const double flops = forward_op_flops(ForwardOp::attention, wide, o.shape);
  ASSERT_EQ(flops, forward_op_flops(ForwardOp::attention, narrow, o.shape));
  EXPECT_NEAR(wide_forward - narrow_forward, flops / c.attention_forward_flops - flops / c.attention_forward_flops_d64,
              1e-9);
}

// The embedding's backward zeroes its f32 table gradient before adding the tokens' rows: a pass
// over vocabulary x dim that the planner counts.
TEST(CostModel, EmbeddingBackwardZeroesTheTableGradient) {
  testing_support::FreshRandom random;
  ModelSection section;
  section.flavor = "llama3_8b";
  section.n_layers = 1;
  const ModelConfig small = make_model_config(section, 0);
  section.vocab_size = small.vocab_size + 1024 * int64_t(1 + random.below(64));
  const ModelConfig large = make_model_config(section, 0);
  const PlanOptions o = options("none");
  const CostModel cost(h200_ceilings());
  auto embedding_backward = [&](const ModelConfig& m) {
    const StepPlan plan = build_step_plan(m, o);
    for (const Step& step : plan.steps)
      if (step.kind == StepKind::embedding_backward) return cost.step_seconds(step, m, o);
    ADD_FAILURE() << "no embedding backward step";
    return 0.0;
  };
  const double extra_rows = static_cast<double>(large.vocab_size - small.vocab_size);
  EXPECT_NEAR(embedding_backward(large) - embedding_backward(small),
              extra_rows * static_cast<double>(small.dim) * 4 / h200_ceilings().elementwise_bytes_per_second, 1e-12);
}

// Gradient accumulation: the per-pass steps count once per microbatch, the gradient norm, AdamW and
// the weight cast once per step; tokens per step grow with the microbatches; the gradients stay f32.
TEST(CostModel, AccumulatedMicrobatchesRepeatThePassAndShareTheUpdate) {
  testing_support::FreshRandom random;
  const ModelConfig model = proxy(2);
  const CostModel cost(h200_ceilings(), true);
  PlanOptions o = options("selective-op");
  o.float8.recipe = Float8Recipe::tensorwise;
  o.linear_grad_dtype = DType::bf16;
  o.loss_chunk_tokens = 2048;
  const int64_t microbatches = 2 + static_cast<int64_t>(random.below(6));
  PlanOptions accumulated = o;
  accumulated.microbatches = microbatches;
  const StepPlan plan = build_step_plan(model, accumulated);
  EXPECT_FALSE(low_precision_linear_grads(accumulated));
  EXPECT_TRUE(low_precision_linear_grads(o));
  const PlanTime time = cost.predict(plan);
  double per_pass = 0, once = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    EXPECT_NEAR(time.step_seconds[i], cost.step_seconds(plan.steps[i], model, accumulated), 1e-15);
    (runs_once_per_step(plan.steps[i].kind) ? once : per_pass) += time.step_seconds[i];
  }
  EXPECT_GT(once, 0.0);
  EXPECT_NEAR(time.seconds, static_cast<double>(microbatches) * per_pass + once, 1e-9);
  EXPECT_NEAR(time.tokens_per_second, static_cast<double>(microbatches * 8192) / time.seconds, 1e-6);
  // The update is shared: more tokens per second than one pass per step (same f32 gradients).
  PlanOptions single = accumulated;
  single.microbatches = 1;
  single.linear_grad_dtype = DType::f32;
  EXPECT_GT(time.tokens_per_second, cost.predict(build_step_plan(model, single)).tokens_per_second);
  // Only the first pass zeroes the embedding's table gradient; the later ones add to it.
  for (const Step& step : plan.steps)
    if (step.kind == StepKind::embedding_backward) {
      const double table = static_cast<double>(model.vocab_size) * static_cast<double>(model.dim) * 4;
      EXPECT_NEAR(cost.step_seconds(step, model, single) - cost.step_seconds(step, model, accumulated),
                  table * (1 - 1.0 / static_cast<double>(microbatches)) / h200_ceilings().elementwise_bytes_per_second,
                  1e-12);
    }
  // Data parallel: FSDP gathers and reduce-scatters in every pass; replicas all-reduce once a step.
  PlanOptions fsdp = single, fsdp_accumulated = accumulated;
  fsdp.shard_degree = fsdp_accumulated.shard_degree = 4;
  EXPECT_NEAR(cost.predict(build_step_plan(model, fsdp_accumulated)).communication_seconds,
              static_cast<double>(microbatches) * cost.predict(build_step_plan(model, fsdp)).communication_seconds, 1e-9);
  const CommunicationVolume one = communication_volume(build_step_plan(model, fsdp));
  const CommunicationVolume all = communication_volume(build_step_plan(model, fsdp_accumulated));
  EXPECT_GT(one.reduce_scatter_bytes, 0.0);
  EXPECT_NEAR(all.all_gather_bytes, static_cast<double>(microbatches) * one.all_gather_bytes, 1.0);
  EXPECT_NEAR(all.reduce_scatter_bytes, static_cast<double>(microbatches) * one.reduce_scatter_bytes, 1.0);
  PlanOptions replicas = single, replicas_accumulated = accumulated;
  replicas.replicate_degree = replicas_accumulated.replicate_degree = 4;
  const double all_reduce = cost.predict(build_step_plan(model, replicas)).communication_seconds;
  EXPECT_GT(all_reduce, 0.0);
  EXPECT_NEAR(cost.predict(build_step_plan(model, replicas_accumulated)).communication_seconds, all_reduce, 1e-9);
  EXPECT_NE(plan_summary_line(plan).find(std::to_string(microbatches * 8192) + " tokens/step (" +
                                         std::to_string(microbatches) + " accumulated microbatches of batch 1 x seq 8192)"),
            std::string::npos)
      << plan_summary_line(plan);
}

// Unsharded float8 linears use weights quantised once per step, and k, v and up take the input q
// and gate quantised just before them; a recompute runs alone and quantises its own input.
TEST(CostModel, Float8LinearsCountTheCastsTheyMake) {
  const ModelConfig model = proxy(2);
  PlanOptions o = options("selective-op");
  o.float8.recipe = Float8Recipe::tensorwise;
  const CostModel cost(h200_ceilings(), true);
  const StepPlan plan = build_step_plan(model, o);
  const Step* forward_k = nullptr;
  const Step* recompute_k = nullptr;
  for (const Step& step : plan.steps) {
    if (step.op != static_cast<uint8_t>(ForwardOp::k_proj) || step.layer != 0) continue;
    if (step.kind == StepKind::layer_forward) forward_k = &step;
    if (step.kind == StepKind::layer_recompute) recompute_k = &step;
  }
  ASSERT_NE(forward_k, nullptr);
  ASSERT_NE(recompute_k, nullptr) << "selective-op recomputes wk";
  const double input = 8192.0 * 4096;  // attention_norm's output, quantised: read twice, one byte written
  const double cast = input * 5 / h200_ceilings().elementwise_bytes_per_second + 2 * 5e-6;
  EXPECT_NEAR(cost.step_seconds(*recompute_k, model, o) - cost.step_seconds(*forward_k, model, o), cast, 1e-12);
  // Sharded: each use quantises the gathered weight as well.
  PlanOptions sharded = o;
  sharded.shard_degree = 2;
  const StepPlan sharded_plan = build_step_plan(model, sharded);
  int compared = 0;
  for (const Step& step : sharded_plan.steps) {
    if (step.kind != StepKind::layer_forward || step.op != static_cast<uint8_t>(ForwardOp::k_proj) || step.layer != 0)
      continue;
    const double weight = 1024.0 * 4096;
    EXPECT_NEAR(cost.step_seconds(step, model, sharded) - cost.step_seconds(*forward_k, model, o),
                weight * 5 / h200_ceilings().elementwise_bytes_per_second + 2 * 5e-6, 1e-12);
    ++compared;
  }
  EXPECT_EQ(compared, 1);
}

// `smelt plan --steps` lists each step's predicted time: the same the prediction sums.
TEST(CostModel, EachListedStepCarriesItsPredictedTime) {
  testing_support::FreshRandom random;
  const ModelConfig model = proxy(1 + int64_t(random.below(3)));
  PlanOptions o = options(random.below(2) == 0 ? "selective-op" : "none");
  if (random.below(2) == 0) o.float8.recipe = Float8Recipe::tensorwise;
  const CostModel cost(h200_ceilings(), o.float8.recipe != Float8Recipe::none);
  const StepPlan plan = build_step_plan(model, o);
  const PlanTime time = cost.predict(plan);
  const nlohmann::json j = plan_to_json(plan, true, &time);
  ASSERT_EQ(j["steps"].size(), plan.steps.size());
  double sum = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const double ms = j["steps"][i]["predicted_ms"].get<double>();
    EXPECT_NEAR(ms, cost.step_seconds(plan.steps[i], model, o) * 1e3, 1e-9) << plan.steps[i].name();
    sum += ms;
  }
  EXPECT_NEAR(sum, time.compute_seconds * 1e3, 1e-6);
  EXPECT_FALSE(plan_to_json(plan, true)["steps"][0].contains("predicted_ms"));
  // The text lists the same steps with a time each.
  const std::string text = format_plan(plan, true, &time);
  size_t timed = 0;
  for (size_t at = text.find(" ms  live "); at != std::string::npos; at = text.find(" ms  live ", at + 1)) ++timed;
  EXPECT_EQ(timed, plan.steps.size());
  EXPECT_EQ(format_plan(plan, true).find(" ms  live "), std::string::npos);
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
  const PlanTime unmatched = CostModel(h200_ceilings(), false, &other).predict(plan);
  EXPECT_EQ(unmatched.calibrated_steps, 0);
  // The report says so, rather than pass the ceilings' figure off as calibrated.
  EXPECT_TRUE(unmatched.timing_cache);
  EXPECT_FALSE(before.timing_cache);
  EXPECT_NE(format_prediction(plan, unmatched, 989e12).find("no entry for this GPU and shape key"), std::string::npos);
  EXPECT_EQ(format_prediction(plan, before, 989e12).find("no entry"), std::string::npos);
  EXPECT_NE(format_prediction(plan, after, 989e12).find("6 steps from calibrated timings"), std::string::npos);
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
