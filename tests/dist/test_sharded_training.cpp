// FSDP on the CPU: 1, 2 and 4 ranks as threads train a small model on slices of one global
// batch and must match the single-rank run on the whole batch (losses, gradient norms, final
// weights and AdamW moments), for each checkpointing policy, bf16 compute and reduce, and float8.
#include <gtest/gtest.h>

#include <cmath>

#include "dist/sharded_fixture.h"

namespace smelt {
namespace {

using testing::GlobalBatches;
using testing::RunResult;
using testing::ShardedCase;

// How far a sharded run may be from the single-rank run. The math is the same; what differs is
// the order of summation: each rank's GEMMs sum over its B*T tokens and the reduce-scatter adds
// the N partial gradients (the loss is the mean of N means), where the single rank sums over all
// N*B*T tokens at once.
// - f64: rounding at 1e-16 relative; the bounds are tight (the runs agree to the bit in practice).
// - f32: ~1e-7 relative per gradient; AdamW's first steps divide m by sqrt(v), so where a gradient
//   is near zero the update (about sign(g) * lr) can differ: 1e-5 absolute on weights that moved
//   by up to lr * steps = 9e-3, 1e-4 relative to the whole update.
// - bf16 compute, bf16 reduce, float8: their own rounding reacts to those differences (a weight's
//   bf16 value, 2^-8 relative, can flip; bf16 gradients are rounded before the sum; float8
//   tensorwise scales activations by each rank's amax, not the global batch's). AdamW then moves
//   some elements the other way: no element may differ by more than two runs moving opposite ways
//   (2 * lr * steps), and the whole update must agree to `relative` (float8: to twice the distance
//   between the single-rank float8 run and the same run without float8, i.e. within float8's noise).
struct Tolerance {
  double loss = 0, weight = 0, relative = 0;
};

Tolerance tolerance_for(const ShardedCase& c) {
  const double lr = double(testing::test_optimizer(1).lr), opposite_updates = 2.0 * lr * c.steps;
  // f64 compute, but the weights as read back are f32: a sum whose last bit rounds the other way
  // moves a weight by one f32 ulp (2.9e-11 at 4e-4 seen; the updates as a whole by up to 1.2e-9
  // over 200 fresh draws).
  if (c.compute == DType::f64) return {1e-12, 1e-8, 1e-8};
  if (c.float8 != Float8Recipe::none) return {5e-3, opposite_updates, 0};  // relative: calibrated in the test
  if (c.compute == DType::bf16) return {1e-3, opposite_updates, 0.02};
  // Gradients rounded to bf16 for the reduce: the updates as a whole differed by up to 3.0% over
  // 600 fresh draws of these scenarios (a wrong reduction differs by order 1).
  if (c.reduce == DType::bf16) return {1e-3, opposite_updates, 0.08};
  // f32: a coordinate whose gradient is a near-cancelling sum has it summed in another order by
  // the shards, and AdamW divides by its root second moment, so such a coordinate can move by a
  // visible part of lr (across fresh draws up to 1.6%); the updates as a whole differed by up to
  // 1.2e-4 over 150 draws of each scenario (f32 full, 4 ranks; 1e-4 failed about one run in ten).
  return {2e-5, 0.1 * lr, 3e-4};
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b, size_t* where) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= worst)) worst = d, *where = i;  // NaN counts as the worst
  }
  return worst;
}

std::string parameter_at(const ModelConfig& model, size_t index) {
  const ParameterLayout layout(model);
  for (const auto& p : layout.parameters())
    if (static_cast<int64_t>(index) >= p.offset && static_cast<int64_t>(index) < p.offset + p.numel()) return p.name;
  return "padding";
}

// ||a - b|| / ||b - initial||: how far the sharded run's weights are from the single rank's,
// relative to how far training moved them.
double relative_update_difference(const std::vector<float>& a, const std::vector<float>& b,
                                  const std::vector<float>& initial) {
  double difference = 0, update = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    update += (double(b[i]) - double(initial[i])) * (double(b[i]) - double(initial[i]));
  }
  return std::sqrt(difference / update);
}

