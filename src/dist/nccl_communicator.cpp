// The NCCL communicator: a TCP rendezvous for the unique id, ncclCommInitRank, collectives on
// their own stream ordered against the compute stream with events from a fixed ring.
#include "dist/nccl_communicator.h"

#include "core/error.h"

#ifdef SMELT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <array>
#include <cstring>
#include <memory>

#include "dist/tcp_rendezvous.h"
#endif

namespace smelt {

#ifndef SMELT_HAVE_NCCL

bool nccl_available() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(const LaunchEnvironment& env, void*) {
  fail(ErrorKind::config, "this smelt was built without NCCL (SMELT_CUDA=OFF or nccl.h not found), so it cannot "
                          "join a run of " + std::to_string(env.world_size) +
                              " ranks; rebuild with CUDA and NCCL (scripts/build) on the GPU machine");
}

#else

namespace {

#define SMELT_NCCL_CHECK(call)                                                                              \
  do {                                                                                                      \
    const ncclResult_t status_ = (call);                                                                    \
    if (status_ != ncclSuccess)                                                                             \
      ::smelt::fail(::smelt::ErrorKind::device, std::string("NCCL: ") + #call + " failed: " +               \
                                                    ncclGetErrorString(status_) +                           \
                                                    "; run with NCCL_DEBUG=INFO to see why");               \
  } while (0)

#define SMELT_NCCL_CUDA_CHECK(call)                                                                          \
  do {                                                                                                      \
    const cudaError_t status_ = (call);                                                                     \
    if (status_ != cudaSuccess)                                                                             \
      ::smelt::fail(::smelt::ErrorKind::device, std::string("CUDA: ") + #call + " failed: " +               \
                                                    cudaGetErrorString(status_));                           \
  } while (0)

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f64: return ncclFloat64;
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::e4m3:
    case DType::e5m2: return ncclUint8;  // gathered as bytes (never reduced)
  }
  return ncclUint8;
}

