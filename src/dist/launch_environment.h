// Where this process sits in a multi-process run, read from the launcher's environment:
// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Slurm (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID) or Open MPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK).
#pragma once
#include <functional>
#include <string>

namespace smelt {

struct LaunchEnvironment {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_address = "127.0.0.1";  // where rank 0 listens for the rendezvous
  int master_port = 29500;
  std::string launcher = "none";             // "torchrun", "slurm", "mpi" or "none" (one process)
  double timeout_seconds = 300;              // SMELT_RENDEZVOUS_TIMEOUT: how long ranks wait for each other
  bool distributed() const { return world_size > 1; }
};

// `lookup(name)` returns the variable's value or null (std::getenv by default). Bad or partial
// settings (a rank outside the world, WORLD_SIZE without RANK) fail with ErrorKind::config.
LaunchEnvironment read_launch_environment(const std::function<const char*(const char*)>& lookup = {});

}  // namespace smelt
