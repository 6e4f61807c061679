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

class Communicator;

// Runs the job. Progress goes to `log`; the run folder gets config.json and metrics.jsonl.
// Several ranks (parallelism.data_parallel_shard_degree > 1): `communicator` joins them (tests
// run ranks as threads); without one, the launcher's environment (torchrun, Slurm, Open MPI)
// says who this process is and NCCL joins the ranks. Each rank trains on its slice of every
// global batch; rank 0 writes the run folder, metrics, the checkpoint index and the final weights;
// every rank writes its own checkpoint shard files.
TrainResult train(const JobConfig& config, std::ostream& log, Communicator* communicator = nullptr);

}  // namespace smelt
