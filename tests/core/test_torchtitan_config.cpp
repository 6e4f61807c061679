// Reading torchtitan job configs: translated keys land on smelt's with the same meaning, keys
// without effect are set aside with their line, torchtitan's defaults are written where smelt's
// differ, settings smelt cannot honour are errors naming key and line, and smelt's own loader
// points a torchtitan file at `smelt import-config`.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/torchtitan_config.h"
#include "support/expect_error.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"

namespace smelt {
namespace {

using testing_support::TemporaryFolder;

bool has_note(const std::vector<std::string>& notes, const std::string& needle) {
  return std::any_of(notes.begin(), notes.end(), [&](const std::string& n) { return n.find(needle) != std::string::npos; });
}

std::string all_notes(const TorchtitanImport& imported) {
  std::string text;
  for (const auto* list : {&imported.translated, &imported.defaults, &imported.set_aside, &imported.warnings})
    for (const std::string& line : *list) text += line + "\n";
  return text;
}

// Expects a config error whose message holds every needle.
void expect_import_error(const std::string& toml, const std::vector<std::string>& needles) {
  testing_support::expect_error(ErrorKind::config, [&] { import_torchtitan_text(toml, "tt.toml"); }, needles);
}

// A torchtitan 8B train config as its repository writes them, with drawn values where smelt must
// copy or translate what it finds.
struct DrawnConfig {
  int64_t seq_len, steps, blocks, interval;
  double lr;
  std::string text;
};

DrawnConfig torchtitan_8b(testing_support::FreshRandom& random) {
  DrawnConfig c;
  c.seq_len = 1024 * int64_t(1 + random.below(8));
  c.steps = 10 + int64_t(random.below(5000));
  c.blocks = 1 + int64_t(random.below(8));
  c.interval = 1 + int64_t(random.below(900));
  c.lr = 1e-4 * double(1 + random.below(9));
  c.text =
      "[job]\n"                                                   // 1
      "dump_folder = \"./outputs\"\n"                             // 2
      "description = \"Llama 3 8B training\"\n"                   // 3
      "\n"                                                        // 4
      "[profiling]\n"                                             // 5
      "enable_profiling = true\n"                                 // 6
      "save_traces_folder = \"profile_trace\"\n"                  // 7
      "profile_freq = 100\n"                                      // 8
      "\n"                                                        // 9
      "[model]\n"                                                 // 10
      "name = \"llama3\"\n"                                       // 11
      "flavor = \"8B\"\n"                                         // 12
      "hf_assets_path = \"./assets/hf/Llama-3.1-8B\"\n"           // 13
      "converters = [\"float8\"]\n"                               // 14
      "\n"                                                        // 15
      "[optimizer]\n"                                             // 16
      "name = \"AdamW\"\n"                                        // 17
      "lr = " + std::to_string(c.lr) + "\n"                       // 18
      "implementation = \"fused\"\n"                              // 19
      "\n"                                                        // 20
      "[training]\n"                                              // 21
      "local_batch_size = 1\n"                                    // 22
      "seq_len = " + std::to_string(c.seq_len) + "\n"             // 23
      "steps = " + std::to_string(c.steps) + "\n"                 // 24
      "dataset = \"c4\"\n"                                        // 25
      "\n"                                                        // 26
      "[parallelism]\n"                                           // 27
      "data_parallel_shard_degree = -1\n"                         // 28
      "tensor_parallel_degree = 1\n"                              // 29
      "fsdp_reshard_after_forward = \"never\"\n"                  // 30
      "\n"                                                        // 31
      "[checkpoint]\n"                                            // 32
      "enable_checkpoint = true\n"                                // 33
      "interval = " + std::to_string(c.interval) + "\n"           // 34
      "async_mode = \"async\"\n"                                  // 35
      "last_save_model_only = true\n"                             // 36
      "\n"                                                        // 37
      "[compile]\n"                                               // 38
      "enable = true\n"                                           // 39
      "components = [\"model\", \"loss\"]\n"                      // 40
      "\n"                                                        // 41
      "[activation_checkpoint]\n"                                 // 42
      "mode = \"selective\"\n"                                    // 43
      "selective_ac_option = \"" + std::to_string(c.blocks) + "\"\n"  // 44
      "\n"                                                        // 45
      "[float8]\n"                                                // 46
      "enable_fsdp_float8_all_gather = true\n"                    // 47
      "precompute_float8_dynamic_scale_for_fsdp = true\n"         // 48
      "recipe_name = \"rowwise\"\n"                               // 49
      "\n"                                                        // 50
      "[lr_scheduler]\n"                                          // 51
      "lr_min = 0.1\n";                                           // 52
  return c;
}

TEST(TorchtitanConfig, AnEightBillionTrainConfigBecomesTheSameRunInSmeltsKeys) {
  testing_support::FreshRandom random;
  const DrawnConfig drawn = torchtitan_8b(random);
  const TorchtitanImport imported = import_torchtitan_text(drawn.text, "tt.toml");
  const JobConfig c = load_config_text(imported.toml, "imported.toml");
  validate_config(c);
  // Copied and translated.
  EXPECT_EQ(c.model.flavor, "llama3_8b");
  EXPECT_EQ(c.training.seq_len, drawn.seq_len);
  EXPECT_EQ(c.training.steps, drawn.steps);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, drawn.lr);
  EXPECT_EQ(c.activation_checkpoint.mode, "selective-layer:" + std::to_string(drawn.blocks));
  EXPECT_EQ(c.float8.recipe, "rowwise");
  EXPECT_EQ(c.float8.filter_fqns, std::vector<std::string>{"output"});  // torchtitan's [] plus smelt's bf16 head
  EXPECT_TRUE(c.float8.all_gather);
  EXPECT_EQ(c.parallelism.reshard_after_forward_policy, "never");
  EXPECT_TRUE(c.checkpoint.enable);
  EXPECT_EQ(c.checkpoint.interval, drawn.interval);
  EXPECT_TRUE(c.checkpoint.async);
  EXPECT_DOUBLE_EQ(c.lr_scheduler.min_lr_factor, 0.1);
  EXPECT_EQ(c.model.tokenizer_path, "./assets/hf/Llama-3.1-8B/original/tokenizer.model");
  EXPECT_TRUE(c.profiling.enable_profiling);
  // torchtitan's defaults where smelt's differ.
  EXPECT_EQ(c.job.device, "cuda");
  EXPECT_EQ(c.training.mixed_precision_param, "bfloat16");
  EXPECT_EQ(c.checkpoint.keep_latest_k, 10);
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 200);
  EXPECT_EQ(c.job.name, "tt");  // runs go to dump_folder/tt
  // The dataset is downloaded by torchtitan: smelt's own text stands in, flagged.
  EXPECT_EQ(c.training.dataset_path, "docs");
  EXPECT_TRUE(has_note(imported.warnings, "tt.toml:25: training.dataset = \"c4\"")) << all_notes(imported);
  // Notes name the lines, in the file's order.
  EXPECT_TRUE(has_note(imported.translated, "tt.toml:12: model.flavor = \"8B\" -> model.flavor = \"llama3_8b\""))
      << all_notes(imported);
  EXPECT_TRUE(has_note(imported.translated, "tt.toml:43: activation_checkpoint.mode = \"selective\", selective_ac_option"))
      << all_notes(imported);
  EXPECT_TRUE(has_note(imported.translated, "tt.toml:35: checkpoint.async_mode = \"async\" -> checkpoint.async = true"));
  for (const char* aside : {"tt.toml:7: profiling.save_traces_folder", "tt.toml:19: optimizer.implementation",
                            "tt.toml:36: checkpoint.last_save_model_only", "tt.toml:39: compile.enable",
                            "tt.toml:48: float8.precompute_float8_dynamic_scale_for_fsdp",
                            "tt.toml:29: parallelism.tensor_parallel_degree = 1"})
    EXPECT_TRUE(has_note(imported.set_aside, aside)) << aside << " not set aside in:\n" << all_notes(imported);
  for (size_t i = 1; i < imported.set_aside.size(); ++i)
    EXPECT_LE(std::stol(imported.set_aside[i - 1].substr(8)), std::stol(imported.set_aside[i].substr(8)));
  // The written file says where each translated key came from.
  EXPECT_NE(imported.toml.find("flavor = \"llama3_8b\"  # torchtitan's flavor = \"8B\""), std::string::npos)
      << imported.toml;
  EXPECT_NE(imported.toml.find("# Set aside from tt.toml"), std::string::npos);
}

