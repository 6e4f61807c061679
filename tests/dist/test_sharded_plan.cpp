// The sharded StepPlan: its collective steps and their order (prefetch one unit ahead, each
// compute step finds its unit's weights in its buffer), its buffers, the one-rank plan equal to
// the unsharded one, the shard layout, and the errors a mismatched communicator or config gives.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "dist/sharded_fixture.h"
#include "plan/plan_report.h"
#include "plan/shard_layout.h"

namespace smelt {
namespace {

StepPlan plan_for(const ModelConfig& model, int64_t degree, const std::string& policy = "selective-op",
                  DType reduce = DType::f32, bool reshard_after_forward = true) {
  testing::ShardedCase c;
  c.policy = policy;
  c.compute = DType::bf16;
  c.reduce = reduce;
  c.reshard_after_forward = reshard_after_forward;
  auto backend = make_cpu_backend();
  return build_step_plan(model, testing::sharded_plan_options(model, c, 2, degree, *backend));
}

bool is_collective(StepKind kind) {
  return kind == StepKind::all_gather || kind == StepKind::reduce_scatter ||
         kind == StepKind::all_reduce_gradient_norm || kind == StepKind::all_reduce_loss;
}

TEST(ShardLayout, UnitsCoverTheFlatLayoutAndShardsTile) {
  const ModelConfig model = testing::small_model(3);
  const ParameterLayout layout(model);
  for (int64_t ranks : {1, 2, 4, 8}) {
    const ShardLayout shards(layout, ranks);
    ASSERT_EQ(shards.units().size(), 5u);  // embedding, 3 blocks, head
    int64_t next = 0, local = 0;
    for (const ShardUnit& unit : shards.units()) {
      EXPECT_EQ(unit.offset, next) << unit.name();
      EXPECT_EQ(unit.padded % (64 * ranks), 0) << unit.name();
      EXPECT_GE(unit.padded, unit.length);
      EXPECT_EQ(unit.shard * ranks, unit.padded);
      EXPECT_EQ(unit.shard_offset, local);
      // Gaps and parameters partition [0, padded).
      int64_t covered = 0;
      for (const auto& [first, last] : unit.gaps) covered += last - first;
      for (const auto& p : layout.parameters())
        if (p.offset >= unit.offset && p.offset < unit.offset + unit.length) covered += p.numel();
      EXPECT_EQ(covered, unit.padded) << unit.name();
      next += unit.length;
      local += unit.shard;
    }
    EXPECT_EQ(next, layout.total());
    EXPECT_EQ(shards.local_total(), local);
  }
  const ShardLayout four(layout, 4);
  EXPECT_EQ(four.unit(0).name(), "tok_embeddings");
  EXPECT_EQ(four.unit(2).name(), "layers.1");
  EXPECT_EQ(four.unit(four.head_unit()).name(), "norm+output");
}

TEST(ShardedPlan, OneRankPlanIsTheUnshardedPlan) {
  const ModelConfig model = testing::small_model();
  testing::ShardedCase c;
  auto backend = make_cpu_backend();
  PlanOptions plain = testing::sharded_plan_options(model, c, 2, 1, *backend);
  plain.reduce_dtype = DType::bf16;  // ignored without sharding
  const StepPlan one = build_step_plan(model, plain);
  PlanOptions defaults = plain;
  defaults.reduce_dtype = PlanOptions{}.reduce_dtype;
  const StepPlan reference = build_step_plan(model, defaults);
  ASSERT_EQ(one.steps.size(), reference.steps.size());
  for (size_t i = 0; i < one.steps.size(); ++i) {
    EXPECT_EQ(one.steps[i].name(), reference.steps[i].name());
    EXPECT_EQ(one.steps[i].unit, -1);
    EXPECT_EQ(one.steps[i].gathered_weights, -1);
    EXPECT_FALSE(is_collective(one.steps[i].kind));
  }
  ASSERT_EQ(one.buffers.size(), reference.buffers.size());
  for (size_t i = 0; i < one.buffers.size(); ++i) EXPECT_EQ(one.buffers[i].request.bytes, reference.buffers[i].request.bytes);
  EXPECT_EQ(one.memory.arena_bytes, reference.memory.arena_bytes);
  EXPECT_EQ(one.bytes_of(BufferClass::communication), 0u);
  EXPECT_EQ(one.local_parameter_count(), ParameterLayout(model).total());
}

TEST(ShardedPlan, CollectivesPerUnitPrefetchedOneUnitAhead) {
  const int64_t layers = 3;
  const ModelConfig model = testing::small_model(layers);
  for (const std::string policy : {"none", "full", "selective-op"}) {
    const StepPlan plan = plan_for(model, 4, policy);
    const ShardLayout shards(ParameterLayout(model), 4);
    std::map<std::string, int> count;
    std::map<int, int> resident;  // gather buffer -> unit it holds
    int previous_unit = -2;
    std::vector<std::string> order;
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      const Step& step = plan.steps[i];
      if (is_collective(step.kind)) ++count[step.name()];
      if (step.kind == StepKind::all_gather) {
        ASSERT_GE(step.gathered_weights, 0);
        resident[step.gathered_weights] = step.unit;
        continue;
      }
      if (step.gathered_weights < 0) continue;
      // A compute step reads its unit's weights from a buffer that holds that unit.
      ASSERT_TRUE(resident.count(step.gathered_weights)) << step.name();
      EXPECT_EQ(resident[step.gathered_weights], step.unit) << policy << ": " << step.name();
      if (step.unit != previous_unit) {
        order.push_back(shards.unit(step.unit).name());
        // Prefetch: the other buffer already holds (or is receiving) the next unit.
        previous_unit = step.unit;
      }
    }
    // Units computed in order: embedding, blocks forward, head, blocks backward.
    const std::vector<std::string> expected{"tok_embeddings", "layers.0", "layers.1", "layers.2", "norm+output",
                                            "layers.2",       "layers.1", "layers.0"};
    EXPECT_EQ(order, expected) << policy;
    // One gather per use, but the last block stays gathered around the head; one reduce-scatter per unit.
    EXPECT_EQ(count["all-gather tok_embeddings"], 1);
    EXPECT_EQ(count["all-gather layers.0"], 2);
    EXPECT_EQ(count["all-gather layers.1"], 2);
    EXPECT_EQ(count["all-gather layers.2"], 1);
    EXPECT_EQ(count["all-gather norm+output"], 1);
    for (const char* unit : {"tok_embeddings", "layers.0", "layers.1", "layers.2", "norm+output"})
      EXPECT_EQ(count[std::string("reduce-scatter ") + unit], 1) << unit;
    EXPECT_EQ(count["all-reduce gradient sum of squares"], 1);
    EXPECT_EQ(count["all-reduce loss"], 1);
  }
}

TEST(ShardedPlan, NextUnitsGatherIsIssuedBeforeTheCurrentUnitComputes) {
  const ModelConfig model = testing::small_model(3);
  const StepPlan plan = plan_for(model, 2);
  // Step index of each gather of `layers.1` for its forward, and of layers.0's first forward op.
  int gather_layer1 = -1, first_layer0_forward = -1, reduce_scatter_head = -1, first_layer2_backward = -1;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    if (s.kind == StepKind::all_gather && s.layer == 1 && gather_layer1 < 0) gather_layer1 = static_cast<int>(i);
    if (s.kind == StepKind::layer_forward && s.layer == 0 && first_layer0_forward < 0) first_layer0_forward = static_cast<int>(i);
    if (s.kind == StepKind::reduce_scatter && s.layer < 0 && s.unit != 0) reduce_scatter_head = static_cast<int>(i);
    if (s.kind == StepKind::layer_backward && s.layer == 2 && first_layer2_backward < 0) first_layer2_backward = static_cast<int>(i);
  }
  EXPECT_LT(gather_layer1, first_layer0_forward) << "layers.1's gather must be in flight during layers.0's forward";
  EXPECT_LT(reduce_scatter_head, first_layer2_backward) << "the head's reduce-scatter must be in flight during layers.2's backward";
}