void check_device(const TensorView& v, const char* what) {
  if (v.device != Device::cuda || v.empty())
    fail(ErrorKind::internal, std::string(what) + ": the NCCL communicator works on device views, found " + v.str());
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const LaunchEnvironment& env, void* compute_stream)
      : rank_(env.rank), world_size_(env.world_size), rendezvous_(std::make_unique<TcpRendezvous>(env)),
        compute_(static_cast<cudaStream_t>(compute_stream)) {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (env.rank == 0) SMELT_NCCL_CHECK(ncclGetUniqueId(&id));
    const std::vector<std::string> all =
        rendezvous_->exchange(env.rank == 0 ? std::string(reinterpret_cast<const char*>(&id), sizeof id) : "");
    if (all[0].size() != sizeof id)
      fail(ErrorKind::device, "rendezvous: rank 0 sent a " + std::to_string(all[0].size()) +
                                  "-byte NCCL id, expected " + std::to_string(sizeof id) +
                                  "; every rank must run the same smelt build");
    std::memcpy(&id, all[0].data(), sizeof id);
    SMELT_NCCL_CHECK(ncclCommInitRank(&comm_, env.world_size, id, env.rank));
    SMELT_NCCL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    owns_stream_ = true;
    create_events();
  }

  // A group split from `parent`: its own NCCL communicator and events, the parent's streams.
  NcclCommunicator(ncclComm_t comm, cudaStream_t compute, cudaStream_t stream) : compute_(compute), stream_(stream), comm_(comm) {
    SMELT_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    SMELT_NCCL_CHECK(ncclCommCount(comm_, &world_size_));
    create_events();
  }

  ~NcclCommunicator() override {
    // No throwing here: report and carry on releasing.
    if (stream_) cudaStreamSynchronize(stream_);
    if (comm_) ncclCommDestroy(comm_);
    for (size_t i = 0; i < kEvents; ++i)
      for (cudaEvent_t event : {ready_[i], done_[i], begin_[i], end_[i]})
        if (event) cudaEventDestroy(event);
    if (stream_ && owns_stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string name() const override { return "nccl"; }
  // NCCL kernels are captured on the communication stream, which joins the capture through the
  // ready/done events; graph replays and eager collectives mix on one communicator (NCCL >= 2.11).
  bool capturable() const override { return true; }

  std::unique_ptr<Communicator> split(int color) override {
    ncclComm_t group = nullptr;
    SMELT_NCCL_CHECK(ncclCommSplit(comm_, color, rank_, &group, nullptr));
    if (!group)
      fail(ErrorKind::device, "NCCL: ncclCommSplit gave rank " + std::to_string(rank_) + " no communicator for color " +
                                  std::to_string(color) + "; every rank must pass a non-negative color");
    return std::make_unique<NcclCommunicator>(group, compute_, stream_);
  }

  CollectiveHandle all_reduce(TensorView data, ReduceOp op) override {
    check_device(data, "all_reduce");
    return issue([&] {
      SMELT_NCCL_CHECK(ncclAllReduce(data.data, data.data, static_cast<size_t>(data.numel()), nccl_type(data.dtype),
                                     nccl_op(op), comm_, stream_));
    });
  }

  CollectiveHandle all_gather(TensorView shard, TensorView full) override {
    check_device(shard, "all_gather");
    check_device(full, "all_gather");
    if (full.dtype != shard.dtype || full.numel() != shard.numel() * world_size_)
      fail(ErrorKind::internal, "all_gather: expected `full` to hold " + std::to_string(world_size_) +
                                    " shards of " + shard.str() + ", found " + full.str());
    return issue([&] {
      SMELT_NCCL_CHECK(ncclAllGather(shard.data, full.data, static_cast<size_t>(shard.numel()),
                                     nccl_type(shard.dtype), comm_, stream_));
    });
  }

  CollectiveHandle reduce_scatter(TensorView full, TensorView shard, ReduceOp op) override {
    check_device(full, "reduce_scatter");
    check_device(shard, "reduce_scatter");
    if (full.dtype != shard.dtype || full.numel() != shard.numel() * world_size_)
      fail(ErrorKind::internal, "reduce_scatter: expected `full` to hold " + std::to_string(world_size_) +
                                    " shards of " + shard.str() + ", found " + full.str());
    return issue([&] {
      SMELT_NCCL_CHECK(ncclReduceScatter(full.data, shard.data, static_cast<size_t>(shard.numel()),
                                         nccl_type(full.dtype), nccl_op(op), comm_, stream_));
    });
  }

  void wait(CollectiveHandle handle) override {
    if (handle == kNoCollective) return;
    // A handle older than the ring names a later collective's event: waiting for it is stronger, still correct.
    SMELT_NCCL_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_[static_cast<size_t>(handle) % kEvents], 0));
  }

  void enable_timing(bool enabled) override {
    timing_ = enabled;
    if (!enabled || begin_[0]) return;
    for (size_t i = 0; i < kEvents; ++i) {  // timing events, made once
      SMELT_NCCL_CUDA_CHECK(cudaEventCreate(&begin_[i]));
      SMELT_NCCL_CUDA_CHECK(cudaEventCreate(&end_[i]));
    }
  }
  CollectiveHandle issued() const override { return next_; }
  bool collective_window_ms(CollectiveHandle handle, void* reference_event, double* start, double* end) override {
    if (!reference_event || handle < 0 || handle >= next_) return false;
    const size_t slot = static_cast<size_t>(handle) % kEvents;
    if (timed_[slot] != handle) return false;  // issued untimed, or its events reused by a later one
    float from = 0, to = 0;
    const cudaEvent_t reference = static_cast<cudaEvent_t>(reference_event);
    if (cudaEventElapsedTime(&from, reference, begin_[slot]) != cudaSuccess ||
        cudaEventElapsedTime(&to, reference, end_[slot]) != cudaSuccess) {
      cudaGetLastError();  // not recorded or not finished: no window
      return false;
    }
    *start = from;
    *end = to;
    return true;
  }

  void synchronize() override { SMELT_NCCL_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void barrier() override { rendezvous().exchange(""); }
  std::vector<std::string> exchange_text(const std::string& text) override { return rendezvous().exchange(text); }

 private:
  static constexpr size_t kEvents = 256;

  // An average over one rank is the sum: NCCL runs a one-rank sum in place as nothing at all, but
  // an average (a pre-multiplied sum for floating types) as a scaling pass over the data.
  ncclRedOp_t nccl_op(ReduceOp op) const {
    switch (op) {
      case ReduceOp::average: return world_size_ == 1 ? ncclSum : ncclAvg;
      case ReduceOp::max: return ncclMax;
      case ReduceOp::sum: break;
    }
    return ncclSum;
  }

  TcpRendezvous& rendezvous() {
    if (!rendezvous_)
      fail(ErrorKind::internal, "barrier / exchange_text on a communicator split from another: call them on the "
                                "communicator of every rank (the parent)");
    return *rendezvous_;
  }

  void create_events() {
    timed_.fill(kNoCollective);
    for (size_t i = 0; i < kEvents; ++i) {
      SMELT_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&ready_[i], cudaEventDisableTiming));
      SMELT_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
  }

  // The collective starts after the compute stream's queued work and records its completion.
  template <typename Launch>
  CollectiveHandle issue(Launch launch) {
    const CollectiveHandle handle = next_++;
    const size_t slot = static_cast<size_t>(handle) % kEvents;
    SMELT_NCCL_CUDA_CHECK(cudaEventRecord(ready_[slot], compute_));
    SMELT_NCCL_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_[slot], 0));
    timed_[slot] = timing_ ? handle : kNoCollective;
    if (timing_) SMELT_NCCL_CUDA_CHECK(cudaEventRecord(begin_[slot], stream_));
    launch();
    if (timing_) SMELT_NCCL_CUDA_CHECK(cudaEventRecord(end_[slot], stream_));
    SMELT_NCCL_CUDA_CHECK(cudaEventRecord(done_[slot], stream_));
    return handle;
  }

  int rank_ = 0, world_size_ = 1;
  std::unique_ptr<TcpRendezvous> rendezvous_;  // null in split groups
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  bool owns_stream_ = false;
  ncclComm_t comm_ = nullptr;
  std::array<cudaEvent_t, kEvents> ready_{}, done_{};
  // Traces (enable_timing): timing events around each collective, and which handle a slot's are.
  bool timing_ = false;
  std::array<cudaEvent_t, kEvents> begin_{}, end_{};
  std::array<CollectiveHandle, kEvents> timed_{};
  CollectiveHandle next_ = 0;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(const LaunchEnvironment& env, void* compute_stream) {
  if (!compute_stream)
    fail(ErrorKind::config, "the NCCL communicator needs the CUDA backend's stream; train with job.device = \"cuda\"");
  return std::make_unique<NcclCommunicator>(env, compute_stream);
}

#endif

}  // namespace smelt
