// Tests for the config system: every file in configs/ loads and validates, overrides of
// each type, and every error names the key, the file and the line.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "support/expect_error.h"
#include "support/temporary_folder.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;

using testing_support::TemporaryFolder;

// Runs `action`, expects a config error whose message contains every one of `needles`.
void expect_config_error(const std::function<void()>& action, const std::vector<std::string>& needles) {
  testing_support::expect_error(ErrorKind::config, action, needles);
}

void expect_file_error(const std::string& text, const std::vector<std::string>& needles) {
  TemporaryFolder folder;
  std::string path = folder.write("bad.toml", text);
  std::vector<std::string> all = needles;
  all.push_back("bad.toml");
  expect_config_error([&] { load_config_file(path); }, all);
}

void expect_override_error(const std::string& assignment, const std::vector<std::string>& needles) {
  JobConfig config;
  std::vector<std::string> all = needles;
  all.push_back(assignment);  // the message quotes the argument
  expect_config_error([&] { apply_override(config, assignment); }, all);
}

TEST(Config, EveryFileInConfigsLoadsAndValidates) {
  fs::path folder = fs::path(SMELT_SOURCE_DIR) / "configs";
  int files = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder)) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    JobConfig config;
    ASSERT_NO_THROW(config = load_config_file(entry.path().string()));
    EXPECT_NO_THROW(validate_config(config));
    EXPECT_EQ(config.source, entry.path().string());
    nlohmann::json json = nlohmann::json::parse(config_to_json(config));
    EXPECT_EQ(json["job"]["name"], config.job.name);
    ++files;
  }
  EXPECT_GE(files, 6);
}

TEST(Config, DebugFileHasTheDebugRun) {
  JobConfig config = load_config_file(std::string(SMELT_SOURCE_DIR) + "/configs/debug.toml");
  EXPECT_EQ(config.model.flavor, "debugmodel");
  EXPECT_EQ(config.job.device, "cpu");
  EXPECT_EQ(config.training.local_batch_size, 4);
  EXPECT_EQ(config.training.seq_len, 256);
  EXPECT_EQ(config.training.steps, 300);
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 8e-4);
  EXPECT_EQ(config.lr_scheduler.warmup_steps, 20);
  EXPECT_EQ(config.metrics.log_freq, 10);
  EXPECT_EQ(config.training.mixed_precision_param, "float32");
  EXPECT_EQ(config.training.dataset_path, ".cache/sotu/shards");
  EXPECT_EQ(config.model.tokenizer_path, ".cache/sotu/tokenizer.model");
  EXPECT_TRUE(config.validation.enable);
}

TEST(Config, ProxyIsTheEightBillionModelWithEightLayers) {
  JobConfig full = load_config_file(std::string(SMELT_SOURCE_DIR) + "/configs/llama3_8b.toml");
  JobConfig proxy = load_config_file(std::string(SMELT_SOURCE_DIR) + "/configs/llama3_8b_proxy.toml");
  EXPECT_EQ(full.model.flavor, "llama3_8b");
  EXPECT_EQ(proxy.model.flavor, "llama3_8b");
  EXPECT_EQ(full.model.n_layers, 0);
  EXPECT_EQ(proxy.model.n_layers, 8);
  for (const JobConfig* config : {&full, &proxy}) {
    EXPECT_EQ(config->job.device, "cuda");
    EXPECT_EQ(config->training.local_batch_size, 1);
    EXPECT_EQ(config->training.seq_len, 8192);
    EXPECT_EQ(config->activation_checkpoint.mode, "selective-op");
    EXPECT_EQ(config->training.mixed_precision_param, "bfloat16");
    EXPECT_DOUBLE_EQ(config->optimizer.lr, 3e-4);
    EXPECT_EQ(config->lr_scheduler.warmup_steps, 200);
  }
}

TEST(Config, DefaultsValidate) { EXPECT_NO_THROW(validate_config(JobConfig{})); }

TEST(Config, FileValuesReplaceDefaultsAndIntegersAreFloats) {
  TemporaryFolder folder;
  std::string path = folder.write("good.toml",
                                  "[optimizer]\nlr = 1\nbeta2 = 0.99\n"
                                  "[float8]\nrecipe = \"rowwise\"\nfilter_fqns = [\"output\", \"layers.0\"]\n"
                                  "[model]\nffn_dim_multiplier = 1.3\nrope_scaling = true\n"
                                  "[activation_checkpoint]\nmode = \"selective-layer:3\"\n");
  JobConfig config = load_config_file(path);
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 1.0);
  EXPECT_DOUBLE_EQ(config.optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(config.optimizer.beta1, 0.9);  // untouched default
  EXPECT_EQ(config.float8.recipe, "rowwise");
  EXPECT_EQ(config.float8.filter_fqns, (std::vector<std::string>{"output", "layers.0"}));
  ASSERT_TRUE(config.model.ffn_dim_multiplier.has_value());
  EXPECT_DOUBLE_EQ(*config.model.ffn_dim_multiplier, 1.3);
  ASSERT_TRUE(config.model.rope_scaling.has_value());
  EXPECT_TRUE(*config.model.rope_scaling);
  EXPECT_EQ(config.activation_checkpoint.mode, "selective-layer:3");
  EXPECT_NO_THROW(validate_config(config));
}

