// Learning-rate schedule: linear warmup, a stable phase, then linear / cosine / sqrt
// decay to lr * min_lr_factor (torchtitan's warmup-stable-decay).
#pragma once
#include <cstdint>
#include <string>

namespace smelt {

enum class DecayType { linear, cosine, sqrt };

struct LrSchedule {
  double lr = 0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double decay_ratio = -1;  // < 0: decay over every step after warmup
  DecayType decay = DecayType::linear;
  double min_lr_factor = 0;

  // Learning rate of training step `step` (1-based).
  double at(int64_t step) const;
};

DecayType parse_decay_type(const std::string& name);

}  // namespace smelt
