// The largest batch that fits (smelt plan's headroom table): against runs configured with each
// batch and planned by prepare_run, found here one batch at a time, on random models and budgets.
#include <gtest/gtest.h>

#include <string>

#include "support/expect_error.h"
#include "support/fresh_random.h"
#include "train/batch_headroom.h"

namespace smelt {
namespace {

// A random small Llama on the CUDA estimates (bf16 compute), any fixed policy, seq 128-1024,
// sometimes float8 tensorwise or two accumulated passes a step.
JobConfig random_config(Random& random) {
  static const char* policies[] = {"none", "selective-layer:2", "selective-op", "full"};
  JobConfig c;
  c.job.device = "cuda";
  c.model.dim = 64 * (1 + int64_t(random.below(4)));
  c.model.n_layers = 1 + int64_t(random.below(4));
  c.model.vocab_size = 512 + 64 * int64_t(random.below(200));
  c.training.seq_len = int64_t(128) << random.below(4);
  c.training.local_batch_size = 1;
  c.training.mixed_precision_param = "bfloat16";
  c.activation_checkpoint.mode = policies[random.below(4)];
  if (random.below(3) == 0) c.float8.recipe = "tensorwise";
  if (random.below(3) == 0) {
    c.training.global_batch_size = 2;
    c.training.linear_grad_dtype = "float32";
  }
  return c;
}

std::string describe(const JobConfig& c) {
  return "dim " + std::to_string(c.model.dim) + " layers " + std::to_string(c.model.n_layers) + " vocabulary " +
         std::to_string(c.model.vocab_size) + " seq " + std::to_string(c.training.seq_len) + " " +
         c.activation_checkpoint.mode + " float8 " + c.float8.recipe +
         (c.training.global_batch_size > 0 ? " accumulated" : "");
}

// The config at a local batch of `batch` (the same passes per step) and a budget (0: the device's).
JobConfig at(JobConfig c, int64_t batch, double budget_bytes) {
  const int64_t passes = c.training.global_batch_size > 0 ? c.training.global_batch_size / c.training.local_batch_size : 0;
  c.training.local_batch_size = batch;
  if (passes > 0) c.training.global_batch_size = passes * batch;
  c.activation_checkpoint.memory_budget_gb = budget_bytes / 1e9;
  return c;
}

// The plan a run configured with this batch and budget makes (prepare_run, no backend).
StepPlan run_plan(const JobConfig& c, int64_t batch, double budget_bytes) {
  const RunSetup setup = prepare_run(at(c, batch, budget_bytes), nullptr, /*need_tokenizer=*/false);
  return build_step_plan(setup.model, setup.plan_options);
}

TEST(BatchHeadroom, IsTheLargestBatchWhoseRunFitsTheBudget) {
  testing_support::FreshRandom random;
  for (int trial = 0; trial < 40; ++trial) {
    const JobConfig c = random_config(random);
    SCOPED_TRACE(describe(c));
    // A budget that fits a run of `target` sequences (planned at the device's budget), plus a
    // random part of the step to the next batch.
    const int64_t target = 1 + int64_t(random.below(24));
    const double low = double(run_plan(c, target, 0).memory.arena_bytes);
    const double high = double(run_plan(c, target + 1, 0).memory.arena_bytes);
    const double budget = low + random.uniform() * (high - low);
    // The expected batch, one run at a time: the last before the first that does not fit.
    int64_t expected = 0;
    while (expected < 200 && double(run_plan(c, expected + 1, budget).memory.arena_bytes) <= budget) ++expected;
    ASSERT_GE(expected, target);  // (a budget short of the next batch's may fit it with a smaller loss chunk)

    const RunSetup setup = prepare_run(at(c, 1, budget), nullptr, false);
    const CostModel cost = setup.cost_model();
    const BatchHeadroom found = largest_fitting_batch(setup, setup.plan_options, cost, 1000);
    EXPECT_EQ(found.batch, expected);
    EXPECT_FALSE(found.at_limit);
    const StepPlan expected_plan = run_plan(c, expected, budget);
    EXPECT_EQ(found.arena_bytes, expected_plan.memory.arena_bytes);
    EXPECT_LE(double(found.arena_bytes), budget);
    EXPECT_DOUBLE_EQ(found.time.seconds, cost.predict(expected_plan).seconds);
    EXPECT_DOUBLE_EQ(found.time.tokens_per_second, cost.predict(expected_plan).tokens_per_second);
  }
}

TEST(BatchHeadroom, StopsAtTheLimitAndFindsNoneBelowOneSequence) {
  testing_support::FreshRandom random;
  const JobConfig c = random_config(random);
  SCOPED_TRACE(describe(c));
  const RunSetup roomy = prepare_run(at(c, 1, 0), nullptr, false);  // the H200's budget: small models fit thousands
  const int64_t limit = 3 + int64_t(random.below(20));
  const BatchHeadroom capped = largest_fitting_batch(roomy, roomy.plan_options, roomy.cost_model(), limit);
  EXPECT_EQ(capped.batch, limit);
  EXPECT_TRUE(capped.at_limit);
  EXPECT_EQ(capped.arena_bytes, run_plan(c, limit, roomy.memory_budget_bytes).memory.arena_bytes);

  const double one = double(run_plan(c, 1, 0).memory.arena_bytes);
  const RunSetup tight = prepare_run(at(c, 1, one * random.uniform(0.5, 0.99)), nullptr, false);
  const BatchHeadroom none = largest_fitting_batch(tight, tight.plan_options, tight.cost_model(), 1000);
  EXPECT_EQ(none.batch, 0);
  EXPECT_EQ(none.arena_bytes, 0u);
}

TEST(BatchHeadroom, RefusesTheAutomaticPolicy) {
  JobConfig c;
  c.job.device = "cuda";
  c.activation_checkpoint.mode = "auto";
  c.training.mixed_precision_param = "bfloat16";
  const RunSetup setup = prepare_run(c, nullptr, false);
  testing_support::expect_error(
      ErrorKind::internal, [&] { largest_fitting_batch(setup, setup.plan_options, setup.cost_model(), 8); },
      {"fixed checkpointing policy"});
}

TEST(BatchHeadroom, DefaultLimitIsAMillionTokensAPass) {
  EXPECT_EQ(default_batch_search_limit(8192), 128);
  EXPECT_EQ(default_batch_search_limit(2048), 512);
  EXPECT_EQ(default_batch_search_limit(3000), 349);
  EXPECT_EQ(default_batch_search_limit(1 << 21), 1);
}

}  // namespace
}  // namespace smelt