void expect_matches(const ModelConfig& model, const RunResult& single,
                    const std::vector<RunResult>& ranks, const std::vector<float>& initial, const Tolerance& t,
                    const std::string& label) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RunResult& mine = ranks[r];
    ASSERT_EQ(mine.losses.size(), single.losses.size());
    for (size_t s = 0; s < single.losses.size(); ++s) {
      EXPECT_NEAR(mine.losses[s], single.losses[s], t.loss) << label << " rank " << r << " step " << s + 1;
      EXPECT_NEAR(mine.gradient_norms[s], single.gradient_norms[s], t.loss * std::max(1.0, single.gradient_norms[s]))
          << label << " rank " << r << " step " << s + 1 << ": gradient norm";
    }
    size_t where = 0;
    const double weights = max_difference(mine.parameters, single.parameters, &where);
    const double relative = relative_update_difference(mine.parameters, single.parameters, initial);
    EXPECT_LE(relative, t.relative) << label << " rank " << r << ": the weight updates differ by this fraction";
    EXPECT_LE(weights, t.weight) << label << " rank " << r << ": final weights differ most at " << parameter_at(model, where)
                                 << " (" << mine.parameters[where] << " vs " << single.parameters[where] << ")";
    const double moments = max_difference(mine.exp_avg, single.exp_avg, &where);
    EXPECT_LE(moments, t.weight) << label << " rank " << r << ": exp_avg differs most at " << parameter_at(model, where);
    // Every rank ends with the same bits: the collectives give each the same result.
    if (r > 0) {
      EXPECT_EQ(mine.parameters, ranks[0].parameters) << label << " rank " << r << " vs rank 0";
    }
  }
}

struct Scenario {
  const char* name;
  ShardedCase c;
};
void PrintTo(const Scenario& scenario, std::ostream* out) { *out << scenario.name; }

class ShardedMatchesSingleRank : public ::testing::TestWithParam<std::tuple<Scenario, int>> {};

TEST_P(ShardedMatchesSingleRank, LossesWeightsAndMomentsAfterThreeSteps) {
  const auto& [scenario, ranks] = GetParam();
  const ShardedCase& c = scenario.c;
  const ModelConfig model = testing::small_model();
  const std::vector<float> initial = testing::initial_weights(model, 17);
  const GlobalBatches batches =
      testing::random_batches(model, ranks * c.batch_per_rank * c.microbatches * c.seq_len, c.steps, 23);
  const RunResult single = testing::train_one_rank(model, c, ranks, nullptr, initial, batches);
  // The run must train (weights move, clipping is active) or matching it proves little.
  ASSERT_GT(single.gradient_norms[0], testing::test_optimizer(1).max_norm);
  size_t where = 0;
  ASSERT_GT(max_difference(single.parameters, initial, &where), 1e-3);
  Tolerance tolerance = tolerance_for(c);
  if (c.float8 != Float8Recipe::none) {  // calibrate: how much float8 itself changes this run
    ShardedCase plain = c;
    plain.float8 = Float8Recipe::none;
    const RunResult reference = testing::train_one_rank(model, plain, ranks, nullptr, initial, batches);
    const double float8_noise = relative_update_difference(single.parameters, reference.parameters, initial);
    ASSERT_GT(float8_noise, 1e-2) << "the float8 run matches the bf16 one: were the linears in float8?";
    tolerance.relative = 2 * float8_noise;
  }
  const std::vector<RunResult> sharded = testing::train_sharded(model, c, ranks, initial, batches);
  expect_matches(model, single, sharded, initial, tolerance, std::string(scenario.name) + " x" + std::to_string(ranks));
}