// Without resharding after forward: one gather per unit and step (none for a block's backward),
// each block in a buffer of its own that its backward reads; the embedding and the head share
// the first gather buffer. Memory grows by the blocks' gathered weights; bytes gathered shrink.
TEST(ShardedPlan, KeptBlocksAreGatheredOnceAndReadAgainByTheirBackward) {
  const int64_t layers = 3;
  const ModelConfig model = testing::small_model(layers);
  const ShardLayout shards(ParameterLayout(model), 4);
  for (const std::string policy : {"none", "full", "selective-op"}) {
    SCOPED_TRACE(policy);
    const StepPlan plan = plan_for(model, 4, policy, DType::f32, false), resharded = plan_for(model, 4, policy);
    ASSERT_EQ(plan.gather_kept.size(), size_t(layers));
    EXPECT_EQ(plan.gather_next, -1);
    std::map<std::string, int> gathers;
    std::map<int, int> resident;  // gather buffer -> unit it holds
    std::set<int> backward_buffers;
    for (const Step& step : plan.steps) {
      if (step.kind == StepKind::all_gather) {
        ++gathers[shards.unit(step.unit).name()];
        EXPECT_EQ(step.op, 0) << "a gather for a backward: " << step.name();
        resident[step.gathered_weights] = step.unit;
        continue;
      }
      if (step.gathered_weights < 0) continue;
      ASSERT_TRUE(resident.count(step.gathered_weights)) << step.name();
      EXPECT_EQ(resident[step.gathered_weights], step.unit) << step.name();
      if (step.layer >= 0) EXPECT_EQ(step.gathered_weights, plan.gather_kept[size_t(step.layer)]) << step.name();
      else EXPECT_EQ(step.gathered_weights, plan.gather_current) << step.name();
      if (step.kind == StepKind::layer_backward) backward_buffers.insert(step.gathered_weights);
    }
    EXPECT_EQ(backward_buffers.size(), size_t(layers));
    EXPECT_NE(parallel_layout(plan).find("kept from its forward to its backward"), std::string::npos) << parallel_layout(plan);
    EXPECT_EQ(parallel_layout(resharded).find("kept"), std::string::npos);
    for (const char* unit : {"tok_embeddings", "layers.0", "layers.1", "layers.2", "norm+output"})
      EXPECT_EQ(gathers[unit], 1) << unit;
    int64_t kept = 0;
    for (int64_t layer = 0; layer < layers; ++layer) {
      const auto& buffer = plan.buffers[size_t(plan.gather_kept[size_t(layer)])];
      EXPECT_EQ(buffer.shape.numel(), shards.unit(shards.block_unit(layer)).padded);
      EXPECT_EQ(buffer.dtype, DType::bf16);
      kept += buffer.shape.numel();
    }
    EXPECT_GT(plan.memory.arena_bytes, resharded.memory.arena_bytes);
    // The communication buffers differ by exactly the gather buffers: the kept ones and one shared
    // by the embedding and head, against two alternating ones.
    auto bytes = [](const StepPlan& p, int id) {
      return (p.buffers[size_t(id)].request.bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
    };
    size_t kept_bytes = 0;
    for (int id : plan.gather_kept) kept_bytes += bytes(plan, id);
    EXPECT_GE(kept_bytes, size_t(kept) * 2);
    EXPECT_EQ(plan.bytes_of(BufferClass::communication) - kept_bytes - bytes(plan, plan.gather_current),
              resharded.bytes_of(BufferClass::communication) - bytes(resharded, resharded.gather_current) -
                  bytes(resharded, resharded.gather_next));
    EXPECT_EQ(plan.buffers[size_t(plan.gather_current)].shape.numel(),
              std::max(shards.unit(shards.embedding_unit()).padded, shards.unit(shards.head_unit()).padded));
    EXPECT_LT(communication_volume(plan).all_gather_bytes, communication_volume(resharded).all_gather_bytes);
  }
}

TEST(ShardedPlan, KeepingGatheredWeightsWithTheFloat8AllGatherIsAClearError) {
  const ModelConfig model = testing::small_model(2);
  testing::ShardedCase c;
  c.compute = DType::bf16;
  c.float8 = Float8Recipe::tensorwise;
  c.float8_all_gather = true;
  c.reshard_after_forward = false;
  auto backend = make_cpu_backend();
  try {
    build_step_plan(model, testing::sharded_plan_options(model, c, 2, 2, *backend));
    FAIL() << "planned a float8 all-gather with kept weights";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::config);
    EXPECT_NE(std::string(e.what()).find("reshard_after_forward_policy"), std::string::npos) << e.what();
  }
}

