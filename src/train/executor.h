// Executor: runs a StepPlan's steps on a backend, with every buffer a view into
// the one arena the MemoryPlan sized. Owns no memory of its own.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "model/llama_ops.h"
#include "plan/shard_layout.h"
#include "plan/step_plan.h"

namespace smelt {

struct OptimizerSettings {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0, max_norm = 0;
  int64_t step = 1;
};

class Executor {
 public:
  // Allocates the arena (the run's one allocation) from the backend's memory resource.
  // A sharded plan (shard_degree N > 1) needs a communicator of N ranks; this executor then holds
  // this rank's shards and runs the plan's collectives through it. Without one (or with one
  // rank) the plan must be unsharded and the executor is the single-device one.
  Executor(const StepPlan& plan, Backend& backend, Communicator* communicator = nullptr);

  const StepPlan& plan() const { return plan_; }
  Backend& backend() { return backend_; }
  const Arena& arena() const { return *arena_; }
  TensorView view(int buffer) const;
  const ParameterLayout& layout() const { return layout_; }

  // Host-side setup: parameters (fp32, total() floats), zeroed optimizer state, rope table.
  // Sharded: load_parameters takes the whole model and keeps this rank's shards; the read
  // functions are collective (every rank calls them in the same order; a rank that only takes
  // part passes null) and return the whole model.
  void load_parameters(const float* host);
  void read_parameters(float* host);
  void reset_optimizer_state();
  void load_optimizer_state(const float* exp_avg, const float* exp_avg_sq);
  void read_optimizer_state(float* exp_avg, float* exp_avg_sq);

  // Sharded only: this rank's own shards of the master weights and both moments, as they sit in
  // its local buffers (ShardLayout::local_total() floats each; a unit's shard at its shard_offset),
  // without collectives. Per-rank checkpoints read and write these.
  void read_local_shards(float* parameters, float* exp_avg, float* exp_avg_sq);
  void load_local_shards(const float* parameters, const float* exp_avg, const float* exp_avg_sq);

  // Sharding (null / false for a single device). Data parallel: sharded, replicated or both
  // (HSDP: `communicator` is split into shard groups of shard_degree consecutive ranks and
  // replica groups across them).
  bool sharded() const { return shard_layout_ != nullptr; }
  bool data_parallel() const { return plan_.data_parallel(); }
  Communicator* communicator() const { return communicator_; }
  const ShardLayout* shard_layout() const { return shard_layout_.get(); }

  // Copies a batch (N ids each) into the token buffers.
  void load_batch(const int32_t* inputs, const int32_t* targets);
  // Runs every step of the plan once: run_gradients (everything but the update), then
  // run_update (the optimizer and the weight cast). A caller that inspects the loss and
  // gradient norm before deciding to update calls the two halves itself. A plan of one microbatch only.
  void run(const OptimizerSettings& optimizer);
  void run_gradients(const OptimizerSettings& optimizer);
  // Gradient accumulation (PlanOptions::microbatches = M): a step is run_microbatch(optimizer, k)
  // for k = 0 .. M-1, each after load_batch of its own tokens, then run_update. Microbatch 0
  // writes the gradients and the loss, the later ones add to them (the loss weighs each 1 / M,
  // and so does the loss gradient); the last also takes the gradient norm. With M = 1,
  // run_microbatch(optimizer, 0) is run_gradients. The first microbatch runs op by op, the
  // later ones replay one CUDA graph (they all add). Data parallel: sharded, each pass's
  // gradients are reduce-scattered and the shard received is added to the gradient shard;
  // replicas all-reduce the accumulated gradients (or shards) once, in the last pass; these
  // steps run op by op.
  void run_microbatch(const OptimizerSettings& optimizer, int64_t index);
  int64_t microbatches() const { return plan_.options.microbatches; }
  void run_update(const OptimizerSettings& optimizer);
  static bool is_update(const Step& step);
  // Runs the steps that compute the loss and nothing else (validation, finite differences):
  // the forward, the output head and the loss reduction.
  void run_loss(const OptimizerSettings& optimizer);
  void run_step(const Step& step, const OptimizerSettings& optimizer);