const Scenario kScenarios[] = {
    {"f64 none", {.policy = "none", .compute = DType::f64}},
    {"f64 full", {.policy = "full", .compute = DType::f64}},
    {"f32 none", {.policy = "none"}},
    {"f32 full", {.policy = "full"}},
    {"f32 selective-op", {.policy = "selective-op"}},
    {"bf16 selective-op", {.policy = "selective-op", .compute = DType::bf16}},
    {"f32 bf16-reduce", {.policy = "none", .reduce = DType::bf16}},
    {"bf16 fp8-tensorwise", {.policy = "selective-op", .compute = DType::bf16, .float8 = Float8Recipe::tensorwise}},
    {"bf16 fp8-blockwise", {.policy = "selective-op", .compute = DType::bf16, .float8 = Float8Recipe::blockwise}},
    {"f64 none kept", {.policy = "none", .compute = DType::f64, .reshard_after_forward = false}},
    {"f32 selective-op kept", {.policy = "selective-op", .reshard_after_forward = false}},
    {"bf16 full kept", {.policy = "full", .compute = DType::bf16, .reshard_after_forward = false}},
    {"bf16 fp8-tensorwise kept",
     {.policy = "none", .compute = DType::bf16, .float8 = Float8Recipe::tensorwise, .reshard_after_forward = false}},
    // Gradient accumulation: each pass's gradients reduce-scattered, the shard received added.
    {"f64 none accumulated", {.policy = "none", .compute = DType::f64, .microbatches = 2}},
    {"f32 selective-op accumulated", {.policy = "selective-op", .microbatches = 3}},
    {"f32 bf16-reduce accumulated", {.policy = "none", .reduce = DType::bf16, .microbatches = 2}},
    {"bf16 full kept accumulated",
     {.policy = "full", .compute = DType::bf16, .reshard_after_forward = false, .microbatches = 2}},
};

