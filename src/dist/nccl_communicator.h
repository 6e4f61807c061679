// The NCCL communicator: the Communicator interface over NCCL for multi-GPU runs. Collectives
// run on a stream of their own; each starts after the work queued on the compute stream when it
// was issued (an event), and wait() makes the compute stream wait for one (another event), so
// the next unit's all-gather and the last unit's reduce-scatter overlap the current compute.
// Plain C++ header; built only with CUDA (SMELT_HAVE_NCCL).
#pragma once
#include <memory>

#include "dist/communicator.h"
#include "dist/launch_environment.h"

namespace smelt {

// True when this smelt was built with NCCL.
bool nccl_available();

// Joins the run `env` describes: rendezvous over TCP at MASTER_ADDR:MASTER_PORT (rank 0 makes
// the NCCL unique id and hands it out), then one NCCL communicator of env.world_size ranks on
// the current CUDA device. `compute_stream` is the backend's cudaStream_t. Fails with
// ErrorKind::device (naming the rank that did not arrive, or NCCL's error) or, built without
// NCCL, says how to get it.
std::unique_ptr<Communicator> make_nccl_communicator(const LaunchEnvironment& env, void* compute_stream);

}  // namespace smelt
