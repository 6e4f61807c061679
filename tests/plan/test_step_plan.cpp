// StepPlan: policies keep what they promise, recompute exactly what is missing,
// the packed arena is valid, and memory falls as the policy keeps less.
#include <gtest/gtest.h>

#include <set>

#include "model/fp8_linear.h"
#include "plan/plan_report.h"
#include "plan/step_plan.h"
#include "support/fresh_random.h"
#include "support/model_shapes.h"

namespace smelt {
namespace {

ModelConfig eight_billion(int64_t layers) { return testing_support::llama3_8b_layers(layers); }

PlanOptions options(const std::string& policy, int64_t batch = 1, int64_t seq = 8192) {
  PlanOptions o;
  o.shape = {batch, seq};
  o.compute_dtype = DType::bf16;
  o.policy = parse_checkpoint_policy(policy);
  o.loss_chunk_tokens = 1024;
  return o;
}

std::set<std::string> kept_names(const LayerBuffers& lb) {
  std::set<std::string> names;
  for (int a = 0; a < kActivationCount; ++a)
    if (lb.kept[a]) names.insert(std::string(activation_name(static_cast<Activation>(a))));
  return names;
}

std::set<ForwardOp> recomputed(const LayerBuffers& lb) {
  std::set<ForwardOp> ops;
  for (int op = 0; op < kForwardOpCount; ++op)
    if (lb.recomputed[op]) ops.insert(static_cast<ForwardOp>(op));
  return ops;
}

TEST(CheckpointPolicy, ParsesEveryModeAndRejectsGarbage) {
  EXPECT_EQ(parse_checkpoint_policy("none").mode, CheckpointMode::none);
  EXPECT_EQ(parse_checkpoint_policy("full").mode, CheckpointMode::full);
  EXPECT_EQ(parse_checkpoint_policy("selective-op").mode, CheckpointMode::selective_op);
  auto layer = parse_checkpoint_policy("selective-layer:3");
  EXPECT_EQ(layer.mode, CheckpointMode::selective_layer);
  EXPECT_EQ(layer.layer_frequency, 3);
  EXPECT_EQ(layer.str(), "selective-layer:3");
  for (const char* bad : {"selective-layer:0", "selective-layer:", "selective-layer:x", "fulll", ""}) {
    try {
      parse_checkpoint_policy(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::config);
      EXPECT_NE(std::string(e.what()).find("activation_checkpoint.mode"), std::string::npos);
    }
  }
}

TEST(StepPlan, NoneKeepsEverythingAndRecomputesNothing) {
  StepPlan plan = build_step_plan(eight_billion(2), options("none"));
  for (const auto& lb : plan.layers) EXPECT_TRUE(recomputed(lb).empty());
  EXPECT_EQ(plan.recompute_flops(), 0);
  for (const auto& s : plan.steps) EXPECT_NE(s.kind, StepKind::layer_recompute);
}

TEST(StepPlan, FullKeepsOnlyTheBlockInput) {
  StepPlan plan = build_step_plan(eight_billion(2), options("full"));
  for (const auto& lb : plan.layers) {
    EXPECT_EQ(kept_names(lb), std::set<std::string>{"input"});
    // Everything but the block output is rebuilt.
    std::set<ForwardOp> expected;
    for (int op = 0; op < kForwardOpCount; ++op)
      if (static_cast<ForwardOp>(op) != ForwardOp::down_proj) expected.insert(static_cast<ForwardOp>(op));
    EXPECT_EQ(recomputed(lb), expected);
  }
}

TEST(StepPlan, SelectiveOpFollowsTheEverySecondMatmulRule) {
  StepPlan plan = build_step_plan(eight_billion(2), options("selective-op"));
  const std::set<std::string> kept = {"input",         "attention.q",   "attention.v",
                                      "attention.out", "attention.lse", "feed_forward.gate"};
  const std::set<ForwardOp> rebuilt = {ForwardOp::attn_norm, ForwardOp::k_proj,  ForwardOp::o_proj,
                                       ForwardOp::ffn_norm,  ForwardOp::up_proj, ForwardOp::swiglu};
  for (const auto& lb : plan.layers) {
    EXPECT_EQ(kept_names(lb), kept);
    EXPECT_EQ(recomputed(lb), rebuilt);
  }
  // Recompute FLOPs: wk, wo and w3 once per layer.
  const auto& m = plan.model;
  const double tokens = 8192;
  const double expected = 2 * 2 * tokens * (m.dim * m.kv_dim() + m.dim * m.dim + m.dim * m.ffn_dim);
  EXPECT_DOUBLE_EQ(plan.recompute_flops(), expected);
}

TEST(StepPlan, SelectiveLayerCheckpointsEveryNthBlock) {
  StepPlan plan = build_step_plan(eight_billion(6), options("selective-layer:3"));
  for (int64_t i = 0; i < 6; ++i) {
    bool checkpointed = (i + 1) % 3 == 0;
    EXPECT_EQ(recomputed(plan.layers[i]).empty(), !checkpointed) << "layer " << i;
  }
}

TEST(StepPlan, PackedArenaIsValidForEveryPolicy) {
  for (const char* policy : {"none", "full", "selective-op", "selective-layer:2"}) {
    StepPlan plan = build_step_plan(eight_billion(3), options(policy));
    const auto& buffers = plan.buffers;
    for (size_t i = 0; i < buffers.size(); ++i)
      for (size_t j = i + 1; j < buffers.size(); ++j) {
        const auto &a = buffers[i].request, &b = buffers[j].request;
        const size_t oa = plan.memory.offsets[i], ob = plan.memory.offsets[j];
        bool live_together = a.first_step <= b.last_step && b.first_step <= a.last_step;
        bool overlap = oa < ob + b.bytes && ob < oa + a.bytes;
        ASSERT_FALSE(live_together && overlap) << policy << ": " << a.name << " / " << b.name;
      }
    EXPECT_GE(plan.memory.arena_bytes, plan.memory.peak_live_bytes);
    // Packing is tight here: within 2% of the live peak.
    EXPECT_LE(static_cast<double>(plan.memory.arena_bytes), 1.02 * static_cast<double>(plan.memory.peak_live_bytes))
        << policy;
  }
}

TEST(StepPlan, MemoryFallsAsThePolicyKeepsLess) {
  auto arena = [](const char* policy) { return build_step_plan(eight_billion(8), options(policy)).memory.arena_bytes; };
  const size_t none = arena("none"), layer = arena("selective-layer:2"), op = arena("selective-op"), full = arena("full");
  EXPECT_GT(none, layer);
  EXPECT_GT(none, op);
  EXPECT_GT(op, full);
  EXPECT_GT(layer, full);
}

TEST(StepPlan, PersistentStateMatchesTheParameterCount) {
  StepPlan plan = build_step_plan(eight_billion(8), options("selective-op"));
  const double parameters = static_cast<double>(plan.model.total_parameters());
  EXPECT_NEAR(static_cast<double>(plan.model.total_parameters()), 2.80e9, 0.01e9);  // BENCHMARKS.md's proxy
  // fp32 master + fp32 gradients + two fp32 moments = 16 bytes per parameter, and a bf16 copy of every
  // parameter but the embedding (its forward rounds the master rows) and the output projection
  // (cast per step, counted here too: its buffer is a compute weight) = 2 bytes more (+ alignment).
  const double state = static_cast<double>(plan.bytes_of(BufferClass::parameters) + plan.bytes_of(BufferClass::gradients) +
                                           plan.bytes_of(BufferClass::optimizer_state) +
                                           plan.bytes_of(BufferClass::compute_weights));
  const double copied = parameters - static_cast<double>(plan.model.embedding_parameters());
  EXPECT_NEAR(state, 16.0 * parameters + 2.0 * copied, 0.001 * parameters);
}

TEST(StepPlan, EveryPresetPlansWithoutAllocating) {
  for (const auto& flavor : model_flavors()) {
    ModelSection section;
    section.flavor = flavor;
    ModelConfig model = make_model_config(section, 258);
    StepPlan plan = build_step_plan(model, options("selective-op", 1, 2048));
    EXPECT_GT(plan.memory.arena_bytes, static_cast<size_t>(model.total_parameters()) * 16) << flavor;
    EXPECT_FALSE(format_plan(plan, true).empty());
  }
}

// The summary line the trainer and `smelt bench` print names the float8 recipe and how many block
// linears it covers, counted here from the filter; a bf16 plan's line names no recipe.
TEST(StepPlan, SummaryLineNamesTheFloat8RecipeAndItsLinears) {
  const ModelConfig model = eight_billion(3);
  PlanOptions o = options("selective-op", 1, 1024);
  EXPECT_EQ(plan_summary_line(build_step_plan(model, o)).find("float8"), std::string::npos);
  for (Float8Recipe recipe : {Float8Recipe::tensorwise, Float8Recipe::rowwise}) {
    o.float8.recipe = recipe;
    o.float8.filter_fqns = {"output", "w2", "layers.1.attention.wq"};
    int64_t float8 = 0, linears = 0;
    for (int64_t layer = 0; layer < model.n_layers; ++layer)
      for (int w = 0; w < kLayerWeightCount; ++w) {
        const auto weight = static_cast<LayerWeight>(w);
        if (weight == LayerWeight::attn_norm || weight == LayerWeight::ffn_norm) continue;
        ++linears;
        float8 += float8_linear_enabled(o.float8, model, layer, weight);
      }
    ASSERT_EQ(linears, 21);
    ASSERT_EQ(float8, 21 - 3 - 1);
    const StepPlan plan = build_step_plan(model, o);
    EXPECT_EQ(plan.block_linears().total, linears);
    EXPECT_EQ(plan.block_linears().float8, float8);
    EXPECT_FALSE(plan.block_linears().all_float8());
    const std::string line = plan_summary_line(plan);
    const std::string want = "float8 " + std::string(float8_recipe_name(recipe)) + " (" + std::to_string(float8) + " of " +
                             std::to_string(linears) + " block linears in float8; block 0 keeps " + std::string(layer_weight_name(LayerWeight::w2)) + " in bf16)";
    EXPECT_NE(line.find(want), std::string::npos) << line;
    // With only the output projection kept in bf16 (it is no block linear), all 21 are float8.
    o.float8.filter_fqns = {"output"};
    EXPECT_TRUE(build_step_plan(model, o).block_linears().all_float8());
    EXPECT_EQ(build_step_plan(model, o).block_linears().float8, 21);
  }
}

// A forward-only plan (evaluation, generation) runs the forward steps, the head and the loss
// reduction, holds no gradients, optimizer state or recompute buffers (and without float8 no f32
// master), keeps no activation past its last forward reader (so every policy plans the same
// arena), and needs less memory than the training step by at least the gradients and moments it
// drops.
TEST(StepPlan, ForwardOnlyPlanHoldsTheWeightsAndOneLayersActivations) {
  const ModelConfig model = eight_billion(4);
  size_t first_arena = 0;
  for (const char* policy : {"none", "selective-op", "full"}) {
    for (Float8Recipe recipe : {Float8Recipe::none, Float8Recipe::tensorwise, Float8Recipe::rowwise}) {
      SCOPED_TRACE(std::string(policy) + " " + std::string(float8_recipe_name(recipe)));
      PlanOptions o = options(policy);
      o.float8.recipe = recipe;
      const StepPlan training = build_step_plan(model, o);
      o.forward_only = true;
      const StepPlan forward = build_step_plan(model, o);
      for (const Step& step : forward.steps)
        EXPECT_TRUE(step.kind == StepKind::embedding_forward || step.kind == StepKind::layer_forward ||
                    step.kind == StepKind::final_norm_forward || step.kind == StepKind::output_head ||
                    step.kind == StepKind::loss_reduce)
            << step.name();
      EXPECT_EQ(forward.steps.back().kind, StepKind::loss_reduce);
      for (BufferClass kind : {BufferClass::gradients, BufferClass::optimizer_state, BufferClass::activation_gradients,
                               BufferClass::recompute})
        EXPECT_EQ(forward.bytes_of(kind), 0u) << buffer_class_name(kind);
      // Without float8 linears the weights are held in bf16 alone (what the compute copy holds);
      // float8 linears quantise theirs from the f32 master, as in training.
      if (recipe == Float8Recipe::none) {
        EXPECT_EQ(forward.bytes_of(BufferClass::parameters) * 2, training.bytes_of(BufferClass::parameters));
        EXPECT_EQ(forward.bytes_of(BufferClass::compute_weights), 0u);
        EXPECT_EQ(forward.buffers[static_cast<size_t>(forward.parameters)].dtype, DType::bf16);
      } else {
        EXPECT_EQ(forward.bytes_of(BufferClass::parameters), training.bytes_of(BufferClass::parameters));
      }
      // (The embedding's gradient, live only at the end of the step, may take the activations' memory.)
      ASSERT_GE(training.embedding_gradient, 0);
      EXPECT_LE(forward.memory.arena_bytes + training.bytes_of(BufferClass::gradients) -
                    training.buffers[size_t(training.embedding_gradient)].request.bytes +
                    training.bytes_of(BufferClass::optimizer_state),
                training.memory.arena_bytes);
      // No activation outlives the block after the one that wrote it: at every step, at most two
      // blocks' activation bytes (plus the residual stream's and the head's) are live.
      size_t block_activations = 0;
      for (const auto& lb : forward.layers)
        for (int a = 0; a < kActivationCount; ++a)
          if (a != static_cast<int>(Activation::layer_input) && a != static_cast<int>(Activation::layer_output))
            block_activations += forward.buffers[static_cast<size_t>(lb.forward[a])].request.bytes;
      block_activations /= forward.layers.size();
      const size_t residual = forward.buffers[static_cast<size_t>(forward.residual[0])].request.bytes;
      size_t peak_activations = 0;
      for (const auto& live : forward.memory.live_by_class)
        peak_activations = std::max(peak_activations, live[static_cast<size_t>(BufferClass::activations)]);
      EXPECT_LE(peak_activations, 2 * block_activations + 3 * residual);
      if (recipe == Float8Recipe::none) {
        if (first_arena == 0) first_arena = forward.memory.arena_bytes;
        EXPECT_EQ(forward.memory.arena_bytes, first_arena) << "the policy should not matter without a backward";
      }
    }
  }
  PlanOptions sharded = options("full");
  sharded.forward_only = true;
  sharded.shard_degree = 2;
  EXPECT_THROW(build_step_plan(model, sharded), Error);
}

TEST(ModelConfig, PresetsHaveThePublishedShapes) {
  auto make = [](const char* flavor) {
    ModelSection s;
    s.flavor = flavor;
    return make_model_config(s, 258);
  };
  EXPECT_EQ(make("llama3_8b").ffn_dim, 14336);
  EXPECT_NEAR(static_cast<double>(make("llama3_8b").total_parameters()), 8.03e9, 0.01e9);
  EXPECT_EQ(make("llama3_70b").ffn_dim, 28672);
  EXPECT_NEAR(static_cast<double>(make("llama3_70b").total_parameters()), 70.55e9, 0.05e9);
  EXPECT_EQ(make("llama3_405b").ffn_dim, 53248);
  EXPECT_NEAR(static_cast<double>(make("llama3_405b").total_parameters()), 405.8e9, 0.5e9);
  EXPECT_NEAR(static_cast<double>(make("llama3_1b").total_parameters()), 1.50e9, 0.01e9);
  ModelConfig debug = make("debugmodel");
  EXPECT_EQ(debug.vocab_size, 258);
  EXPECT_EQ(debug.ffn_dim, 768);
  // torchtitan's FLOPs per token for the 8-layer proxy: 496 TFLOPS at 29,440 tokens/s (BENCHMARKS.md).
  EXPECT_NEAR(eight_billion(8).training_flops_per_token(8192) * 29440 / 1e12, 496, 1);
}

TEST(ModelConfig, OverridesAndErrors) {
  ModelSection s;
  s.flavor = "debugmodel";
  s.n_layers = 2;
  s.dim = 64;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  ModelConfig c = make_model_config(s, 258);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.head_dim(), 16);
  s.n_kv_heads = 3;
  EXPECT_THROW(make_model_config(s, 258), Error);
  s.n_kv_heads = 2;
  s.flavor = "llama4";
  try {
    make_model_config(s, 258);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("debugmodel"), std::string::npos);
  }
}