  // Whole-step graphs: after one eager step, run_gradients' steps are captured once and
  // replayed every step (the update, whose learning rate changes, runs eagerly); with several
  // microbatches, the steps of the later ones (which add to the gradients) are the graph. Ignored by backends without graphs and while timing is enabled.
  void enable_graph(bool enabled) { graph_wanted_ = enabled; }
  bool graph_active() const { return graph_captured_; }

  // Per-step timing for traces: when enabled, run() marks the backend's timeline around
  // every step (and names an NVTX range per step); step_milliseconds() reads them back
  // after the step (it synchronises).
  void enable_timing(bool enabled);
  std::vector<double> step_milliseconds();
  // With timing on, after step_milliseconds(): each step's collectives on the communication stream,
  // from the start of the first to the end of the last, in ms after the first step's mark
  // (the trace's time 0); {-1, -1} for steps that issued none or where the communicator cannot
  // time them (ranks as threads: their collectives run inside the compute steps).
  std::vector<std::pair<double, double>> collective_windows();

  // Float8 linears that read the same input in consecutive steps (wq, wk, wv; w1, w3) quantise
  // it once (on by default; off: each quantises its own, the same bytes). `float8_inputs_reused`
  // counts the quantisations skipped so far.
  void share_float8_inputs(bool enabled) { context_.float8_reuse = enabled ? &float8_reuse_ : nullptr; }
  int64_t float8_inputs_reused() const { return float8_reuse_.reused; }

  // Results of the last step, read from the backend (synchronises).
  double loss();
  double gradient_norm();

 private:
  // Which of the plan's steps a call runs (in plan order).
  enum class StepSet : uint8_t {
    gradients,      // everything but the update (a step of one microbatch)
    microbatch,     // everything but the update and the gradient norm (one of several microbatches)
    gradient_norm,  // the gradient norm, after the last microbatch
    updates,        // the optimizer and the weight cast
  };
  static bool in_set(StepSet set, StepKind kind);
  void run_indexed(size_t index, const OptimizerSettings& optimizer);
  void run_steps(StepSet set, const OptimizerSettings& optimizer);
  // Runs `set` as a CUDA graph where it can (the first call eagerly, the second captures it, later
  // ones replay it); one set per executor is ever graphed.
  void run_graphed(StepSet set, const OptimizerSettings& optimizer);
  LayerViews layer_views(const Step& step) const;
  HeadViews head_views(const Step& step) const;
  // Where `step` reads parameter `info` and writes its gradient: the flat buffers (the weight from
  // the compute copy, or from the master when the parameter has no copy: see
  // StepPlan::compute_copy_offset), or in a sharded plan the step's unit buffers (empty when not
  // in the step's unit).
  TensorView weight_view(const ParameterInfo& info, const Step& step) const;
  TensorView grad_view(const ParameterInfo& info, const Step& step) const;
  TensorView unit_view(int buffer, const ParameterInfo& info, const Step& step) const;
  TensorView unit_buffer(int buffer, const ShardUnit& unit) const;  // the unit's whole (padded) range in `buffer`
  // Unsharded: the compute copy (compute_weights) from the master weights, over the runs that have one.
  void fill_compute_copy();
  // AdamW where the embedding's gradient has a buffer of its own (StepPlan::embedding_gradient):
  // one call over the embedding, one over the rest with runs_after_embedding_.
  void run_adamw_split(const AdamwArgs& all);

