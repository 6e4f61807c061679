// Communicator: the collectives data parallelism needs (all-reduce, all-gather,
// reduce-scatter) on views. NCCL implements it on GPUs; LocalCommunicator runs
// ranks as threads of one process so sharding is tested without GPUs.
#pragma once
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace smelt {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Element-wise sum over ranks, in place; every rank gets the same bits.
  virtual void all_reduce_sum(TensorView data) = 0;
  // Concatenates each rank's `shard` (same size everywhere) into `full`, rank order.
  virtual void all_gather(TensorView shard, TensorView full) = 0;
  // Sums `full` over ranks and leaves slice `rank` of the sum in `shard`.
  virtual void reduce_scatter_sum(TensorView full, TensorView shard) = 0;
  virtual void barrier() = 0;
};

// A group of `world_size` in-process ranks; communicator(r) is used by the thread of rank r.
// Reductions add in rank order, so results are deterministic and identical on every rank.
class LocalGroup {
 public:
  explicit LocalGroup(int world_size);
  ~LocalGroup();
  Communicator& communicator(int rank);

 struct State;  // the rendezvous table the ranks share (local_communicator.cpp)

 private:
  std::unique_ptr<State> state_;
};

}  // namespace smelt
