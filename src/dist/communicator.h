// Communicator: the collectives data parallelism needs (all-reduce, all-gather,
// reduce-scatter) on views. NCCL implements it on GPUs; LocalCommunicator runs
// ranks as threads of one process so sharding is tested without GPUs.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace smelt {

enum class ReduceOp : uint8_t {
  sum,
  average,  // the sum divided by the world size (what data-parallel gradients and losses need)
  max,      // the largest value (float8 amax shared by every rank)
};

// Collectives are issued in order; on a GPU they run on the communicator's own stream, each
// starting after the work the backend had queued when it was issued. A collective returns a
// handle; wait(handle) orders the backend's later work after it (the host does not block).
// Synchronous implementations (the in-process one) finish before returning.
using CollectiveHandle = int64_t;
constexpr CollectiveHandle kNoCollective = -1;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;  // "local threads", "nccl"
  // Whether collectives may be issued while the backend's stream is being captured as a CUDA graph
  // (they then replay with it). Host-synchronous implementations cannot.
  virtual bool capturable() const { return false; }

  // Element-wise reduction over ranks, in place; every rank gets the same bits.
  virtual CollectiveHandle all_reduce(TensorView data, ReduceOp op) = 0;
  // Concatenates each rank's `shard` (same size and dtype everywhere) into `full`, rank order.
  // In place when `shard` is slice `rank` of `full`.
  virtual CollectiveHandle all_gather(TensorView shard, TensorView full) = 0;
  // Reduces `full` over ranks and leaves slice `rank` of the result in `shard` (same dtype). In
  // place when `shard` is slice `rank` of `full`.
  virtual CollectiveHandle reduce_scatter(TensorView full, TensorView shard, ReduceOp op) = 0;
  // Traces: with timing on, each collective issued records when it starts and ends on the
  // communication stream. issued() is the next handle (handles given out so far); after
  // synchronize(), collective_window_ms gives a handle's start and end in ms after
  // `reference_event` (a backend timing event, Backend::timing_event). Host-synchronous
  // implementations have no communication stream: they report nothing, and their collectives'
  // time is the compute track's.
  virtual void enable_timing(bool /*enabled*/) {}
  virtual CollectiveHandle issued() const { return 0; }
  virtual bool collective_window_ms(CollectiveHandle /*handle*/, void* /*reference_event*/, double* /*start*/,
                                    double* /*end*/) {
    return false;
  }
  // Makes the backend's later work wait for `handle` (no-op for kNoCollective and finished ones).
  virtual void wait(CollectiveHandle handle) = 0;
  // Blocks the host until every issued collective has finished.
  virtual void synchronize() = 0;
  virtual void barrier() = 0;

  // Start-up only (host memory, no device buffers): every rank's `text`, in rank order.
  virtual std::vector<std::string> exchange_text(const std::string& text) = 0;

  // Start-up only, collective: the ranks passing the same `color` form a new communicator
  // (HSDP's shard and replica groups), ranked in the order of their ranks here. Collectives of
  // the parent and of what is split from it run in the order they are issued (NCCL: on the
  // parent's stream). exchange_text and barrier stay on the parent.
  virtual std::unique_ptr<Communicator> split(int color) = 0;

  // Synchronous shorthands (tests, start-up).
  void all_reduce_sum(TensorView data) { wait(all_reduce(data, ReduceOp::sum)); }
  void reduce_scatter_sum(TensorView full, TensorView shard) { wait(reduce_scatter(full, shard, ReduceOp::sum)); }
};

// A group of `world_size` in-process ranks; communicator(r) is used by the thread of rank r.
// Reductions add in rank order (in float for f32 and bf16, rounded once; in double for f64), so
// results are deterministic and identical on every rank. Views must be host memory. Groups split
// from it share the rendezvous's failure: abandon() releases their waiters too.
class LocalGroup {
 public:
  explicit LocalGroup(int world_size);
  ~LocalGroup();
  Communicator& communicator(int rank);
  // Releases every rank waiting in a collective (they fail); for a rank that failed outside one.
  void abandon();

  struct State;  // the rendezvous table the ranks share (local_communicator.cpp)

 private:
  std::unique_ptr<State> state_;
};

// Start-up check that every rank runs the same configuration: exchanges `config_json` (the
// effective config as JSON) and fails (ErrorKind::config) on every rank, naming the ranks and
// the first key whose values differ.
void check_same_config(Communicator& communicator, const std::string& config_json);

}  // namespace smelt
