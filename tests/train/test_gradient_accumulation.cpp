// Gradient accumulation from the config: training.global_batch_size over local_batch_size gives
// the passes per step; a run of two passes of two sequences trains as one of four (the same
// sequences, the same mean gradient), in the memory of the smaller pass; bad settings are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/run_setup.h"
#include "train/source_corpus.h"
#include "train/trainer.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;

JobConfig small_run(const fs::path& folder, const std::string& name, int64_t local, int64_t global) {
  JobConfig config;
  config.job.name = name;
  config.job.dump_folder = (folder / "runs").string();
  config.training.dataset_path = (folder / "data").string();
  config.training.local_batch_size = local;
  config.training.global_batch_size = global;
  config.model.dim = 64;
  config.model.n_layers = 2;
  config.training.seq_len = 64;
  config.training.steps = 6;
  config.optimizer.lr = 3e-3;
  config.lr_scheduler.warmup_steps = 2;
  config.metrics.log_freq = 3;
  return config;
}

TEST(GradientAccumulationTraining, TwoPassesOfTwoSequencesTrainAsOneOfFour) {
  const testing_support::TemporaryFolder temporary;
  const fs::path folder = temporary.path();
  testing_support::write_source_corpus(folder / "data", {"docs", "src/model"});

  std::ostringstream whole_log, accumulated_log;
  const TrainResult whole = train(small_run(folder, "whole", 4, -1), whole_log);
  const TrainResult accumulated = train(small_run(folder, "accumulated", 2, 4), accumulated_log);
  EXPECT_NE(accumulated_log.str().find("256 tokens/step (2 accumulated microbatches of batch 2 x seq 64)"),
            std::string::npos)
      << accumulated_log.str();
  ASSERT_EQ(whole.losses.size(), 6u);
  ASSERT_EQ(accumulated.losses.size(), 6u);
  // The same four sequences a step, the loss and gradient their mean: only f32 summation order
  // differs, so the losses agree to rounding at every step (they would not if one pass's gradient
  // were dropped or counted twice, or the data differed).
  for (size_t i = 0; i < 6; ++i)
    EXPECT_NEAR(accumulated.losses[i], whole.losses[i], 2e-5 * whole.losses[i]) << "step " << i + 1;
  EXPECT_NE(whole.losses[0], whole.losses[5]) << "the weights moved";
  // Half the activations: the accumulated run's arena is smaller.
  EXPECT_LT(accumulated.arena_bytes, whole.arena_bytes);
  // Throughput counts every pass's tokens: a logged step of the accumulated run holds 256.
  std::ifstream metrics(folder / "runs" / "accumulated" / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_GT(j["tokens_per_second"].get<double>(), 0);
    ++lines;
  }
  EXPECT_EQ(lines, 3);
}

TEST(GradientAccumulationTraining, PassesPerStepComeFromTheGlobalBatch) {
  JobConfig config;
  config.training.local_batch_size = 2;
  EXPECT_EQ(gradient_accumulation_steps(config, 1), 1);  // -1: one pass
  config.training.global_batch_size = 2;
  EXPECT_EQ(gradient_accumulation_steps(config, 1), 1);
  config.training.global_batch_size = 8;
  EXPECT_EQ(gradient_accumulation_steps(config, 1), 4);
  config.training.global_batch_size = 16;
  // Data parallel: 16 sequences over 8 ranks of 2 is one pass each, and no accumulation.
  EXPECT_EQ(gradient_accumulation_steps(config, 8), 1);
}

void expect_error(const JobConfig& config, int64_t ranks, const std::vector<std::string>& needles) {
  try {
    gradient_accumulation_steps(config, ranks);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "'" << needle << "' not in: " << e.what();
  }
}

TEST(GradientAccumulationTraining, BadSettingsAreErrorsNamingTheKeys) {
  JobConfig config;
  config.training.local_batch_size = 2;
  config.training.global_batch_size = 12;
  expect_error(config, 4, {"training.global_batch_size (12)", "2 x 4 = 8"});
  config.training.global_batch_size = 16;  // two passes on each of 4 ranks
  EXPECT_EQ(gradient_accumulation_steps(config, 4), 2);
  config.training.global_batch_size = 4;
  config.training.mixed_precision_param = "bfloat16";
  config.training.linear_grad_dtype = "bfloat16";
  expect_error(config, 1, {"training.linear_grad_dtype", "float32"});
  config.training.linear_grad_dtype = "auto";  // auto keeps them in f32 when accumulating
  EXPECT_EQ(gradient_accumulation_steps(config, 1), 2);
}

}  // namespace
}  // namespace smelt