TEST(Config, OverridesOfEveryType) {
  JobConfig config;
  apply_override(config, "training.steps=17");
  apply_override(config, "optimizer.lr=1e-4");
  apply_override(config, "checkpoint.enable=true");
  apply_override(config, "--job.device=cuda");
  apply_override(config, "job.description=a run, with commas = and equals");
  apply_override(config, "float8.filter_fqns=output, layers.1.attention");
  apply_override(config, "model.ffn_dim_multiplier=1.5");
  apply_override(config, "model.rope_scaling=false");
  apply_override(config, "lr_scheduler.decay_ratio=-1");
  EXPECT_FALSE(config.training.gemm_autotune) << "off by default: exact resume needs the same GEMM kernels";
  apply_override(config, "training.gemm_autotune=true");
  EXPECT_TRUE(config.training.gemm_autotune);
  EXPECT_EQ(config.training.steps, 17);
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 1e-4);
  EXPECT_TRUE(config.checkpoint.enable);
  EXPECT_EQ(config.job.device, "cuda");
  EXPECT_EQ(config.job.description, "a run, with commas = and equals");
  EXPECT_EQ(config.float8.filter_fqns, (std::vector<std::string>{"output", "layers.1.attention"}));
  EXPECT_EQ(config.model.ffn_dim_multiplier, std::optional<double>(1.5));
  EXPECT_EQ(config.model.rope_scaling, std::optional<bool>(false));
  EXPECT_DOUBLE_EQ(config.lr_scheduler.decay_ratio, -1.0);

  apply_override(config, "model.ffn_dim_multiplier=none");
  apply_override(config, "float8.filter_fqns=");
  EXPECT_FALSE(config.model.ffn_dim_multiplier.has_value());
  EXPECT_TRUE(config.float8.filter_fqns.empty());
  EXPECT_NO_THROW(validate_config(config));
}

TEST(Config, OverrideErrorsNameTheArgument) {
  expect_override_error("model.n_layers", {"'='", "section.key=value"});
  expect_override_error("nosection=3", {"nosection", "no section"});
  expect_override_error("training.seq_lne=5", {"training.seq_lne", "Did you mean training.seq_len?"});
  expect_override_error("trainig.steps=5", {"trainig", "unknown section"});
  expect_override_error("training.steps=3.5", {"training.steps", "integer", "3.5"});
  expect_override_error("training.steps=ten", {"training.steps", "ten"});
  expect_override_error("optimizer.lr=fast", {"optimizer.lr", "1e-4"});
  expect_override_error("checkpoint.enable=yes", {"checkpoint.enable", "true or false"});
  expect_override_error("job.device=tpu", {"job.device", "cpu, cuda", "tpu"});
  expect_override_error("optimizer.beta1=1.0", {"optimizer.beta1", "[0, 1)"});
  expect_override_error("training.local_batch_size=0", {"training.local_batch_size", ">= 1"});
  expect_override_error("activation_checkpoint.mode=selective-layer:0",
                        {"activation_checkpoint.mode", "selective-layer:N"});
}

TEST(Config, UnknownKeyNamesFileLineAndSuggests) {
  expect_file_error("[training]\nsteps = 10\nseq_lne = 128\n",
                    {"training.seq_lne", "bad.toml:3", "Did you mean training.seq_len?"});
  // The right key in the wrong section.
  expect_file_error("[training]\nlr = 0.1\n", {"training.lr", "bad.toml:2", "optimizer.lr"});
  // Nothing close: the section's keys are listed.
  expect_file_error("[metrics]\n\nwandb_project = \"x\"\n",
                    {"metrics.wandb_project", "bad.toml:3", "log_freq"});
}

TEST(Config, UnknownSectionAndLooseKeys) {
  expect_file_error("[job]\nname = \"a\"\n\n[trainig]\nsteps = 3\n",
                    {"unknown section [trainig]", "bad.toml:4", "[training]"});
  expect_file_error("steps = 3\n", {"steps", "outside any section", "bad.toml:1"});
}

