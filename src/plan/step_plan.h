// StepPlan: one training step as an ordered list of steps over planned buffers.
// Built from the model, the step shape, the compute dtype and the checkpointing
// policy; printed by `smelt plan`, executed by the trainer, asserted on by tests.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "core/memory_plan.h"
#include "core/tensor.h"
#include "model/fp8_linear.h"
#include "model/parameters.h"
#include "plan/checkpoint_policy.h"

namespace smelt {

enum class StepKind : uint8_t {
  embedding_forward,
  layer_forward,
  final_norm_forward,
  output_head,          // output projection + cross-entropy, forward and backward, chunked (unsharded
                        // bf16 plans: the projection's bf16 copy cast from the master first)
  final_norm_backward,
  layer_recompute,
  layer_backward,
  embedding_backward,
  gradient_norm,        // sum of squares of all gradients
  optimizer,            // clip + AdamW over the flat parameter range
  cast_weights,         // fp32 master weights -> float8 weight copies, after the optimizer (the fp32 ->
                        // compute-dtype cast of the other weights is fused into the optimizer step)
  loss_reduce,          // mean of per-token losses
  // Data-parallel plans only (shard_degree > 1 or replicate_degree > 1); `unit` names the
  // ShardLayout unit.
  all_gather,           // one unit's weights, compute dtype (or float8), from every rank's shard into a gather buffer
  reduce_scatter,       // one unit's gradients, averaged over the shard group, into this rank's gradient shard
  all_reduce_gradients, // replicate_degree > 1: one unit's gradients (plain data parallel) or gradient
                        // shard (HSDP), averaged over the replica group
  all_reduce_gradient_norm,  // the local sums of squares, summed over the shard group
  all_reduce_loss,      // the local mean losses, averaged over every rank
  // Float8 all-gather (PlanOptions::float8_all_gather), at the start of the step: every float8
  // linear's amax over this rank's shard, their max over the shard group (one collective for all
  // of them), and this rank's shards cast to e4m3 with those global scales.
  float8_shard_amax,
  all_reduce_float8_amax,
  float8_shard_cast,
};

struct Step {
  StepKind kind;
  int layer = -1;       // for layer steps
  uint8_t op = 0;       // ForwardOp for forward / recompute, BackwardOp for backward
  double flops = 0;     // matmul + attention FLOPs
  // Sharded plans only (-1 otherwise): the unit the step works on, the buffer holding that unit's
  // gathered weights and the one receiving its unsharded gradients (compute steps read and write
  // their weights and gradients there instead of the flat buffers).
  int unit = -1;
  // Reduce-scatter and all-reduce-gradients steps: which of the two gradient slots (reduce_scatter,
  // reduce_send, reduce_receive) the unit passes through is `op` (0 or 1).
  int gathered_weights = -1, unit_gradients = -1;
  std::string name() const;  // "forward layers.3.attention.wq", "all-gather layers.3"
};

// Steps that run once per optimizer step, after the last microbatch (the gradient norm, the
// update, the weight cast); every other step runs once per microbatch (PlanOptions::microbatches).
inline bool runs_once_per_step(StepKind kind) {
  return kind == StepKind::gradient_norm || kind == StepKind::all_reduce_gradient_norm ||
         kind == StepKind::optimizer || kind == StepKind::cast_weights;
}

struct PlanOptions {
  StepShape shape;  // one microbatch: what one forward-backward pass holds
  // Gradient accumulation: forward-backward passes per optimizer step, each over `shape`, adding
  // to the parameter gradients (then kept in the master dtype); the plan is one pass's, run that
  // many times, then the update. Memory does not grow with it; tokens per step do.
  int64_t microbatches = 1;
  DType compute_dtype = DType::f32;
  CheckpointPolicy policy;
  int64_t loss_chunk_tokens = 1024;
  size_t backend_workspace_bytes = 0;
  // Scratch the attention backward wants per call (Backend::attention_backward_scratch_bytes with
  // WorkspaceShape::attention_backward_planned): one buffer per block's backward attention step,
  // live only there, instead of a persistent part of the workspace. 0: none.
  size_t attention_backward_scratch_bytes = 0;
  // One keep-set per block, overriding `policy` (what the automatic policy resolves to);
  // empty: every block follows `policy`. layer_input is always kept.
  std::vector<KeepSet> keep_sets;
  // FSDP / ZeRO-3 ranks: parameters, gradients, optimizer state and the compute copy are
  // divided by it, and all-gather / reduce-scatter buffers hold one unit's weights.
  // 1 (one device) leaves the plan exactly as without sharding.
  int64_t shard_degree = 1;
  // Sharded plans: the dtype gradients travel in during the reduce-scatter (f32 or bf16); the
  // shards the optimizer reads stay f32.
  DType reduce_dtype = DType::f32;
  // Plain data parallelism / HSDP: replicas of the (sharded) model. World = shard_degree *
  // replicate_degree; shard groups are runs of shard_degree consecutive ranks. With shard_degree 1
  // every rank holds the whole model and each unit's gradients are all-reduced after its backward.
  int64_t replicate_degree = 1;
  // Sharded plans with float8 tensorwise: gather float8 linears' weights in e4m3 (scales from one
  // all-reduce of every linear's amax) instead of the compute dtype.
  bool float8_all_gather = false;
  // The FSDP schedule even with shard_degree 1 (collectives over one rank): measures what the
  // sharding machinery costs on one GPU, and tests it against the unsharded plan.
  bool shard_single_rank = false;
  // Sharded plans: free each block's gathered weights after its forward and gather them again for
  // its backward (torchtitan's reshard_after_forward), or keep them from forward to backward in a
  // buffer per block (false: no backward gathers, the blocks' whole weights held meanwhile).
  bool reshard_after_forward = true;
  // Float8 linears ([float8] recipe and filter_fqns); recipe none leaves the plan as without.
  Float8Options float8;
  // Unsharded plans with a bf16 compute dtype: the dtype the block linears' weight gradients are
  // kept in. bf16 is what their grad-weight GEMMs round to anyway in PyTorch's mixed precision
  // (autocast widens the rounded values to f32 afterwards); kept in bf16 they take half the memory
  // and half the bytes for the gradient norm and AdamW to read. So does the output projection's
  // when the head runs in one loss chunk (loss_chunk_tokens >= tokens: written once; over several
  // chunks it is accumulated, in the master dtype). The embedding's and the norms' stay in the
  // master dtype. Sharded and replicated plans keep every gradient in the master dtype (their
  // reduce dtype is reduce_dtype).
  DType linear_grad_dtype = DType::f32;
  // Unsharded plans with a compute copy: the output projection's compute-dtype copy is persistent,
  // written by AdamW with the others, instead of cast from the master by the output head at each
  // step into a buffer live only there. The persistent copy saves the cast's pass over the master
  // (4 + 2 bytes per element against AdamW's 2) but holds its bytes across the whole step; it
  // costs no memory where the output head is the peak (choose_persistent_output_copy, plan/output_copy.h).
  bool persistent_output_copy = false;
  // An evaluation plan (smelt eval, smelt generate): the forward steps, the final norm, the output
  // head's projection and per-token losses, and the loss reduction; no backward, no gradients, no
  // optimizer state. Every activation then lives only until its last forward reader, whatever the
  // policy says. Without float8 linears the weights are held in the compute dtype alone (the
  // values a training step's compute copy holds; no master); float8 linears quantise theirs from
  // the fp32 master, as training does. Unsharded, one microbatch.
  bool forward_only = false;
};

// The dtype of the plan's flat parameters: the master dtype (f32; f64 for f64 compute), or the
// compute dtype in forward-only plans without float8 linears.
DType parameter_dtype(const PlanOptions& options);

struct PlannedBuffer {
  BufferRequest request;
  DType dtype = DType::f32;
  Shape shape;
};

// Buffer ids of one block: what its forward writes, what its backward reads
// (the same id when kept, a recompute buffer otherwise), its gradient temporaries.
struct LayerBuffers {
  std::array<int, kActivationCount> forward{};
  std::array<int, kActivationCount> backward{};
  std::array<int, kGradientCount> gradient{};
  KeepSet kept{};
  std::array<bool, kForwardOpCount> recomputed{};
  std::array<bool, kLayerWeightCount> float8{};  // linears whose GEMMs run in float8
  // Activations kept for the backward as float8 x^T (float8_saved_inputs): the buffer holding it
  // (values, then scales; float8_saved_input_view), written by the forward and read by the
  // backward in place of lb.backward, whose compute-dtype buffer then lives only in the forward.
  // -1 for the others.
  std::array<int, kActivationCount> float8_saved = [] {
    std::array<int, kActivationCount> none;
    none.fill(-1);
    return none;
  }();
  int attention_scratch = -1;  // the backward attention step's scratch (-1: the workspace holds it)
};

// Floats per block of StepPlan::float8_producer_amax.
inline constexpr int64_t kProducerAmaxPerBlock = 6;

struct StepPlan {
  ModelConfig model;
  PlanOptions options;
  std::vector<Step> steps;
  std::vector<PlannedBuffer> buffers;
  std::vector<LayerBuffers> layers;
  std::vector<int> residual;  // n_layers + 1 residual-stream buffers
  // Buffers outside the blocks.
  int parameters = -1, gradients = -1, exp_avg = -1, exp_avg_sq = -1, compute_weights = -1;
  // Unsharded plans with a compute copy: which runs of the flat parameters have one, and where in
  // compute_weights (see compute_copy_ranges); AdamW writes the copy over these runs. The runs
  // also say where each one's gradients are: in `gradients`, or with bf16 linear gradients
  // (low_precision_linear_grads) in `linear_gradients`, each packed in parameter order.
  std::vector<ParameterRun> compute_copy_ranges;
  int linear_gradients = -1;
  // separate_embedding_gradient plans: the embedding's f32 gradient, live only from its backward
  // to the optimizer (its run of compute_copy_ranges has own_grad), so it is not held through the
  // forward and the rest of the backward (-1 otherwise: in `gradients`).
  int embedding_gradient = -1;
  // Unsharded plans with a compute copy: the output projection in the compute dtype, cast from the
  // master by the output-head step and live only during it (-1 otherwise: read from compute_weights).
  int output_weight = -1;
  int tokens = -1, targets = -1, rope_frequencies = -1, workspace = -1;
  int final_norm_out = -1, final_rstd = -1, final_norm_out_grad = -1, residual_gradient = -1;
  int logits = -1, grad_logits = -1, losses = -1, loss = -1, grad_sum_squares = -1;
  // Sharded plans only (-1 otherwise): two gather buffers used alternately (a unit's weights, and
  // the next unit's arriving meanwhile), two buffers of unsharded gradients used alternately (a
  // unit's backward writes one while the other's reduce-scatter is in flight), and with a bf16
  // reduce dtype the bf16 copies sent and the bf16 shards received, one per gradient buffer;
  // with gradient accumulation (microbatches > 1) and a master-dtype reduce, the shards received
  // in the master dtype (each pass's shard is added to the gradient shard, not written over it).
  // Each is sized by the largest unit that passes through it.
  // Plain data parallel plans use reduce_send alone: with a bf16 reduce, the bf16 copy a unit's
  // gradients are all-reduced in (two, alternately).
  // One rank per shard group (shard_degree 1, shard_single_rank): the collectives have nothing to
  // move, so they run in place. A unit's gathered weights are its part of the compute copy (or of
  // the master weights; with the float8 all-gather, its float8 linears' are its part of the e4m3
  // shards), and its gradients are written straight into its part of the gradient shard. The
  // all-gather and reduce-scatter steps remain, over those buffers, and no gather or reduce-scatter
  // buffer is planned.
  bool collectives_in_place = false;
  int gather_current = -1, gather_next = -1;
  // Without resharding after forward (PlanOptions::reshard_after_forward false): one gather buffer
  // per block, filled for its forward and read again by its backward; gather_current then serves
  // the embedding and the head.
  std::vector<int> gather_kept;
  std::array<int, 2> reduce_scatter{-1, -1}, reduce_send{-1, -1}, reduce_receive{-1, -1};
  // Float8 all-gather only (-1 otherwise): this rank's shards cast to e4m3 (local layout, one byte
  // per element), every float8 linear's amax then global scale, two e4m3 gather buffers (used
  // alternately like the compute-dtype ones), the gathered unit's W^T copies, and the elements of
  // float8-gathered units that are not float8 weights (norms): packed shard, and gathered.
  int float8_shards = -1, float8_gather_scales = -1, float8_remainder_shard = -1;
  std::array<int, 2> float8_gather{-1, -1}, float8_remainder_gather{-1, -1};
  int float8_gather_transposed = -1;
  // Float8 plans only (-1 otherwise): the scratch every float8 linear reuses in turn (x, dy, dy^T,
  // x^T; per-use weight copies in sharded plans) and its amax and scales (see Float8Scratch).
  // Unsharded plans also keep every float8 linear's weight in float8 (W and W^T, quantised once per
  // step by the cast_weights step after the optimizer, placed by float8_weight_layout) and, for
  // tensorwise, each linear's input amax from the forward (reused by its grad-weight GEMM).
  // The float8 linears' scratch values: one buffer for the forward steps, one for the recompute
  // and backward steps, so neither is live across the output head in between; the amax and
  // scales (float8_statistics) are shared and persistent.
  int float8_scratch = -1, float8_scratch_backward = -1, float8_statistics = -1;
  int float8_weights = -1, float8_weight_scales = -1, float8_input_amax = -1;
  // Float8 amax taken by producers (float8_fused_amax): per block (kProducerAmaxPerBlock floats),
  // SwiGLU's output, d gate, d up, the attention norm's and the FFN norm's outputs, and the residual
  // gradient after the FFN norm's backward (wo's dy).
  int float8_producer_amax = -1;
  // Float8 weights' amax taken by AdamW (optimizer_takes_float8_weight_amax): layer * 7 + weight.
  int float8_weight_amax = -1;
  Float8ScratchSizes float8_sizes;
  Float8WeightLayout float8_weight_layout;
  MemoryPlan memory;

