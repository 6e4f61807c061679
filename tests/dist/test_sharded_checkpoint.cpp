// Per-rank checkpoints of sharded runs (ranks as threads): every rank writes its own files, rank 0
// the index; 2N steps == N + resume + N bit for bit (2 and 4 ranks, sync and async; HSDP); a
// 4-rank checkpoint resumes on 2 ranks and on 1; corrupted and missing rank files are refused
// naming the file; the model assembled from the rank files equals the same weights saved whole.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dist/sharded_fixture.h"
#include "train/checkpoint.h"
#include "train/hf_weights.h"
#include "train/model_weights.h"
#include "train/safetensors.h"
#include "train/source_corpus.h"
#include "train/trainer.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;

struct Folder : testing_support::CorpusFolder {
  Folder() : CorpusFolder({"docs", "src/train"}) {}
};

// `global_batch` sequences per step over `ranks` ranks.
JobConfig small_job(const Folder& folder, const std::string& name, int64_t global_batch, int64_t ranks, int64_t steps) {
  JobConfig config;
  config.job.name = name;
  config.job.dump_folder = (folder.path / "runs").string();
  config.model.dim = 32;
  config.model.n_layers = 2;
  config.model.n_heads = 4;
  config.model.n_kv_heads = 2;
  config.model.ffn_dim = 64;
  config.training.dataset_path = (folder.path / "data").string();
  config.training.local_batch_size = global_batch / ranks;
  config.training.seq_len = 16;
  config.training.steps = steps;
  config.optimizer.lr = 3e-3;
  config.optimizer.weight_decay = 0.1;
  config.lr_scheduler.warmup_steps = 1;
  config.metrics.log_freq = 1;
  config.parallelism.data_parallel_shard_degree = ranks;
  config.checkpoint.enable = true;
  config.checkpoint.keep_latest_k = 0;
  return config;
}

// Trains on `ranks` threads (one rank: the plain trainer); rank 0's result, every rank's log.
TrainResult train_ranks(const JobConfig& config, int ranks, std::vector<std::string>* logs = nullptr) {
  if (ranks == 1) {
    std::ostringstream log;
    TrainResult result = train(config, log);
    if (logs) logs->push_back(log.str());
    return result;
  }
  std::vector<TrainResult> results(static_cast<size_t>(ranks));
  std::vector<std::ostringstream> streams(static_cast<size_t>(ranks));
  testing::run_ranks(ranks, [&](Communicator& c) {
    results[static_cast<size_t>(c.rank())] = train(config, streams[static_cast<size_t>(c.rank())], &c);
  });
  if (logs)
    for (auto& s : streams) logs->push_back(s.str());
  return results[0];
}

fs::path checkpoint_of(const TrainResult& run, int64_t step) { return fs::path(run.run_folder) / "checkpoint" / checkpoint_name(step); }

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void flip_byte(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto middle = static_cast<std::streamoff>(fs::file_size(file) / 2);
  f.seekg(middle);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(middle);
  f.write(&c, 1);
}

