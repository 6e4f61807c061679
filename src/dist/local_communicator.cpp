// In-process communicator: ranks are threads sharing a rendezvous table.
#include <barrier>
#include <cstring>

#include "core/error.h"
#include "dist/communicator.h"

namespace smelt {

namespace {

void check_host_f32(const TensorView& v, const char* what) {
  SMELT_CHECK(v.device == Device::cpu && v.dtype == DType::f32,
              std::string(what) + ": the local communicator works on host f32 views, got " + v.str());
}

}  // namespace

struct LocalGroup::State {
  explicit State(int world) : world_size(world), sync(world), pointers(static_cast<size_t>(world)) {}
  int world_size;
  std::barrier<> sync;
  std::vector<void*> pointers;
  std::vector<std::unique_ptr<Communicator>> communicators;
};

namespace {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(LocalGroup::State& state, int rank) : state_(state), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return state_.world_size; }

  void all_reduce_sum(TensorView data) override {
    check_host_f32(data, "all_reduce_sum");
    publish(data.data);
    const int64_t n = data.numel();
    // Each rank computes the rank-ordered sum of every element into a private result, then all write.
    std::vector<float> sum(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < state_.world_size; ++r) {
      const float* src = static_cast<const float*>(state_.pointers[static_cast<size_t>(r)]);
      for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += src[i];
    }
    state_.sync.arrive_and_wait();  // everyone has read every input
    std::memcpy(data.data, sum.data(), static_cast<size_t>(n) * sizeof(float));
    state_.sync.arrive_and_wait();
  }

  void all_gather(TensorView shard, TensorView full) override {
    check_host_f32(shard, "all_gather");
    check_host_f32(full, "all_gather");
    SMELT_CHECK(full.numel() == shard.numel() * state_.world_size, "all_gather: full must hold world_size shards");
    publish(shard.data);
    for (int r = 0; r < state_.world_size; ++r)
      std::memcpy(static_cast<char*>(full.data) + static_cast<size_t>(r) * shard.bytes(),
                  state_.pointers[static_cast<size_t>(r)], shard.bytes());
    state_.sync.arrive_and_wait();
  }

  void reduce_scatter_sum(TensorView full, TensorView shard) override {
    check_host_f32(full, "reduce_scatter_sum");
    check_host_f32(shard, "reduce_scatter_sum");
    SMELT_CHECK(full.numel() == shard.numel() * state_.world_size, "reduce_scatter_sum: full must hold world_size shards");
    publish(full.data);
    const int64_t n = shard.numel();
    float* out = shard.as<float>();
    for (int64_t i = 0; i < n; ++i) {
      float sum = 0;
      for (int r = 0; r < state_.world_size; ++r)
        sum += static_cast<const float*>(state_.pointers[static_cast<size_t>(r)])[rank_ * n + i];
      out[i] = sum;
    }
    state_.sync.arrive_and_wait();
  }

  void barrier() override { state_.sync.arrive_and_wait(); }

 private:
  // Makes this rank's buffer visible and waits until every rank's is.
  void publish(void* pointer) {
    state_.pointers[static_cast<size_t>(rank_)] = pointer;
    state_.sync.arrive_and_wait();
  }
  LocalGroup::State& state_;
  int rank_;
};

}  // namespace

LocalGroup::LocalGroup(int world_size) : state_(std::make_unique<State>(world_size)) {
  SMELT_CHECK(world_size >= 1, "LocalGroup needs at least one rank");
  for (int r = 0; r < world_size; ++r) state_->communicators.push_back(std::make_unique<LocalCommunicator>(*state_, r));
}

LocalGroup::~LocalGroup() = default;

Communicator& LocalGroup::communicator(int rank) { return *state_->communicators.at(static_cast<size_t>(rank)); }

}  // namespace smelt
