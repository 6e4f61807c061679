// The test helpers that seed draws afresh from one seed per test: the test's seed replays its
// FreshRandom generators and numbered streams, the listener draws a new seed per test (SMELT_TEST_SEED
// fixes it), and a malformed SMELT_TEST_SEED fails the test that reads it.
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

// Sets the running test's seed (and its count of FreshRandom generators) for one scope, as a test
// starting with that seed would, restoring both after.
class RunningSeed {
 public:
  explicit RunningSeed(uint64_t seed)
      : saved_(testing_support::running_test_seed()), made_(testing_support::fresh_generators_made()) {
    testing_support::begin_test(seed);
  }
  ~RunningSeed() {
    testing_support::running_test_seed() = saved_;
    testing_support::fresh_generators_made() = made_;
  }

 private:
  uint64_t saved_, made_;
};

// The k-th FreshRandom of a test is the same generator whenever the test runs with the same seed
// (so the one seed the listener names replays it), and another with another seed; two within a
// test differ.
TEST(FreshRandom, TheTestSeedReplaysEveryGeneratorTheTestMakes) {
  const uint64_t seed = testing_support::FreshRandom().next(), other = testing_support::FreshRandom().next();
  uint64_t first[2], again[2], elsewhere[2];
  {
    const RunningSeed running(seed);
    testing_support::FreshRandom a, b;
    first[0] = a.next(), first[1] = b.next();
    EXPECT_NE(a.seed(), b.seed());
  }
  {
    const RunningSeed running(seed);
    testing_support::FreshRandom a, b;
    again[0] = a.next(), again[1] = b.next();
    Random replay(a.seed());
    EXPECT_EQ(replay.next(), again[0]) << "a FreshRandom is Random seeded with seed()";
  }
  {
    const RunningSeed running(other);
    testing_support::FreshRandom a, b;
    elsewhere[0] = a.next(), elsewhere[1] = b.next();
  }
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(first[k], again[k]) << "generator " << k << " with the same test seed";
    EXPECT_NE(first[k], elsewhere[k]) << "generator " << k << " with another test seed";
  }
  EXPECT_NE(first[0], first[1]);
}

TEST(FreshRandom, AMalformedReplayFailsTheTestThatReadsIt) {
  const SeedVariable variable(std::string("12x"));
  EXPECT_NONFATAL_FAILURE(testing_support::fresh_seed(), "SMELT_TEST_SEED='12x' is not a decimal number");
}

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
  testing_support::FreshRandom made_in_the_test;
  EXPECT_EQ(testing_support::fresh_generators_made(), 1u);
  listener.OnTestStart(test);
  EXPECT_NE(testing_support::running_test_seed(), first);
  EXPECT_EQ(testing_support::fresh_generators_made(), 0u) << "a new test counts its generators from 0";
}

}  // namespace
}  // namespace smelt
