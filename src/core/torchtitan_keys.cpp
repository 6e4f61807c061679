// The torchtitan key table (torchtitan_keys.h).
#include "core/torchtitan_keys.h"

#include <algorithm>
#include <map>

namespace smelt::torchtitan {
namespace {

constexpr const char* kNoTensorParallel =
    "smelt has no tensor parallelism (FSDP, plain data parallel and HSDP: parallelism.data_parallel_*)";
constexpr const char* kNoPipeline = "smelt has no pipeline parallelism";
constexpr const char* kHfExport = "`smelt export --from RUN --output DIR --format hf [--dtype D]` writes the final weights";

}  // namespace

const std::vector<TorchtitanKey>& torchtitan_keys() {
  static const std::vector<TorchtitanKey> keys = {
      {"job", "config_file", Kind::set_aside, "", "the file itself"},
      {"job", "use_for_integration_test", Kind::set_aside, "", "torchtitan's own test-suite flag"},
      {"job", "print_args", Kind::set_aside, "", "smelt writes the effective config to the run folder's config.json"},
      {"job", "print_config", Kind::set_aside, "", "smelt writes the effective config to the run folder's config.json"},
      {"job", "save_config_file", Kind::set_aside, "", "smelt writes the effective config to the run folder's config.json"},
      {"job", "custom_config_module", Kind::neutral, "\"\"", "smelt loads no Python modules"},
      {"profiling", "save_traces_folder", Kind::set_aside, "",
       "smelt writes one Chrome trace, profiling.trace_file (default: trace.json in the run folder)"},
      {"profiling", "profile_freq", Kind::set_aside, "", "smelt traces the steps it runs (`smelt bench --trace` for per-op spans)"},
      {"profiling", "enable_memory_snapshot", Kind::set_aside, "",
       "smelt plans memory before step 0: `smelt plan --timeline FILE` draws every buffer's lifetime"},
      {"profiling", "save_memory_snapshot_folder", Kind::set_aside, "", "see profiling.enable_memory_snapshot"},
      {"metrics", "disable_color_printing", Kind::set_aside, "", "smelt prints no colours"},
      {"metrics", "rank_0_only", Kind::set_aside, "", "rank 0 writes the metrics"},
      {"metrics", "enable_color_printing", Kind::set_aside, "", "smelt prints no colours"},
      {"metrics", "save_tb_folder", Kind::set_aside, "", "smelt writes TensorBoard files to the run folder's tensorboard/"},
      {"metrics", "save_for_all_ranks", Kind::set_aside, "", "rank 0 writes the metrics"},
      {"metrics", "enable_wandb", Kind::neutral, "false", "smelt writes JSONL and TensorBoard metrics, not Weights & Biases"},
      {"model", "converters", Kind::special, "", ""},
      {"model", "hf_assets_path", Kind::special, "", ""},
      {"model", "norm_type", Kind::neutral, "\"rmsnorm\"|\"fused_rmsnorm\"|\"compiled_rmsnorm\"",
       "Llama 3's blocks normalise with RMSNorm (smelt's own fused kernels)"},
      {"model", "print_after_conversion", Kind::set_aside, "", "`smelt plan` says which linears run in float8"},
      {"optimizer", "implementation", Kind::set_aside, "", "smelt's AdamW is one fused pass over every parameter"},
      {"optimizer", "early_step_in_backward", Kind::neutral, "false",
       "smelt steps the optimizer after the backward (the gradient clip needs every gradient)"},
      {"lr_scheduler", "lr_min", Kind::rename, "lr_scheduler.min_lr_factor", ""},
      {"training", "dataset", Kind::special, "", ""},
      // Earlier torchtitan releases: the batch, warm-up and parallel degrees lived in [training].
      {"training", "batch_size", Kind::rename, "training.local_batch_size", ""},
      {"training", "warmup_steps", Kind::rename, "lr_scheduler.warmup_steps", ""},
      {"training", "data_parallel_shard_degree", Kind::rename, "parallelism.data_parallel_shard_degree", ""},
      {"training", "data_parallel_degree", Kind::rename, "parallelism.data_parallel_shard_degree", ""},
      {"training", "data_parallel_replicate_degree", Kind::rename, "parallelism.data_parallel_replicate_degree", ""},
      {"training", "tensor_parallel_degree", Kind::neutral, "1", kNoTensorParallel},
      {"training", "enable_loss_parallel", Kind::set_aside, "", "loss parallelism comes with tensor parallelism"},
      {"training", "enable_cpu_offload", Kind::neutral, "false",
       "smelt keeps parameters, gradients and optimizer state on the GPU (shard them with "
       "parallelism.data_parallel_shard_degree)"},
      {"training", "mixed_precision_reduce", Kind::rename, "parallelism.reduce_dtype", ""},
      {"training", "dtype", Kind::neutral, "\"float32\"",
       "smelt keeps float32 master weights and optimizer state (training.mixed_precision_param is the compute dtype)"},
      {"training.dataloader", "*", Kind::set_aside, "", "PyTorch DataLoader workers; smelt reads token shards directly"},
      {"validation.dataloader", "*", Kind::set_aside, "", "PyTorch DataLoader workers; smelt reads token shards directly"},
      {"debug", "seed", Kind::rename, "training.seed", ""},
      {"debug", "*", Kind::set_aside, "", "PyTorch debugging switches"},
      {"training", "compile", Kind::set_aside, "", "smelt has nothing to compile: its kernels are fused ahead of time"},
      {"training", "gc_freq", Kind::set_aside, "", "Python garbage collection"},
      {"training", "gc_debug", Kind::set_aside, "", "Python garbage collection"},
      {"training", "deterministic", Kind::set_aside, "", "smelt has no switch for deterministic algorithms"},
      {"training", "debug_moe_force_load_balance", Kind::set_aside, "", "Llama 3 has no experts"},
      {"parallelism", "enable_compiled_autograd", Kind::set_aside, "", "smelt has nothing to compile"},
      {"parallelism", "fsdp_reshard_after_forward", Kind::rename, "parallelism.reshard_after_forward_policy", ""},
      {"parallelism", "tensor_parallel_degree", Kind::neutral, "1", kNoTensorParallel},
      {"parallelism", "enable_async_tensor_parallel", Kind::neutral, "false", kNoTensorParallel},
      {"parallelism", "disable_loss_parallel", Kind::set_aside, "", "loss parallelism comes with tensor parallelism"},
      {"parallelism", "pipeline_parallel_degree", Kind::neutral, "1", kNoPipeline},
      {"parallelism", "pipeline_parallel_split_points", Kind::set_aside, "", "pipeline parallelism is off"},
      {"parallelism", "pipeline_parallel_layers_per_stage", Kind::set_aside, "", "pipeline parallelism is off"},
      {"parallelism", "pipeline_parallel_first_stage_less_layers", Kind::set_aside, "", "pipeline parallelism is off"},
      {"parallelism", "pipeline_parallel_last_stage_less_layers", Kind::set_aside, "", "pipeline parallelism is off"},
      {"parallelism", "pipeline_parallel_schedule", Kind::set_aside, "", "pipeline parallelism is off"},
      {"parallelism", "pipeline_parallel_schedule_csv", Kind::set_aside, "", "pipeline parallelism is off"},
      {"parallelism", "pipeline_parallel_microbatch_size", Kind::set_aside, "", "pipeline parallelism is off"},
      {"parallelism", "module_fqns_per_model_part", Kind::set_aside, "", "pipeline parallelism is off"},
      {"parallelism", "context_parallel_degree", Kind::neutral, "1", "smelt has no context parallelism"},
      {"parallelism", "context_parallel_rotate_method", Kind::set_aside, "", "context parallelism is off"},
      {"parallelism", "expert_parallel_degree", Kind::neutral, "1", "Llama 3 has no experts"},
      {"parallelism", "expert_tensor_parallel_degree", Kind::neutral, "1", "Llama 3 has no experts"},
      {"checkpoint", "enable_checkpoint", Kind::rename, "checkpoint.enable", ""},
      {"checkpoint", "model_weights_only", Kind::set_aside, "", kHfExport},
      {"checkpoint", "interval_type", Kind::neutral, "\"steps\"", "smelt counts checkpoint.interval in steps"},
      {"checkpoint", "initial_load_path", Kind::rename, "checkpoint.load",
       "smelt starts from checkpoint.load at every launch, even when the run's checkpoint folder holds newer "
       "checkpoints (torchtitan then takes those), and resumes a smelt checkpoint whole, optimizer state and step "
       "included; remove it from the imported config to resume the run's own checkpoints"},
      {"checkpoint", "initial_load_model_only", Kind::set_aside, "",
       "checkpoint.load resumes a smelt checkpoint whole, or takes the weights alone from a Hugging Face folder"},
      {"checkpoint", "initial_load_in_hf", Kind::set_aside, "", "smelt tells a Hugging Face folder by its files"},
      {"checkpoint", "last_save_model_only", Kind::set_aside, "", kHfExport},
      {"checkpoint", "last_save_in_hf", Kind::set_aside, "", kHfExport},
      {"checkpoint", "export_dtype", Kind::set_aside, "", kHfExport},
      {"checkpoint", "create_seed_checkpoint", Kind::neutral, "false",
       "smelt initialises the weights from training.seed in every run"},
      {"checkpoint", "async_mode", Kind::special, "", ""},
      {"checkpoint", "load_step", Kind::neutral, "-1", "name the checkpoint to start from in checkpoint.load"},
      {"checkpoint", "exclude_from_loading", Kind::neutral, "[]",
       "smelt resumes a checkpoint whole (or loads a Hugging Face folder's weights alone)"},
      {"checkpoint", "enable_first_step_checkpoint", Kind::set_aside, "", "smelt saves every checkpoint.interval steps"},
      {"activation_checkpoint", "selective_ac_option", Kind::special, "", ""},
      {"activation_checkpoint", "per_op_sac_force_recompute_mm_shapes_by_fqns", Kind::set_aside, "",
       "mixture-of-experts router gates; Llama 3 has none"},
      {"activation_checkpoint", "memory_budget", Kind::set_aside, "", "used by mode = \"memory_budget\" only"},
      {"activation_checkpoint", "early_stop", Kind::set_aside, "", "a PyTorch checkpointing switch"},
      {"activation_checkpoint", "visualize_memory_budget_pareto", Kind::set_aside, "",
       "`smelt plan` prints every policy's memory and predicted time"},
      {"float8", "enable_fsdp_float8_all_gather", Kind::rename, "float8.all_gather", ""},
      {"float8", "precompute_float8_dynamic_scale_for_fsdp", Kind::set_aside, "",
       "smelt computes the float8 all-gather's scales in one all-reduce per step"},
      {"float8", "force_recompute_fp8_weight_in_bwd", Kind::set_aside, "",
       "the plan decides what the backward keeps (float8.keep_transposed_weights)"},
      {"float8", "recipe_name", Kind::special, "", ""},
      {"float8", "enable_float8_linear", Kind::special, "", ""},  // earlier releases' switch: the converter
      {"float8", "emulate", Kind::set_aside, "", "the CPU backend emulates float8 bit-exactly; GPUs run it in hardware"},
      {"float8", "moe_fqns_prototype", Kind::neutral, "[]", "Llama 3 has no experts"},
      {"mx", "*", Kind::special, "", ""},
      {"compile", "*", Kind::set_aside, "", "smelt has nothing to compile: its kernels are fused ahead of time"},
      {"comm", "*", Kind::set_aside, "", "smelt's communication timeouts and traces are not configured here"},
      {"memory_estimation", "*", Kind::set_aside, "", "`smelt plan` gives the memory before the run"},
      {"fault_tolerance", "enable", Kind::neutral, "false", "smelt has no TorchFT integration"},
      {"fault_tolerance", "*", Kind::set_aside, "", "fault tolerance is off"},
      {"experimental", "pipeline_parallel_degree", Kind::neutral, "1", kNoPipeline},
      {"experimental", "custom_import", Kind::neutral, "\"\"", "smelt loads no Python modules"},
      {"experimental", "custom_args_module", Kind::neutral, "\"\"", "smelt loads no Python modules"},
      {"experimental", "*", Kind::set_aside, "", "torchtitan's experimental settings"},
      {"validation", "enabled", Kind::rename, "validation.enable", ""},
      {"validation", "dataset", Kind::set_aside, "",
       "a dataset torchtitan downloads; smelt validates on validation.dataset_path, or the held-out part of "
       "training.dataset_path"},

      {"validation", "local_batch_size", Kind::set_aside, "", "smelt validates with the training batch"},
      {"validation", "seq_len", Kind::set_aside, "", "smelt validates with the training batch"},
      {"validation", "steps", Kind::special, "", ""},
  };
  // The last TOML releases kept the float8 settings under [quantize.dense.float8], then
  // [quantize.linear.float8] (converter "quantize.dense.float8" / "quantize.linear.float8").
  static const std::vector<TorchtitanKey> all = [] {
    std::vector<TorchtitanKey> k = keys;
    for (const std::string dense : {"quantize.linear", "quantize.dense"}) {
      const std::string float8 = dense + ".float8", mx = dense + ".mx";
      k.push_back({float8, "enable_fsdp_float8_all_gather", Kind::rename, "float8.all_gather", ""});
      k.push_back({float8, "precompute_float8_dynamic_scale_for_fsdp", Kind::set_aside, "",
                   "smelt computes the float8 all-gather's scales in one all-reduce per step"});
      k.push_back({float8, "recipe_name", Kind::special, "float8.recipe_name", ""});
      k.push_back({float8, "filter_fqns", Kind::rename, "float8.filter_fqns", ""});
      k.push_back({float8, "emulate", Kind::set_aside, "", "the CPU backend emulates float8 bit-exactly; GPUs run it in hardware"});
      k.push_back({mx, "*", Kind::set_aside, "", "no MX converter listed (smelt has no MX formats)"});
    }
    for (const std::string experts : {"quantize.grouped_mm", "quantize.grouped_mm.float8", "quantize.grouped_mm.mx",
                                "quantize.moe", "quantize.moe.float8", "quantize.moe.mx"})
      k.push_back({experts, "*", Kind::set_aside, "", "mixture-of-experts settings; Llama 3 has no experts"});
    return k;
  }();
  return all;
}

const TorchtitanKey* find_torchtitan_key(const std::string& section, const std::string& key) {
  const TorchtitanKey* whole_section = nullptr;
  for (const TorchtitanKey& k : torchtitan_keys()) {
    if (section != k.section) continue;
    if (key == k.key) return &k;
    if (std::string(k.key) == "*") whole_section = &k;
  }
  return whole_section;
}

bool is_torchtitan_section(const std::string& section) {
  return std::any_of(torchtitan_keys().begin(), torchtitan_keys().end(), [&](const TorchtitanKey& k) {
    return k.section == section || k.section.rfind(section + ".", 0) == 0;
  });
}

std::optional<std::string> smelt_flavor(const std::string& flavor) {
  static const std::map<std::string, std::string> names = {
      {"debugmodel", "debugmodel"}, {"8B", "llama3_8b"}, {"70B", "llama3_70b"}, {"405B", "llama3_405b"}};
  std::string base = flavor;
  const std::string flex = "_flex_attn";
  if (base.size() > flex.size() && base.compare(base.size() - flex.size(), flex.size(), flex) == 0)
    base.resize(base.size() - flex.size());
  auto found = names.find(base);
  if (found == names.end()) return std::nullopt;
  return found->second;
}

}  // namespace smelt::torchtitan
