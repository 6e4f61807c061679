// A generator seeded afresh on every run, for tests that draw their inputs at random. The seed
// goes into every failure message of the scope that holds the generator, and SMELT_TEST_SEED=N
// replays a run: the same seed, so the same draws.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

#include "core/random.h"

namespace smelt::testing_support {

// SMELT_TEST_SEED when set (a decimal number), else 64 bits of entropy.
inline uint64_t fresh_seed() {
  if (const char* replay = std::getenv("SMELT_TEST_SEED"); replay && *replay) {
    char* end = nullptr;
    const uint64_t seed = std::strtoull(replay, &end, 10);
    if (*end == '\0') return seed;
    ADD_FAILURE() << "SMELT_TEST_SEED='" << replay << "' is not a decimal number; drawing a fresh seed";
  }
  std::random_device entropy;
  return uint64_t(entropy()) << 32 | entropy();
}

class FreshRandom : public Random {
 public:
  explicit FreshRandom(uint64_t seed = fresh_seed())
      : Random(seed), seed_(seed), trace_(__FILE__, __LINE__, "random seed " + std::to_string(seed) +
                                                                  " (SMELT_TEST_SEED=" + std::to_string(seed) +
                                                                  " replays it)") {}
  uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_;
  ::testing::ScopedTrace trace_;
};

}  // namespace smelt::testing_support
