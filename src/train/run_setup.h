// From a JobConfig to what a run needs before it allocates: the tokenizer, the
// model shapes, the checkpointing policy and the StepPlan.
#pragma once
#include <memory>
#include <ostream>

#include "core/config.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "ops/backend.h"
#include "plan/cost_model.h"
#include "plan/step_plan.h"

namespace smelt {

// The device a plan is made for when it is not the one at hand (smelt plan).
struct PlanTarget {
  std::string gpu = "h200";          // ceilings of the cost model for cuda configs: h200 or h100
  double device_memory_bytes = 0;    // 0: the GPU's memory (cuda) or this machine's (cpu)
  std::string op_timings_path;       // calibrated per-op timings (JSON); empty: ceilings only
};

struct RunSetup {
  JobConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  ModelConfig model;
  PlanOptions plan_options;          // with keep_sets filled when the policy is auto
  DeviceCeilings ceilings;           // memory_bytes: the device memory the plan is made for
  std::shared_ptr<OpTimingCache> op_timings;  // null without calibrated timings
  bool float8_linears = false;
  double memory_budget_bytes = 0;    // activation_checkpoint.memory_budget_gb, or memory minus the margin
  bool memory_budget_explicit = false;
  CostModel cost_model() const { return CostModel(ceilings, float8_linears, op_timings.get()); }
};

// What the arena may use of a device's memory by default: the memory minus a safety margin
// for the CUDA context, library handles and communication library buffers (max(2 GB, 3%)).
double default_memory_budget(double device_memory_bytes);

// Forward-backward passes per optimizer step (training.global_batch_size over local_batch_size x
// data_parallel_ranks; 1 when it is -1). Errors name the keys: not a multiple, or accumulation
// with linear_grad_dtype = bfloat16.
int64_t gradient_accumulation_steps(const JobConfig& config, int64_t data_parallel_ranks);

// Validates the config, loads the tokenizer and derives the model and plan options.
// `backend` sizes the workspace; without one (planning for a device this machine
// lacks) a conservative estimate is used.
// `need_tokenizer` false (planning) skips loading it when the model's vocabulary is known.
// The automatic policy is resolved here (keep-sets under the budget, or Error(ErrorKind::memory)
// with the breakdown and the smallest change that fits); so is an explicit budget for fixed policies.
// plan_options carry the [parallelism] layout: a sharded plan is per rank, and its executor needs
// a communicator of data_parallel_shard_degree ranks (the trainer makes one from the environment).
// The cost model's name for a GPU the driver calls `device_model`: "h100" for an H100, else "h200".
std::string gpu_kind(const std::string& device_model);

RunSetup prepare_run(const JobConfig& config, const Backend* backend, bool need_tokenizer = true,
                     const PlanTarget& target = {});

// The output head's choices the config leaves to the planner, made for `options`' policy and
// keep-sets: the loss chunk (training.loss_chunk_tokens = 0: choose_loss_chunk from the base chunk,
// within budget_bytes) and then whether the output projection's copy is persistent
// (training.output_weight_copy; auto: choose_persistent_output_copy). prepare_run applies them to
// the configured policy; `smelt plan` to each policy it compares, so each row is the plan that
// policy would run.
void choose_head_options(const JobConfig& config, const ModelConfig& model, PlanOptions& options, double budget_bytes);
// The second of those choices alone, for `options`' loss chunk.
void choose_output_copy(const JobConfig& config, const ModelConfig& model, PlanOptions& options);
// The head options before those choices, as the automatic policy searches with them: the
// configured loss chunk or the base one (kBaseLossChunkTokens, at most the step's tokens), and the
// output projection's copy cast per step.
void reset_head_options(const JobConfig& config, PlanOptions& options);

// With an explicit activation_checkpoint.memory_budget_gb, holds the rest of the device's free
// memory back (MemoryResource::limit_to) so the run has exactly the budget and no more; logs it.
// Call after prepare_run and before the arena is allocated. Without an explicit budget: nothing.
void hold_to_memory_budget(const RunSetup& setup, Backend& backend, std::ostream& log);

// The data loader's options for this run: the config's dataset and validation paths, seed and
// cache folder (<dump_folder>/.cache), the plan's batch and sequence length, and this rank's slice.
DatasetOptions dataset_options(const RunSetup& setup, int rank = 0, int world_size = 1);

WorkspaceShape workspace_shape(const ModelConfig& model, const PlanOptions& options);
// Sets options.backend_workspace_bytes and attention_backward_scratch_bytes for its shape: from
// `backend` when there is one, else from the estimates below for `device` (cpu or cuda).
void size_workspaces(const std::string& device, const ModelConfig& model, PlanOptions& options, const Backend* backend);

// parallelism.data_parallel_shard_degree as a rank count: a positive value as is; -1 (torchtitan's
// default) the ranks left after replication, world_size / data_parallel_replicate_degree (world_size:
// the launcher's WORLD_SIZE, 1 outside a launch). Other values: Error(ErrorKind::config).
int64_t resolve_shard_degree(const ParallelismSection& parallelism, int64_t world_size);

// Workspace estimate for a device without its backend at hand.
size_t estimated_workspace_bytes(const std::string& device, const WorkspaceShape& shape);
// Likewise for Backend::attention_backward_scratch_bytes.
size_t estimated_attention_backward_scratch_bytes(const std::string& device, const WorkspaceShape& shape);

}  // namespace smelt
