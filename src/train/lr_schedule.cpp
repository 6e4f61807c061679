// Warmup-stable-decay learning-rate schedule.
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace smelt {

DecayType parse_decay_type(const std::string& name) {
  if (name == "linear") return DecayType::linear;
  if (name == "cosine") return DecayType::cosine;
  if (name == "sqrt") return DecayType::sqrt;
  fail(ErrorKind::config, "lr_scheduler.decay_type: expected linear, cosine or sqrt, found '" + name + "'");
}

double LrSchedule::at(int64_t step) const {
  const int64_t warmup = std::min(warmup_steps, total_steps);
  if (step <= warmup && warmup > 0) return lr * static_cast<double>(step) / static_cast<double>(warmup);
  const int64_t after_warmup = total_steps - warmup;
  const int64_t decay_steps =
      decay_ratio < 0 ? after_warmup : static_cast<int64_t>(std::round(decay_ratio * static_cast<double>(total_steps)));
  const int64_t stable_end = total_steps - std::min(decay_steps, after_warmup);
  if (step <= stable_end || decay_steps <= 0) return lr;
  const double progress =
      std::clamp(static_cast<double>(step - stable_end) / static_cast<double>(decay_steps), 0.0, 1.0);
  double factor = 1;
  switch (decay) {
    case DecayType::linear: factor = 1 - progress; break;
    case DecayType::cosine: factor = 0.5 * (1 + std::cos(std::numbers::pi * progress)); break;
    case DecayType::sqrt: factor = 1 - std::sqrt(progress); break;
  }
  return lr * (min_lr_factor + (1 - min_lr_factor) * factor);
}

}  // namespace smelt
