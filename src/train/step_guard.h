// Never train on garbage: before each optimizer update, a non-finite loss or gradient norm, or a
// loss spike (z-score against a window of recent losses), skips the update or stops the run.
#pragma once
#include <cstdint>
#include <iosfwd>

#include "core/config.h"
#include "train/checkpoint_index.h"

namespace smelt {

enum class StepVerdict { apply, skip };
enum class GuardAction { skip, stop };

class StepGuard {
 public:
  // Keeps its state (counts, loss window) in `progress`, so checkpoints carry it.
  StepGuard(const TrainingSection& settings, TrainingProgress& progress);

  // Judges step `step`; logs every skip; throws Error(internal) when the action is stop or the
  // run skipped more than max_consecutive_skips updates in a row. Applied steps enter the loss window.
  StepVerdict check(int64_t step, double loss, double gradient_norm, std::ostream& log);

  // The z-score of `loss` against the window (0 while the window is not full). The standard
  // deviation is floored at 0.1% of the mean so a flat window does not call noise a spike.
  double spike_zscore(double loss) const;

 private:
  GuardAction nonfinite_, spike_;
  int64_t window_;
  double zscore_;
  int64_t max_consecutive_skips_;
  int64_t consecutive_skips_ = 0;
  TrainingProgress& progress_;
};

}  // namespace smelt
