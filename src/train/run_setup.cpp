// Deriving model shapes, policy and plan options from a config.
#include "train/run_setup.h"

#include <algorithm>
#include <filesystem>

#include <unistd.h>

#include "core/error.h"
#include "dist/launch_environment.h"
#include "ops/cuda_workspace.h"
#include "plan/auto_policy.h"
#include "plan/loss_chunk.h"
#include "plan/output_copy.h"

namespace smelt {

WorkspaceShape workspace_shape(const ModelConfig& model, const PlanOptions& options) {
  WorkspaceShape w;
  w.tokens = options.shape.tokens();
  w.seq_len = options.shape.seq_len;
  w.batch = options.shape.batch;
  w.max_rows = std::max({w.tokens, model.vocab_size, model.ffn_dim, model.dim});
  w.max_inner = std::max({w.tokens, model.ffn_dim, model.dim, model.vocab_size});
  w.max_cols = std::max({model.vocab_size, model.ffn_dim, model.dim});
  w.heads = model.n_heads;
  w.kv_heads = model.n_kv_heads;
  w.head_dim = model.head_dim();
  w.compute_dtype = options.compute_dtype;
  return w;
}

void size_workspaces(const std::string& device, const ModelConfig& model, PlanOptions& options, const Backend* backend) {
  WorkspaceShape ws = workspace_shape(model, options);
  ws.attention_backward_planned = true;  // its scratch is a planned buffer per backward attention step
  options.backend_workspace_bytes = backend ? backend->workspace_bytes(ws) : estimated_workspace_bytes(device, ws);
  options.attention_backward_scratch_bytes = backend ? backend->attention_backward_scratch_bytes(ws)
                                                     : estimated_attention_backward_scratch_bytes(device, ws);
}

size_t estimated_attention_backward_scratch_bytes(const std::string& device, const WorkspaceShape& shape) {
  return device == "cuda" ? cuda_attention_workspace_bytes(shape) : 0;
}

size_t estimated_workspace_bytes(const std::string& device, const WorkspaceShape& shape) {
  if (device == "cuda") return cuda_workspace_bytes(shape);  // the CUDA backend's own formula
  // CPU: f32 copies of two GEMM operands and the output, bounded by the largest shapes.
  const size_t largest = static_cast<size_t>(std::max(shape.max_rows, shape.tokens)) *
                         static_cast<size_t>(std::max(shape.max_inner, shape.max_cols));
  return 3 * largest * 4;
}

double default_memory_budget(double device_memory_bytes) {
  return device_memory_bytes - std::max(2e9, 0.03 * device_memory_bytes);
}

static double machine_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 64e9;
}

int64_t resolve_shard_degree(const ParallelismSection& parallelism, int64_t world_size) {
  const int64_t shard = parallelism.data_parallel_shard_degree, replicas = parallelism.data_parallel_replicate_degree;
  if (shard > 0) return shard;
  if (shard != -1)
    fail(ErrorKind::config, "parallelism.data_parallel_shard_degree = " + std::to_string(shard) +
                                ": expected a positive rank count, or -1 for the ranks left after replication");
  if (world_size % replicas != 0)
    fail(ErrorKind::config, "parallelism.data_parallel_shard_degree = -1 shards over the ranks left after "
                            "replication, but " + std::to_string(world_size) + " ranks do not divide into " +
                            "data_parallel_replicate_degree = " + std::to_string(replicas) + " replicas");
  return std::max<int64_t>(1, world_size / replicas);
}