  // Float8 (executor_float8.cpp): the scratch in the model context, each float8 linear's weight
  // copies and saved amax, and the cast of the weight copies from the master weights.
  void setup_float8();
  // The scratch a step's float8 linears use: the forward's, or the recompute and backward's.
  void select_float8_scratch(const Step& step);
  std::array<Float8LinearState, kLayerWeightCount> float8_states(int layer) const;
  // after_optimizer: the amax of each weight is the one AdamW just took (plan_.float8_weight_amax,
  // when the plan has it); otherwise (start-up, loaded weights) every amax is taken here.
  void quantize_float8_weights(bool after_optimizer = false);
  // Float8 all-gather: the amax / all-reduce / cast steps that fill this rank's e4m3 shards; the
  // gathered unit's norms unpacked and its W^T copies made (once per use); the layer's float8
  // linears pointed at the gathered e4m3 weights.
  void run_float8_gather_step(const Step& step);
  void gather_float8_unit(const ShardUnit& unit, int slot);
  void unpack_float8_remainder(int slot);
  void transpose_float8_unit(int layer, int slot);
  void gathered_float8_states(const Step& step, std::array<Float8LinearState, kLayerWeightCount>& states) const;
  void gathered_float8_states(int layer, int slot, std::array<Float8LinearState, kLayerWeightCount>& states) const;
  // In place both slots name the same local buffers, so the slot only matters with gather buffers.
  int gather_slot(int buffer) const { return buffer == plan_.gather_current ? 0 : 1; }
  // Where a float8 unit's gathered e4m3 weights are: a gather buffer, or in place the shards
  // (the buffer id, for the pending-collective bookkeeping, and the unit's span of it).
  int float8_rows_buffer(int slot) const {
    return plan_.collectives_in_place ? plan_.float8_shards : plan_.float8_gather[static_cast<size_t>(slot)];
  }
  TensorView float8_unit_rows(const ShardUnit& unit, int slot) const;

  // Sharded execution (executor_sharded.cpp).
  void setup_sharding();  // checks the communicator against the plan, splits it for HSDP
  void run_collective(const Step& step);
  void all_reduce_replicas(const Step& step);
  void set_pending(int buffer, Communicator& by, CollectiveHandle handle);
  void wait_pending(int buffer);
  void wait_for_buffers(const Step& step);
  void finish_receive(int slot);
  void finish_collectives();
  void scatter_to_shards(const float* host, int buffer);
  void gather_from_shards(int buffer, float* host);

  const StepPlan& plan_;
  Backend& backend_;
  ParameterLayout layout_;
  std::unique_ptr<Arena> arena_;
  ModelContext context_;
  Float8InputReuse float8_reuse_;
  Communicator* communicator_ = nullptr;
  std::unique_ptr<ShardLayout> shard_layout_;     // sharded plans only
  std::unique_ptr<ShardLayout> unit_layout_;      // data-parallel plans: units (of one rank when unsharded)
  // The groups collectives run over: gathers, reduce-scatters and the gradient norm over the shard
  // group; gradient all-reduces over the replica group; the loss over every rank.
  Communicator* shard_group_ = nullptr;
  Communicator* replica_group_ = nullptr;
  std::unique_ptr<Communicator> shard_split_, replica_split_;  // HSDP: split from communicator_
  struct Pending {
    Communicator* by = nullptr;
    CollectiveHandle handle = kNoCollective;
  };
  std::vector<Pending> pending_;                  // per buffer: the collective its users must wait for
  std::array<int, 2> receiving_unit_{-1, -1};     // bf16 reduce: the unit whose shard each receive buffer awaits
  // Gradient accumulation, sharded: whether each receive buffer's shard is added to the gradient
  // shard (a later microbatch's) or written over it (the step's first); set when it is issued.
  std::array<bool, 2> receiving_adds_{false, false};
  int64_t microbatch_ = 0;                        // the microbatch running (0 with one per step)
  // run_adamw_split: the first call's run (only where the embedding has a copy), and the second's
  // runs, begin counted from the embedding's end.
  std::vector<ParameterRun> embedding_run_, runs_after_embedding_;
  std::array<int, 2> float8_unpack_unit_{-1, -1}; // float8 all-gather: the unit whose norms each slot awaits
  Float8Scratch float8_forward_scratch_, float8_backward_scratch_;
  int float8_transposed_layer_ = -1;              // the layer whose W^T copies are made
  // Timing: the handles each step issued, per communicator (first, end).
  struct IssuedCollectives {
    Communicator* by;
    CollectiveHandle first, end;
  };
  std::vector<std::vector<IssuedCollectives>> issued_;
  std::vector<Communicator*> communicators() const;  // the distinct ones this rank issues on
  bool timing_ = false;
  std::vector<size_t> timed_order_;  // with timing: the steps in the order the last pass ran them
  bool evaluating_ = false;          // run_loss: the loss is one pass's mean, whatever the microbatches
  bool graph_wanted_ = false, graph_captured_ = false, graph_failed_ = false;
  int eager_runs_ = 0;
  std::vector<std::string> step_names_;
};

}  // namespace smelt
