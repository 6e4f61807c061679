// MemoryPlan packing: buffers live at the same time never share memory, the arena
// holds them all, and memory is reused when lifetimes do not overlap.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/memory_plan.h"
#include "support/fresh_random.h"

namespace smelt {
namespace {

void expect_valid_packing(const std::vector<BufferRequest>& requests, const MemoryPlan& plan) {
  ASSERT_EQ(plan.offsets.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(plan.offsets[i] % kBufferAlignment, 0u);
    EXPECT_LE(plan.offsets[i] + requests[i].bytes, plan.arena_bytes) << requests[i].name;
    for (size_t j = i + 1; j < requests.size(); ++j) {
      const auto &a = requests[i], &b = requests[j];
      bool live_together = a.first_step <= b.last_step && b.first_step <= a.last_step;
      bool memory_overlaps = plan.offsets[i] < plan.offsets[j] + b.bytes && plan.offsets[j] < plan.offsets[i] + a.bytes;
      if (a.bytes > 0 && b.bytes > 0) {
        EXPECT_FALSE(live_together && memory_overlaps) << a.name << " and " << b.name;
      }
    }
  }
  EXPECT_GE(plan.arena_bytes, plan.peak_live_bytes);
}

TEST(MemoryPlan, RandomBuffersNeverOverlapWhileLive) {
  testing_support::FreshRandom random;
  for (int trial = 0; trial < 50; ++trial) {
    const int steps = 1 + static_cast<int>(random.below(40));
    std::vector<BufferRequest> requests;
    const int count = 1 + static_cast<int>(random.below(60));
    for (int i = 0; i < count; ++i) {
      int first = static_cast<int>(random.below(static_cast<uint64_t>(steps)));
      int last = first + static_cast<int>(random.below(static_cast<uint64_t>(steps - first)));
      std::string name = "b";
      name += std::to_string(i);
      requests.push_back({name, 1 + random.below(100000), first, last, BufferClass::activations});
    }
    MemoryPlan plan = pack_buffers(requests, steps);
    expect_valid_packing(requests, plan);
  }
}

TEST(MemoryPlan, DisjointLifetimesShareMemory) {
  std::vector<BufferRequest> requests = {
      {"a", 1000, 0, 1, BufferClass::activations},
      {"b", 1000, 2, 3, BufferClass::activations},
      {"c", 1000, 4, 5, BufferClass::activations},
  };
  MemoryPlan plan = pack_buffers(requests, 6);
  EXPECT_EQ(plan.arena_bytes, 1024u);  // one aligned slot reused three times
  EXPECT_EQ(plan.peak_live_bytes, 1024u);
}

TEST(MemoryPlan, PeakStepAndClassBreakdown) {
  std::vector<BufferRequest> requests = {
      {"weights", 4096, 0, 4, BufferClass::parameters},
      {"x", 2048, 1, 2, BufferClass::activations},
      {"y", 8192, 2, 3, BufferClass::activations},
  };
  MemoryPlan plan = pack_buffers(requests, 5);
  EXPECT_EQ(plan.peak_step, 2);
  EXPECT_EQ(plan.peak_live_bytes, 4096u + 2048u + 8192u);
  EXPECT_EQ(plan.live_by_class[2][static_cast<size_t>(BufferClass::parameters)], 4096u);
  EXPECT_EQ(plan.live_by_class[4][static_cast<size_t>(BufferClass::activations)], 0u);
}

// Largest-first placement fragments this set: the two 5-unit buffers tie on size, the one first
// used goes above the 6-unit buffer it meets at step 4, the other below it, and the 4-unit buffer
// of step 7 finds only a 1-unit gap between them (15 units). Placing the longest-lived first packs
// it into the live peak (14 units at step 7), as the arena then does. A whole-step buffer under
// them, a random unit and a shuffled request order change none of that.
TEST(MemoryPlan, ATieThatFragmentsLargestFirstPacksIntoTheLivePeak) {
  testing_support::FreshRandom random;
  for (int trial = 0; trial < 20; ++trial) {
    const size_t unit = kBufferAlignment * (1 + random.below(8));
    const size_t weights = kBufferAlignment * (1 + random.below(64));
    std::vector<BufferRequest> requests = {
        {"at step 4", 6 * unit, 4, 4, BufferClass::activations},
        {"at step 7", 5 * unit, 7, 7, BufferClass::activations},
        {"from step 4", 5 * unit, 4, 7, BufferClass::gradients},
        {"also at step 7", 4 * unit, 7, 7, BufferClass::activations},
        {"weights", weights, 0, 7, BufferClass::parameters},
    };
    for (size_t i = requests.size() - 1; i > 0; --i) std::swap(requests[i], requests[random.below(i + 1)]);
    MemoryPlan plan = pack_buffers(requests, 8);
    expect_valid_packing(requests, plan);
    EXPECT_EQ(plan.peak_live_bytes, weights + 14 * unit);
    EXPECT_EQ(plan.peak_step, 7);
    EXPECT_EQ(plan.arena_bytes, plan.peak_live_bytes) << "unit " << unit << ", weights " << weights;
  }
}

TEST(MemoryPlan, RejectsBadLiveRange) {
  std::vector<BufferRequest> requests = {{"bad", 16, 3, 1, BufferClass::activations}};
  EXPECT_THROW(pack_buffers(requests, 5), Error);
}

}  // namespace
}  // namespace smelt