void expect_per_rank_resume(int ranks, bool async) {
  Folder folder;
  const int64_t half = 3;
  JobConfig full = small_job(folder, "full", 4, ranks, 2 * half);
  full.checkpoint.interval = half;
  full.checkpoint.async = async;
  std::vector<std::string> logs;
  const TrainResult a = train_ranks(full, ranks, &logs);
  ASSERT_EQ(a.losses.size(), size_t(2 * half));

  // Every rank's pair of files, the index naming them with their checksums and the layout.
  const fs::path step_n = checkpoint_of(a, half);
  EXPECT_FALSE(fs::exists(step_n / "model.safetensors"));
  const CheckpointIndex index = read_checkpoint_index(step_n.string());
  EXPECT_EQ(index.format, kShardedCheckpointFormat);
  EXPECT_EQ(index.sharding.world_size, ranks);
  EXPECT_EQ(index.sharding.units.size(), size_t(4));  // embedding, 2 blocks, head
  ASSERT_EQ(index.files.size(), size_t(2 * ranks));
  for (int r = 0; r < ranks; ++r)
    for (const char* kind : {"model", "optimizer"}) {
      const std::string name = rank_file_name(kind, r, ranks);
      EXPECT_TRUE(fs::exists(step_n / name)) << name;
      bool listed = false;
      for (const auto& f : index.files) listed = listed || (f.name == name && f.rank == r);
      EXPECT_TRUE(listed) << name << " missing from the index";
    }
  EXPECT_EQ(index.progress.step, half);
  for (const auto& entry : fs::directory_iterator(step_n.parent_path()))
    EXPECT_NE(entry.path().filename().string().rfind(".partial-", 0), 0u) << entry.path();

  // N steps + resume + N steps: the same losses and final weights and moments, bit for bit.
  JobConfig resumed = small_job(folder, "resumed", 4, ranks, 2 * half);
  resumed.checkpoint.interval = half;
  resumed.checkpoint.async = async;
  resumed.checkpoint.load = step_n.string();
  logs.clear();
  const TrainResult b = train_ranks(resumed, ranks, &logs);
  EXPECT_NE(logs[static_cast<size_t>(ranks - 1)].find("(this rank's shards)"), std::string::npos) << logs.back();
  ASSERT_EQ(b.losses.size(), size_t(half));
  for (int64_t i = 0; i < half; ++i)
    EXPECT_EQ(a.losses[static_cast<size_t>(half + i)], b.losses[static_cast<size_t>(i)]) << "step " << half + i + 1;
  EXPECT_TRUE(load_safetensors(a.run_folder + "/model.safetensors").data ==
              load_safetensors(b.run_folder + "/model.safetensors").data)
      << "final weights differ";
  const CheckpointIndex end_a = read_checkpoint_index(checkpoint_of(a, 2 * half).string());
  const CheckpointIndex end_b = read_checkpoint_index(checkpoint_of(b, 2 * half).string());
  ASSERT_EQ(end_a.files.size(), end_b.files.size());
  for (size_t f = 0; f < end_a.files.size(); ++f) {  // weights and moments of every rank
    EXPECT_EQ(end_a.files[f].name, end_b.files[f].name);
    EXPECT_EQ(end_a.files[f].checksum, end_b.files[f].checksum) << end_a.files[f].name;
  }
}

TEST(ShardedCheckpoint, TwoRanksWritePerRankFilesAndResumeBitIdentically) { expect_per_rank_resume(2, false); }

TEST(ShardedCheckpoint, FourRanksWritePerRankFilesInTheBackgroundAndResumeBitIdentically) {
  expect_per_rank_resume(4, true);
}

// HSDP (2 shards x 2 replicas): the first shard group writes; every rank reads its shard's files.
TEST(ShardedCheckpoint, HsdpWritesOneShardGroupAndResumesBitIdentically) {
  Folder folder;
  auto job = [&](const std::string& name) {
    JobConfig config = small_job(folder, name, 4, 4, 4);
    config.parallelism.data_parallel_shard_degree = 2;
    config.parallelism.data_parallel_replicate_degree = 2;
    config.checkpoint.interval = 2;
    return config;
  };
  const TrainResult a = train_ranks(job("full"), 4);
  const CheckpointIndex index = read_checkpoint_index(checkpoint_of(a, 2).string());
  EXPECT_EQ(index.sharding.world_size, 2);
  EXPECT_EQ(index.files.size(), size_t(4));
  JobConfig resumed = job("resumed");
  resumed.checkpoint.load = checkpoint_of(a, 2).string();
  const TrainResult b = train_ranks(resumed, 4);
  ASSERT_EQ(b.losses.size(), size_t(2));
  EXPECT_EQ(a.losses[2], b.losses[0]);
  EXPECT_EQ(a.losses[3], b.losses[1]);
  EXPECT_TRUE(load_safetensors(a.run_folder + "/model.safetensors").data ==
              load_safetensors(b.run_folder + "/model.safetensors").data);
}

