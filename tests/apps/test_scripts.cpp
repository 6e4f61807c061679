// The float8 quality scripts (scripts/float8_quality.py, scripts/plot_loss_curves.py) on a tiny
// CPU run: one run per recipe, their curves in the JSON, the table and the exit code at the
// tolerance, the plot, and a clear error for bad input. scripts/pytorch_reference.py: the table it
// writes is one smelt bench reads and matches (its measuring needs PyTorch and a GPU), and bad
// input is refused before anything runs. Skipped where there is no python3.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/run_command.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"

namespace {

namespace fs = std::filesystem;
using smelt::testing_support::run_command;
using smelt::testing_support::TemporaryFolder;

std::string script(const char* name) { return "python3 " + std::string(SMELT_SOURCE_DIR) + "/scripts/" + name; }

// A two-block model of dim 64 on fresh pseudo-text (lines, so that the end of the file can be
// split off for validation), bf16 compute, validation every 3 steps.
fs::path tiny_config(const TemporaryFolder& folder) {
  static const char* words[] = {"float", "eight", "scales", "the", "tensor", "per", "row", "and", "block", "."};
  smelt::Random random(smelt::testing_support::fresh(1), 0);
  std::string text;
  for (int i = 0; i < 6000; ++i) text += std::string(words[random.next() % 10]) + (i % 12 == 11 ? "\n" : " ");
  folder.write("data/corpus.txt", text);
  std::ostringstream toml;
  toml << "[job]\nname = \"tiny\"\ndump_folder = \"" << folder.path("runs") << "\"\ndevice = \"cpu\"\n"
       << "[model]\nflavor = \"debugmodel\"\ndim = 64\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\n"
       << "tokenizer_path = \"byte\"\n"
       << "[training]\nlocal_batch_size = 2\nseq_len = 32\nsteps = 6\nseed = 3\nmixed_precision_param = \"bfloat16\"\n"
       << "dataset_path = \"" << folder.path("data") << "\"\n"
       << "[optimizer]\nlr = 3e-3\n[lr_scheduler]\nwarmup_steps = 2\n[metrics]\nlog_freq = 1\nenable_tensorboard = false\n"
       << "[validation]\nenable = true\nfreq = 3\nsteps = 1\n";
  return folder.write("tiny.toml", toml.str());
}

TEST(Float8QualityScript, ComparesEachRecipeWithBf16AndFailsOutsideTheTolerance) {
  if (run_command("python3 --version").exit_code != 0) GTEST_SKIP() << "no python3 on this machine";
  const TemporaryFolder folder;
  const fs::path config = tiny_config(folder);
  const std::string smelt = std::string(SMELT_BINARY_DIR) + "/smelt";
  const std::string common = script("float8_quality.py") + " --smelt " + smelt + " --config " + config.string() +
                             " --runs " + folder.path("quality");
  const fs::path results = folder.path("quality.json");
  auto ok = run_command(common + " --recipes none,tensorwise,rowwise --output " + results.string());
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("| tensorwise |"), std::string::npos) << ok.output;

  std::ifstream file(results);
  const auto j = nlohmann::json::parse(file);
  ASSERT_EQ(j["runs"].size(), 3u);
  const double base = j["runs"][0]["final_validation_loss"].get<double>();
  for (const auto& run : j["runs"]) {
    SCOPED_TRACE(run["recipe"].get<std::string>());
    EXPECT_EQ(run["loss"].size(), 6u) << "one point per logged step";
    ASSERT_EQ(run["validation_loss"].size(), 2u) << "steps 3 and 6";
    const double last = run["validation_loss"][1][1].get<double>();
    EXPECT_TRUE(std::isfinite(last) && last > 0);
    EXPECT_EQ(run["final_validation_loss"].get<double>(), last);
    EXPECT_NEAR(run["relative_gap"].get<double>(), (last - base) / base, 1e-12);
    EXPECT_TRUE(run["within_tolerance"].get<bool>()) << "six steps of float8 against bf16 differ far less than 1.5%";
    // The run trained under its recipe: the log names it on the plan line.
    const std::string recipe = run["recipe"].get<std::string>();
    std::ifstream log(folder.path("quality/quality_" + recipe + ".log"));
    std::stringstream text;
    text << log.rdbuf();
    EXPECT_EQ(text.str().find("float8 " + recipe) != std::string::npos, recipe != "none") << text.str();
  }
  EXPECT_NE(j["runs"][1]["final_validation_loss"].get<double>(), base) << "float8 rounding changed nothing";