TEST(Config, WrongTypeSaysExpectedAndFound) {
  expect_file_error("[training]\n\nseq_len = 256.0\n",
                    {"training.seq_len", "bad.toml:3", "an int", "a float"});
  expect_file_error("[training]\nsteps = \"300\"\n", {"training.steps", "bad.toml:2", "a string"});
  expect_file_error("[checkpoint]\nenable = 1\n",
                    {"checkpoint.enable", "bad.toml:2", "a bool", "an integer"});
  expect_file_error("[job]\ndevice = true\n", {"job.device", "bad.toml:2", "a string"});
  expect_file_error("[float8]\nfilter_fqns = \"output\"\n",
                    {"float8.filter_fqns", "bad.toml:2", "list of strings"});
  expect_file_error("[float8]\nfilter_fqns = [\"output\",\n  3]\n", {"float8.filter_fqns", "bad.toml:3"});
  expect_file_error("[model]\nrope_scaling = \"yes\"\n", {"model.rope_scaling", "bad.toml:2", "a bool"});
}

TEST(Config, BadEnumValuesListTheAllowedOnes) {
  expect_file_error("[job]\ndevice = \"tpu\"\n", {"job.device", "bad.toml:2", "cpu, cuda", "\"tpu\""});
  expect_file_error("[float8]\n\nrecipe = \"delayed\"\n",
                    {"float8.recipe", "bad.toml:3", "tensorwise, rowwise, rowwise_with_gw_hp, blockwise"});
  expect_file_error("[float8]\nfusion = \"none\"\n", {"float8.fusion", "bad.toml:2", "full, linear"});
  expect_file_error("[lr_scheduler]\ndecay_type = \"step\"\n",
                    {"lr_scheduler.decay_type", "bad.toml:2", "cosine"});
  expect_file_error("[training]\nmixed_precision_param = \"float16\"\n",
                    {"training.mixed_precision_param", "bad.toml:2", "float32, bfloat16"});
  expect_file_error("[model]\nflavor = \"llama3_7b\"\n", {"model.flavor", "bad.toml:2", "llama3_8b"});
  for (const char* mode :
       {"selective", "selective-layer:", "selective-layer:0", "selective-layer:2x", "partial"})
    expect_file_error(std::string("[activation_checkpoint]\nmode = \"") + mode + "\"\n",
                      {"activation_checkpoint.mode", "bad.toml:2", "selective-layer:N with N >= 1"});
}

TEST(Config, OutOfRangeValues) {
  expect_file_error("[training]\nlocal_batch_size = 0\n",
                    {"training.local_batch_size", "bad.toml:2", ">= 1"});
  expect_file_error("[training]\nseq_len = -5\n", {"training.seq_len", "bad.toml:2", "-5"});
  expect_file_error("[optimizer]\n\n\nlr = -0.001\n", {"optimizer.lr", "bad.toml:4", ">= 0"});
  expect_file_error("[optimizer]\nbeta2 = 1\n", {"optimizer.beta2", "bad.toml:2", "[0, 1)"});
  expect_file_error("[optimizer]\neps = 0.0\n", {"optimizer.eps", "bad.toml:2", "> 0"});
  expect_file_error("[optimizer]\nlr = nan\n", {"optimizer.lr", "bad.toml:2", "finite"});
  expect_file_error("[lr_scheduler]\nmin_lr_factor = 1.5\n",
                    {"lr_scheduler.min_lr_factor", "bad.toml:2", "[0, 1]"});
  expect_file_error("[parallelism]\ndata_parallel_shard_degree = 0\n",
                    {"parallelism.data_parallel_shard_degree", "bad.toml:2"});
  expect_file_error("[parallelism]\ndata_parallel_shard_degree = -2\n",
                    {"parallelism.data_parallel_shard_degree", "bad.toml:2", ">= 1 or -1"});
  expect_file_error("[job]\nname = \"a/b\"\n", {"job.name", "bad.toml:2", "'/'"});
  expect_file_error("[training]\nglobal_batch_size = 0\n", {"training.global_batch_size", "bad.toml:2", ">= 1 or -1"});
  expect_file_error("[training]\nglobal_batch_size = -4\n", {"training.global_batch_size", "bad.toml:2", ">= 1 or -1"});
}

TEST(Config, SyntaxErrorNamesFileLineAndColumn) {
  expect_file_error("[training]\nsteps = 10\nseq_len = = 3\n", {"bad.toml:3:", "syntax"});
  expect_file_error("[training]\nsteps = 1\nsteps = 2\n", {"bad.toml:3", "syntax"});
}

TEST(Config, MissingFileNamesThePath) {
  TemporaryFolder folder;
  std::string path = folder.path("absent.toml");
  expect_config_error([&] { load_config_file(path); }, {path, "does not exist"});
  expect_config_error([&] { load_config_file(folder.path()); }, {folder.path(), "folder"});
}

