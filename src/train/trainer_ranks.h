// The trainer's ranks: the communicator a run uses (given, from the launcher's environment, or
// none), and what ranks other than 0 do where rank 0 writes files (they take part in the gathers).
#pragma once
#include <memory>

#include "core/config.h"
#include "dist/communicator.h"
#include "dist/launch_environment.h"
#include "ops/backend.h"
#include "train/executor.h"

namespace smelt {

struct RunRanks {
  Communicator* communicator = nullptr;  // null: one device, no collectives
  int rank = 0, world_size = 1;
  bool leader() const { return rank == 0; }  // writes the run folder, metrics, weights, checkpoint indexes
  std::unique_ptr<Communicator> owned;       // NCCL, made here
  std::unique_ptr<LocalGroup> local;         // one in-process rank (shard_single_rank on the CPU)
};

// `given` (tests: ranks as threads) or one made from `env`: NCCL on CUDA when the environment
// names several ranks, or when the config shards (shard_degree > 1 or shard_single_rank); none
// otherwise. Several CPU processes are not supported (ErrorKind::config).
RunRanks join_ranks(const JobConfig& config, const LaunchEnvironment& env, Backend& backend, Communicator* given);

// What a checkpoint save reads from the executor, in the same order (CheckpointWriter::save):
// ranks other than 0 call it when a checkpoint is due so the collective reads line up
// (whole-model checkpoints only).
void take_part_in_checkpoint(Executor& executor);

// Whether each rank writes its own checkpoint files (sharded over several ranks, the shard groups
// covering the world: FSDP, or HSDP whose first shard group writes) rather than rank 0 the whole model.
bool per_rank_checkpoints(const Executor& executor, const RunRanks& ranks);

// A compact "rank 3/8" log prefix; "" for a single rank.
std::string rank_label(const RunRanks& ranks);

}  // namespace smelt