  // A tolerance below every gap (the baseline's own is 0): exit 1, naming the recipes.
  auto strict = run_command(common + " --recipes none,tensorwise --tolerance -0.01 --output " +
                            folder.path("strict.json"));
  EXPECT_EQ(strict.exit_code, 1) << strict.output;
  EXPECT_NE(strict.output.find("none, tensorwise ended more than"), std::string::npos) << strict.output;

  auto plot = run_command(script("plot_loss_curves.py") + " " + results.string() + " --output " +
                          folder.path("curves.html"));
  ASSERT_EQ(plot.exit_code, 0) << plot.output;
  std::ifstream page(folder.path("curves.html"));
  std::stringstream html;
  html << page.rdbuf();
  for (const char* expected : {"<svg", "validation loss", "tensorwise", "rowwise", "bf16"})
    EXPECT_NE(html.str().find(expected), std::string::npos) << expected;
}

TEST(Float8QualityScript, BadInputIsAClearErrorBeforeAnyRun) {
  if (run_command("python3 --version").exit_code != 0) GTEST_SKIP() << "no python3 on this machine";
  const TemporaryFolder folder;
  const std::string smelt = std::string(SMELT_BINARY_DIR) + "/smelt";
  auto missing = run_command(script("float8_quality.py") + " --smelt " + smelt + " --config " +
                             folder.path("absent.toml") + " --output " + folder.path("q.json"));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("absent.toml does not exist"), std::string::npos) << missing.output;
  auto one = run_command(script("float8_quality.py") + " --smelt " + smelt + " --config " +
                         std::string(SMELT_SOURCE_DIR) + "/configs/debug.toml --recipes none --output " +
                         folder.path("q.json"));
  EXPECT_NE(one.exit_code, 0);
  EXPECT_NE(one.output.find("--recipes needs a baseline"), std::string::npos) << one.output;
  EXPECT_FALSE(fs::exists(folder.path("q.json"))) << "no results file for a refused run";
}

