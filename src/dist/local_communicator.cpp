// In-process communicator: ranks are threads sharing a rendezvous table. Synchronous;
// a rank that fails abandons the group so the others stop waiting and fail too.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"
#include "core/numerics.h"
#include "dist/communicator.h"

namespace smelt {

namespace {

void check_host(const TensorView& v, const char* what) {
  if (v.device != Device::cpu || v.empty())
    fail(ErrorKind::internal, std::string(what) + ": the local communicator works on host views, found " + v.str() +
                                  "; use the NCCL communicator for device memory");
}

void check_reducible(const TensorView& v, const char* what) {
  check_host(v, what);
  if (v.dtype != DType::f32 && v.dtype != DType::f64 && v.dtype != DType::bf16)
    fail(ErrorKind::internal, std::string(what) + ": expected f32, f64 or bf16 data to reduce, found " + v.str());
}

// A reusable barrier that a failing rank can break: waiters then throw instead of hanging.
class BreakableBarrier {
 public:
  explicit BreakableBarrier(int count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    if (broken_) throw_broken();
    const uint64_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      wake_.notify_all();
      return;
    }
    wake_.wait(lock, [&] { return generation_ != generation || broken_; });
    if (generation_ == generation) throw_broken();
  }
  void break_all() {
    std::lock_guard lock(mutex_);
    broken_ = true;
    wake_.notify_all();
  }

 private:
  [[noreturn]] static void throw_broken() {
    fail(ErrorKind::internal, "local communicator: another rank failed while this one waited in a collective; "
                              "see that rank's error");
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  int count_, arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
};

// Element i of a reducible view, widened.
double load(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::f64: return v.as<const double>()[i];
    case DType::bf16: return bf16_to_float(v.as<const uint16_t>()[i]);
    default: return v.as<const float>()[i];
  }
}

}  // namespace

struct LocalGroup::State {
  explicit State(int world, State* parent = nullptr)
      : world_size(world), sync(world), pointers(static_cast<size_t>(world)), texts(static_cast<size_t>(world)),
        root(parent ? parent->root : this) {}
  int world_size;
  BreakableBarrier sync;
  std::vector<TensorView> pointers;
  std::vector<std::string> texts;
  std::vector<std::unique_ptr<Communicator>> communicators;
  // Split groups: the root owns every group split from it (directly or not), so one failure
  // releases them all; `forming` hands a new group from its first rank to the others.
  State* root;
  std::mutex groups_mutex;
  std::vector<std::shared_ptr<State>> groups;
  std::map<int, std::shared_ptr<State>> forming;

  void break_everything() {
    root->sync.break_all();
    std::lock_guard lock(root->groups_mutex);
    for (auto& group : root->groups) group->sync.break_all();
  }
};

namespace {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(LocalGroup::State& state, int rank) : state_(state), rank_(rank) {}
  LocalCommunicator(std::shared_ptr<LocalGroup::State> group, int rank)
      : state_(*group), rank_(rank), group_(std::move(group)) {}
  int rank() const override { return rank_; }
  int world_size() const override { return state_.world_size; }
  std::string name() const override { return "local threads"; }

  CollectiveHandle all_reduce(TensorView data, ReduceOp op) override {
    check_reducible(data, "all_reduce");
    guarded([&] {
      publish(data);
      const int64_t n = data.numel();
      check_peers(n, data.dtype, "all_reduce");
      std::vector<double> result(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) result[static_cast<size_t>(i)] = reduce(i, op, data.dtype);
      state_.sync.arrive_and_wait();  // every rank has read every input before anyone writes
      for (int64_t i = 0; i < n; ++i) store(data, i, result[static_cast<size_t>(i)]);
      state_.sync.arrive_and_wait();
    });
    return kNoCollective;
  }

  CollectiveHandle all_gather(TensorView shard, TensorView full) override {
    check_host(shard, "all_gather");
    check_host(full, "all_gather");
    if (full.dtype != shard.dtype || full.numel() != shard.numel() * state_.world_size)
      fail(ErrorKind::internal, "all_gather: expected `full` to hold " + std::to_string(state_.world_size) +
                                    " shards of " + shard.str() + ", found " + full.str());
    guarded([&] {
      publish(shard);
      check_peers(shard.numel(), shard.dtype, "all_gather");
      for (int r = 0; r < state_.world_size; ++r) {
        char* to = static_cast<char*>(full.data) + static_cast<size_t>(r) * shard.bytes();
        if (to != state_.pointers[static_cast<size_t>(r)].data)  // in place: this rank's part already there
          std::memcpy(to, state_.pointers[static_cast<size_t>(r)].data, shard.bytes());
      }
      state_.sync.arrive_and_wait();
    });
    return kNoCollective;
  }