TEST(Config, ValidateChecksValuesSetInCode) {
  JobConfig config;
  config.job.device = "tpu";
  expect_config_error([&] { validate_config(config); }, {"job.device", "cpu, cuda"});
  config = JobConfig{};
  config.training.steps = 0;
  expect_config_error([&] { validate_config(config); }, {"training.steps", ">= 1"});
  config = JobConfig{};
  config.model.n_heads = 32;
  config.model.n_kv_heads = 5;
  expect_config_error([&] { validate_config(config); }, {"model.n_heads", "model.n_kv_heads"});
  config = JobConfig{};
  config.model.dim = 100;
  config.model.n_heads = 3;
  expect_config_error([&] { validate_config(config); }, {"model.dim", "model.n_heads"});
  config = JobConfig{};
  config.training.linear_grad_dtype = "float16";
  expect_config_error([&] { validate_config(config); }, {"training.linear_grad_dtype", "bfloat16"});
  config = JobConfig{};
  config.training.linear_grad_dtype = "bfloat16";  // bf16 gradients of f32 GEMMs: refused
  expect_config_error([&] { validate_config(config); }, {"training.linear_grad_dtype", "training.mixed_precision_param"});
  config.training.mixed_precision_param = "bfloat16";
  EXPECT_NO_THROW(validate_config(config));
  config.parallelism.shard_single_rank = true;
  expect_config_error([&] { validate_config(config); }, {"training.linear_grad_dtype", "parallelism.reduce_dtype"});
  config.parallelism.shard_single_rank = false;
  config.parallelism.data_parallel_replicate_degree = 2;
  expect_config_error([&] { validate_config(config); }, {"data_parallel_replicate_degree = 2", "parallelism.reduce_dtype"});
  config = JobConfig{};
  config.parallelism.shard_single_rank = true;  // auto: f32 where sharded, no error
  EXPECT_NO_THROW(validate_config(config));
  config = JobConfig{};
  config.training.local_batch_size = 4;
  config.training.global_batch_size = 10;  // not a whole number of passes
  expect_config_error([&] { validate_config(config); }, {"training.global_batch_size (10)", "local_batch_size (4)"});
  config.training.global_batch_size = 12;
  EXPECT_NO_THROW(validate_config(config));
  config = JobConfig{};
  config.training.output_weight_copy = "always";
  expect_config_error([&] { validate_config(config); }, {"training.output_weight_copy", "per_step"});
  config.training.output_weight_copy = "persistent";  // a bf16 copy of f32 compute: refused
  expect_config_error([&] { validate_config(config); }, {"training.output_weight_copy", "training.mixed_precision_param"});
  config.training.mixed_precision_param = "bfloat16";
  EXPECT_NO_THROW(validate_config(config));
  config.parallelism.data_parallel_shard_degree = 4;
  expect_config_error([&] { validate_config(config); }, {"training.output_weight_copy", "data_parallel_shard_degree = 4"});
  config.training.output_weight_copy = "auto";
  EXPECT_NO_THROW(validate_config(config));
}

TEST(Config, KeysAndJsonCoverEverySection) {
  std::vector<ConfigKeyInfo> keys = config_keys();
  std::set<std::string> names;
  for (const ConfigKeyInfo& key : keys) {
    EXPECT_TRUE(names.insert(key.key).second) << "duplicate key " << key.key;
    EXPECT_FALSE(key.help.empty()) << key.key;
    EXPECT_FALSE(key.type.empty()) << key.key;
  }
  for (const char* key : {"job.device", "training.seq_len", "optimizer.beta2", "float8.filter_fqns",
                          "validation.steps", "profiling.trace_file", "model.rope_scaling"})
    EXPECT_TRUE(names.count(key)) << key;

  JobConfig config;
  apply_override(config, "training.seq_len=512");
  apply_override(config, "model.ffn_dim_multiplier=1.3");
  nlohmann::json json = nlohmann::json::parse(config_to_json(config));
  size_t leaves = 0;
  for (const auto& [section, values] : json.items())
    if (values.is_object()) leaves += values.size();
  EXPECT_EQ(leaves, keys.size());
  for (const ConfigKeyInfo& key : keys) {
    size_t dot = key.key.find('.');
    EXPECT_TRUE(json[key.key.substr(0, dot)].contains(key.key.substr(dot + 1))) << key.key;
  }
  EXPECT_EQ(json["training"]["seq_len"], 512);
  EXPECT_DOUBLE_EQ(json["model"]["ffn_dim_multiplier"].get<double>(), 1.3);
  EXPECT_TRUE(json["model"]["rope_scaling"].is_null());
  EXPECT_EQ(json["float8"]["filter_fqns"], nlohmann::json::array({"output"}));
  EXPECT_EQ(json["job"]["device"], "cpu");
}

}  // namespace
}  // namespace smelt