// The shapes come from smelt's own plan of the config, and the table written from them (with a
// fresh random speed) is the one smelt bench sets beside its result: the compiled run, the faster.
TEST(PyTorchReferenceScript, TheTableItWritesIsOneSmeltBenchMatches) {
  if (run_command("python3 --version").exit_code != 0) GTEST_SKIP() << "no python3 on this machine";
  const TemporaryFolder folder;
  const fs::path config = tiny_config(folder);
  const std::string smelt = std::string(SMELT_BINARY_DIR) + "/smelt";
  smelt::Random random(smelt::testing_support::fresh(2), 0);
  const int64_t speed = 1000 + static_cast<int64_t>(random.next() % 90000);
  const double gb = 0.01 * static_cast<double>(10 + random.next() % 5000);
  const std::string table = folder.path("pytorch.toml");
  const std::string program =
      "import importlib.util\n"
      "spec = importlib.util.spec_from_file_location('reference', '" + std::string(SMELT_SOURCE_DIR) +
      "/scripts/pytorch_reference.py')\n"
      "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
      "name, shapes, batch, seq_len = m.model_shapes('" + smelt + "', '" + config.string() + "', [])\n"
      "runs = [(('bf16', 'none', 'none'), {'tokens_per_second': " + std::to_string(speed / 2) + ", 'peak_gb': 1.0}),\n"
      "        (('bf16', 'block', 'none'), {'tokens_per_second': " + std::to_string(speed) + ", 'peak_gb': " +
      std::to_string(gb) + "}),\n"
      "        (('bf16', 'block', 'selective-op'), {'tokens_per_second': 7.0, 'peak_gb': 1.0}),\n"
      "        (('fp8-tensorwise', 'linear', 'selective-op'), {'tokens_per_second': 5.0, 'peak_gb': 1.0}),\n"
      "        (('fp8-rowwise', 'block', 'none'), {'tokens_per_second': 6.0, 'peak_gb': 1.0}),\n"
      "        (('fp8-rowwise', 'none', 'none'), {'tokens_per_second': 4.0, 'peak_gb': 1.0})]\n"
      "open('" + table + "', 'w').write(m.table_text(name, shapes, batch, seq_len, runs, 'PyTorch, a test', 'cpu'))\n";
  const std::string script_file = folder.write("write_table.py", program);
  auto written = run_command("python3 " + script_file);
  ASSERT_EQ(written.exit_code, 0) << written.output;

  // Each float8 run names the fusion it compares with: whole blocks compiled "full", linear layers
  // compiled alone "linear", eager none.
  std::ifstream written_table(table);
  const std::string text((std::istreambuf_iterator<char>(written_table)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("precision = \"fp8-tensorwise\"\nactivation_checkpoint = \"selective-op\"\n"
                      "compile = \"linear layers only\"\nfusion = \"linear\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("compile = \"full (per block)\"\nfusion = \"full\"\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("compile = \"none (eager)\"\nfusion"), std::string::npos) << text;
  EXPECT_EQ(text.find("precision = \"bf16\"\nactivation_checkpoint = \"none\"\ncompile = \"full (per block)\"\nfusion"),
            std::string::npos) << text;

  const std::string output = folder.path("bench.json");
  auto bench = run_command(smelt + " bench --config " + config.string() + " --steps 1 --warmup 0 --reference " +
                           table + " --output " + output);
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  std::ifstream file(output);
  const auto j = nlohmann::json::parse(file);
  const auto& reference = j["reference"];
  ASSERT_TRUE(reference.is_object()) << bench.output;
  EXPECT_DOUBLE_EQ(reference["tokens_per_second"].get<double>(), static_cast<double>(speed));
  EXPECT_NEAR(reference["peak_gb"].get<double>(), gb, 0.006);
  EXPECT_EQ(reference["compile"], "full (per block)");
  EXPECT_EQ(reference["activation_checkpoint"], "none");
  EXPECT_EQ(reference["model"]["dim"], 64);
  EXPECT_EQ(reference["model"]["n_layers"], 2);
  EXPECT_EQ(reference["batch"], 2);
  EXPECT_EQ(reference["seq_len"], 32);
}

TEST(PyTorchReferenceScript, BadInputIsAClearErrorBeforeAnyRun) {
  if (run_command("python3 --version").exit_code != 0) GTEST_SKIP() << "no python3 on this machine";
  const TemporaryFolder folder;
  const fs::path config = tiny_config(folder);
  const std::string smelt = std::string(SMELT_BINARY_DIR) + "/smelt";
  const std::string out = folder.path("pytorch.toml");
  const std::string common = script("pytorch_reference.py") + " --out " + out;
  struct Case {
    std::string arguments, message;
  };
  const Case cases[] = {
      {" --smelt " + smelt + " --config " + config.string() + " --runs precision=fp9", "precision 'fp9' is not one of"},
      {" --smelt " + smelt + " --config " + config.string() + " --runs speed=fast", "'speed=fast' is not precision="},
      {" --smelt " + smelt + " --config " + config.string() + " --steps 0", "--steps and --warmup must be at least 1"},
      {" --smelt " + smelt + " --config " + config.string() + " --set training.seq_len", "'training.seq_len' is not KEY=VALUE"},
      {" --smelt " + smelt + " --config " + folder.path("absent.toml"), "absent.toml"},
      {" --smelt " + folder.path("no-smelt") + " --config " + config.string(), "name the binary with --smelt"},
  };
  for (const Case& c : cases) {
    auto refused = run_command(common + c.arguments);
    EXPECT_EQ(refused.exit_code, 2) << c.arguments << "\n" << refused.output;
    EXPECT_NE(refused.output.find(c.message), std::string::npos) << c.arguments << "\n" << refused.output;
    EXPECT_FALSE(fs::exists(out)) << "a refused run wrote " << out;
  }
}

}  // namespace