// Weights' shapes as a [model] section (smelt eval configures its run with them): every preset,
// and random shapes under a flavor no preset has (a Hugging Face folder's), come back unchanged.
TEST(ModelConfig, SectionOfShapesGivesTheShapesBack) {
  for (const std::string& flavor : model_flavors()) {
    ModelSection s;
    s.flavor = flavor;
    const ModelConfig preset = make_model_config(s, 258);
    JobConfig config;
    config.model = model_section_of(preset);
    validate_config(config);
    EXPECT_EQ(model_config_to_json(make_model_config(model_section_of(preset), 0)), model_config_to_json(preset)) << flavor;
  }
  testing_support::FreshRandom random;
  for (int trial = 0; trial < 50; ++trial) {
    ModelConfig m;
    m.flavor = "hf";
    m.n_kv_heads = 1 + int64_t(random.below(4));
    m.n_heads = m.n_kv_heads * (1 + int64_t(random.below(4)));
    m.dim = m.n_heads * 2 * (1 + int64_t(random.below(32)));
    m.n_layers = 1 + int64_t(random.below(40));
    m.vocab_size = 1 + int64_t(random.below(200000));
    m.ffn_dim = 1 + int64_t(random.below(30000));
    m.multiple_of = 1 + int64_t(random.below(1024));
    m.ffn_dim_multiplier = random.below(2) ? 0 : random.uniform(0.5, 2);
    m.norm_eps = random.uniform(1e-6, 1e-4);
    m.rope_theta = random.uniform(1e3, 1e6);
    m.rope_scaling = random.below(2) == 1;
    JobConfig config;
    config.model = model_section_of(m);
    validate_config(config);  // a section a config file could hold
    const ModelConfig back = make_model_config(config.model, 0);
    EXPECT_EQ(back.flavor, "debugmodel");
    ModelConfig renamed = back;
    renamed.flavor = m.flavor;
    EXPECT_EQ(model_config_to_json(renamed), model_config_to_json(m)) << trial;
  }
}

}  // namespace
}  // namespace smelt
