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

}  // namespace
}  // namespace smelt
