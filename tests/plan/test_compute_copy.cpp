// The compute-dtype weight copy of unsharded plans: it holds exactly the weights a compute-dtype
// GEMM or op reads (norms, output, linears not in float8), its runs tile the flat parameters, and
// the cost model counts the optimizer's and the float8 cast's traffic from it.
#include <gtest/gtest.h>

#include <algorithm>

#include "plan/cost_model.h"
#include "plan/output_copy.h"
#include "plan/step_plan.h"
#include "support/model_shapes.h"

namespace smelt {
namespace {

ModelConfig small_model(int64_t layers) {
  ModelConfig model = testing_support::llama3_8b_layers(layers);
  model.vocab_size = 1000;
  model.dim = 200;  // norms (200) and wk / wv (100 x 200) are padded to 64-element steps
  model.n_heads = 4;
  model.n_kv_heads = 2;
  model.ffn_dim = 704;
  return model;
}

PlanOptions bf16_options(Float8Recipe recipe = Float8Recipe::none, std::vector<std::string> filter = {"output"}) {
  PlanOptions o;
  o.shape = {1, 128};
  o.compute_dtype = DType::bf16;
  o.policy = parse_checkpoint_policy("selective-op");
  o.loss_chunk_tokens = 64;
  o.float8.recipe = recipe;
  o.float8.filter_fqns = std::move(filter);
  return o;
}

int64_t padded(int64_t elements) { return (elements + 63) / 64 * 64; }

// Which parameters must have a copy under `o`: everything but the embedding and the output
// projection (cast per step, unless its copy is persistent), less the float8 linears.
bool expected_copy(const ModelConfig& model, const PlanOptions& o, size_t index) {
  if (index == 0) return false;
  const int64_t block = static_cast<int64_t>(index) - 1;
  if (block == model.n_layers * kLayerWeightCount) return true;  // final norm
  if (block > model.n_layers * kLayerWeightCount) return o.persistent_output_copy;  // output
  const auto weight = static_cast<LayerWeight>(block % kLayerWeightCount);
  if (weight == LayerWeight::attn_norm || weight == LayerWeight::ffn_norm) return true;
  return o.float8.recipe == Float8Recipe::none ||
         !float8_linear_enabled(o.float8, model, block / kLayerWeightCount, weight);
}

// The plan's copy holds exactly the expected parameters, packed without overlap, and its runs tile
// the flat range.
void expect_copy_holds_exactly(const PlanOptions& o, const std::string& what) {
  SCOPED_TRACE(what);
  const ModelConfig model = small_model(3);
  const StepPlan plan = build_step_plan(model, o);
  const ParameterLayout layout(model);
  ASSERT_GE(plan.compute_weights, 0);
  ASSERT_FALSE(plan.compute_copy_ranges.empty());
  int64_t expected_elements = 0, kept = 0, skipped = 0;
  std::vector<std::pair<int64_t, int64_t>> slices;  // (copy offset, padded length) of every kept parameter
  for (size_t i = 0; i < layout.parameters().size(); ++i) {
    const ParameterInfo& p = layout.parameters()[i];
    const int64_t offset = plan.compute_copy_offset(p);
    if (expected_copy(model, o, i)) {
      ASSERT_GE(offset, 0) << p.name << " must have a compute copy";
      ASSERT_EQ(offset % 64, 0) << p.name;
      expected_elements += padded(p.numel());
      slices.emplace_back(offset, padded(p.numel()));
      ++kept;
    } else {
      EXPECT_EQ(offset, -1) << p.name << " must be read from the master weights";
      ++skipped;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(skipped, 0);
  EXPECT_EQ(plan.buffers[size_t(plan.compute_weights)].shape.numel(), expected_elements);
  EXPECT_EQ(compute_copy_elements(plan.compute_copy_ranges), expected_elements);
  EXPECT_EQ(plan.buffers[size_t(plan.compute_weights)].request.bytes, size_t(expected_elements * 2));
  std::sort(slices.begin(), slices.end());
  for (size_t i = 0; i + 1 < slices.size(); ++i)
    EXPECT_EQ(slices[i].first + slices[i].second, slices[i + 1].first) << "kept parameters packed in order";
  EXPECT_EQ(slices.back().first + slices.back().second, expected_elements);
  // The runs: consecutive over [0, total), alternating copied and not (maximal), except that with
  // AdamW taking the float8 weights' amax each float8 weight is a run of its own, slot layer * 7 + weight.
  const bool slots = optimizer_takes_float8_weight_amax(o);
  EXPECT_EQ(slots, plan.float8_weight_amax >= 0);
  int64_t next = 0, slotted = 0;
  for (size_t r = 0; r < plan.compute_copy_ranges.size(); ++r) {
    const auto& run = plan.compute_copy_ranges[r];
    EXPECT_EQ(run.begin, next);
    EXPECT_GT(run.count, 0);
    if (r > 0 && run.amax_slot < 0 && plan.compute_copy_ranges[r - 1].amax_slot < 0) {
      EXPECT_NE(run.copied(), plan.compute_copy_ranges[r - 1].copied()) << "run " << r << " not maximal";
    }
    if (run.amax_slot >= 0) {
      ++slotted;
      EXPECT_TRUE(slots) << "run " << r << " has an amax slot in a plan without them";
      EXPECT_FALSE(run.copied());
      const ParameterInfo& p = layout.parameters()[size_t(run.amax_slot) + 1];  // after the embedding
      EXPECT_EQ(run.begin, p.offset) << p.name;
      EXPECT_EQ(run.count, padded(p.numel())) << p.name;
      EXPECT_FALSE(expected_copy(model, o, size_t(run.amax_slot) + 1)) << p.name << " is not a float8 linear";
    }
    next = run.begin + run.count;
  }
  EXPECT_EQ(next, layout.total());
  if (slots) {
    const int64_t others = o.persistent_output_copy ? 1 : 2;  // the embedding, and the output unless copied
    EXPECT_EQ(slotted, skipped - others) << "every float8 linear (all skipped but the embedding and the output) has a slot";
  }
}

TEST(ComputeCopy, Bf16PlanCopiesEverythingButTheEmbeddingAndTheOutput) {
  expect_copy_holds_exactly(bf16_options(), "bf16");
  const ModelConfig model = small_model(3);
  const StepPlan plan = build_step_plan(model, bf16_options());
  const ParameterLayout layout(model);
  EXPECT_EQ(compute_copy_elements(plan.compute_copy_ranges), layout.output().offset - layout.parameters()[1].offset);
  ASSERT_EQ(plan.compute_copy_ranges.size(), 3u) << "the embedding, the blocks and the final norm, the output";
}

// The output projection's bf16 copy lives only during the output head, which casts it.
TEST(ComputeCopy, OutputWeightIsCastPerStepForTheOutputHeadAlone) {
  const ModelConfig model = small_model(2);
  for (Float8Recipe recipe : {Float8Recipe::none, Float8Recipe::tensorwise}) {
    const StepPlan plan = build_step_plan(model, bf16_options(recipe));
    ASSERT_GE(plan.output_weight, 0);
    const auto& buffer = plan.buffers[size_t(plan.output_weight)];
    EXPECT_EQ(buffer.dtype, DType::bf16);
    EXPECT_EQ(buffer.shape.numel(), model.vocab_size * model.dim);
    EXPECT_EQ(buffer.request.kind, BufferClass::compute_weights);
    EXPECT_EQ(buffer.request.first_step, buffer.request.last_step);
    EXPECT_EQ(plan.steps[size_t(buffer.request.first_step)].kind, StepKind::output_head);
  }
  PlanOptions sharded = bf16_options();
  sharded.shard_single_rank = true;
  EXPECT_LT(build_step_plan(model, sharded).output_weight, 0) << "sharded plans read the gathered output weight";
  PlanOptions f32 = bf16_options();
  f32.compute_dtype = DType::f32;
  EXPECT_LT(build_step_plan(model, f32).output_weight, 0);
}

TEST(ComputeCopy, Float8PlansCopyNormsOutputAndFilteredLinears) {
  for (Float8Recipe recipe : {Float8Recipe::tensorwise, Float8Recipe::rowwise, Float8Recipe::rowwise_with_gw_hp})
    expect_copy_holds_exactly(bf16_options(recipe), std::string(float8_recipe_name(recipe)));
  // Linears filtered out of float8 keep their bf16 copy.
  expect_copy_holds_exactly(bf16_options(Float8Recipe::tensorwise, {"output", "w2", "layers.1.attention"}),
                            "tensorwise with w2 and layer 1's attention in bf16");
}

TEST(ComputeCopy, PlansWithoutACopyOrShardedOnesAreUnchanged) {
  PlanOptions f32 = bf16_options();
  f32.compute_dtype = DType::f32;
  const StepPlan plain = build_step_plan(small_model(2), f32);
  EXPECT_LT(plain.compute_weights, 0);
  EXPECT_TRUE(plain.compute_copy_ranges.empty());
  EXPECT_EQ(plain.compute_copy_offset(ParameterLayout(small_model(2)).output()), -1);

  PlanOptions sharded = bf16_options(Float8Recipe::tensorwise);
  sharded.shard_single_rank = true;
  const StepPlan plan = build_step_plan(small_model(2), sharded);
  ASSERT_GE(plan.compute_weights, 0);
  EXPECT_TRUE(plan.compute_copy_ranges.empty()) << "sharded plans keep a copy of every element of the shard";
  EXPECT_EQ(plan.buffers[size_t(plan.compute_weights)].shape.numel(), plan.local_parameter_count());
}

// bf16 linear gradients: every block linear's gradient in linear_gradients (bf16), the embedding's
// in its own buffer, everything else's in gradients, each packed in parameter order without overlap; the step's gradient memory
// smaller by two bytes per linear element; the gradient norm and AdamW read both buffers; and the
// cost model counts two bytes less per linear element for each. f32 and sharded plans ignore it.
TEST(ComputeCopy, Bf16LinearGradientsArePackedApartFromTheOthers) {
  const ModelConfig model = small_model(3);
  const ParameterLayout layout(model);
  for (Float8Recipe recipe : {Float8Recipe::none, Float8Recipe::tensorwise}) {
    SCOPED_TRACE(std::string(float8_recipe_name(recipe)));
    const PlanOptions f32_grads = bf16_options(recipe);
    PlanOptions low = f32_grads;
    low.linear_grad_dtype = DType::bf16;
    ASSERT_TRUE(low_precision_linear_grads(low));
    const StepPlan plan = build_step_plan(model, low), wide = build_step_plan(model, f32_grads);
    ASSERT_GE(plan.linear_gradients, 0);
    EXPECT_LT(wide.linear_gradients, 0);
    EXPECT_EQ(plan.buffers[size_t(plan.linear_gradients)].dtype, DType::bf16);
    EXPECT_EQ(plan.buffers[size_t(plan.linear_gradients)].request.kind, BufferClass::gradients);
    int64_t linear_elements = 0, other_elements = 0;
    std::vector<std::pair<int64_t, int64_t>> places[2];  // (offset, padded length) per buffer
    for (size_t i = 0; i < layout.parameters().size(); ++i) {
      const ParameterInfo& p = layout.parameters()[i];
      const int64_t block = int64_t(i) - 1;
      const bool linear = i > 0 && block < model.n_layers * kLayerWeightCount &&
                          static_cast<LayerWeight>(block % kLayerWeightCount) != LayerWeight::attn_norm &&
                          static_cast<LayerWeight>(block % kLayerWeightCount) != LayerWeight::ffn_norm;
      const StepPlan::GradientPlace place = plan.gradient_place(p), flat = wide.gradient_place(p);
      if (i == 0) {  // the embedding: a buffer of its own in both
        for (const StepPlan* each : {&plan, &wide}) {
          const StepPlan::GradientPlace own = each->gradient_place(p);
          ASSERT_GE(each->embedding_gradient, 0);
          EXPECT_EQ(own.buffer, each->embedding_gradient);
          EXPECT_EQ(own.offset, 0);
          EXPECT_EQ(each->buffers[size_t(each->embedding_gradient)].shape.numel(), layout.parameters()[1].offset);
        }
        continue;
      }
      EXPECT_EQ(place.buffer, linear ? plan.linear_gradients : plan.gradients) << p.name;
      EXPECT_EQ(place.offset % 64, 0) << p.name;
      places[linear].emplace_back(place.offset, padded(p.numel()));
      (linear ? linear_elements : other_elements) += padded(p.numel());
      EXPECT_EQ(flat.buffer, wide.gradients) << p.name;
      EXPECT_EQ(flat.offset, p.offset - layout.parameters()[1].offset)
          << p.name << ": without bf16 gradients they are laid out like the parameters after the embedding";
    }
    EXPECT_EQ(linear_elements + other_elements + layout.parameters()[1].offset, layout.total());
    EXPECT_EQ(plan.buffers[size_t(plan.linear_gradients)].shape.numel(), linear_elements);
    EXPECT_EQ(plan.buffers[size_t(plan.gradients)].shape.numel(), other_elements);
    for (auto& list : places) {
      std::sort(list.begin(), list.end());
      for (size_t i = 0; i + 1 < list.size(); ++i) EXPECT_EQ(list[i].first + list[i].second, list[i + 1].first);
    }
    EXPECT_EQ(places[1].back().first + places[1].back().second, linear_elements);
    EXPECT_EQ(places[0].back().first + places[0].back().second, other_elements);
    EXPECT_EQ(plan.bytes_of(BufferClass::gradients) + size_t(2 * linear_elements), wide.bytes_of(BufferClass::gradients));
    EXPECT_LT(plan.memory.arena_bytes, wide.memory.arena_bytes);
    EXPECT_EQ(gradient_elements(plan.compute_copy_ranges, true), linear_elements);
    for (const auto& run : plan.compute_copy_ranges) {
      EXPECT_GE(run.grad_offset, 0);
      if (run.amax_slot >= 0) {
        EXPECT_TRUE(run.low_grad) << "a float8 linear's run";
      }
    }
    // Both gradient buffers are read by the gradient norm and by AdamW: live to the optimizer.
    size_t optimizer = 0;
    while (plan.steps[optimizer].kind != StepKind::optimizer) ++optimizer;
    EXPECT_GE(plan.buffers[size_t(plan.linear_gradients)].request.last_step, int(optimizer));
    // The cost model: two bytes less per linear element for the gradient norm and for AdamW.
    DeviceCeilings ceilings = h200_ceilings();
    const CostModel cost(ceilings, recipe != Float8Recipe::none);
    const double saved = 2.0 * double(linear_elements) / ceilings.streaming_bytes_per_second;
    EXPECT_NEAR(cost.step_seconds(Step{StepKind::optimizer}, model, f32_grads) -
                    cost.step_seconds(Step{StepKind::optimizer}, model, low), saved, 1e-12);
    EXPECT_NEAR(cost.step_seconds(Step{StepKind::gradient_norm}, model, f32_grads) -
                    cost.step_seconds(Step{StepKind::gradient_norm}, model, low),
                saved - 2 * ceilings.kernel_launch_seconds, 1e-12);
  }
  // One loss chunk: the output projection's gradient is written once, so it is bf16 too.
  PlanOptions one_chunk = bf16_options();
  one_chunk.linear_grad_dtype = DType::bf16;
  one_chunk.loss_chunk_tokens = one_chunk.shape.tokens();
  const StepPlan whole = build_step_plan(model, one_chunk), chunked = build_step_plan(model, [&] {
    PlanOptions o = one_chunk;
    o.loss_chunk_tokens = o.shape.tokens() / 2;
    return o;
  }());
  EXPECT_EQ(whole.gradient_place(layout.output()).buffer, whole.linear_gradients);
  EXPECT_EQ(chunked.gradient_place(layout.output()).buffer, chunked.gradients) << "accumulated over two chunks: f32";
  const auto elements = [](const StepPlan& p, int buffer) { return p.buffers[size_t(buffer)].shape.numel(); };
  EXPECT_EQ(elements(whole, whole.linear_gradients), elements(chunked, chunked.linear_gradients) + padded(layout.output().numel()));
  EXPECT_EQ(elements(whole, whole.gradients) + padded(layout.output().numel()), elements(chunked, chunked.gradients));
  EXPECT_LT(whole.bytes_of(BufferClass::gradients), chunked.bytes_of(BufferClass::gradients));
  EXPECT_EQ(whole.gradient_place(layout.final_norm()).buffer, whole.gradients);
  PlanOptions f32 = bf16_options();
  f32.compute_dtype = DType::f32;
  f32.linear_grad_dtype = DType::bf16;
  EXPECT_LT(build_step_plan(model, f32).linear_gradients, 0) << "f32 compute: every gradient f32";
  PlanOptions sharded = bf16_options();
  sharded.shard_single_rank = true;
  sharded.linear_grad_dtype = DType::bf16;
  EXPECT_LT(build_step_plan(model, sharded).linear_gradients, 0) << "sharded: reduce_dtype decides";
  PlanOptions replicated = bf16_options();
  replicated.replicate_degree = 2;
  replicated.linear_grad_dtype = DType::bf16;
  EXPECT_LT(build_step_plan(model, replicated).linear_gradients, 0) << "replicas all-reduce the flat layout";
}

// Optimizer: 28 bytes per parameter (read p g m v, write p m v) and 2 per copied element; the
// float8 cast: 10 bytes per float8 weight element (fp32 read twice, W and W^T written), 9 when
// tensorwise leaves W^T to each backward use.
TEST(ComputeCopy, CostModelCountsTheCopyAndTheMasterCast) {
  const ModelConfig model = small_model(3);
  DeviceCeilings ceilings = h200_ceilings();
  const CostModel cost(ceilings, true);
  const ParameterLayout layout(model);
  const double parameters = double(layout.total());
  auto seconds = [&](StepKind kind, const PlanOptions& o) { return cost.step_seconds(Step{kind}, model, o); };
  auto expected = [&](double bytes, double launches) {  // whole-parameter passes stream
    return bytes / ceilings.streaming_bytes_per_second + launches * ceilings.kernel_launch_seconds;
  };
  const PlanOptions bf16 = bf16_options(), fp8 = bf16_options(Float8Recipe::tensorwise);
  const double bf16_copy = double(compute_copy_elements(compute_copy_ranges(model, bf16)));
  const double fp8_copy = double(compute_copy_elements(compute_copy_ranges(model, fp8)));
  EXPECT_LT(fp8_copy, bf16_copy);
  EXPECT_NEAR(seconds(StepKind::optimizer, bf16), expected(28 * parameters + 2 * bf16_copy, 2), 1e-12);
  EXPECT_NEAR(seconds(StepKind::optimizer, fp8), expected(28 * parameters + 2 * fp8_copy, 2), 1e-12);
  const StepPlan plan = build_step_plan(model, fp8);
  double float8_elements = 0, linears = 0;
  for (size_t i = 1; i + 1 < layout.parameters().size(); ++i)  // nor are the embedding (0) and the output (last)
    if (plan.compute_copy_offset(layout.parameters()[i]) < 0) float8_elements += double(layout.parameters()[i].numel()), ++linears;
  EXPECT_EQ(linears, 7.0 * double(model.n_layers));
  // AdamW took the amax (fusion full): the cast reads the master once and writes W (and W^T when kept).
  EXPECT_NEAR(seconds(StepKind::cast_weights, fp8), expected(5 * float8_elements, linears), 1e-12);
  PlanOptions fp8_kept = fp8;
  fp8_kept.float8.keep_transposed_weights = true;
  EXPECT_NEAR(seconds(StepKind::cast_weights, fp8_kept), expected(6 * float8_elements, linears), 1e-12);
  PlanOptions fp8_linear = fp8;  // fusion linear: an amax pass first
  fp8_linear.float8.fuse_amax_into_producers = false;
  EXPECT_NEAR(seconds(StepKind::cast_weights, fp8_linear), expected(9 * float8_elements, 2 * linears), 1e-12);
  // The output head also casts its weight (read 4 bytes, write 2 per element) when there is a bf16 copy.
  PlanOptions f32 = bf16_options();
  f32.compute_dtype = DType::f32;
  PlanOptions bf16_sharded = bf16;
  bf16_sharded.shard_single_rank = true;
  const double head = seconds(StepKind::output_head, bf16) - seconds(StepKind::output_head, bf16_sharded);
  EXPECT_NEAR(head,
              6.0 * double(layout.output().numel()) / ceilings.elementwise_bytes_per_second + ceilings.kernel_launch_seconds,
              1e-9);
  // A persistent output copy: no cast in the head; AdamW writes its 2 bytes per element instead.
  PlanOptions persistent = bf16;
  persistent.persistent_output_copy = true;
  EXPECT_NEAR(seconds(StepKind::output_head, persistent), seconds(StepKind::output_head, bf16_sharded), 1e-12);
  EXPECT_NEAR(seconds(StepKind::optimizer, persistent) - seconds(StepKind::optimizer, bf16),
              expected(2.0 * double(layout.output().numel()), 0), 1e-12);
}

// PlanOptions::persistent_output_copy: the output projection joins the copy AdamW writes (after
// the final norm's), the head's per-step buffer is gone, and the copy holds exactly the expected
// parameters, with float8 linears too. choose_persistent_output_copy takes it exactly where the
// arena does not grow: the 8B proxy at batch 1, whose peak is the output head, and not a model
// whose head is small beside its activations.
TEST(ComputeCopy, PersistentOutputCopyIsWrittenByTheOptimizer) {
  for (Float8Recipe recipe : {Float8Recipe::none, Float8Recipe::tensorwise}) {
    PlanOptions o = bf16_options(recipe);
    const StepPlan per_step = build_step_plan(small_model(3), o);
    o.persistent_output_copy = true;
    expect_copy_holds_exactly(o, std::string(float8_recipe_name(recipe)) + ", persistent output copy");
    const StepPlan persistent = build_step_plan(small_model(3), o);
    EXPECT_GE(per_step.output_weight, 0);
    EXPECT_LT(persistent.output_weight, 0);
    const ParameterLayout layout(persistent.model);
    const int64_t output = layout.output().numel();
    EXPECT_EQ(persistent.buffers[size_t(persistent.compute_weights)].shape.numel(),
              per_step.buffers[size_t(per_step.compute_weights)].shape.numel() + padded(output));
    EXPECT_EQ(persistent.compute_copy_offset(layout.output()),
              persistent.compute_copy_offset(layout.final_norm()) + padded(layout.final_norm().numel()));
  }

  auto arenas = [](const ModelConfig& model, PlanOptions o) {
    o.persistent_output_copy = false;
    const size_t per_step = build_step_plan(model, o).memory.arena_bytes;
    o.persistent_output_copy = true;
    return std::make_pair(per_step, build_step_plan(model, o).memory.arena_bytes);
  };
  const ModelConfig proxy = testing_support::llama3_8b_layers(8);
  PlanOptions proxy_options = bf16_options();
  proxy_options.shape = {1, 8192};
  proxy_options.loss_chunk_tokens = 8192;
  proxy_options.linear_grad_dtype = DType::bf16;
  const auto [proxy_per_step, proxy_persistent] = arenas(proxy, proxy_options);
  EXPECT_EQ(proxy_persistent, proxy_per_step);
  EXPECT_TRUE(choose_persistent_output_copy(proxy, proxy_options));

  ModelConfig deep = small_model(6);  // 6 blocks of 2 x 2048 tokens, AC none: activations peak
  PlanOptions deep_options = bf16_options();
  deep_options.shape = {2, 2048};
  deep_options.policy = parse_checkpoint_policy("none");
  const auto [deep_per_step, deep_persistent] = arenas(deep, deep_options);
  EXPECT_GT(deep_persistent, deep_per_step);
  EXPECT_FALSE(choose_persistent_output_copy(deep, deep_options));

  PlanOptions f32 = bf16_options();  // no compute copy: nothing to keep
  f32.compute_dtype = DType::f32;
  EXPECT_FALSE(choose_persistent_output_copy(small_model(3), f32));
}

}  // namespace
}  // namespace smelt