// One rank per shard group: the same collective steps as with two ranks, over the flat weights
// and gradients themselves (nothing to move), and no gather or reduce-scatter buffer; a float8
// all-gather gathers the e4m3 shards in place. A bf16 reduce keeps its bf16 buffers.
TEST(ShardedPlan, OneRankShardGroupsRunTheSameCollectivesInPlace) {
  const ModelConfig model = testing::small_model(3);
  auto backend = make_cpu_backend();
  testing::ShardedCase c;
  c.policy = "selective-op";
  c.compute = DType::bf16;
  c.shard_single_rank = true;
  const StepPlan one = build_step_plan(model, testing::sharded_plan_options(model, c, 2, 1, *backend));
  const StepPlan two = plan_for(model, 2);
  EXPECT_TRUE(one.collectives_in_place);
  EXPECT_FALSE(two.collectives_in_place);
  EXPECT_EQ(one.gather_current, -1);
  EXPECT_EQ(one.reduce_scatter[0], -1);
  EXPECT_EQ(one.bytes_of(BufferClass::communication), 0u);
  EXPECT_GT(two.bytes_of(BufferClass::communication), 0u);
  ASSERT_GE(one.compute_weights, 0);
  std::vector<std::string> names_one, names_two;
  int gathers = 0, scatters = 0, writers = 0;
  for (const Step& s : one.steps) {
    if (is_collective(s.kind)) names_one.push_back(s.name());
    if (s.gathered_weights >= 0) {
      EXPECT_EQ(s.gathered_weights, one.compute_weights) << s.name();
      ++gathers;
    }
    if (s.unit_gradients >= 0) {
      EXPECT_EQ(s.unit_gradients, one.gradients) << s.name();
      ++writers;
    }
    scatters += s.kind == StepKind::reduce_scatter;
  }
  for (const Step& s : two.steps)
    if (is_collective(s.kind)) names_two.push_back(s.name());
  EXPECT_EQ(names_one, names_two);
  const std::string report = format_plan(one, false);  // `smelt plan` says so, at world 1 too
  EXPECT_NE(report.find("the collectives run in place"), std::string::npos) << report;
  EXPECT_EQ(format_plan(two, false).find("run in place"), std::string::npos);
  EXPECT_GT(gathers, 0);
  EXPECT_EQ(scatters, 5);  // the embedding, 3 blocks, the head
  EXPECT_GT(writers, scatters);

  testing::ShardedCase float8 = c;
  float8.float8 = Float8Recipe::tensorwise;
  float8.float8_all_gather = true;
  const StepPlan e4m3 = build_step_plan(model, testing::sharded_plan_options(model, float8, 2, 1, *backend));
  EXPECT_TRUE(e4m3.collectives_in_place);
  EXPECT_TRUE(e4m3.float8_gathered());  // the e4m3 shards, gathered in place
  EXPECT_EQ(e4m3.gather_current, -1);
  EXPECT_EQ(e4m3.float8_gather[0], -1);
  EXPECT_EQ(e4m3.float8_remainder_gather[1], -1);
  EXPECT_EQ(e4m3.reduce_scatter[0], -1);

  testing::ShardedCase bf16_reduce = c;
  bf16_reduce.reduce = DType::bf16;
  const StepPlan bf16 = build_step_plan(model, testing::sharded_plan_options(model, bf16_reduce, 2, 1, *backend));
  EXPECT_EQ(bf16.reduce_scatter[0], -1);
  EXPECT_GE(bf16.reduce_send[0], 0);
  EXPECT_GE(bf16.reduce_receive[1], 0);
}

