// Test support: random consecutive runs over a flat range, alternately copied and not, the shape
// of AdamwArgs::copy_ranges (CPU and CUDA optimizer tests share it), with amax slots and gradient
// places as plans give them.
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
inline std::vector<ParameterRun> random_copy_runs(int64_t count, uint64_t seed, bool first_copied,
                                                      int64_t& copy_count) {
  std::mt19937_64 generator(fresh(seed));
  std::vector<ParameterRun> runs;
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
inline void assign_amax_slots(std::vector<ParameterRun>& runs, int32_t slots, uint64_t seed) {
  std::mt19937_64 generator(fresh(seed));
  int uncopied = 0, dealt = 0;
  for (ParameterRun& run : runs) {
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

// Places the runs' gradients as a plan with bf16 linear gradients does: about half the runs (at
// random, at least one of each kind when there are two runs or more) in the bf16 low_grads, the
// others in the f32 grads, each kind packed in run order into `grad_count` and `low_count` elements.
inline void assign_gradient_places(std::vector<ParameterRun>& runs, uint64_t seed, int64_t& grad_count,
                                   int64_t& low_count) {
  std::mt19937_64 generator(fresh(seed));
  grad_count = low_count = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    ParameterRun& run = runs[r];
    run.low_grad = r == 0 ? false : r == 1 ? true : generator() % 2 == 0;
    int64_t& total = run.low_grad ? low_count : grad_count;
    run.grad_offset = total;
    total += run.count;
  }
}

}  // namespace smelt::testing_support