  CollectiveHandle reduce_scatter(TensorView full, TensorView shard, ReduceOp op) override {
    check_reducible(full, "reduce_scatter");
    check_host(shard, "reduce_scatter");
    if (full.dtype != shard.dtype || full.numel() != shard.numel() * state_.world_size)
      fail(ErrorKind::internal, "reduce_scatter: expected `full` to hold " + std::to_string(state_.world_size) +
                                    " shards of " + shard.str() + ", found " + full.str());
    guarded([&] {
      publish(full);
      check_peers(full.numel(), full.dtype, "reduce_scatter");
      const int64_t n = shard.numel();
      std::vector<double> result(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) result[static_cast<size_t>(i)] = reduce(rank_ * n + i, op, full.dtype);
      state_.sync.arrive_and_wait();  // `shard` may alias this rank's part of `full`
      for (int64_t i = 0; i < n; ++i) store(shard, i, result[static_cast<size_t>(i)]);
      state_.sync.arrive_and_wait();
    });
    return kNoCollective;
  }

  void wait(CollectiveHandle) override {}
  void synchronize() override {}
  void barrier() override {
    guarded([&] { state_.sync.arrive_and_wait(); });
  }

  std::unique_ptr<Communicator> split(int color) override {
    const std::vector<std::string> colors = exchange_text(std::to_string(color));
    int size = 0, rank_in_group = 0, first = -1;
    for (int r = 0; r < state_.world_size; ++r) {
      if (std::stoi(colors[static_cast<size_t>(r)]) != color) continue;
      if (first < 0) first = r;
      if (r < rank_) ++rank_in_group;
      ++size;
    }
    std::shared_ptr<LocalGroup::State> group;
    guarded([&] {
      if (rank_ == first) {
        group = std::make_shared<LocalGroup::State>(size, &state_);
        std::lock_guard lock(state_.root->groups_mutex);
        state_.root->groups.push_back(group);
        state_.forming[color] = group;
      }
      state_.sync.arrive_and_wait();
      if (rank_ != first) group = state_.forming.at(color);
      state_.sync.arrive_and_wait();
      if (rank_ == 0) state_.forming.clear();  // the next split starts with a barrier
    });
    return std::make_unique<LocalCommunicator>(std::move(group), rank_in_group);
  }

  std::vector<std::string> exchange_text(const std::string& text) override {
    std::vector<std::string> all;
    guarded([&] {
      state_.texts[static_cast<size_t>(rank_)] = text;
      state_.sync.arrive_and_wait();
      all = state_.texts;
      state_.sync.arrive_and_wait();
    });
    return all;
  }

 private:
  // Runs a collective; if this rank fails inside it, the others are released (and fail) too.
  template <typename Body>
  void guarded(Body body) {
    try {
      body();
    } catch (...) {
      state_.break_everything();
      throw;
    }
  }

  // Makes this rank's view visible and waits until every rank's is.
  void publish(const TensorView& view) {
    state_.pointers[static_cast<size_t>(rank_)] = view;
    state_.sync.arrive_and_wait();
  }

  void check_peers(int64_t count, DType dtype, const char* what) const {
    for (int r = 0; r < state_.world_size; ++r) {
      const TensorView& peer = state_.pointers[static_cast<size_t>(r)];
      if (peer.numel() != count || peer.dtype != dtype)
        fail(ErrorKind::internal, std::string(what) + ": rank " + std::to_string(rank_) + " passed " +
                                      std::to_string(count) + " " + std::string(dtype_name(dtype)) +
                                      " elements, rank " + std::to_string(r) + " passed " + peer.str() +
                                      "; every rank must issue the same collectives");
    }
  }

  // Element i reduced over ranks in rank order: float additions for f32 and bf16 (as a GPU
  // reduction of those types would), double for f64.
  double reduce(int64_t i, ReduceOp op, DType dtype) const {
    if (op == ReduceOp::max) {
      double largest = load(state_.pointers[0], i);
      for (const auto& peer : state_.pointers) largest = std::max(largest, load(peer, i));
      return largest;
    }
    if (dtype == DType::f64) {
      double sum = 0;
      for (const auto& peer : state_.pointers) sum += load(peer, i);
      return op == ReduceOp::average ? sum / state_.world_size : sum;
    }
    float sum = 0;
    for (const auto& peer : state_.pointers) sum += static_cast<float>(load(peer, i));
    return op == ReduceOp::average ? sum / static_cast<float>(state_.world_size) : sum;
  }

  static void store(const TensorView& v, int64_t i, double value) {
    switch (v.dtype) {
      case DType::f64: v.as<double>()[i] = value; return;
      case DType::bf16: v.as<uint16_t>()[i] = float_to_bf16(static_cast<float>(value)); return;
      default: v.as<float>()[i] = static_cast<float>(value); return;
    }
  }

  LocalGroup::State& state_;
  int rank_;
  std::shared_ptr<LocalGroup::State> group_;  // split groups: keeps the group alive
};

}  // namespace

LocalGroup::LocalGroup(int world_size) {
  SMELT_CHECK(world_size >= 1, "LocalGroup needs at least one rank");
  state_ = std::make_unique<State>(world_size);
  for (int r = 0; r < world_size; ++r) state_->communicators.push_back(std::make_unique<LocalCommunicator>(*state_, r));
}

LocalGroup::~LocalGroup() = default;

void LocalGroup::abandon() { state_->break_everything(); }

Communicator& LocalGroup::communicator(int rank) { return *state_->communicators.at(static_cast<size_t>(rank)); }

}  // namespace smelt
