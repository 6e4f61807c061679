// The automatic policy: its plan always fits the budget (the packed arena, not an estimate),
// it is never slower than a fixed policy that fits, it becomes `none` without a limit and
// `full`-like just above full's arena, and it refuses with the changes that would fit.
#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"
#include "core/random.h"
#include "plan/auto_policy.h"
#include "support/fresh_random.h"
#include "support/model_shapes.h"

namespace smelt {
namespace {

ModelConfig proxy(int64_t layers) { return testing_support::llama3_8b_layers(layers); }

PlanOptions options(const std::string& policy, int64_t seq = 4096) {
  PlanOptions o;
  o.shape = {1, seq};
  o.compute_dtype = DType::bf16;
  o.policy = parse_checkpoint_policy(policy);
  o.loss_chunk_tokens = 1024;
  o.backend_workspace_bytes = 32u << 20;
  return o;
}

StepPlan fixed(const ModelConfig& model, const std::string& policy) { return build_step_plan(model, options(policy)); }

TEST(AutoPolicy, CandidatesSpanNoneToFull) {
  const ModelConfig model = proxy(2);
  const CostModel cost(h200_ceilings());
  const auto candidates = keep_candidates(model, options("auto"), cost);
  ASSERT_GE(candidates.size(), 3u);
  EXPECT_EQ(candidates.front().kept_bytes, 0u);  // full: only the block input
  bool has_none = false;
  for (const auto& c : candidates) has_none |= c.kept == keep_set(parse_checkpoint_policy("none"), 0);
  EXPECT_TRUE(has_none);
  for (size_t i = 1; i < candidates.size(); ++i) EXPECT_LE(candidates[i - 1].kept_bytes, candidates[i].kept_bytes);
}

TEST(AutoPolicy, ChosenPlanFitsEveryRandomBudgetAndBeatsFixedPolicies) {
  const ModelConfig model = proxy(4);
  const CostModel cost(h200_ceilings());
  std::vector<StepPlan> fixed_plans;
  for (const char* p : {"none", "selective-layer:2", "selective-op", "full"}) fixed_plans.push_back(fixed(model, p));
  const double low = static_cast<double>(fixed_plans.back().memory.arena_bytes);
  const double high = 1.05 * static_cast<double>(fixed_plans.front().memory.arena_bytes);
  Random random(testing_support::fresh(2027));
  for (int trial = 0; trial < 40; ++trial) {
    const double budget = low + (high - low) * static_cast<double>(random.below(1000000)) / 1e6;
    AutoPolicyResult result = choose_automatic_policy(model, options("auto"), budget, cost);
    ASSERT_LE(static_cast<double>(result.plan.memory.arena_bytes), budget) << "trial " << trial;
    // The memory the planner predicts is the packed arena of the plan that will run.
    StepPlan rebuilt = build_step_plan(model, result.plan.options);
    EXPECT_EQ(rebuilt.memory.arena_bytes, result.plan.memory.arena_bytes);
    EXPECT_EQ(result.plan.options.policy.mode, CheckpointMode::automatic);
    for (const auto& f : fixed_plans) {
      if (static_cast<double>(f.memory.arena_bytes) <= budget) {
        EXPECT_LE(result.time.seconds, cost.predict(f).seconds * (1 + 1e-9)) << f.options.policy.str() << " trial " << trial;
      }
    }
  }
}

TEST(AutoPolicy, UnlimitedBudgetEqualsNone) {
  const ModelConfig model = proxy(3);
  const CostModel cost(h200_ceilings());
  AutoPolicyResult result = choose_automatic_policy(model, options("auto"), 1e15, cost);
  StepPlan none = fixed(model, "none");
  for (size_t i = 0; i < none.layers.size(); ++i) EXPECT_EQ(result.plan.layers[i].kept, none.layers[i].kept) << i;
  EXPECT_EQ(result.plan.recompute_flops(), 0);
  EXPECT_EQ(result.plan.memory.arena_bytes, none.memory.arena_bytes);
}

// Plans whose peak is at the output head under every policy (one loss chunk for the sequence), so
// what a policy keeps decides the arena. With 1024-token chunks `full` peaks at the embedding's
// backward (the weights, moments and gradients with the embedding's), where nothing it saved
// matters, and a policy keeping more can fit the same arena.
PlanOptions head_peak_options(const std::string& policy) {
  PlanOptions o = options(policy);
  o.loss_chunk_tokens = o.shape.tokens();
  return o;
}

TEST(AutoPolicy, BudgetJustAboveFullIsFullLike) {
  const ModelConfig model = proxy(4);
  const CostModel cost(h200_ceilings());
  StepPlan full = build_step_plan(model, head_peak_options("full"));
  ASSERT_EQ(full.steps[size_t(full.memory.peak_step)].kind, StepKind::output_head);
  const double budget = static_cast<double>(full.memory.arena_bytes) * 1.001;
  AutoPolicyResult result = choose_automatic_policy(model, head_peak_options("auto"), budget, cost);
  EXPECT_LE(static_cast<double>(result.plan.memory.arena_bytes), budget);
  EXPECT_GE(result.plan.recompute_flops(), 0.9 * full.recompute_flops());
  EXPECT_LE(result.time.seconds, cost.predict(full).seconds * (1 + 1e-9));
}

// A larger budget never gives a slower plan, and the arena uses the budget (the search does not
// stop at a fixed policy far below it). Budgets on a fine grid from full's arena to none's.
TEST(AutoPolicy, MoreMemoryIsNeverSlowerAndTheBudgetIsUsed) {
  const ModelConfig model = proxy(8);
  const CostModel cost(h200_ceilings());
  const double low = static_cast<double>(fixed(model, "full").memory.arena_bytes) * 1.001;
  const double high = static_cast<double>(fixed(model, "none").memory.arena_bytes);
  double previous_seconds = std::numeric_limits<double>::infinity();
  Random random(testing_support::fresh(20261202), 3);
  const int points = 24;
  for (int i = 0; i < points; ++i) {
    const double budget = low + (high - low) * (i + 0.5 * random.uniform()) / points;
    AutoPolicyResult result = choose_automatic_policy(model, options("auto"), budget, cost);
    const double arena = static_cast<double>(result.plan.memory.arena_bytes);
    EXPECT_LE(arena, budget) << "budget " << budget;
    EXPECT_LE(result.time.seconds, previous_seconds * (1 + 1e-9)) << "budget " << budget << " chose a slower plan";
    // The budget is used: packing leaves some slack (a few activations of a block), never gigabytes.
    EXPECT_GE(arena, budget - 0.5e9) << "budget " << budget << " left unused by " << result.chosen_by;
    previous_seconds = result.time.seconds;
  }
}

TEST(AutoPolicy, NothingFitsNamesTheBreakdownAndTheSmallestChanges) {
  const ModelConfig model = proxy(4);
  const CostModel cost(h200_ceilings());
  StepPlan full = fixed(model, "full");
  const double budget = 0.8 * static_cast<double>(full.memory.arena_bytes);
  try {
    choose_automatic_policy(model, options("auto"), budget, cost);
    ADD_FAILURE() << "a budget below full's arena was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::memory);
    const std::string message = e.what();
    for (const char* expected : {"does not fit", "optimizer state", "activations", "smallest changes",
                                 "--parallelism.data_parallel_shard_degree=2"})
      EXPECT_NE(message.find(expected), std::string::npos) << "missing '" << expected << "' in:\n" << message;
  }
  // Where the state fits but the activations do not, a shorter sequence is suggested; each change fits.
  PlanOptions shorter = options("full", 1024);
  const double tight = static_cast<double>(build_step_plan(model, shorter).memory.arena_bytes) * 1.001;
  const auto changes = changes_that_fit(model, options("auto"), tight, cost);
  bool sequence = false;
  for (const auto& change : changes) sequence |= change.find("--training.seq_len=") != std::string::npos;
  EXPECT_TRUE(sequence);
  for (const auto& change : changes) {
    PlanOptions o = options("full");
    const auto value = std::stoll(change.substr(change.find('=') + 1));
    if (change.find("shard_degree") != std::string::npos) o.shard_degree = value;
    else if (change.find("seq_len") != std::string::npos) o.shape.seq_len = value;
    else continue;
    EXPECT_LE(static_cast<double>(build_step_plan(model, o).memory.arena_bytes), tight) << change;
  }
}

// A batch too large for the budget: besides the smaller batch, the same sequences per step in
// smaller accumulated passes, and that plan fits. (Policy none and 16 sequences: accumulating keeps
// the embedding's gradient across the passes, so the activations halved must outweigh it.)
TEST(AutoPolicy, ABatchOverBudgetSuggestsAccumulatingSmallerPasses) {
  const ModelConfig model = proxy(2);
  const CostModel cost(h200_ceilings());
  PlanOptions sixteen = options("none", 2048);
  sixteen.shape.batch = 16;
  PlanOptions accumulated = sixteen;
  accumulated.shape.batch = 8;
  accumulated.microbatches = 2;
  const double budget = static_cast<double>(build_step_plan(model, accumulated).memory.arena_bytes) * 1.001;
  ASSERT_GT(static_cast<double>(build_step_plan(model, sixteen).memory.arena_bytes), budget);
  const auto changes = changes_that_fit(model, sixteen, budget, cost);
  bool found = false;
  for (const auto& change : changes)
    found |= change.find("--training.local_batch_size=8 --training.global_batch_size=16 (2 accumulated passes") == 0;
  EXPECT_TRUE(found) << ::testing::PrintToString(changes);
  // Sharded over 2 ranks, the global batch counts both ranks' sequences.
  PlanOptions sharded = sixteen;
  sharded.shard_degree = 2;
  found = false;
  for (const auto& change : changes_that_fit(model, sharded, budget, cost))
    found |= change.find("--training.global_batch_size=32 (") != std::string::npos;
  EXPECT_TRUE(found) << ::testing::PrintToString(changes_that_fit(model, sharded, budget, cost));
}

TEST(AutoPolicy, FixedPolicyOverBudgetSuggestsPolicies) {
  const ModelConfig model = proxy(4);
  const CostModel cost(h200_ceilings());
  const double budget = static_cast<double>(build_step_plan(model, head_peak_options("full")).memory.arena_bytes) * 1.01;
  const auto changes = changes_that_fit(model, head_peak_options("none"), budget, cost);
  ASSERT_FALSE(changes.empty());
  EXPECT_NE(changes.front().find("--activation_checkpoint.mode=full"), std::string::npos) << changes.front();
}

TEST(ShardedPlan, StateIsDividedAndCommunicationBuffersAppear) {
  const ModelConfig model = proxy(4);
  PlanOptions one = options("selective-op"), four = one;
  four.shard_degree = 4;
  StepPlan single = build_step_plan(model, one), sharded = build_step_plan(model, four);
  EXPECT_EQ(single.bytes_of(BufferClass::communication), 0u);
  EXPECT_EQ(single.gather_current, -1);
  // Two gather, two reduce-scatter buffers; the unsharded plan's per-step output weight copy and
  // the embedding's own gradient buffer go (a sharded plan's gradient shard holds it).
  ASSERT_GE(single.output_weight, 0);
  ASSERT_GE(single.embedding_gradient, 0);
  EXPECT_LT(sharded.output_weight, 0);
  EXPECT_LT(sharded.embedding_gradient, 0);
  EXPECT_EQ(single.buffers.size() + 4 - 2, sharded.buffers.size());
  const double ratio = static_cast<double>(single.bytes_of(BufferClass::optimizer_state)) /
                       static_cast<double>(sharded.bytes_of(BufferClass::optimizer_state));
  EXPECT_NEAR(ratio, 4.0, 1e-3);
  // Two bf16 gather buffers and two f32 reduce-scatter buffers, each used by a vocabulary-sized
  // unit here (the embedding or the output head, the largest).
  const double unit = static_cast<double>(largest_gather_unit(model));
  EXPECT_NEAR(static_cast<double>(sharded.bytes_of(BufferClass::communication)), unit * (2 + 2 + 4 + 4), unit * 1e-3);
  EXPECT_EQ(sharded.bytes_of(BufferClass::activations), single.bytes_of(BufferClass::activations));
  EXPECT_LT(sharded.memory.arena_bytes, single.memory.arena_bytes);
}

}  // namespace
}  // namespace smelt
