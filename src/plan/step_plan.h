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
  output_head,          // output projection + cross-entropy, forward and backward, chunked
  final_norm_backward,
  layer_recompute,
  layer_backward,
  embedding_backward,
  gradient_norm,        // sum of squares of all gradients
  optimizer,            // clip + AdamW over the flat parameter range
  cast_weights,         // fp32 master -> compute copies (when the compute dtype is not f32)
  loss_reduce,          // mean of per-token losses
};

struct Step {
  StepKind kind;
  int layer = -1;       // for layer steps
  uint8_t op = 0;       // ForwardOp for forward / recompute, BackwardOp for backward
  double flops = 0;     // matmul + attention FLOPs
  std::string name() const;  // "forward layers.3.attention.wq"
};

struct PlanOptions {
  StepShape shape;
  DType compute_dtype = DType::f32;
  CheckpointPolicy policy;
  int64_t loss_chunk_tokens = 1024;
  size_t backend_workspace_bytes = 0;
  // One keep-set per block, overriding `policy` (what the automatic policy resolves to);
  // empty: every block follows `policy`. layer_input is always kept.
  std::vector<KeepSet> keep_sets;
  // FSDP / ZeRO-3 ranks: parameters, gradients, optimizer state and the compute copy are
  // divided by it, and all-gather / reduce-scatter buffers hold one unit's weights.
  // 1 (one device) leaves the plan exactly as without sharding.
  int64_t shard_degree = 1;
  // Float8 linears ([float8] recipe and filter_fqns); recipe none leaves the plan as without.
  Float8Options float8;
};

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
};

struct StepPlan {
  ModelConfig model;
  PlanOptions options;
  std::vector<Step> steps;
  std::vector<PlannedBuffer> buffers;
  std::vector<LayerBuffers> layers;
  std::vector<int> residual;  // n_layers + 1 residual-stream buffers
  // Buffers outside the blocks.
  int parameters = -1, gradients = -1, exp_avg = -1, exp_avg_sq = -1, compute_weights = -1;
  int tokens = -1, targets = -1, rope_frequencies = -1, workspace = -1;
  int final_norm_out = -1, final_rstd = -1, final_norm_out_grad = -1, residual_gradient = -1;
  int logits = -1, grad_logits = -1, losses = -1, loss = -1, grad_sum_squares = -1;
  // Sharded plans only (-1 otherwise): gathered weights (current unit and the prefetched
  // next one) and the unsharded gradients of one unit before its reduce-scatter.
  int gather_current = -1, gather_next = -1, reduce_scatter = -1;
  // Float8 plans only (-1 otherwise): quantised operands and their scales, one set reused by
  // every float8 linear (see Float8Scratch).
  int float8_operand_a = -1, float8_operand_b = -1, float8_scale_a = -1, float8_scale_b = -1;
  MemoryPlan memory;

  int64_t parameter_count() const;
  double step_flops() const;       // executed FLOPs, recompute included
  double recompute_flops() const;
  size_t bytes_of(BufferClass kind) const;  // sum of buffer sizes of a class (not packed)
  int64_t local_parameter_count() const;    // this rank's shard of the flat parameters
};

// Parameters of the largest unit FSDP gathers at once: one block, the embedding or the output head.
int64_t largest_gather_unit(const ModelConfig& model);

StepPlan build_step_plan(const ModelConfig& model, const PlanOptions& options);

}  // namespace smelt
