// Reference runs: another engine's measured tokens/s and peak memory for a model, batch, precision
// and checkpointing policy on a GPU (configs/reference/*.toml, built in), and the one a
// benchmark's configuration compares with.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/config.h"
#include "model/model_config.h"
#include "plan/step_plan.h"

namespace smelt {

// The shapes a reference run's model had (what ModelConfig calls them).
struct ReferenceModel {
  std::string name;
  int64_t dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, ffn_dim = 0, vocab_size = 0;
};

struct ReferenceRun {
  ReferenceModel model;
  int64_t batch = 0, seq_len = 0;
  std::string precision;              // "bf16", "fp8-tensorwise", ... (smelt bench's precision names)
  std::string activation_checkpoint;  // a checkpoint policy as smelt writes it: "none", "selective-op", ...
  std::string fusion;                 // float8 runs: "full" or "linear", the smelt fusion it compares with
  std::string compile;                // how the reference ran (a label)
  double tokens_per_second = 0;
  double peak_gb = 0;                 // 0: not recorded
  std::string place;                  // "file:line" of its [[runs]] entry
};

struct ReferenceTable {
  std::string source;  // what the runs were ("PyTorch 2.11 + torch.compile ...")
  std::string gpu;     // the runs' GPU: a device whose name contains it (case-insensitively) matches
  std::string path;    // where the table came from ("built in" or a file)
  std::vector<ReferenceRun> runs;
};

// A table from TOML text (`path` names it in errors); every error is a config error naming the
// file, line and key.
ReferenceTable parse_reference_table(const std::string& text, const std::string& path);
ReferenceTable load_reference_table(const std::string& path);
// Every configs/reference/*.toml, compiled into smelt, in file-name order (one table per GPU).
std::vector<ReferenceTable> builtin_reference_tables();
// The built-in table whose runs were on `gpu_name`'s GPU (configs/reference/pytorch_h100.toml for
// "NVIDIA H100 80GB HBM3"); for a GPU none was measured on, the H200's, which then matches nothing.
ReferenceTable builtin_reference_table(const std::string& gpu_name);
// True when `gpu_name` (a device's name) contains the table's `gpu`, case-insensitively.
bool runs_on(const ReferenceTable& table, const std::string& gpu_name);

// What a benchmarked configuration is, as the reference runs describe theirs.
struct ReferenceQuery {
  std::string gpu_name;  // the device's name ("NVIDIA H200"; "cpu" on the CPU backend)
  ReferenceModel model;
  int64_t batch = 0, seq_len = 0;
  std::string precision, activation_checkpoint, fusion;
  // Float8 runs: every block linear in float8 (as the reference runs converted them; the output
  // projection stays bf16 in both). False when float8.filter_fqns keeps some in bf16.
  bool all_block_linears_in_float8 = true;
  bool single_device_step = true;  // one GPU, one pass per step (no data parallelism, no accumulation)
};

// "bf16", "f32" or "fp8-<recipe>": a config's precision as smelt bench and the tables name it.
std::string precision_label(const JobConfig& config);
// The step `plan` runs (from `config`, on `world_size` ranks of `gpu_name`), as a query.
ReferenceQuery reference_query(const JobConfig& config, const ModelConfig& model, const StepPlan& plan,
                               const std::string& gpu_name, int world_size);

// The fastest run that describes the same step as `query`, or nullopt.
std::optional<ReferenceRun> find_reference(const ReferenceTable& table, const ReferenceQuery& query);

// One line setting smelt's figures beside `run` (a run of `source`): "reference: SOURCE (compile C;
// file:line): N tokens/s at G GB peak; LABEL R.RRx its tokens/s, D.D GB less memory". `label` says
// what smelt's figures are ("smelt": measured; "predicted": the plan's); the memory is left out
// where the run recorded no peak or `bytes` is 0.
std::string compare_with_reference(const std::string& source, const ReferenceRun& run, const std::string& label,
                                   double tokens_per_second, double bytes);

// A matched run as bench.json and `smelt plan --json` write it: source, entry, compile, tokens/s,
// peak_gb and the step it describes (model, batch, seq_len, precision, activation_checkpoint,
// fusion). reference_run_from_json reads what reference_run_json wrote; a missing key reads as
// empty or zero.
nlohmann::json reference_run_json(const std::string& source, const ReferenceRun& run);
ReferenceRun reference_run_from_json(const nlohmann::json& json);

}  // namespace smelt