// A file that says almost nothing runs torchtitan's defaults, not smelt's: selective checkpointing
// of every second block, 2048-token sequences, 10,000 steps, bf16, on the GPU, in Llama 3's vocabulary.
TEST(TorchtitanConfig, KeysLeftOutTakeTorchtitansDefaults) {
  for (const char* flavor : {"70B", "405B"}) {
    const TorchtitanImport imported = import_torchtitan_text(std::string("[model]\nflavor = \"") + flavor + "\"\n", "tt.toml");
    const JobConfig c = load_config_text(imported.toml, "imported.toml");
    EXPECT_EQ(c.activation_checkpoint.mode, "selective-layer:2");
    EXPECT_EQ(c.training.seq_len, 2048);
    EXPECT_EQ(c.training.steps, 10000);
    EXPECT_EQ(c.training.mixed_precision_param, "bfloat16");
    EXPECT_EQ(c.job.device, "cuda");
    EXPECT_EQ(c.model.vocab_size, 128256);
    EXPECT_EQ(c.float8.recipe, "none");
    EXPECT_FALSE(c.float8.all_gather);
    EXPECT_TRUE(has_note(imported.defaults, "selective_ac_option = \"2\" (torchtitan's default)")) << all_notes(imported);
  }
  // Without the float8 converter torchtitan ignores [float8]; so does the import.
  const TorchtitanImport bf16 =
      import_torchtitan_text("[model]\nflavor = \"8B\"\n[float8]\nrecipe_name = \"rowwise\"\n", "tt.toml");
  EXPECT_EQ(load_config_text(bf16.toml, "imported.toml").float8.recipe, "none");
  EXPECT_TRUE(has_note(bf16.set_aside, "tt.toml:4: float8.recipe_name")) << all_notes(bf16);
  // The converter alone is torchao's default recipe; torchtitan's command-line spelling (one
  // comma-separated string) is read too.
  EXPECT_EQ(load_config_text(import_torchtitan_text("[model]\nconverters = \"float8\"\n", "tt.toml").toml, "i.toml")
                .float8.recipe,
            "tensorwise");
  const TorchtitanImport tensorwise = import_torchtitan_text("[model]\nconverters = [\"float8\"]\n", "tt.toml");
  EXPECT_EQ(load_config_text(tensorwise.toml, "imported.toml").float8.recipe, "tensorwise");
}

