// Test support: random consecutive runs over a flat range, alternately copied and not, the shape
// of AdamwArgs::copy_ranges (CPU and CUDA optimizer tests share it).
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "ops/op_args.h"
#include "support/fresh_random.h"

namespace smelt::testing_support {

// Runs over [0, count), alternately copied and not (the first copied when `first_copied`),
// lengths multiples of 4 (some zero); copied runs packed into a copy of `copy_count` elements.
inline std::vector<ComputeCopyRange> random_copy_runs(int64_t count, uint64_t seed, bool first_copied,
                                                      int64_t& copy_count) {
  std::mt19937_64 generator(fresh(seed));
  std::vector<ComputeCopyRange> runs;
  bool copied = first_copied;
  copy_count = 0;
  for (int64_t begin = 0; begin < count;) {
    const int64_t length = std::min<int64_t>(count - begin, 4 * int64_t(generator() % 40));
    runs.push_back({begin, length, copied ? copy_count : -1});
    if (copied) copy_count += length;
    begin += length;
    copied = !copied;
  }
  return runs;
}

// Gives the runs without a copy amax slots in [0, slots - 1) (every third one none), so that some
// slots gather several runs and slot slots - 1 is named by none: the first two rounds of
// non-empty runs name every slot in turn (each slot gathers at least two), the rest at random.
inline void assign_amax_slots(std::vector<ComputeCopyRange>& runs, int32_t slots, uint64_t seed) {
  std::mt19937_64 generator(fresh(seed));
  int uncopied = 0, dealt = 0;
  for (ComputeCopyRange& run : runs) {
    if (run.copied()) continue;
    if (uncopied++ % 3 == 2) {
      run.amax_slot = -1;
    } else if (run.count > 0 && dealt < 2 * (slots - 1)) {
      run.amax_slot = dealt++ % (slots - 1);
    } else {
      run.amax_slot = int32_t(generator() % uint64_t(slots - 1));
    }
  }
}

}  // namespace smelt::testing_support