int64_t gradient_accumulation_steps(const JobConfig& config, int64_t data_parallel_ranks) {
  const TrainingSection& t = config.training;
  if (t.global_batch_size <= 0) return 1;
  const int64_t per_pass = t.local_batch_size * std::max<int64_t>(1, data_parallel_ranks);
  if (t.global_batch_size % per_pass != 0)
    fail(ErrorKind::config, "training.global_batch_size (" + std::to_string(t.global_batch_size) +
                                ") must be a multiple of local_batch_size x data-parallel ranks (" +
                                std::to_string(t.local_batch_size) + " x " + std::to_string(data_parallel_ranks) +
                                " = " + std::to_string(per_pass) + "); pick a multiple, or -1 for " +
                                std::to_string(per_pass));
  const int64_t steps = t.global_batch_size / per_pass;
  if (steps == 1) return 1;
  if (t.linear_grad_dtype == "bfloat16")
    fail(ErrorKind::config, "training.linear_grad_dtype = \"bfloat16\" keeps gradients that are written once; "
                            "gradient accumulation (training.global_batch_size = " +
                                std::to_string(t.global_batch_size) + ", " + std::to_string(steps) +
                                " passes per step) adds to them, which needs float32. Set linear_grad_dtype "
                                "to auto or float32");
  return steps;
}

std::string gpu_kind(const std::string& device_model) {
  return device_model.find("H100") != std::string::npos ? "h100" : "h200";
}

RunSetup prepare_run(const JobConfig& config, const Backend* backend, bool need_tokenizer, const PlanTarget& target) {
  validate_config(config);
  RunSetup setup;
  setup.config = config;
  ModelSection preset_only = config.model;
  bool vocabulary_known = config.model.vocab_size > 0;
  try {
    vocabulary_known = vocabulary_known || make_model_config(preset_only, 0).vocab_size > 0;
  } catch (const Error&) {
  }
  if (need_tokenizer || !vocabulary_known) setup.tokenizer = load_tokenizer(config.model.tokenizer_path);
  const int64_t tokenizer_vocabulary = setup.tokenizer ? setup.tokenizer->vocab_size() : 0;
  setup.model = make_model_config(config.model, tokenizer_vocabulary);
  if (setup.model.vocab_size < tokenizer_vocabulary)
    fail(ErrorKind::config, "model.vocab_size (" + std::to_string(setup.model.vocab_size) +
                                ") is smaller than the tokenizer's vocabulary (" +
                                std::to_string(tokenizer_vocabulary) + "); raise it or use another tokenizer");
  auto& o = setup.plan_options;
  o.shape.batch = config.training.local_batch_size;
  o.shape.seq_len = config.training.seq_len;
  o.compute_dtype = parse_dtype(config.training.mixed_precision_param);
  // auto and bfloat16 alike: the plan keeps them in bf16 where it can (unsharded, bf16 compute).
  o.linear_grad_dtype = config.training.linear_grad_dtype == "float32" ? DType::f32 : DType::bf16;
  o.policy = parse_checkpoint_policy(config.activation_checkpoint.mode);
  // The base chunk and no persistent output copy while the checkpointing policy is chosen;
  // choose_head_options below grows them where they cost no memory.
  reset_head_options(config, o);
  o.float8.recipe = parse_float8_recipe(config.float8.recipe);
  o.float8.filter_fqns = config.float8.filter_fqns;
  o.float8.save_inputs_in_float8 = config.float8.save_inputs_in_float8;
  o.float8.keep_transposed_weights = config.float8.keep_transposed_weights;
  o.float8.fuse_amax_into_producers = config.float8.fusion == "full";
  size_workspaces(config.job.device, setup.model, o, backend);
  o.shard_degree = resolve_shard_degree(config.parallelism, read_launch_environment().world_size);
  o.reduce_dtype = parse_dtype(config.parallelism.reduce_dtype);
  o.shard_single_rank = config.parallelism.shard_single_rank;
  o.reshard_after_forward = config.parallelism.reshard_after_forward_policy != "never";
  o.replicate_degree = config.parallelism.data_parallel_replicate_degree;
  o.float8_all_gather = config.float8.all_gather;
  o.microbatches = gradient_accumulation_steps(config, o.shard_degree * o.replicate_degree);

  // The device, its memory and the budget; the cost model.
  const bool cuda = config.job.device == "cuda";
  // A run on a GPU (train, bench) describes the GPU it has: an H100's ceilings and memory on an H100.
  const std::string gpu = cuda && backend && backend->device() == Device::cuda ? gpu_kind(backend->device_model()) : target.gpu;
  setup.ceilings = cuda ? ceilings_by_name(gpu) : cpu_ceilings();
  setup.ceilings.memory_bytes = target.device_memory_bytes > 0 ? target.device_memory_bytes
                                : cuda                          ? setup.ceilings.memory_bytes
                                                                : machine_memory_bytes();
  const std::string& timings =
      target.op_timings_path.empty() ? config.activation_checkpoint.op_timings : target.op_timings_path;
  if (!timings.empty()) setup.op_timings = std::make_shared<OpTimingCache>(OpTimingCache::load(timings));
  setup.float8_linears = config.float8.recipe != "none";
  setup.memory_budget_explicit = config.activation_checkpoint.memory_budget_gb > 0;
  setup.memory_budget_bytes = setup.memory_budget_explicit ? config.activation_checkpoint.memory_budget_gb * 1e9
                                                           : default_memory_budget(setup.ceilings.memory_bytes);
  const CostModel cost = setup.cost_model();
  if (o.policy.mode == CheckpointMode::automatic) {
    AutoPolicyResult chosen = choose_automatic_policy(setup.model, o, setup.memory_budget_bytes, cost);
    o.keep_sets = chosen.plan.options.keep_sets;
  } else if (setup.memory_budget_explicit && backend) {
    StepPlan plan = build_step_plan(setup.model, o);
    if (static_cast<double>(plan.memory.arena_bytes) > setup.memory_budget_bytes)
      fail(ErrorKind::memory, does_not_fit_message(plan, setup.memory_budget_bytes,
                                                   changes_that_fit(setup.model, o, setup.memory_budget_bytes, cost)));
  }
  choose_head_options(config, setup.model, o, setup.memory_budget_bytes);
  return setup;
}