TEST(TorchtitanConfig, WhatSmeltCannotDoIsAnErrorNamingKeyAndLine) {
  testing_support::FreshRandom random;
  const std::string degree = std::to_string(2 + random.below(7));
  expect_import_error("[model]\nflavor = \"8B\"\n[parallelism]\ntensor_parallel_degree = " + degree + "\n",
                      {"tt.toml:4:", "parallelism.tensor_parallel_degree = " + degree, "no tensor parallelism"});
  expect_import_error("[parallelism]\n\npipeline_parallel_degree = " + degree + "\n",
                      {"tt.toml:3:", "pipeline_parallel_degree", "no pipeline parallelism"});
  expect_import_error("[parallelism]\ncontext_parallel_degree = " + degree + "\n", {"tt.toml:2:", "context parallelism"});
  expect_import_error("[training]\nenable_cpu_offload = true\n", {"tt.toml:2:", "enable_cpu_offload", "on the GPU"});
  expect_import_error("[model]\nconverters = [\"mx\"]\n", {"tt.toml:2:", "MX"});
  expect_import_error("[model]\nconverters = [\"quantize\"]\n", {"tt.toml:2:", "\"float8\" converter only"});
  expect_import_error("[activation_checkpoint]\nmode = \"memory_budget\"\n", {"tt.toml:2:", "\"auto\"", "memory_budget_gb"});
  expect_import_error("[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"sometimes\"\n",
                      {"tt.toml:3:", "selective_ac_option", "\"op\" or a whole number"});
  expect_import_error("[model]\nflavor = \"3B\"\n", {"tt.toml:2:", "model.flavor = \"3B\"", "llama3_8b"});
  expect_import_error("[checkpoint]\nasync_mode = \"later\"\n", {"tt.toml:2:", "async_mode", "\"disabled\""});
  expect_import_error("[checkpoint]\nload_step = " + degree + "\n", {"tt.toml:2:", "checkpoint.load"});
  expect_import_error("[training]\nseq_lenn = 8\n", {"tt.toml:2:", "unknown key training.seq_lenn"});
  expect_import_error("[pipelines]\nx = 1\n", {"tt.toml:1:", "unknown section [pipelines]"});
  expect_import_error("[training]\nsteps = -" + degree + "\n", {"tt.toml:2:", "training.steps"});
  expect_import_error("[float8]\nall_gather = true\nenable_fsdp_float8_all_gather = false\n",
                      {"tt.toml:3:", "float8.all_gather is set twice", "(line 2)"});
  expect_import_error("[parallelism]\nfsdp_reshard_after_forward = \"never\"\nreshard_after_forward_policy = \"always\"\n",
                      {"parallelism.reshard_after_forward_policy is set twice", "(line 2)", "(line 3)"});
  expect_import_error("[float8]\nrecipe_name = \"rowwise\"\n[quantize.linear.float8]\nrecipe_name = \"tensorwise\"\n",
                      {"repeats float8.recipe_name", "tt.toml:2"});
}

