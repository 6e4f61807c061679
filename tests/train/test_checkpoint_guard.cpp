// The step guard: non-finite losses and loss spikes skip the update (or stop the run), and
// skipped steps neither count as AdamW steps nor enter the loss window.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "train/step_guard.h"

namespace smelt {
namespace {

TEST(StepGuard, SkipsNonFiniteStepsAndStopsWhenAskedTo) {
  TrainingSection settings;
  TrainingProgress progress;
  StepGuard guard(settings, progress);
  std::ostringstream log;
  EXPECT_EQ(guard.check(1, 3.0, 1.0, log), StepVerdict::apply);
  EXPECT_EQ(guard.check(2, std::numeric_limits<double>::quiet_NaN(), 1.0, log), StepVerdict::skip);
  EXPECT_EQ(guard.check(3, 3.0, std::numeric_limits<double>::infinity(), log), StepVerdict::skip);
  EXPECT_EQ(guard.check(4, 2.9, 1.0, log), StepVerdict::apply);
  EXPECT_EQ(progress.optimizer_steps, 2);
  EXPECT_EQ(progress.skipped_steps, 2);
  EXPECT_NE(log.str().find("step 2: loss nan"), std::string::npos) << log.str();

  settings.on_nonfinite = "stop";
  TrainingProgress other;
  StepGuard stopping(settings, other);
  EXPECT_THROW(stopping.check(1, std::nan(""), 1.0, log), Error);
}

TEST(StepGuard, DetectsALossSpikeAgainstTheWindow) {
  TrainingSection settings;
  settings.loss_spike_window = 8;
  settings.loss_spike_zscore = 6;
  TrainingProgress progress;
  StepGuard guard(settings, progress);
  std::ostringstream log;
  for (int step = 1; step <= 8; ++step)
    EXPECT_EQ(guard.check(step, 3.0 + 0.05 * (step % 3), 1.0, log), StepVerdict::apply);  // std ~0.04
  EXPECT_EQ(progress.loss_window.size(), 8u);
  EXPECT_EQ(guard.check(9, 3.1, 1.0, log), StepVerdict::apply);     // within noise
  EXPECT_EQ(guard.check(10, 4.0, 1.0, log), StepVerdict::skip);     // ~20 standard deviations
  EXPECT_EQ(guard.check(11, 2.0, 1.0, log), StepVerdict::apply);    // downward moves are never spikes
  EXPECT_EQ(progress.loss_window.size(), 8u);
  EXPECT_EQ(progress.loss_window.back(), 2.0);

  settings.max_consecutive_skips = 2;
  TrainingProgress diverging;
  StepGuard strict(settings, diverging);
  EXPECT_EQ(strict.check(1, std::nan(""), 1.0, log), StepVerdict::skip);
  EXPECT_EQ(strict.check(2, std::nan(""), 1.0, log), StepVerdict::skip);
  EXPECT_THROW(strict.check(3, std::nan(""), 1.0, log), Error);
}

}  // namespace
}  // namespace smelt
