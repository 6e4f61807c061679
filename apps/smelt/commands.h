// The subcommands' bodies, one file each.
#pragma once
#include <string>
#include <vector>

#include "cli_common.h"
#include "core/config.h"
#include "train/evaluate.h"

namespace smelt {

int run_train(const JobConfig& config);

struct PlanCommandOptions {
  std::string format = "text";
  bool list_steps = false;
  double memory_budget_gb = 0;
};
int run_plan(const JobConfig& config, const PlanCommandOptions& options);

struct BenchCommandOptions {
  int64_t steps = 10;
  int64_t warmup = 3;
  std::string matrix;  // "precision=bf16,fp8-tensorwise ac=none,selective-op"
  std::string output;  // JSON results; default <dump_folder>/bench.json
  std::string trace;   // Chrome trace file (single configuration)
  std::string calibrate;  // op timing cache to merge the traced per-op times into
  std::string reference;  // reference runs to compare with: "" built in, "none" off, else a TOML file
};
int run_bench(const JobConfig& config, const BenchCommandOptions& options, const ConfigOptions& config_options);

struct PrepareCommandOptions {
  std::vector<std::string> inputs;
  std::string output;
  std::string tokenizer = "byte";
  std::string text_field = "text";
  double validation_fraction = 0.05;
};
int run_prepare(const PrepareCommandOptions& options);

struct TokenizerTrainCommandOptions {
  std::vector<std::string> inputs;
  std::string output = "tokenizer.model";
  int64_t vocab_size = 8192;
  std::string text_field = "text";
};
int run_tokenizer_train(const TokenizerTrainCommandOptions& options);

struct EvalCommandOptions {
  EvaluateOptions evaluate;
  std::string format = "text";
};
int run_eval(const JobConfig& config, const EvalCommandOptions& options);

struct GenerateOptions;
int run_generate(const GenerateOptions& options);

}  // namespace smelt
