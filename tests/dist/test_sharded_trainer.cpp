// The trainer with ranks as threads: two ranks on slices of each global batch train like one
// rank on the whole batch; rank 0 alone writes the run folder (metrics with the communication
// dtype and bytes, weights; each rank writes its own checkpoint files, test_sharded_checkpoint.cpp);
// a sharded run resumes from its checkpoint; ranks that
// disagree on the config stop with an error naming the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dist/sharded_fixture.h"
#include "train/source_corpus.h"
#include "train/trainer.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;

struct Folder : testing_support::CorpusFolder {
  Folder() : CorpusFolder({"docs", "src/plan"}) {}
};

JobConfig small_job(const Folder& folder, const std::string& name, int64_t batch, int64_t ranks) {
  JobConfig config;
  config.job.name = name;
  config.job.dump_folder = (folder.path / "runs").string();
  config.model.dim = 32;
  config.model.n_layers = 2;
  config.model.n_heads = 4;
  config.model.n_kv_heads = 2;
  config.model.ffn_dim = 64;
  config.training.dataset_path = (folder.path / "data").string();
  config.training.local_batch_size = batch;
  config.training.seq_len = 32;
  config.training.steps = 4;
  config.optimizer.lr = 3e-3;
  config.lr_scheduler.warmup_steps = 1;
  config.metrics.log_freq = 1;
  config.parallelism.data_parallel_shard_degree = ranks;
  return config;
}

// Trains `config` on `ranks` threads; returns rank 0's result and every rank's log.
TrainResult train_ranks(const JobConfig& config, int ranks, std::vector<std::string>* logs = nullptr,
                        const std::function<void(JobConfig&, int)>& per_rank = {}) {
  std::vector<TrainResult> results(static_cast<size_t>(ranks));
  std::vector<std::ostringstream> streams(static_cast<size_t>(ranks));
  testing::run_ranks(ranks, [&](Communicator& c) {
    JobConfig mine = config;
    if (per_rank) per_rank(mine, c.rank());
    results[static_cast<size_t>(c.rank())] = train(mine, streams[static_cast<size_t>(c.rank())], &c);
  });
  if (logs)
    for (auto& s : streams) logs->push_back(s.str());
  return results[0];
}

// Gradient accumulation over ranks: 2 ranks of batch 1 in 2 passes a step (global batch 4) read
// the 4 sequences one rank of batch 4 reads, and train the same.
TEST(ShardedTrainer, TwoRanksAccumulatingTwoPassesTrainLikeOneRankOnTheWholeStep) {
  Folder folder;
  std::ostringstream single_log;
  const TrainResult single = train(small_job(folder, "single", 4, 1), single_log);
  JobConfig accumulated = small_job(folder, "accumulated", 1, 2);
  accumulated.training.global_batch_size = 4;
  std::vector<std::string> logs;
  const TrainResult sharded = train_ranks(accumulated, 2, &logs);
  // The plan is per rank: 64 of the step's 128 tokens.
  EXPECT_NE(logs[0].find("64 tokens/step (2 accumulated microbatches of batch 1 x seq 32)"), std::string::npos)
      << logs[0];
  ASSERT_EQ(sharded.losses.size(), single.losses.size());
  for (size_t s = 0; s < single.losses.size(); ++s)
    EXPECT_NEAR(sharded.losses[s], single.losses[s], 2e-5) << "step " << s + 1;
  EXPECT_NE(single.losses.front(), single.losses.back());
}

TEST(ShardedTrainer, TwoRanksTrainLikeOneRankOnTheWholeBatchAndOnlyRankZeroWrites) {
  Folder folder;
  std::ostringstream single_log;
  const TrainResult single = train(small_job(folder, "single", 4, 1), single_log);
  std::vector<std::string> logs;
  const TrainResult sharded = train_ranks(small_job(folder, "sharded", 2, 2), 2, &logs);
  ASSERT_EQ(sharded.losses.size(), single.losses.size());
  for (size_t s = 0; s < single.losses.size(); ++s)  // f32: summation order only (see test_sharded_training.cpp)
    EXPECT_NEAR(sharded.losses[s], single.losses[s], 2e-5) << "step " << s + 1;
  EXPECT_NE(logs[1].find("rank 1/2: step:"), std::string::npos) << logs[1];
  EXPECT_NE(logs[0].find("FSDP over 2 rank(s) (local threads)"), std::string::npos) << logs[0];
  // Rank 0's metrics say what the collectives moved.
  std::ifstream metrics(folder.path / "runs" / "sharded" / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("ranks").get<int>(), 2);
    EXPECT_EQ(j.at("gather_dtype").get<std::string>(), "f32");
    EXPECT_EQ(j.at("reduce_dtype").get<std::string>(), "f32");
    EXPECT_GT(j.at("communication_bytes").get<double>(), 0);
    ++lines;
  }
  EXPECT_EQ(lines, 4);
  EXPECT_TRUE(fs::exists(folder.path / "runs" / "sharded" / "model.safetensors"));
}

TEST(ShardedTrainer, ASharded4RankRunResumesFromItsCheckpoint) {
  Folder folder;
  JobConfig config = small_job(folder, "resume", 1, 4);
  config.training.steps = 4;
  config.checkpoint.enable = true;
  config.checkpoint.interval = 2;
  config.checkpoint.keep_latest_k = 0;
  const TrainResult straight = train_ranks(config, 4);
  // Drop the step-4 checkpoint and run again: it resumes at step 2 and must repeat steps 3 and 4.
  fs::remove_all(folder.path / "runs" / "resume" / "checkpoint" / "step-00000004");
  std::vector<std::string> logs;
  const TrainResult resumed = train_ranks(config, 4, &logs);
  EXPECT_NE(logs[0].find("resumed from"), std::string::npos) << logs[0];
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[0], straight.losses[2]);
  EXPECT_EQ(resumed.losses[1], straight.losses[3]);
}

TEST(ShardedTrainer, RanksThatDisagreeOnTheConfigStop) {
  Folder folder;
  try {
    train_ranks(small_job(folder, "disagree", 2, 2), 2, nullptr,
                [](JobConfig& c, int rank) { c.training.seq_len = rank == 0 ? 32 : 64; });
    FAIL() << "ranks with different configs trained";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training.seq_len"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace smelt