// Earlier torchtitan releases kept the batch, the warm-up and the parallel degrees in [training]
// and switched float8 on with enable_float8_linear.
TEST(TorchtitanConfig, EarlierReleasesKeysTranslateToo) {
  testing_support::FreshRandom random;
  const int64_t batch = 1 + int64_t(random.below(16)), warmup = int64_t(random.below(500));
  const int64_t shards = 1 + int64_t(random.below(8));
  const TorchtitanImport imported = import_torchtitan_text(
      "[training]\nbatch_size = " + std::to_string(batch) + "\nwarmup_steps = " + std::to_string(warmup) +
          "\ndata_parallel_shard_degree = " + std::to_string(shards) + "\ntensor_parallel_degree = 1\n"
          "[float8]\nenable_float8_linear = true\n[checkpoint]\nmodel_weights_only = false\n",
      "tt.toml");
  const JobConfig c = load_config_text(imported.toml, "imported.toml");
  EXPECT_EQ(c.training.local_batch_size, batch);
  EXPECT_EQ(c.lr_scheduler.warmup_steps, warmup);
  EXPECT_EQ(c.parallelism.data_parallel_shard_degree, shards);
  EXPECT_EQ(c.float8.recipe, "tensorwise");
  EXPECT_TRUE(has_note(imported.translated, "tt.toml:7: float8.enable_float8_linear = true")) << all_notes(imported);
  expect_import_error("[training]\ntensor_parallel_degree = 2\n", {"tt.toml:2:", "no tensor parallelism"});
}

// The last TOML releases: float8 settings in nested tables ([quantize.linear.float8], before that
// [quantize.dense.float8]) and converters named after them; experts' tables set aside.
TEST(TorchtitanConfig, NestedQuantizeTablesOfTheLastReleasesTranslate) {
  testing_support::FreshRandom random;
  const std::vector<std::string> recipes = {"tensorwise", "rowwise", "rowwise_with_gw_hp"};
  for (const std::string table : {"quantize.linear.float8", "quantize.dense.float8"}) {
    const std::string recipe = recipes[random.below(recipes.size())];
    const TorchtitanImport imported = import_torchtitan_text(
        "[model]\nflavor = \"8B\"\nconverters = [\"" + table + "\"]\nnorm_type = \"fused_rmsnorm\"\n"
        "[" + table + "]\nrecipe_name = \"" + recipe + "\"\nfilter_fqns = [\"output\", \"attention.wk\"]\n"
        "enable_fsdp_float8_all_gather = true\n[quantize.grouped_mm.float8]\nfqns = [\"experts\"]\n",
        "tt.toml");
    const JobConfig c = load_config_text(imported.toml, "imported.toml");
    EXPECT_EQ(c.float8.recipe, recipe) << table;
    EXPECT_EQ(c.float8.filter_fqns, (std::vector<std::string>{"output", "attention.wk"}));
    EXPECT_TRUE(c.float8.all_gather);
    EXPECT_TRUE(has_note(imported.set_aside, ": quantize.grouped_mm.float8")) << all_notes(imported);
    EXPECT_TRUE(has_note(imported.translated, "tt.toml:3: model.converters = [\"" + table + "\"]")) << all_notes(imported);
    EXPECT_TRUE(has_note(imported.set_aside, "tt.toml:4: model.norm_type")) << all_notes(imported);
  }
  expect_import_error("[model]\nnorm_type = \"layernorm\"\n", {"tt.toml:2:", "RMSNorm"});
  expect_import_error("[model]\nconverters = [\"quantize.linear.mx\"]\n", {"tt.toml:2:", "MX"});
  expect_import_error("[quantize.linear.float8]\nrecipe = 3\n", {"tt.toml:2:", "quantize.linear.float8.recipe"});
}