TEST(ShardedPlan, BuffersSizedPerUnitAndStateDivided) {
  const ModelConfig model = testing::small_model(3);
  const StepPlan one = plan_for(model, 1), four = plan_for(model, 4), bf16 = plan_for(model, 4, "none", DType::bf16);
  const ShardLayout shards(ParameterLayout(model), 4);
  EXPECT_EQ(four.local_parameter_count(), shards.local_total());
  EXPECT_EQ(four.buffers[static_cast<size_t>(four.parameters)].shape.numel(), shards.local_total());
  EXPECT_EQ(four.buffers[static_cast<size_t>(four.exp_avg)].shape.numel(), shards.local_total());
  EXPECT_LT(four.bytes_of(BufferClass::optimizer_state) * 3, one.bytes_of(BufferClass::optimizer_state));
  // Every unit fits the buffers it passes through; the largest unit sets one of each.
  const auto numel = [&](const StepPlan& p, int id) { return p.buffers[static_cast<size_t>(id)].shape.numel(); };
  for (const Step& s : four.steps) {
    if (s.kind == StepKind::all_gather) {
      EXPECT_GE(numel(four, s.gathered_weights), shards.unit(s.unit).padded);
    } else if (s.kind == StepKind::reduce_scatter) {
      EXPECT_GE(numel(four, s.unit_gradients), shards.unit(s.unit).padded);
    }
  }
  EXPECT_EQ(std::max(numel(four, four.gather_current), numel(four, four.gather_next)), shards.largest_padded());
  EXPECT_EQ(four.buffers[static_cast<size_t>(four.gather_current)].dtype, DType::bf16);
  EXPECT_EQ(four.buffers[static_cast<size_t>(four.reduce_scatter[0])].dtype, DType::f32);
  EXPECT_EQ(four.reduce_send[0], -1);
  // A bf16 reduce adds the bf16 copies sent and the bf16 shards received.
  ASSERT_GE(bf16.reduce_send[0], 0);
  ASSERT_GE(bf16.reduce_receive[1], 0);
  EXPECT_EQ(bf16.buffers[static_cast<size_t>(bf16.reduce_send[0])].dtype, DType::bf16);
  EXPECT_EQ(numel(bf16, bf16.reduce_receive[0]) * 4, numel(bf16, bf16.reduce_scatter[0]));
}

