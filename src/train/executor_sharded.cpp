// Executor, data-parallel half: the plan's collectives (all-gather of a unit's weights,
// reduce-scatter of its gradients, all-reduces over replicas, of the loss and gradient norm), the
// groups they run over, the waits that order compute after them, and moving whole-model host
// arrays to and from this rank's shards.
#include <algorithm>
#include <cstring>

#include "train/executor.h"

namespace smelt {

void Executor::setup_sharding() {
  const int64_t shard = plan_.options.shard_degree, replicas = plan_.options.replicate_degree;
  const int64_t ranks = plan_.world_size();
  const int world = communicator_ ? communicator_->world_size() : 1;
  const std::string degrees = "parallelism.data_parallel_shard_degree (" + std::to_string(shard) +
                              ") x parallelism.data_parallel_replicate_degree (" + std::to_string(replicas) + ") = " +
                              std::to_string(ranks);
  if (plan_.data_parallel() && !communicator_)
    fail(ErrorKind::config, "the plan runs over " + std::to_string(ranks) + " ranks (" + degrees +
                                ") but no communicator was given; launch one process per GPU (scripts/run_train.sh) "
                                "or set the degrees to 1");
  if (world != ranks) {
    std::string hint = "set the degrees so that they multiply to " + std::to_string(world);
    if (world % replicas == 0)
      hint = "set --parallelism.data_parallel_shard_degree=" + std::to_string(world / replicas) + " (or change " +
             "data_parallel_replicate_degree)";
    fail(ErrorKind::config, degrees + " but " + std::to_string(world) + " ranks were started (" +
                                communicator_->name() + "); the degrees must multiply to the number of ranks: " + hint);
  }
  if (!plan_.data_parallel()) return;
  pending_.assign(plan_.buffers.size(), Pending{});
  unit_layout_ = std::make_unique<ShardLayout>(layout_, plan_.sharded() ? shard : 1);
  if (plan_.float8_gathered()) {
    std::vector<std::array<bool, kLayerWeightCount>> float8;
    for (const auto& lb : plan_.layers) float8.push_back(lb.float8);
    unit_layout_->gather_in_float8(layout_, float8);
  }
  // Groups: shard groups are runs of `shard` consecutive ranks, replica groups take one rank of each.
  const int rank = communicator_->rank();
  if (plan_.sharded() && plan_.replicated()) {
    shard_split_ = communicator_->split(rank / static_cast<int>(shard));
    replica_split_ = communicator_->split(rank % static_cast<int>(shard));
    shard_group_ = shard_split_.get();
    replica_group_ = replica_split_.get();
  } else if (plan_.sharded()) {
    shard_group_ = communicator_;
  } else {
    replica_group_ = communicator_;
  }
  if (plan_.sharded()) {
    shard_layout_ = std::make_unique<ShardLayout>(*unit_layout_);
    SMELT_CHECK(shard_layout_->local_total() == plan_.buffers[static_cast<size_t>(plan_.parameters)].shape.numel(),
                "the plan's parameter shard does not match the shard layout");
  }
}

void Executor::set_pending(int buffer, Communicator& by, CollectiveHandle handle) {
  if (buffer >= 0) pending_[static_cast<size_t>(buffer)] = Pending{&by, handle};
}

void Executor::wait_pending(int buffer) {
  if (buffer < 0) return;
  Pending& p = pending_[static_cast<size_t>(buffer)];
  if (p.handle != kNoCollective) p.by->wait(p.handle);
  p = Pending{};
}

TensorView Executor::unit_buffer(int buffer, const ShardUnit& unit) const {
  // In place (StepPlan::collectives_in_place): the unit's part of a flat local
  // buffer, which at one rank per shard group is the whole unit; otherwise a gather or
  // reduce-scatter buffer holding one unit from its start.
  const bool local = buffer == plan_.parameters || buffer == plan_.compute_weights || buffer == plan_.gradients;
  SMELT_CHECK(!local || shard_layout_->ranks() == 1, "unit_buffer: a flat local buffer holds a whole unit only at one rank");
  return view(buffer).elements(local ? unit.shard_offset : 0, unit.padded);
}

TensorView Executor::unit_view(int buffer, const ParameterInfo& info, const Step& step) const {
  if (buffer < 0 || step.unit < 0) return TensorView();
  const ShardUnit& unit = shard_layout_->unit(step.unit);
  if (info.offset < unit.offset || info.offset + info.numel() > unit.offset + unit.length) return TensorView();
  ParameterInfo relative = info;
  relative.offset -= unit.offset;
  return ParameterLayout::slice(unit_buffer(buffer, unit), relative);
}

void Executor::wait_for_buffers(const Step& step) {
  if (step.kind == StepKind::gradient_norm) finish_collectives();  // it reads every gradient shard
  for (int buffer : {step.gathered_weights, step.unit_gradients}) wait_pending(buffer);
  if (step.gathered_weights >= 0 && plan_.float8_gathered()) {
    const int slot = gather_slot(step.gathered_weights);
    wait_pending(float8_rows_buffer(slot));
    unpack_float8_remainder(slot);
    if (step.kind == StepKind::layer_backward) transpose_float8_unit(step.layer, slot);
  }
}

// bf16 reduce: the shard received in `slot` (once its reduce-scatter is done) into the f32
// gradients; plain data parallel: the unit's all-reduced bf16 copy back into the flat gradients.
void Executor::finish_receive(int slot) {
  const int unit_index = receiving_unit_[static_cast<size_t>(slot)];
  if (unit_index < 0) return;
  receiving_unit_[static_cast<size_t>(slot)] = -1;
  const ShardUnit& unit = unit_layout_->unit(unit_index);
  if (!sharded()) {
    const int send = plan_.reduce_send[static_cast<size_t>(slot)];
    wait_pending(send);
    backend_.convert({view(send).elements(0, unit.length), view(plan_.gradients).elements(unit.offset, unit.length)});
    return;
  }
  const int receive = plan_.reduce_receive[static_cast<size_t>(slot)];
  wait_pending(receive);
  backend_.convert({view(receive).elements(0, unit.shard), view(plan_.gradients).elements(unit.shard_offset, unit.shard),
                    receiving_adds_[static_cast<size_t>(slot)]});
}

// Everything issued has landed (before the gradient norm reads the gradient shards).
void Executor::finish_collectives() {
  for (int slot = 0; slot < 2; ++slot) finish_receive(slot);
  for (size_t buffer = 0; buffer < pending_.size(); ++buffer) wait_pending(static_cast<int>(buffer));
}

// After a unit's gradients are reduced over the shard group (or, unsharded, computed): their
// average over the replica group. f32 in place; bf16 through the bf16 buffers (see finish_receive).
void Executor::all_reduce_replicas(const Step& step) {
  Communicator& c = *replica_group_;
  const ShardUnit& unit = unit_layout_->unit(step.unit);
  const int slot = step.op;
  if (sharded()) {
    // The shard, in place in the f32 gradients: what the step accumulated (the last pass only,
    // once its receive is added: finish_receive), or what the reduce-scatter wrote there.
    if (plan_.options.microbatches > 1 || plan_.reduce_receive[0] < 0) {
      finish_receive(slot);  // nothing to add without accumulation
      const CollectiveHandle handle =
          c.all_reduce(view(plan_.gradients).elements(unit.shard_offset, unit.shard), ReduceOp::average);
      set_pending(plan_.gradients, c, handle);
      return;
    }
    const int receive = plan_.reduce_receive[static_cast<size_t>(slot)];  // the bf16 shard, before it is widened
    set_pending(receive, c, c.all_reduce(view(receive).elements(0, unit.shard), ReduceOp::average));
    return;
  }
  if (step.unit_gradients < 0) {  // plain data parallel, in place
    set_pending(plan_.gradients, c,
                c.all_reduce(view(plan_.gradients).elements(unit.offset, unit.length), ReduceOp::average));
    return;
  }
  finish_receive(slot);  // the unit before last used this bf16 copy
  const TensorView copy = view(step.unit_gradients).elements(0, unit.length);
  backend_.convert({view(plan_.gradients).elements(unit.offset, unit.length), copy});
  set_pending(step.unit_gradients, c, c.all_reduce(copy, ReduceOp::average));
  receiving_unit_[static_cast<size_t>(slot)] = step.unit;
}

void Executor::run_collective(const Step& step) {
  switch (step.kind) {
    case StepKind::all_gather: {
      Communicator& c = *shard_group_;
      const ShardUnit& unit = shard_layout_->unit(step.unit);
      if (unit.float8_gathered()) return gather_float8_unit(unit, gather_slot(step.gathered_weights));
      const TensorView source = view(plan_.compute_weights >= 0 ? plan_.compute_weights : plan_.parameters);
      // In place at one rank: the shard is the whole gathered unit (NCCL then moves nothing).
      set_pending(step.gathered_weights, c,
                  c.all_gather(source.elements(unit.shard_offset, unit.shard), unit_buffer(step.gathered_weights, unit)));
      return;
    }
    case StepKind::reduce_scatter: {
      Communicator& c = *shard_group_;
      const ShardUnit& unit = shard_layout_->unit(step.unit);
      const TensorView gradients = unit_buffer(step.unit_gradients, unit);  // in place: the shard itself
      for (const auto& [first, last] : unit.gaps) backend_.fill(gradients.elements(first, last - first), 0.0f);
      const int slot = step.op;
      const int send = plan_.reduce_send[static_cast<size_t>(slot)];
      const int receive = plan_.reduce_receive[static_cast<size_t>(slot)];
      if (send < 0 && receive < 0) {  // gradients travel in the master dtype, straight into the shard
        const CollectiveHandle handle = c.reduce_scatter(gradients,
                                                         view(plan_.gradients).elements(unit.shard_offset, unit.shard),
                                                         ReduceOp::average);
        set_pending(step.unit_gradients, c, handle);
        set_pending(plan_.gradients, c, handle);  // the latest; earlier ones precede it
        return;
      }
      // Through a receive buffer: the bf16 shard, widened into the f32 shard, or (gradient
      // accumulation) the f32 shard, added to it in the later passes. finish_receive does either
      // once the collective is done; first the unit before last's, which used these buffers.
      finish_receive(slot);
      TensorView source = gradients;
      if (send >= 0) {  // bf16: the unit's gradients narrowed into the send buffer first
        wait_pending(send);
        source = view(send).elements(0, unit.padded);
        backend_.convert({gradients.elements(0, unit.padded), source});
      }
      const CollectiveHandle handle = c.reduce_scatter(source, view(receive).elements(0, unit.shard), ReduceOp::average);
      set_pending(send >= 0 ? send : step.unit_gradients, c, handle);
      set_pending(receive, c, handle);
      receiving_unit_[static_cast<size_t>(slot)] = step.unit;
      receiving_adds_[static_cast<size_t>(slot)] = microbatch_ > 0;  // gradient accumulation's later passes
      return;
    }
    case StepKind::all_reduce_gradients: return all_reduce_replicas(step);
    case StepKind::all_reduce_gradient_norm: {
      finish_collectives();  // no-op when the gradient norm step already waited
      Communicator& c = *shard_group_;
      c.wait(c.all_reduce(view(plan_.grad_sum_squares), ReduceOp::sum));
      return;
    }
    case StepKind::all_reduce_loss: communicator_->wait(communicator_->all_reduce(view(plan_.loss), ReduceOp::average)); return;
    case StepKind::float8_shard_amax:
    case StepKind::all_reduce_float8_amax:
    case StepKind::float8_shard_cast: return run_float8_gather_step(step);
    default: break;
  }
  SMELT_CHECK(false, "run_collective: not a collective step: " + step.name());
}

// Whole-model host array (flat layout, f32) -> this rank's shard of every unit in `buffer`.
void Executor::scatter_to_shards(const float* host, int buffer) {
  const TensorView local = view(buffer);
  const int rank = shard_group_->rank();
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
// Staged through the first reduce-scatter buffer (master dtype), a piece of every unit at a time;
// with one rank per shard group (no such buffer: reduce-scatters in place) the shards are the units.
void Executor::gather_from_shards(int buffer, float* host) {
  Communicator& c = *shard_group_;  // every shard group holds the whole model (HSDP: identical replicas)
  finish_collectives();
  const TensorView local = view(buffer);
  if (plan_.collectives_in_place) {
    SMELT_CHECK(shard_layout_->ranks() == 1, "gather_from_shards: in place needs one rank per shard group");
    if (!host) return;
    std::vector<double> shards(static_cast<size_t>(local.numel()));
    if (local.dtype == DType::f64) {
      backend_.copy_to_host(shards.data(), local);
    } else {
      std::vector<float> narrow(shards.size());
      backend_.copy_to_host(narrow.data(), local);
      std::copy(narrow.begin(), narrow.end(), shards.begin());
    }
    for (const ShardUnit& unit : shard_layout_->units())
      for (int64_t k = 0; k < unit.length; ++k)
        host[unit.offset + k] = static_cast<float>(shards[static_cast<size_t>(unit.shard_offset + k)]);
    return;
  }
  const TensorView staging = view(plan_.reduce_scatter[0]);
  const int64_t ranks = shard_layout_->ranks();
  const int64_t piece = staging.numel() / ranks;
  SMELT_CHECK(piece > 0 && staging.dtype == local.dtype, "gather_from_shards: no staging buffer for " + local.str());
  std::vector<char> received(static_cast<size_t>(piece * ranks) * dtype_size(local.dtype));
  for (const ShardUnit& unit : shard_layout_->units())
    for (int64_t first = 0; first < unit.shard; first += piece) {
      const int64_t count = std::min(piece, unit.shard - first);
      const TensorView full = staging.elements(0, count * ranks);
      c.wait(c.all_gather(local.elements(unit.shard_offset + first, count), full));
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

void Executor::read_local_shards(float* parameters, float* exp_avg, float* exp_avg_sq) {
  SMELT_CHECK(sharded(), "read_local_shards needs a sharded executor");
  finish_collectives();
  for (auto [buffer, host] : {std::pair{plan_.parameters, parameters}, std::pair{plan_.exp_avg, exp_avg},
                              std::pair{plan_.exp_avg_sq, exp_avg_sq}}) {
    const TensorView local = view(buffer);
    SMELT_CHECK(local.dtype == DType::f32, "read_local_shards: f32 master state expected, found " + local.str());
    backend_.copy_to_host(host, local);
  }
}

void Executor::load_local_shards(const float* parameters, const float* exp_avg, const float* exp_avg_sq) {
  SMELT_CHECK(sharded(), "load_local_shards needs a sharded executor");
  for (auto [buffer, host] : {std::pair{plan_.parameters, parameters}, std::pair{plan_.exp_avg, exp_avg},
                              std::pair{plan_.exp_avg_sq, exp_avg_sq}}) {
    const TensorView local = view(buffer);
    SMELT_CHECK(local.dtype == DType::f32, "load_local_shards: f32 master state expected, found " + local.str());
    backend_.copy_to_device(local, host);
  }
  if (plan_.compute_weights >= 0) backend_.convert({view(plan_.parameters), view(plan_.compute_weights)});
}

}  // namespace smelt