  int64_t parameter_count() const;
  // The block linears of every layer, and how many of them run in float8 (LayerBuffers::float8).
  struct LinearCount {
    int64_t float8 = 0, total = 0;
    bool all_float8() const { return float8 == total; }
  };
  LinearCount block_linears() const;
  double step_flops() const;       // executed FLOPs, recompute included
  double recompute_flops() const;
  size_t bytes_of(BufferClass kind) const;  // sum of buffer sizes of a class (not packed)
  int64_t local_parameter_count() const;    // this rank's shard of the flat parameters
  // Unsharded plans: where parameter `info`'s compute-dtype copy starts in compute_weights
  // (elements), or -1 when it has none (no compute copy, the embedding, float8 linears, the output
  // projection): its readers take the master weights (the output head: output_weight).
  int64_t compute_copy_offset(const ParameterInfo& info) const;
  // Unsharded plans: the buffer holding parameter `info`'s gradient (gradients, linear_gradients
  // or embedding_gradient) and the element it starts at there.
  struct GradientPlace {
    int buffer = -1;
    int64_t offset = 0;
  };
  GradientPlace gradient_place(const ParameterInfo& info) const;
  bool sharded() const { return options.shard_degree > 1 || options.shard_single_rank; }
  bool replicated() const { return options.replicate_degree > 1; }
  bool data_parallel() const { return sharded() || replicated(); }
  int64_t world_size() const { return options.shard_degree * options.replicate_degree; }
  bool float8_gathered() const { return float8_shards >= 0; }
  // Data-parallel plans: the dtype gradients travel in through the reduce-scatters (and through
  // the replicas' all-reduce of one pass's gradients): bf16 with parallelism.reduce_dtype
  // bfloat16, the master dtype otherwise.
  DType gradient_reduce_dtype() const;
  // The replicas' all-reduce: sharded plans that accumulate gradients over several passes
  // all-reduce the accumulated shard, in the master dtype; otherwise gradient_reduce_dtype.
  DType replica_reduce_dtype() const;