TEST(ShardedExecutor, RefusesAMissingOrMismatchedCommunicator) {
  const ModelConfig model = testing::small_model();
  const StepPlan four = plan_for(model, 4), one = plan_for(model, 1);
  auto backend = make_cpu_backend();
  try {
    Executor executor(four, *backend);
    FAIL() << "a sharded plan ran without a communicator";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no communicator"), std::string::npos) << e.what();
  }
  LocalGroup two(2);
  try {
    Executor executor(four, *backend, &two.communicator(0));
    FAIL() << "a plan for 4 ranks ran with 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data_parallel_shard_degree=2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Executor(one, *backend, &two.communicator(0)), Error);
  LocalGroup single(1);
  EXPECT_NO_THROW(Executor(one, *backend, &single.communicator(0)));
}

TEST(ShardedConfig, RanksThatDisagreeFailNamingTheKey) {
  std::vector<std::string> errors(3);
  testing::run_ranks(3, [&](Communicator& c) {
    JobConfig config;
    if (c.rank() == 2) config.optimizer.lr = 1e-2;
    try {
      check_same_config(c, config_to_json(config));
    } catch (const Error& e) {
      errors[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("optimizer.lr"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 2"), std::string::npos) << e;
  }
  // The same config (read from different paths) passes.
  testing::run_ranks(2, [&](Communicator& c) {
    JobConfig config;
    config.source = "rank" + std::to_string(c.rank()) + ".toml";
    check_same_config(c, config_to_json(config));
  });
}

}  // namespace
}  // namespace smelt