TEST(ShardedCheckpoint, AFourRankCheckpointResumesOnTwoRanksAndOnOne) {
  Folder folder;
  const int64_t half = 2;
  JobConfig four = small_job(folder, "four", 4, 4, 2 * half);
  four.checkpoint.interval = half;
  const TrainResult a = train_ranks(four, 4);
  const SavedModel at_half = load_model_weights(checkpoint_of(a, half).string());

  for (int ranks : {2, 1}) {
    SCOPED_TRACE(std::to_string(ranks) + " rank(s)");
    // Resumed with no steps left: the final weights are the checkpoint's, exactly.
    JobConfig same = small_job(folder, "weights-" + std::to_string(ranks), 4, ranks, half);
    same.checkpoint.load = checkpoint_of(a, half).string();
    train_ranks(same, ranks);
    const SavedModel loaded = load_model_weights((folder.path / "runs" / same.job.name).string());
    EXPECT_TRUE(loaded.parameters == at_half.parameters) << "resharded weights differ";
    // And training on: the same global batches, so the losses match the 4-rank run's up to
    // summation order (wrong moments would move them by far more).
    JobConfig more = small_job(folder, "more-" + std::to_string(ranks), 4, ranks, 2 * half);
    more.checkpoint.load = checkpoint_of(a, half).string();
    const TrainResult b = train_ranks(more, ranks);
    ASSERT_EQ(b.losses.size(), size_t(half));
    for (int64_t i = 0; i < half; ++i)
      EXPECT_NEAR(a.losses[static_cast<size_t>(half + i)], b.losses[static_cast<size_t>(i)], 2e-5) << "step " << half + i + 1;
  }
}

TEST(ShardedCheckpoint, ACorruptedOrMissingRankFileIsRefusedNamingIt) {
  Folder folder;
  JobConfig config = small_job(folder, "damaged", 4, 2, 2);
  config.checkpoint.interval = 1;
  const TrainResult a = train_ranks(config, 2);
  const fs::path step = checkpoint_of(a, 2);
  const std::string victim = rank_file_name("model", 1, 2);
  flip_byte(step / victim);
  JobConfig resumed = small_job(folder, "resumed", 4, 2, 3);
  resumed.checkpoint.load = step.string();
  std::string message = error_of([&] { train_ranks(resumed, 2); });
  EXPECT_NE(message.find(victim), std::string::npos) << message;
  EXPECT_NE(message.find("checksum"), std::string::npos) << message;
  message = error_of([&] { load_model_weights(step.string()); });  // export and generate assemble every file
  EXPECT_NE(message.find(victim), std::string::npos) << message;

  const std::string missing = rank_file_name("optimizer", 0, 2);
  fs::remove(step / missing);
  message = error_of([&] { train_ranks(resumed, 2); });
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  EXPECT_NE(message.find("missing"), std::string::npos) << message;
  // The newest complete checkpoint skips it.
  EXPECT_EQ(find_newest_checkpoint(step.parent_path().string()), checkpoint_of(a, 1).string());
}

TEST(ShardedCheckpoint, ExportOfAShardedCheckpointEqualsTheSameWeightsSavedWhole) {
  Folder folder;
  const TrainResult a = train_ranks(small_job(folder, "export", 4, 4, 2), 4);
  // Rank 0 also wrote the final weights whole (gathered): the same weights as the step-2 checkpoint.
  const SavedModel from_shards = load_model_weights(checkpoint_of(a, 2).string());
  const SavedModel whole = load_model_weights(a.run_folder);
  EXPECT_TRUE(from_shards.parameters == whole.parameters);
  EXPECT_EQ(model_config_to_json(from_shards.model), model_config_to_json(whole.model));
  EXPECT_EQ(from_shards.tokenizer, whole.tokenizer);
  EXPECT_EQ(from_shards.seq_len, whole.seq_len);
  // What `smelt export --format hf` writes from each.
  const fs::path hf_shards = folder.path / "hf-shards", hf_whole = folder.path / "hf-whole";
  save_hf_folder(hf_shards.string(), from_shards.model, from_shards.parameters.data(), DType::f32, from_shards.seq_len);
  save_hf_folder(hf_whole.string(), whole.model, whole.parameters.data(), DType::f32, whole.seq_len);
  EXPECT_TRUE(load_safetensors((hf_shards / "model.safetensors").string()).data ==
              load_safetensors((hf_whole / "model.safetensors").string()).data);
  // Resuming the sharded checkpoint whole (one rank, no steps left) gives the same weights too.
  LoadedCheckpoint loaded = load_checkpoint(checkpoint_of(a, 2).string(), from_shards.model);
  EXPECT_TRUE(loaded.parameters == whole.parameters);
  EXPECT_FALSE(loaded.local_shards);
}

}  // namespace
}  // namespace smelt
