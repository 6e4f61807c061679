// The test helper that seeds generators afresh: SMELT_TEST_SEED replays a run's draws, runs
// without it differ, and a malformed value fails the test that reads it.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "support/fresh_random.h"

namespace smelt {
namespace {

// Sets SMELT_TEST_SEED (or unsets it, given nullopt) for one scope, restoring what was there.
class SeedVariable {
 public:
  explicit SeedVariable(const std::optional<std::string>& value) {
    if (const char* old = std::getenv("SMELT_TEST_SEED")) saved_ = old;
    if (value) ::setenv("SMELT_TEST_SEED", value->c_str(), 1);
    else ::unsetenv("SMELT_TEST_SEED");
  }
  ~SeedVariable() {
    if (saved_) ::setenv("SMELT_TEST_SEED", saved_->c_str(), 1);
    else ::unsetenv("SMELT_TEST_SEED");
  }

 private:
  std::optional<std::string> saved_;
};

TEST(FreshRandom, SmeltTestSeedReplaysTheDraws) {
  const uint64_t seed = testing_support::FreshRandom().seed();  // any seed, then replayed
  const SeedVariable variable(std::to_string(seed));
  testing_support::FreshRandom replayed;
  Random original(seed);
  EXPECT_EQ(replayed.seed(), seed);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(replayed.next(), original.next()) << "draw " << i;
}

TEST(FreshRandom, RunsWithoutAReplayDrawDifferentSeeds) {
  const SeedVariable variable(std::nullopt);
  testing_support::FreshRandom a, b;
  EXPECT_NE(a.seed(), b.seed());
  EXPECT_NE(a.next(), b.next());
}

TEST(FreshRandom, AMalformedReplayFailsTheTestThatReadsIt) {
  const SeedVariable variable(std::string("12x"));
  EXPECT_NONFATAL_FAILURE(testing_support::fresh_seed(), "SMELT_TEST_SEED='12x' is not a decimal number");
}

// Sets the running test's seed for one scope, restoring it after.
class RunningSeed {
 public:
  explicit RunningSeed(uint64_t seed) : saved_(testing_support::running_test_seed()) {
    testing_support::running_test_seed() = seed;
  }
  ~RunningSeed() { testing_support::running_test_seed() = saved_; }

 private:
  uint64_t saved_;
};

TEST(FreshSeeds, AStreamNumberGivesTheSameSeedWithinARunAndAnotherInTheNext) {
  testing_support::FreshRandom random;
  const uint64_t seed = random.next(), other = random.next();
  uint64_t first_run[3], second_run[3];
  {
    const RunningSeed running(seed);
    for (uint64_t stream = 0; stream < 3; ++stream) first_run[stream] = testing_support::fresh(stream);
    EXPECT_EQ(testing_support::fresh(1), first_run[1]);
    EXPECT_NE(first_run[0], first_run[1]);
    EXPECT_NE(first_run[1], first_run[2]);
  }
  {
    const RunningSeed running(other);
    for (uint64_t stream = 0; stream < 3; ++stream) second_run[stream] = testing_support::fresh(stream);
  }
  for (int stream = 0; stream < 3; ++stream) EXPECT_NE(first_run[stream], second_run[stream]) << "stream " << stream;
  const RunningSeed again(seed);
  EXPECT_EQ(testing_support::fresh(2), first_run[2]);
}

TEST(FreshSeeds, TheListenerDrawsEachTestsSeedAndSmeltTestSeedReplaysIt) {
  const RunningSeed restore(testing_support::running_test_seed());
  testing_support::FreshSeedListener listener;
  const ::testing::TestInfo& test = *::testing::UnitTest::GetInstance()->current_test_info();
  {
    const SeedVariable variable(std::string("123456789012345"));
    listener.OnTestStart(test);
    EXPECT_EQ(testing_support::running_test_seed(), 123456789012345u);
  }
  const SeedVariable variable(std::nullopt);
  listener.OnTestStart(test);
  const uint64_t first = testing_support::running_test_seed();
  listener.OnTestStart(test);
  EXPECT_NE(testing_support::running_test_seed(), first);
}

}  // namespace
}  // namespace smelt
