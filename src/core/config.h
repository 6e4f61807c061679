// JobConfig: everything a run is configured by, in torchtitan's TOML sections.
// Loaded from a file, then overridden by `--section.key=value` arguments.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace smelt {

struct JobSection {
  std::string name = "smelt";            // run name: the run folder is dump_folder/name
  std::string description;
  std::string dump_folder = "runs";      // where run folders go
  std::string device = "cpu";            // "cpu" or "cuda"
};

struct ModelSection {
  std::string name = "llama3";
  std::string flavor = "debugmodel";     // preset: debugmodel, llama3_1b, llama3_8b, llama3_70b, llama3_405b
  // Overrides of the preset; 0 / unset means "as the preset says".
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t vocab_size = 0;                // 0: from the tokenizer
  int64_t ffn_dim = 0;                   // 0: from dim, ffn_dim_multiplier and multiple_of
  std::optional<double> ffn_dim_multiplier;
  int64_t multiple_of = 0;
  double norm_eps = 0;
  double rope_theta = 0;
  std::optional<bool> rope_scaling;      // Llama-3.1 frequency scaling
  std::string tokenizer_path = "byte";   // "byte" (built-in, 256 bytes + BOS/EOS) or a tiktoken file
};

struct TrainingSection {
  int64_t local_batch_size = 8;
  int64_t global_batch_size = -1;        // sequences per optimizer step over all ranks; -1: local x ranks
  int64_t seq_len = 256;
  int64_t steps = 300;
  double max_norm = 1.0;                 // global gradient-norm clip; 0 disables
  int64_t seed = 42;
  std::string dataset_path = "docs";     // a folder or file of text, or of token shards (*.tok)
  std::string mixed_precision_param = "float32";  // activation / compute-weight dtype: float32 or bfloat16
  std::string linear_grad_dtype = "auto";  // block linears' weight gradients: auto, float32 or bfloat16
  int64_t loss_chunk_tokens = 0;         // rows of the output projection computed at once; 0: the planner's choice
  std::string output_weight_copy = "auto";  // the output projection's bf16 copy: auto, persistent or per_step
  bool cuda_graph = true;                // CUDA: capture the step once and replay it
  bool gemm_autotune = false;            // CUDA: time cuBLASLt's candidates per GEMM shape, keep the fastest
  std::string on_nonfinite = "skip";     // non-finite loss or gradient norm: "skip" the update or "stop"
  int64_t loss_spike_window = 0;         // losses a spike is judged against; 0 disables spike detection
  double loss_spike_zscore = 6.0;        // a loss this many standard deviations above the window's mean spikes
  std::string on_loss_spike = "skip";    // "skip" the update or "stop"
  int64_t max_consecutive_skips = 20;    // more skipped steps in a row than this stops the run
};

struct OptimizerSection {
  std::string name = "AdamW";
  double lr = 8e-4;
  double eps = 1e-8;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double weight_decay = 0.1;
};

struct LrSchedulerSection {
  int64_t warmup_steps = 20;
  double decay_ratio = -1;               // fraction of steps spent decaying at the end; <0: all after warmup
  std::string decay_type = "linear";     // linear, cosine, sqrt
  double min_lr_factor = 0.0;            // final lr = lr * min_lr_factor
};

struct ActivationCheckpointSection {
  std::string mode = "none";             // none, full, selective-op, selective-layer:N, auto
  double memory_budget_gb = 0;           // for auto; 0: device memory minus a margin
  std::string op_timings;                // calibrated per-op timings (smelt bench --calibrate); empty: ceilings
};

struct Float8Section {
  std::string recipe = "none";           // none, tensorwise, rowwise, rowwise_with_gw_hp, blockwise
  std::vector<std::string> filter_fqns = {"output"};
  std::string fusion = "full";           // full, linear
  bool all_gather = true;                // sharded tensorwise runs: gather float8 weights in e4m3
  bool save_inputs_in_float8 = true;     // keep float8 x^T (not x) for the grad-weight GEMM where possible
  bool keep_transposed_weights = false;  // tensorwise: keep W^T copies instead of transposing W per use
};

struct ParallelismSection {
  int64_t data_parallel_shard_degree = -1;  // -1: the ranks left after replication
  int64_t data_parallel_replicate_degree = 1;
  std::string reduce_dtype = "float32";  // FSDP: gradients are reduce-scattered in float32 or bfloat16
  bool shard_single_rank = false;        // the FSDP schedule with one rank (measures its cost on one GPU)
  // "default" / "always": gather each block's weights again for its backward; "never": keep them
  // gathered from forward to backward (more memory, no backward gathers). torchtitan's names.
  std::string reshard_after_forward_policy = "default";
};

struct CheckpointSection {
  bool enable = false;
  std::string folder = "checkpoint";
  int64_t interval = 500;
  int64_t keep_latest_k = 2;
  std::string load;                      // folder to resume from
  bool async = false;                    // write in a background thread while training continues
};

struct MetricsSection {
  int64_t log_freq = 10;
  bool enable_tensorboard = false;
};

struct ValidationSection {
  bool enable = false;
  int64_t freq = 100;
  int64_t steps = 4;
  std::string dataset_path;  // validation data of its own; empty: the held-out part of training.dataset_path
};

struct ProfilingSection {
  bool enable_profiling = false;
  std::string trace_file;
};

struct JobConfig {
  JobSection job;
  ModelSection model;
  TrainingSection training;
  OptimizerSection optimizer;
  LrSchedulerSection lr_scheduler;
  ActivationCheckpointSection activation_checkpoint;
  Float8Section float8;
  ParallelismSection parallelism;
  CheckpointSection checkpoint;
  MetricsSection metrics;
  ValidationSection validation;
  ProfilingSection profiling;
  std::string source;  // the file it came from, "" for the built-in default
};

// Reads `path` (TOML) over the defaults. Errors (ErrorKind::config) name the file, line and key.
JobConfig load_config_file(const std::string& path);
// The same for TOML text read from `path` (named in errors).
JobConfig load_config_text(const std::string& contents, const std::string& path);
// Applies one "section.key=value" override (value parsed by the key's type).
void apply_override(JobConfig& config, const std::string& assignment);
// Checks ranges and cross-field rules; errors name the key.
void validate_config(const JobConfig& config);
// The effective config as a JSON string (written into the run folder).
std::string config_to_json(const JobConfig& config);
// Every key as "section.key", with its type and help text, for `--help` and errors.
struct ConfigKeyInfo {
  std::string key, type, help;
};
std::vector<ConfigKeyInfo> config_keys();

}  // namespace smelt
