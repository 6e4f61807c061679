// Trainer: the training loop. Plans, allocates once, initialises, then for each
// step loads a batch, runs the plan, and logs; validation every N steps.
#pragma once
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/config.h"

namespace smelt {

struct TrainResult {
  int64_t steps = 0;
  double first_loss = 0, final_loss = 0;
  double first_validation_loss = -1, final_validation_loss = -1;
  double median_tokens_per_second = 0;
  double median_tflops = 0;
  double seconds = 0;
  size_t arena_bytes = 0;
  std::string run_folder;
  std::vector<double> losses;  // every step's training loss
};

// Runs the job. Progress goes to `log`; the run folder gets config.json and metrics.jsonl.
TrainResult train(const JobConfig& config, std::ostream& log);

}  // namespace smelt
