// Joining a multi-rank run and the non-writing ranks' side of checkpoints.
#include "train/trainer_ranks.h"

#include "dist/nccl_communicator.h"
#include "train/backends.h"

namespace smelt {

RunRanks join_ranks(const JobConfig& config, const LaunchEnvironment& env, Backend& backend, Communicator* given) {
  RunRanks ranks;
  const bool shards = config.parallelism.data_parallel_shard_degree > 1 || config.parallelism.shard_single_rank ||
                     config.parallelism.data_parallel_replicate_degree > 1;
  if (given) {
    ranks.communicator = given;
  } else if (env.distributed() || shards) {
    if (backend.device() == Device::cuda) {
      ranks.owned = make_nccl_communicator(env, backend_stream(backend));
      ranks.communicator = ranks.owned.get();
    } else if (!env.distributed()) {
      ranks.local = std::make_unique<LocalGroup>(1);  // the plan checks the degree against one rank
      ranks.communicator = &ranks.local->communicator(0);
    } else {
      fail(ErrorKind::config, "this process is rank " + std::to_string(env.rank) + " of " +
                                  std::to_string(env.world_size) + " (" + env.launcher +
                                  ") but job.device is cpu; multi-process training runs on GPUs (NCCL): set "
                                  "job.device = \"cuda\", or start one process");
    }
  }
  if (ranks.communicator) {
    ranks.rank = ranks.communicator->rank();
    ranks.world_size = ranks.communicator->world_size();
  }
  return ranks;
}

void take_part_in_checkpoint(Executor& executor) {
  executor.read_parameters(nullptr);
  executor.read_optimizer_state(nullptr, nullptr);
}

bool per_rank_checkpoints(const Executor& executor, const RunRanks& ranks) {
  return executor.sharded() && executor.shard_layout()->ranks() > 1 && ranks.communicator != nullptr &&
         ranks.world_size % executor.shard_layout()->ranks() == 0;
}

std::string rank_label(const RunRanks& ranks) {
  if (ranks.world_size <= 1) return "";
  return "rank " + std::to_string(ranks.rank) + "/" + std::to_string(ranks.world_size) + ": ";
}

}  // namespace smelt
