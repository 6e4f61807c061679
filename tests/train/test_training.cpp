// End-to-end training on the CPU: the debug model learns real text, and the run
// folder holds the effective config and one metrics line per logged step.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "train/lr_schedule.h"
#include "train/source_corpus.h"
#include "train/trainer.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;

std::string write_corpus(const fs::path& folder) {
  return testing_support::write_source_corpus(folder, {"docs", "src/model", "src/plan", "src/core"});
}

// Cross-entropy (nats) of the best context-free predictor: the bytes' own frequencies.
double unigram_entropy(const std::string& text) {
  std::map<unsigned char, double> counts;
  for (unsigned char c : text) counts[c] += 1;
  double entropy = 0;
  for (const auto& [byte, count] : counts) {
    double p = count / static_cast<double>(text.size());
    entropy -= p * std::log(p);
  }
  return entropy;
}

TEST(Training, DebugModelLearnsRealTextWithinTwoHundredSteps) {
  const testing_support::TemporaryFolder temporary;  // removed with what it holds, however the test ends
  const fs::path folder = temporary.path();
  const std::string text = write_corpus(folder / "data");
  ASSERT_GT(text.size(), 100000u);

  JobConfig config;
  config.job.name = "learns";
  config.job.dump_folder = (folder / "runs").string();
  config.training.dataset_path = (folder / "data").string();
  config.training.local_batch_size = 4;
  config.training.seq_len = 128;
  config.training.steps = 200;
  config.optimizer.lr = 2e-3;
  config.lr_scheduler.warmup_steps = 20;
  config.metrics.log_freq = 50;
  std::ostringstream log;
  TrainResult result = train(config, log);

  ASSERT_EQ(result.losses.size(), 200u);
  // Untrained: the final norm's output has unit RMS and the output weights std dim^-1/2
  // (truncated at 3 sigma), so the logits are about unit-variance Gaussians and the expected
  // loss is log(258) + 1/2 (the log-sum-exp of N(0, 1) logits), not the uniform guess log(258).
  // One batch is 512 bytes of this repository's own text, which changes with every commit: over 20
  // seeds on docs/ the first loss spread 5.91-6.21, and a batch inside a markdown table (few
  // distinct bytes, so correlated logits) gave 6.37. A wrong scale moves it by far more: output
  // weights of twice the std already give about log(258) + 2.
  EXPECT_NEAR(result.first_loss, std::log(258.0) + 0.5, 0.5);
  double last = 0;
  for (size_t i = 190; i < 200; ++i) last += result.losses[i] / 10;
  // Trained, it must beat every context-free predictor of this text by a clear margin:
  // the model has learned to use context, not just letter frequencies.
  const double unigram = unigram_entropy(text);
  EXPECT_LT(last, unigram - 0.5) << "unigram entropy " << unigram << ", log:\n" << log.str();

  // The run folder: the effective config and one JSON line per logged step.
  const fs::path run = folder / "runs" / "learns";
  EXPECT_TRUE(fs::exists(run / "config.json"));
  std::ifstream metrics(run / "metrics.jsonl");
  std::string line;
  std::vector<int64_t> steps;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    steps.push_back(j["step"].get<int64_t>());
    EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
    EXPECT_GT(j["tokens_per_second"].get<double>(), 0);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 50, 100, 150, 200}));
}

// Each evaluation reads the first validation.steps batches of the split: with the weights held
// (lr 0), every validation loss of the run is the one before training, bit for bit. A loader that
// went on through the split would read other batches at each evaluation (the split holds dozens).
TEST(Training, EveryValidationReadsTheSameBatches) {
  const testing_support::TemporaryFolder temporary;
  const fs::path folder = temporary.path();
  write_corpus(folder / "data");
  JobConfig config;
  config.job.name = "validation";
  config.job.dump_folder = (folder / "runs").string();
  config.training.dataset_path = (folder / "data").string();
  config.training.local_batch_size = 2;
  config.training.seq_len = 64;
  config.training.steps = 6;
  config.optimizer.lr = 0;
  config.metrics.log_freq = 2;
  config.validation.enable = true;
  config.validation.freq = 2;
  config.validation.steps = 2;
  std::ostringstream log;
  TrainResult result = train(config, log);
  ASSERT_GT(result.first_validation_loss, 0) << log.str();
  std::ifstream metrics(folder / "runs" / "validation" / "metrics.jsonl");
  std::string line;
  std::vector<double> losses;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("validation_loss")) losses.push_back(j["validation_loss"].get<double>());
  }
  ASSERT_EQ(losses.size(), 3u) << log.str();
  for (double loss : losses) EXPECT_EQ(loss, result.first_validation_loss) << log.str();
  // The training batches differ from step to step, so the held weights see different losses.
  EXPECT_NE(result.losses[0], result.losses[5]);
}

// validation.dataset_path reaches the loader: validation reads that text, not the held-out part
// of the training data (same weights, lr 0: a different first validation loss).
TEST(Training, ValidationDatasetPathIsWhatValidationReads) {
  const testing_support::TemporaryFolder temporary;
  const fs::path folder = temporary.path();
  write_corpus(folder / "data");
  {
    std::ofstream held(folder / "held.txt");
    for (int i = 0; i < 400; ++i) held << "validation text of its own, line " << i << "\n";
  }
  JobConfig config;
  config.job.dump_folder = (folder / "runs").string();
  config.training.dataset_path = (folder / "data").string();
  config.training.local_batch_size = 2;
  config.training.seq_len = 64;
  config.training.steps = 1;
  config.optimizer.lr = 0;
  config.validation.enable = true;
  config.validation.steps = 2;
  config.job.name = "held_out";
  std::ostringstream held_out_log;
  const TrainResult held_out = train(config, held_out_log);
  config.job.name = "own";
  config.validation.dataset_path = (folder / "held.txt").string();
  std::ostringstream own_log;
  const TrainResult own = train(config, own_log);
  ASSERT_GT(held_out.first_validation_loss, 0) << held_out_log.str();
  ASSERT_GT(own.first_validation_loss, 0) << own_log.str();
  EXPECT_NE(own.first_validation_loss, held_out.first_validation_loss);
  EXPECT_NE(own_log.str().find("validation: " + config.validation.dataset_path), std::string::npos) << own_log.str();
}

TEST(LrSchedule, WarmupThenLinearAndCosineDecay) {
  LrSchedule s;
  s.lr = 1.0;
  s.warmup_steps = 10;
  s.total_steps = 110;
  EXPECT_DOUBLE_EQ(s.at(1), 0.1);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.5, 1e-12);
  EXPECT_NEAR(s.at(110), 0.0, 1e-12);
  s.decay = DecayType::cosine;
  EXPECT_NEAR(s.at(60), 0.5, 1e-12);
  EXPECT_NEAR(s.at(35), 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  s.min_lr_factor = 0.1;
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  // A stable phase: decay only over the last 20% of steps.
  s.decay = DecayType::linear;
  s.min_lr_factor = 0;
  s.decay_ratio = 0.2;
  EXPECT_DOUBLE_EQ(s.at(80), 1.0);
  EXPECT_NEAR(s.at(99), 0.5, 1e-12);
}

}  // namespace
}  // namespace smelt