INSTANTIATE_TEST_SUITE_P(Ranks, ShardedMatchesSingleRank,
                         ::testing::Combine(::testing::ValuesIn(kScenarios), ::testing::Values(1, 2, 4)),
                         [](const auto& info) {
                           std::string name = std::string(std::get<0>(info.param).name) + "_ranks" +
                                              std::to_string(std::get<1>(info.param));
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

// Plain data parallel (every rank holds the whole model, gradients all-reduced per unit) and
// HSDP (sharded within groups of consecutive ranks, replicated across them) match one rank on the
// global batch, with the same tolerances as FSDP: only the order of summation differs.
struct Layout {
  int ranks;
  int64_t replicate;
};
void PrintTo(const Layout& layout, std::ostream* out) { *out << layout.replicate << "x" << layout.ranks / layout.replicate; }

class DataParallelMatchesSingleRank : public ::testing::TestWithParam<std::tuple<Scenario, Layout>> {};

TEST_P(DataParallelMatchesSingleRank, LossesWeightsAndMomentsAfterThreeSteps) {
  const auto& [scenario, layout] = GetParam();
  ShardedCase c = scenario.c;
  c.replicate = layout.replicate;
  const ModelConfig model = testing::small_model();
  const std::vector<float> initial = testing::initial_weights(model, 19);
  const GlobalBatches batches =
      testing::random_batches(model, layout.ranks * c.batch_per_rank * c.microbatches * c.seq_len, c.steps, 29);
  const RunResult single = testing::train_one_rank(model, c, layout.ranks, nullptr, initial, batches);
  ASSERT_GT(single.gradient_norms[0], testing::test_optimizer(1).max_norm);
  const std::vector<RunResult> replicated = testing::train_sharded(model, c, layout.ranks, initial, batches);
  const std::string label = std::string(scenario.name) + " " + std::to_string(layout.replicate) + " replicas x " +
                            std::to_string(layout.ranks / layout.replicate) + " shards";
  expect_matches(model, single, replicated, initial, tolerance_for(c), label);
  // Replicas end with the same bits too (each rank's own moments, not only the gathered weights).
  for (size_t r = 1; r < replicated.size(); ++r) EXPECT_EQ(replicated[r].exp_avg_sq, replicated[0].exp_avg_sq) << label;
}

const Scenario kReplicatedScenarios[] = {
    {"f64 none", {.policy = "none", .compute = DType::f64}},
    {"f32 full", {.policy = "full"}},
    {"f32 bf16-reduce", {.policy = "none", .reduce = DType::bf16}},
    {"bf16 selective-op", {.policy = "selective-op", .compute = DType::bf16}},
    // Gradient accumulation: replicas all-reduce what the step accumulated, once, in its last pass.
    {"f64 none accumulated", {.policy = "none", .compute = DType::f64, .microbatches = 3}},
    {"f32 bf16-reduce accumulated", {.policy = "none", .reduce = DType::bf16, .microbatches = 2}},
};

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallelMatchesSingleRank,
                         ::testing::Combine(::testing::ValuesIn(kReplicatedScenarios),
                                            ::testing::Values(Layout{2, 2}, Layout{4, 4}, Layout{4, 2})),
                         [](const auto& info) {
                           const Layout& layout = std::get<1>(info.param);
                           std::string name = std::string(std::get<0>(info.param).name) + "_replicas" +
                                              std::to_string(layout.replicate) + "_shards" +
                                              std::to_string(layout.ranks / layout.replicate);
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

// Float8 all-gather: two ranks gather float8 linears' weights in e4m3 with scales from one
// all-reduce of every weight's amax. The GEMMs then see exactly the e4m3 weights one rank makes
// from the whole tensor, so the bound is the one of the float8 FSDP case: twice float8's own
// effect on the run (activation scales still come from each rank's own tokens).
TEST(Float8AllGather, TwoRanksMatchOneRankWithinFloat8Noise) {
  ShardedCase c{.policy = "selective-op", .compute = DType::bf16, .float8 = Float8Recipe::tensorwise};
  c.float8_all_gather = true;
  const ModelConfig model = testing::small_model();
  const std::vector<float> initial = testing::initial_weights(model, 17);
  const GlobalBatches batches = testing::random_batches(model, 2 * c.batch_per_rank * c.seq_len, c.steps, 23);
  const RunResult single = testing::train_one_rank(model, c, 2, nullptr, initial, batches);
  ShardedCase plain = c;
  plain.float8 = Float8Recipe::none;
  const RunResult reference = testing::train_one_rank(model, plain, 2, nullptr, initial, batches);
  const double float8_noise = relative_update_difference(single.parameters, reference.parameters, initial);
  ASSERT_GT(float8_noise, 1e-2) << "the float8 run matches the bf16 one: were the linears in float8?";
  Tolerance tolerance = tolerance_for(c);
  tolerance.relative = 2 * float8_noise;
  const std::vector<RunResult> gathered = testing::train_sharded(model, c, 2, initial, batches);
  expect_matches(model, single, gathered, initial, tolerance, "float8 all-gather x2");
  // The bf16 gather quantises each gathered weight with the amax of the whole weight: the same
  // scale and the same e4m3 values as the float8 gather's global amax. So the two runs agree to the
  // bit, which checks the e4m3 path (shard casts, amax all-reduce, norms packed beside it, W^T made
  // after the gather) exactly, not only within float8's noise.
  ShardedCase bf16_gather = c;
  bf16_gather.float8_all_gather = false;
  const std::vector<RunResult> plain_gather = testing::train_sharded(model, bf16_gather, 2, initial, batches);
  for (size_t r = 0; r < gathered.size(); ++r) {
    EXPECT_EQ(gathered[r].losses, plain_gather[r].losses) << "rank " << r;
    EXPECT_EQ(gathered[r].parameters, plain_gather[r].parameters) << "rank " << r;
  }
}

// At one rank the float8 all-gather runs in place in the e4m3 shards (W^T from their codes) and
// the bf16 gather in the compute copy (StepPlan::collectives_in_place). The two still agree to the
// bit, as at two ranks.
TEST(Float8AllGather, OneRankInE4m3AndInPlaceInBf16AgreeToTheBit) {
  ShardedCase c{.policy = "selective-op", .compute = DType::bf16, .float8 = Float8Recipe::tensorwise};
  c.float8_all_gather = true;
  c.shard_single_rank = true;
  const ModelConfig model = testing::small_model();
  const std::vector<float> initial = testing::initial_weights(model, 19);
  const GlobalBatches batches = testing::random_batches(model, c.batch_per_rank * c.seq_len, c.steps, 29);
  const std::vector<RunResult> gathered = testing::train_sharded(model, c, 1, initial, batches);
  ShardedCase in_place = c;
  in_place.float8_all_gather = false;
  const std::vector<RunResult> plain = testing::train_sharded(model, in_place, 1, initial, batches);
  EXPECT_EQ(gathered[0].losses, plain[0].losses);
  EXPECT_EQ(gathered[0].parameters, plain[0].parameters);
  EXPECT_NE(gathered[0].parameters, initial) << "nothing was trained";
}

// The FSDP schedule over a communicator of one rank (what measures the machinery's cost on one
// GPU) computes exactly what the unsharded plan computes: its collectives run in place, and an
// average over one rank is the value itself.
TEST(ShardedSingleRank, TheFsdpScheduleOverOneRankIsBitIdenticalToTheUnshardedRun) {
  const ModelConfig model = testing::small_model();
  const std::vector<float> initial = testing::initial_weights(model, 31);
  for (const DType reduce : {DType::f32, DType::bf16}) {
    for (const bool reshard : {true, false}) {
    ShardedCase c;
    c.policy = "selective-op";
    c.compute = DType::bf16;
    const GlobalBatches batches = testing::random_batches(model, c.batch_per_rank * c.seq_len, c.steps, 37);
    const RunResult plain = testing::train_one_rank(model, c, 1, nullptr, initial, batches);
    c.shard_single_rank = true;
    c.reduce = reduce;
    c.reshard_after_forward = reshard;
    SCOPED_TRACE(reshard ? "resharded after forward" : "kept from forward to backward");
    const std::vector<RunResult> fsdp = testing::train_sharded(model, c, 1, initial, batches);
    if (reduce == DType::f32) {
      EXPECT_EQ(fsdp[0].losses, plain.losses);
      EXPECT_EQ(fsdp[0].gradient_norms, plain.gradient_norms);
      EXPECT_EQ(fsdp[0].parameters, plain.parameters);
      EXPECT_EQ(fsdp[0].exp_avg_sq, plain.exp_avg_sq);
    } else {  // gradients rounded to bf16 on the way: the first forward agrees, the updates differ a little
      EXPECT_EQ(fsdp[0].losses[0], plain.losses[0]);
      EXPECT_NE(fsdp[0].gradient_norms[0], plain.gradient_norms[0]) << "the bf16 reduce was not used";
      EXPECT_NEAR(fsdp[0].gradient_norms[0], plain.gradient_norms[0], 1e-2 * plain.gradient_norms[0]);
      EXPECT_NEAR(fsdp[0].losses.back(), plain.losses.back(), 1e-3);
    }
    }
  }
}

// A sharded checkpoint round trip: every rank's shards gathered into whole-model arrays (what
// a checkpoint writes), loaded back into fresh executors (which keep their shards), and the run
// continued, matches the uninterrupted run bit for bit; so does resuming on another world size.
TEST(ShardedCheckpoint, GatheredStateReloadsIntoShardsAndContinuesExactly) {
  const ModelConfig model = testing::small_model();
  const std::vector<float> initial = testing::initial_weights(model, 41);
  ShardedCase c;
  c.steps = 3;
  const GlobalBatches batches = testing::random_batches(model, 4 * c.batch_per_rank * c.seq_len, c.steps, 43);
  const std::vector<RunResult> straight = testing::train_sharded(model, c, 4, initial, batches);
  ShardedCase first_two = c;
  first_two.steps = 2;
  const std::vector<RunResult> saved = testing::train_sharded(model, first_two, 4, initial, batches);
  for (size_t r = 1; r < saved.size(); ++r) ASSERT_EQ(saved[r].exp_avg, saved[0].exp_avg);
  const std::vector<RunResult> resumed = testing::train_sharded(model, c, 4, initial, batches, &saved[0], 2);
  EXPECT_EQ(resumed[0].losses.back(), straight[0].losses.back());
  EXPECT_EQ(resumed[0].parameters, straight[0].parameters);
  EXPECT_EQ(resumed[0].exp_avg, straight[0].exp_avg);
  EXPECT_EQ(resumed[0].exp_avg_sq, straight[0].exp_avg_sq);
  // The gathered state is the whole model in the flat layout: the one-rank run resumes from it.
  const RunResult single = testing::train_one_rank(model, c, 4, nullptr, initial, batches, &saved[0], 2);
  size_t where = 0;
  EXPECT_LE(max_difference(single.parameters, straight[0].parameters, &where), 1e-5) << parameter_at(model, where);
}

}  // namespace
}  // namespace smelt