// A warm start from another run's checkpoint: smelt's checkpoint.load differs from torchtitan's
// initial_load_path on a relaunch, and the import says so.
TEST(TorchtitanConfig, InitialLoadPathBecomesCheckpointLoadWithAWarning) {
  const TorchtitanImport imported =
      import_torchtitan_text("[checkpoint]\ninitial_load_path = \"/ckpt/step-100\"\n", "tt.toml");
  EXPECT_EQ(load_config_text(imported.toml, "imported.toml").checkpoint.load, "/ckpt/step-100");
  EXPECT_TRUE(has_note(imported.warnings, "tt.toml:2: checkpoint.initial_load_path")) << all_notes(imported);
}

// smelt's own loader refuses torchtitan's keys and values, and says how to translate them.
TEST(TorchtitanConfig, SmeltsLoaderPointsTorchtitanFilesAtTheImport) {
  for (const std::string& text :
       {std::string("[model]\nflavor = \"8B\"\n"), std::string("[activation_checkpoint]\nmode = \"selective\"\n"),
        std::string("[compile]\nenable = true\n"), std::string("[float8]\nrecipe_name = \"rowwise\"\n")}) {
    try {
      load_config_text(text, "tt.toml");
      ADD_FAILURE() << "loaded:\n" << text;
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::config);
      EXPECT_NE(std::string(error.what()).find("smelt import-config"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("tt.toml:"), std::string::npos) << error.what();
    }
  }
  // Overrides too.
  JobConfig config;
  testing_support::expect_error(ErrorKind::config, [&] { apply_override(config, "model.flavor=70B"); },
                                {"model.flavor", "llama3_70b", "smelt import-config"});
  testing_support::expect_error(ErrorKind::config,
                                [&] { apply_override(config, "activation_checkpoint.selective_ac_option=op"); },
                                {"selective_ac_option", "smelt import-config"});
  // A plain typo gets no such hint.
  try {
    load_config_text("[training]\nstepz = 3\n", "tt.toml");
    ADD_FAILURE() << "loaded a typo";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()).find("import-config"), std::string::npos) << error.what();
  }
}

// Strings the import writes are escaped: paths with quotes and backslashes load back unchanged.
TEST(TorchtitanConfig, WrittenStringsAreEscaped) {
  const std::string path = "C:\\data\\\"quoted\" run";
  const TorchtitanImport imported =
      import_torchtitan_text("[training]\ndataset_path = 'C:\\data\\\"quoted\" run'\n", "tt.toml");
  EXPECT_EQ(load_config_text(imported.toml, "imported.toml").training.dataset_path, path);
}

// What is set aside is listed in comments at the end of the written file: a nested table, or a
// quoted key holding a line break or a control character, stays within its comment line.
TEST(TorchtitanConfig, SetAsideTablesAndOddKeysStayInTheirComments) {
  const TorchtitanImport imported = import_torchtitan_text(
      "[compile]\nenable = true\n\"odd\\nkey\\u0001\" = 1\n[compile.activation_checkpoint]\nmode = \"selective\"\n",
      "tt.toml");
  const JobConfig c = load_config_text(imported.toml, "imported.toml");  // a comment broken over lines would not parse
  EXPECT_EQ(c.activation_checkpoint.mode, "selective-layer:2");  // the nested table is not smelt's section
  EXPECT_TRUE(has_note(imported.set_aside, "compile.activation_checkpoint = { mode = \"selective\" }"))
      << all_notes(imported);
}

}  // namespace
}  // namespace smelt