DatasetOptions dataset_options(const RunSetup& setup, int rank, int world_size) {
  const JobConfig& config = setup.config;
  DatasetOptions data;
  data.path = config.training.dataset_path;
  data.validation_path = config.validation.dataset_path;
  data.batch_size = setup.plan_options.shape.batch;
  data.seq_len = setup.plan_options.shape.seq_len;
  data.seed = static_cast<uint64_t>(config.training.seed);
  data.model_vocab_size = setup.model.vocab_size;
  data.cache_dir = (std::filesystem::path(config.job.dump_folder) / ".cache").string();
  data.rank = rank;
  data.world_size = world_size;
  return data;
}

void reset_head_options(const JobConfig& config, PlanOptions& o) {
  o.loss_chunk_tokens = config.training.loss_chunk_tokens > 0 ? config.training.loss_chunk_tokens
                                                               : std::min(kBaseLossChunkTokens, o.shape.tokens());
  o.persistent_output_copy = false;
}

void choose_head_options(const JobConfig& config, const ModelConfig& model, PlanOptions& o, double budget_bytes) {
  reset_head_options(config, o);
  if (config.training.loss_chunk_tokens == 0) o.loss_chunk_tokens = choose_loss_chunk(model, o, budget_bytes);
  choose_output_copy(config, model, o);  // after the chunk: the head's buffers decide whether it is the peak
}

void choose_output_copy(const JobConfig& config, const ModelConfig& model, PlanOptions& o) {
  const std::string& output_copy = config.training.output_weight_copy;
  o.persistent_output_copy = output_copy == "persistent" || (output_copy == "auto" && choose_persistent_output_copy(model, o));
}

void hold_to_memory_budget(const RunSetup& setup, Backend& backend, std::ostream& log) {
  if (!setup.memory_budget_explicit) return;
  const size_t held = backend.memory().limit_to(static_cast<size_t>(setup.memory_budget_bytes));
  if (held > 0)
    log << "memory: budget " << setup.memory_budget_bytes / 1e9 << " GB enforced; " << static_cast<double>(held) / 1e9
        << " GB of free device memory held back\n";
}

}  // namespace smelt