 private:
  // The run of compute_copy_ranges holding parameter `info` (it must lie within one).
  const ParameterRun& run_holding(const ParameterInfo& info, const char* caller) const;
};

// The persistent compute-dtype copy of an unsharded plan (compute dtype other than the master's)
// holds only what a compute-dtype GEMM or op reads across the step: the norms and the linears that
// run in the compute dtype. The embedding (its forward rounds the master rows it gathers), the
// float8 linears (quantised from the master) and, unless PlanOptions::persistent_output_copy, the
// output projection (cast from the master into StepPlan::output_weight by the output-head step,
// which alone reads it) have none. Returns the runs of the
// flat parameter range [0, ParameterLayout::total()) with and without a copy, in order, each
// copied run packed after the previous one (64-element aligned, like the flat layout); empty when
// the plan has no compute copy, or is sharded (its copy covers every element of the shard). With
// optimizer_takes_float8_weight_amax, each float8 linear's weight is a run of its own whose
// amax_slot is layer * 7 + weight. Each run's gradients are packed likewise, in the master dtype
// or (low_precision_linear_grads: the block linears, and the output projection when the head runs
// in one loss chunk) bf16: grad_offset and low_grad.
std::vector<ParameterRun> compute_copy_ranges(const ModelConfig& model, const PlanOptions& options);
// True when the block linears' weight gradients are kept in bf16 (PlanOptions::linear_grad_dtype):
// plans of one rank's whole model (neither sharded nor replicated) and one microbatch per step,
// with a bf16 compute dtype, that ask for it.
bool low_precision_linear_grads(const PlanOptions& options);
// True when the embedding's gradient has a buffer of its own (StepPlan::embedding_gradient) live
// from the embedding's backward to the optimizer: plans with a packed compute copy (unsharded, a
// compute dtype other than the master's), not replicated, one microbatch per step (accumulated
// gradients must outlive the pass), training. Nothing reads it before the embedding's backward, the
// step's last gradient, so the forward and the rest of the backward run without it.
bool separate_embedding_gradient(const PlanOptions& options);
// Gradient elements the runs place in bf16 (low) or in the master dtype's shared buffer (runs with
// own_grad are in neither).
int64_t gradient_elements(const std::vector<ParameterRun>& ranges, bool low);
// True when AdamW takes the tensorwise amax of every float8 linear's updated master weight (copy
// runs with amax slots, StepPlan::float8_weight_amax) and the weight cast skips its amax pass:
// unsharded plans with a compute copy, tensorwise with fusion "full".
bool optimizer_takes_float8_weight_amax(const PlanOptions& options);
// Elements of the compute copy the runs describe (0 for no runs).
int64_t compute_copy_elements(const std::vector<ParameterRun>& ranges);

// Parameters of the largest unit FSDP gathers at once: one block, the embedding or the output head.
int64_t largest_gather_unit(const ModelConfig& model);

// The activations a block keeps for its backward as float8 x^T (Float8Options::save_inputs_in_float8,
// with a recipe whose grad-weight GEMM is in float8): those it keeps whose every backward reader is
// the backward of a float8 linear taking it as x, that no recomputed op reads or writes. With
// Llama's block: the norms' outputs and SwiGLU's (attention's output is also read by attention's
// backward).
std::array<bool, kActivationCount> float8_saved_inputs(const LayerBuffers& lb, const Float8Options& float8);

StepPlan build_step_plan(const ModelConfig& model, const PlanOptions& options);

}  // namespace smelt
