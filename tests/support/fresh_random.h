// Fresh random inputs for tests, replayable.
//
// FreshRandom: a generator seeded afresh on every run. The seed goes into every failure message
// of the scope that holds the generator.
//
// fresh(stream): for tests that name their draws by number (random_tensor(..., 7)): the number
// picks a stream within the running test's seed, which FreshSeedListener (installed by
// test_main.cpp) draws afresh as each test starts and names when the test fails. Within one run
// of a test the same number gives the same draws (a CPU and a GPU run of one op see the same
// inputs); from run to run they differ.
//
// SMELT_TEST_SEED=N replays a run: every seed drawn afresh is N, so the same draws.
#pragma once
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
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

// The seed of the test now running (set by FreshSeedListener; 0 outside a test).
inline uint64_t& running_test_seed() {
  static uint64_t seed = 0;
  return seed;
}

// Stream `stream` of the running test's seed: the first draw of Random's own (seed, stream)
// generator, so nearby streams and nearby seeds give unrelated values.
inline uint64_t fresh(uint64_t stream) { return Random(running_test_seed(), stream).next(); }

// Draws each test's seed as it starts and names it, with the command that replays it, when the
// test fails.
class FreshSeedListener : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo&) override { running_test_seed() = fresh_seed(); }
  void OnTestEnd(const ::testing::TestInfo& test) override {
    if (!test.result()->Failed()) return;
    std::printf("[   SEED   ] %s.%s drew its inputs from seed %" PRIu64 "; SMELT_TEST_SEED=%" PRIu64
                " replays them\n",
                test.test_suite_name(), test.name(), running_test_seed(), running_test_seed());
    std::fflush(stdout);
  }
};

}  // namespace smelt::testing_support
