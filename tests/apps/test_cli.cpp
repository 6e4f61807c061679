// The smelt command line: exit codes and messages for bad input, and `smelt plan`
// output for a model far larger than this machine.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

Outcome run_smelt(const std::string& arguments) {
  const std::string command = std::string(SMELT_BINARY_DIR) + "/smelt " + arguments + " 2>&1";
  Outcome outcome;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return outcome;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) outcome.output.append(buffer.data(), n);
  int status = ::pclose(pipe);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return outcome;
}

std::string config(const char* name) { return std::string(SMELT_SOURCE_DIR) + "/configs/" + name; }

TEST(Cli, PlanPrintsTheBreakdownForEightBillion) {
  Outcome o = run_smelt("plan --config " + config("llama3_8b.toml") + " --activation_checkpoint.mode=selective-op");
  ASSERT_EQ(o.exit_code, 0) << o.output;
  for (const char* expected : {"llama3_8b: 32 layers", "selective-op", "parameters", "gradients", "optimizer state",
                               "activations", "recompute", "peak at step", "checkpointing policies", "full"})
    EXPECT_NE(o.output.find(expected), std::string::npos) << "missing '" << expected << "' in:\n" << o.output;
}

TEST(Cli, PlanJsonIsMachineReadable) {
  Outcome o = run_smelt("plan --config " + config("llama3_8b_proxy.toml") + " --format json --memory-budget-gb 80");
  ASSERT_EQ(o.exit_code, 0) << o.output;
  auto j = nlohmann::json::parse(o.output);
  EXPECT_EQ(j["model"]["n_layers"], 8);
  EXPECT_GT(j["arena_bytes"].get<double>(), 40e9);
  EXPECT_EQ(j["policies"].size(), 4u);
  for (const auto& p : j["policies"]) EXPECT_TRUE(p["fits"].is_boolean());
}

TEST(Cli, UnknownOverrideKeyExitsWithTwoAndNamesTheKey) {
  Outcome o = run_smelt("plan --training.sequence_length=4");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.output.find("training.sequence_length"), std::string::npos) << o.output;
}

TEST(Cli, BadValueInAFileNamesFileLineAndKey) {
  const fs::path file = fs::temp_directory_path() / ("smelt_cli_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(file) << "[training]\nsteps = 10\nseq_len = \"long\"\n";
  Outcome o = run_smelt("train --config " + file.string());
  fs::remove(file);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.output.find("seq_len"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find(file.filename().string()), std::string::npos) << o.output;
  EXPECT_NE(o.output.find(":3"), std::string::npos) << o.output;
}

TEST(Cli, MissingConfigFileExitsWithTwo) {
  Outcome o = run_smelt("train --config /nonexistent/smelt.toml");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.output.find("/nonexistent/smelt.toml"), std::string::npos) << o.output;
}

TEST(Cli, BadPolicyAndOutOfRangeValuesExitWithTwo) {
  Outcome policy = run_smelt("plan --activation_checkpoint.mode=sometimes");
  EXPECT_EQ(policy.exit_code, 2);
  EXPECT_NE(policy.output.find("activation_checkpoint.mode"), std::string::npos) << policy.output;
  Outcome range = run_smelt("plan --training.local_batch_size=0");
  EXPECT_EQ(range.exit_code, 2);
  EXPECT_NE(range.output.find("training.local_batch_size"), std::string::npos) << range.output;
}

TEST(Cli, CudaWithoutAGpuIsAClearError) {
  if (fs::exists("/dev/nvidia0")) GTEST_SKIP() << "a GPU is present";
  Outcome o = run_smelt("train --job.device=cuda --training.steps=1");
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.output.find("cuda"), std::string::npos) << o.output;
}

}  // namespace
