// Fresh random inputs for tests, replayable from one seed per test.
//
// FreshSeedListener (installed by test_main.cpp) draws a new seed as each test starts and names it
// when the test fails; everything below derives from it, so that one number replays the test.
//
// fresh(stream): for tests that name their draws by number (random_tensor(..., 7)): the number
// picks a stream within the running test's seed. Within one run of a test the same number gives
// the same draws (a CPU and a GPU run of one op see the same inputs); from run to run they differ.
//
// FreshRandom: a generator for tests that just want draws: the k-th one a test makes is seeded
// from stream k of a range of its own within the test's seed.
//
// SMELT_TEST_SEED=N replays a run: every test's seed is N, so the same draws.
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

// The seed of the test now running (set by FreshSeedListener; 0 outside a test).
inline uint64_t& running_test_seed() {
  static uint64_t seed = 0;
  return seed;
}

// FreshRandom generators made so far by the running test.
inline uint64_t& fresh_generators_made() {
  static uint64_t count = 0;
  return count;
}

// A test starts with `seed`: its numbered streams and its FreshRandom generators derive from it.
inline void begin_test(uint64_t seed) {
  running_test_seed() = seed;
  fresh_generators_made() = 0;
}

// FreshRandom's streams start here, far from the small numbers tests give fresh(stream).
inline constexpr uint64_t kFreshRandomStreams = uint64_t(1) << 40;

class FreshRandom : public Random {
 public:
  FreshRandom() : FreshRandom(Random(running_test_seed(), kFreshRandomStreams + fresh_generators_made()++).next()) {}
  explicit FreshRandom(uint64_t seed) : Random(seed), seed_(seed) {}
  uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_;
};

// Stream `stream` of the running test's seed: the first draw of Random's own (seed, stream)
// generator, so nearby streams and nearby seeds give unrelated values.
inline uint64_t fresh(uint64_t stream) { return Random(running_test_seed(), stream).next(); }

// Draws each test's seed as it starts and names it, with the command that replays it, when the
// test fails.
class FreshSeedListener : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo&) override { begin_test(fresh_seed()); }
  void OnTestEnd(const ::testing::TestInfo& test) override {
    if (!test.result()->Failed()) return;
    std::printf("[   SEED   ] %s.%s drew its inputs from seed %" PRIu64 "; SMELT_TEST_SEED=%" PRIu64
                " replays them\n",
                test.test_suite_name(), test.name(), running_test_seed(), running_test_seed());
    std::fflush(stdout);
  }
};

}  // namespace smelt::testing_support
