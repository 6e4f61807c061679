// smelt: the command line. Subcommands train, plan, bench, eval, prepare,
// tokenizer train, generate, export, import-config and config-keys; every error
// becomes a message on stderr and a non-zero exit code (2 for config errors).
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "commands.h"
#include "export_command.h"
#include "import_command.h"
#include "plan_command.h"
#include "core/error.h"
#include "train/generate.h"

int main(int argc, char** argv) {
  using namespace smelt;
  CLI::App app{"smelt: Llama-3 pre-training with float8 linear layers, a memory plan known before step 0"};
  app.require_subcommand(1);
  app.set_version_flag("--version", SMELT_VERSION);

  ConfigOptions train_config;
  auto* train_command = app.add_subcommand("train", "Train a model (default: the debug model on CPU)");
  add_config_options(*train_command, train_config);

  ConfigOptions plan_config;
  PlanCommandOptions plan_options;
  auto* plan_command = app.add_subcommand("plan", "Print the step plan and memory breakdown without allocating model memory");
  add_config_options(*plan_command, plan_config);
  PlanTargetOptions plan_target;
  add_plan_command_options(*plan_command, plan_options, plan_target);

  ConfigOptions bench_config;
  BenchCommandOptions bench_options;
  auto* bench_command = app.add_subcommand("bench", "Time training steps on synthetic tokens: median tokens/s, TFLOPS, MFU, memory");
  add_config_options(*bench_command, bench_config);
  bench_command->add_option("--steps", bench_options.steps, "Timed steps (after warm-up)")->check(CLI::PositiveNumber);
  bench_command->add_option("--warmup", bench_options.warmup, "Untimed steps first")->check(CLI::NonNegativeNumber);
  bench_command->add_option("--matrix", bench_options.matrix,
                            "Grid, e.g. \"precision=bf16,fp8-tensorwise ac=none,selective-op,full\" (one process per cell)");
  bench_command->add_option("--trace", bench_options.trace, "Chrome trace (Perfetto) of the timed steps, and a per-op summary");
  bench_command->add_option("--calibrate", bench_options.calibrate,
                            "With --trace: merge the measured per-op times into this op timing cache (JSON), which "
                            "activation_checkpoint.op_timings and `smelt plan --op-timings` read");
  bench_command->add_option("--output", bench_options.output, "JSON results file (default <dump_folder>/bench.json)");
  bench_command->add_option("--reference", bench_options.reference,
                            "Reference runs to set beside each result, matched by GPU, model, batch, precision and "
                            "policy: a TOML file like configs/reference/pytorch_h200.toml (built in: configs/reference/*.toml, "
                            "the table of the GPU the bench runs on, the default), or none");

  ConfigOptions eval_config;
  EvalCommandOptions eval_options;
  auto* eval_command = app.add_subcommand(
      "eval", "Loss and perplexity of trained weights on validation data, computed as training's validation is");
  add_config_options(*eval_command, eval_config);
  eval_command
      ->add_option("--weights", eval_options.evaluate.weights,
                   "Run folder, checkpoint (folder), folder of checkpoints, model.safetensors or Hugging Face folder")
      ->required();
  eval_command->add_option("--tokenizer", eval_options.evaluate.tokenizer,
                           "Tokenizer (byte or a tiktoken file; default: the one the weights record)");
  eval_command->add_option("--batches", eval_options.evaluate.batches,
                           "Batches to evaluate (default: validation.steps; at most what the data holds)")
      ->check(CLI::PositiveNumber);
  eval_command->add_option("--format", eval_options.format, "text or json")->check(CLI::IsMember({"text", "json"}));

  GenerateOptions generate_options;
  auto* generate_command = app.add_subcommand("generate", "Sample text from trained weights");
  generate_command
      ->add_option("--checkpoint", generate_options.checkpoint,
                   "Run folder, checkpoint (folder, whole or per-rank), folder of checkpoints, model.safetensors or "
                   "Hugging Face folder")
      ->required();
  generate_command->add_option("--tokenizer", generate_options.tokenizer,
                               "Tokenizer (byte or a tiktoken file; default: the one the weights record)");
  generate_command->add_option("--prompt", generate_options.prompt, "Text to continue");
  generate_command->add_option("--max-tokens", generate_options.max_tokens, "Tokens to generate")->check(CLI::NonNegativeNumber);
  generate_command->add_option("--temperature", generate_options.temperature, "Sampling temperature (0: greedy)")->check(CLI::NonNegativeNumber);
  generate_command->add_option("--top-p", generate_options.top_p, "Nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  generate_command->add_option("--seed", generate_options.seed, "Sampling seed");
  generate_command->add_option("--device", generate_options.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));

  PrepareCommandOptions prepare_options;
  auto* prepare_command = app.add_subcommand("prepare", "Tokenize text (files or folders of .txt/.md/.jsonl) into token shards");
  prepare_command->add_option("--input", prepare_options.inputs, "Files or folders of text")->required();
  prepare_command->add_option("--output", prepare_options.output, "Folder for the shards")->required();
  prepare_command->add_option("--tokenizer", prepare_options.tokenizer, "byte, or a tiktoken-format file");
  prepare_command->add_option("--text-field", prepare_options.text_field, "JSON Lines field holding the text");
  prepare_command->add_option("--validation-fraction", prepare_options.validation_fraction,
                              "Share of the input (from the end) held out for validation")->check(CLI::Range(0.0, 0.9));

  auto* tokenizer_command = app.add_subcommand("tokenizer", "Tokenizer tools");
  TokenizerTrainCommandOptions tokenizer_options;
  auto* tokenizer_train = tokenizer_command->add_subcommand("train", "Train a BPE vocabulary (Llama-3 pre-tokenization, tiktoken format)");
  tokenizer_command->require_subcommand(1);
  tokenizer_train->add_option("--input", tokenizer_options.inputs, "Files or folders of text")->required();
  tokenizer_train->add_option("--output", tokenizer_options.output, "The tokenizer file to write");
  tokenizer_train->add_option("--vocab-size", tokenizer_options.vocab_size, "Vocabulary size, special tokens included")
      ->check(CLI::Range(512, 1 << 20));
  tokenizer_train->add_option("--text-field", tokenizer_options.text_field, "JSON Lines field holding the text");

  ExportCommandOptions export_options;
  auto* export_command = app.add_subcommand("export", "Write weights (run, checkpoint or Hugging Face folder) as a Hugging Face Llama folder or smelt weights");
  export_command->add_option("--from", export_options.from, "Run folder, model.safetensors, checkpoint (folder) or Hugging Face folder")->required();
  export_command->add_option("--output", export_options.output, "Folder (hf) or file (smelt)")->required();
  export_command->add_option("--format", export_options.format, "hf or smelt")->check(CLI::IsMember({"hf", "smelt"}));
  export_command->add_option("--dtype", export_options.dtype, "float32 or bfloat16 (hf)")->check(CLI::IsMember({"float32", "bfloat16"}));
  export_command->add_option("--tokenizer", export_options.tokenizer, "Tokenizer spec recorded when importing an HF folder");
  export_command->add_option("--seq-len", export_options.seq_len, "Context length recorded (0: from the source)");

  ImportCommandOptions import_options;
  auto* import_command = app.add_subcommand(
      "import-config", "Translate a torchtitan job config (TOML) into a smelt config, saying what changed");
  import_command->add_option("--from", import_options.from, "torchtitan TOML file")->required();
  import_command->add_option("--output", import_options.output, "smelt TOML to write (default: print it)");
  import_command->add_flag("--force", import_options.force, "Overwrite --output if it exists");

  auto* keys_command = app.add_subcommand("config-keys", "List every config key with its type and meaning");

  try {
    app.parse(argc, argv);
    if (*train_command) return run_train(resolve_config(*train_command, train_config));
    if (*plan_command) return run_plan(resolve_config(*plan_command, plan_config), plan_options, plan_target);
    if (*bench_command) {
      JobConfig config = resolve_config(*bench_command, bench_config);
      return run_bench(config, bench_options, bench_config);
    }
    if (*eval_command) return run_eval(resolve_config(*eval_command, eval_config), eval_options);
    if (*generate_command) return run_generate(generate_options);
    if (*prepare_command) return run_prepare(prepare_options);
    if (*export_command) return run_export(export_options);
    if (*import_command) return run_import_config(import_options);
    if (*tokenizer_train) return run_tokenizer_train(tokenizer_options);
    if (*keys_command) {
      std::cout << config_keys_help();
      return 0;
    }
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const Error& e) {
    std::cerr << "smelt: error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "smelt: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
