// Executor, sharded half: the plan's collectives (all-gather of a unit's weights, reduce-scatter
// of its gradients, all-reduces of the loss and gradient norm), the waits that order compute
// after them, and moving whole-model host arrays to and from this rank's shards.
#include <algorithm>
#include <cstring>

#include "train/executor.h"

namespace smelt {

namespace {

// Elements [offset, offset + count) of a flat view.
TensorView flat_slice(const TensorView& v, int64_t offset, int64_t count) {
  SMELT_CHECK(offset >= 0 && offset + count <= v.numel(), "flat_slice out of range of " + v.str());
  return TensorView(static_cast<char*>(v.data) + static_cast<size_t>(offset) * dtype_size(v.dtype), v.dtype,
                    Shape{count}, v.device);
}

}  // namespace

void Executor::setup_sharding() {
  const int64_t degree = plan_.options.shard_degree;
  const int world = communicator_ ? communicator_->world_size() : 1;
  if (plan_.sharded() && !communicator_)
    fail(ErrorKind::config, "the plan shards over " + std::to_string(degree) +
                                " ranks (parallelism.data_parallel_shard_degree) but no communicator was given; "
                                "launch one process per GPU (scripts/run_train.sh) or set the degree to 1");
  if (world != degree)
    fail(ErrorKind::config, "parallelism.data_parallel_shard_degree is " + std::to_string(degree) + " but " +
                                std::to_string(world) + " ranks were started (" + communicator_->name() +
                                "); set --parallelism.data_parallel_shard_degree=" + std::to_string(world) +
                                " (plain data parallelism and HSDP are not implemented yet)");
  if (plan_.sharded()) {
    shard_layout_ = std::make_unique<ShardLayout>(layout_, degree);
    pending_.assign(plan_.buffers.size(), kNoCollective);
    SMELT_CHECK(shard_layout_->local_total() == plan_.buffers[static_cast<size_t>(plan_.parameters)].shape.numel(),
                "the plan's parameter shard does not match the shard layout");
  }
}

TensorView Executor::unit_view(int buffer, const ParameterInfo& info, const Step& step) const {
  if (buffer < 0 || step.unit < 0) return TensorView();
  const ShardUnit& unit = shard_layout_->unit(step.unit);
  if (info.offset < unit.offset || info.offset + info.numel() > unit.offset + unit.length) return TensorView();
  ParameterInfo relative = info;
  relative.offset -= unit.offset;
  return ParameterLayout::slice(view(buffer), relative);
}

void Executor::wait_for_buffers(const Step& step) {
  if (step.kind == StepKind::gradient_norm) finish_collectives();  // it reads every gradient shard
  for (int buffer : {step.gathered_weights, step.unit_gradients}) {
    if (buffer < 0) continue;
    auto& handle = pending_[static_cast<size_t>(buffer)];
    if (handle != kNoCollective) communicator_->wait(handle);
    handle = kNoCollective;
  }
}

// bf16 reduce: the shard received in `slot` (once its reduce-scatter is done) into the f32 gradients.
void Executor::finish_receive(int slot) {
  const int unit_index = receiving_unit_[static_cast<size_t>(slot)];
  if (unit_index < 0) return;
  const ShardUnit& unit = shard_layout_->unit(unit_index);
  const int receive = plan_.reduce_receive[static_cast<size_t>(slot)];
  communicator_->wait(pending_[static_cast<size_t>(receive)]);
  pending_[static_cast<size_t>(receive)] = kNoCollective;
  backend_.convert({flat_slice(view(receive), 0, unit.shard), flat_slice(view(plan_.gradients), unit.shard_offset, unit.shard)});
  receiving_unit_[static_cast<size_t>(slot)] = -1;
}

// Everything issued has landed (before the gradient norm reads the gradient shards).
void Executor::finish_collectives() {
  for (int slot = 0; slot < 2; ++slot) finish_receive(slot);
  for (auto& handle : pending_) {
    if (handle != kNoCollective) communicator_->wait(handle);
    handle = kNoCollective;
  }
}

void Executor::run_collective(const Step& step) {
  Communicator& c = *communicator_;
  switch (step.kind) {
    case StepKind::all_gather: {
      const ShardUnit& unit = shard_layout_->unit(step.unit);
      const TensorView source = view(plan_.compute_weights >= 0 ? plan_.compute_weights : plan_.parameters);
      pending_[static_cast<size_t>(step.gathered_weights)] =
          c.all_gather(flat_slice(source, unit.shard_offset, unit.shard), flat_slice(view(step.gathered_weights), 0, unit.padded));
      return;
    }
    case StepKind::reduce_scatter: {
      const ShardUnit& unit = shard_layout_->unit(step.unit);
      const TensorView gradients = view(step.unit_gradients);
      for (const auto& [first, last] : unit.gaps) backend_.fill(flat_slice(gradients, first, last - first), 0.0f);
      const int slot = step.unit_gradients == plan_.reduce_scatter[0] ? 0 : 1;
      const int send = plan_.reduce_send[static_cast<size_t>(slot)];
      if (send < 0) {  // gradients travel in the master dtype, straight into the shard
        const CollectiveHandle handle = c.reduce_scatter(flat_slice(gradients, 0, unit.padded),
                                                         flat_slice(view(plan_.gradients), unit.shard_offset, unit.shard),
                                                         ReduceOp::average);
        pending_[static_cast<size_t>(step.unit_gradients)] = handle;
        pending_[static_cast<size_t>(plan_.gradients)] = handle;  // the latest; earlier ones precede it
        return;
      }
      finish_receive(slot);  // the unit before last used these bf16 buffers
      communicator_->wait(pending_[static_cast<size_t>(send)]);
      const TensorView sent = flat_slice(view(send), 0, unit.padded);
      backend_.convert({flat_slice(gradients, 0, unit.padded), sent});
      const int receive = plan_.reduce_receive[static_cast<size_t>(slot)];
      const CollectiveHandle handle = c.reduce_scatter(sent, flat_slice(view(receive), 0, unit.shard), ReduceOp::average);
      pending_[static_cast<size_t>(send)] = handle;
      pending_[static_cast<size_t>(receive)] = handle;
      receiving_unit_[static_cast<size_t>(slot)] = step.unit;
      return;
    }
    case StepKind::all_reduce_gradient_norm:
      finish_collectives();  // no-op when the gradient norm step already waited
      c.wait(c.all_reduce(view(plan_.grad_sum_squares), ReduceOp::sum));
      return;
    case StepKind::all_reduce_loss: c.wait(c.all_reduce(view(plan_.loss), ReduceOp::average)); return;
    default: break;
  }
  SMELT_CHECK(false, "run_collective: not a collective step: " + step.name());
}

// Whole-model host array (flat layout, f32) -> this rank's shard of every unit in `buffer`.
void Executor::scatter_to_shards(const float* host, int buffer) {
  const TensorView local = view(buffer);
  const int rank = communicator_->rank();
  std::vector<double> shard(static_cast<size_t>(local.numel()), 0.0);
  for (const ShardUnit& unit : shard_layout_->units())
    for (int64_t k = 0; k < unit.shard; ++k) {
      const int64_t position = rank * unit.shard + k;  // within the unit
      if (position < unit.length) shard[static_cast<size_t>(unit.shard_offset + k)] = host[unit.offset + position];
    }
  if (local.dtype == DType::f64) {
    backend_.copy_to_device(local, shard.data());
  } else {
    std::vector<float> narrow(shard.begin(), shard.end());
    backend_.copy_to_device(local, narrow.data());
  }
}

// Collective: every rank's shards of `buffer` -> the whole-model host array (null: take part only).
// Staged through the first reduce-scatter buffer (master dtype), a piece of every unit at a time.
void Executor::gather_from_shards(int buffer, float* host) {
  Communicator& c = *communicator_;
  finish_collectives();
  const TensorView local = view(buffer), staging = view(plan_.reduce_scatter[0]);
  const int64_t ranks = shard_layout_->ranks();
  const int64_t piece = staging.numel() / ranks;
  SMELT_CHECK(piece > 0 && staging.dtype == local.dtype, "gather_from_shards: no staging buffer for " + local.str());
  std::vector<char> received(static_cast<size_t>(piece * ranks) * dtype_size(local.dtype));
  for (const ShardUnit& unit : shard_layout_->units())
    for (int64_t first = 0; first < unit.shard; first += piece) {
      const int64_t count = std::min(piece, unit.shard - first);
      const TensorView full = flat_slice(staging, 0, count * ranks);
      c.wait(c.all_gather(flat_slice(local, unit.shard_offset + first, count), full));
      c.synchronize();
      if (!host) continue;
      backend_.copy_to_host(received.data(), full);
      for (int64_t r = 0; r < ranks; ++r)
        for (int64_t k = 0; k < count; ++k) {
          const int64_t position = r * unit.shard + first + k;
          if (position >= unit.length) continue;
          const size_t index = static_cast<size_t>(r * count + k);
          host[unit.offset + position] = local.dtype == DType::f64
                                             ? static_cast<float>(reinterpret_cast<const double*>(received.data())[index])
                                             : reinterpret_cast<const float*>(received.data())[index];
        }
    }
}

void Executor::load_optimizer_state(const float* exp_avg, const float* exp_avg_sq) {
  if (sharded()) {
    scatter_to_shards(exp_avg, plan_.exp_avg);
    scatter_to_shards(exp_avg_sq, plan_.exp_avg_sq);
    return;
  }
  for (auto [buffer, host] : {std::pair{plan_.exp_avg, exp_avg}, std::pair{plan_.exp_avg_sq, exp_avg_sq}}) {
    const TensorView state = view(buffer);
    if (state.dtype == DType::f64) {  // f64 master (finite-difference tests)
      std::vector<double> wide(host, host + state.numel());
      backend_.copy_to_device(state, wide.data());
    } else {
      backend_.copy_to_device(state, host);
    }
  }
}

void Executor::read_optimizer_state(float* exp_avg, float* exp_avg_sq) {
  if (sharded()) {
    gather_from_shards(plan_.exp_avg, exp_avg);
    gather_from_shards(plan_.exp_avg_sq, exp_avg_sq);
    return;
  }
  for (auto [buffer, host] : {std::pair{plan_.exp_avg, exp_avg}, std::pair{plan_.exp_avg_sq, exp_avg_sq}}) {
    const TensorView state = view(buffer);
    if (!host) continue;
    if (state.dtype == DType::f64) {
      std::vector<double> wide(static_cast<size_t>(state.numel()));
      backend_.copy_to_host(wide.data(), state);
      std::copy(wide.begin(), wide.end(), host);
    } else {
      backend_.copy_to_host(host, state);
    }
  }
}

}  // namespace smelt
