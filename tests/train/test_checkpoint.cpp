// Checkpoints: a run of 2N steps and a run resumed from its step-N checkpoint give bit-identical
// losses and weights (sync and async writes); corrupted, foreign and escaping checkpoints are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/random.h"
#include "model/model_config.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"
#include "train/trainer.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;
using testing_support::TemporaryFolder;

// Seeded pseudo-text: words from a small vocabulary, so the model has something to learn.
std::string corpus(uint64_t seed, size_t words) {
  static const char* vocabulary[] = {"the", "memory", "plan", "is", "known", "before", "step", "zero", "and",
                                     "every", "buffer", "has", "an", "offset", "in", "one", "arena", "."};
  Random random(testing_support::fresh(seed), 0);
  std::string text;
  for (size_t i = 0; i < words; ++i) text += std::string(vocabulary[random.next() % 18]) + " ";
  return text;
}

JobConfig tiny_config(const TemporaryFolder& folder, const std::string& name, int64_t steps) {
  JobConfig config;
  config.job.name = name;
  config.job.dump_folder = folder.path("runs");
  config.training.dataset_path = folder.path("data");
  config.model.dim = 64;
  config.model.n_layers = 2;
  config.model.n_heads = 4;
  config.model.n_kv_heads = 2;
  config.training.local_batch_size = 2;
  config.training.seq_len = 32;
  config.training.steps = steps;
  config.optimizer.lr = 3e-3;
  config.lr_scheduler.warmup_steps = 2;
  config.metrics.log_freq = 3;
  config.validation.enable = true;
  config.validation.freq = 2;
  config.validation.steps = 1;
  return config;
}

std::vector<uint8_t> weights_bytes(const std::string& run_folder) {
  return load_safetensors(run_folder + "/model.safetensors").data;
}

// global_batch: training.global_batch_size of both runs (-1: one pass per step; 6: three
// accumulated passes of 2 sequences, whose data position moves three batches per step).
void expect_exact_resume(bool async, int64_t global_batch = -1) {
  TemporaryFolder folder;
  folder.write("data/corpus.txt", corpus(7, 20000));
  const int64_t half = 4;
  JobConfig full = tiny_config(folder, "full", 2 * half);
  full.training.global_batch_size = global_batch;
  full.checkpoint.enable = true;
  full.checkpoint.interval = half;
  full.checkpoint.keep_latest_k = 0;
  full.checkpoint.async = async;
  std::ostringstream log_full;
  TrainResult a = train(full, log_full);
  ASSERT_EQ(a.losses.size(), size_t(2 * half));

  // A fresh process-equivalent: new executor, loaders and optimizer, from the step-N files alone.
  JobConfig resumed = tiny_config(folder, "resumed", 2 * half);
  resumed.training.global_batch_size = global_batch;
  resumed.checkpoint.load = fs::path(a.run_folder) / "checkpoint" / checkpoint_name(half);
  std::ostringstream log_resumed;
  TrainResult b = train(resumed, log_resumed);
  ASSERT_EQ(b.losses.size(), size_t(half)) << log_resumed.str();
  EXPECT_NE(log_resumed.str().find("resumed from"), std::string::npos);
  for (int64_t i = 0; i < half; ++i)
    EXPECT_EQ(std::memcmp(&a.losses[static_cast<size_t>(half + i)], &b.losses[static_cast<size_t>(i)], sizeof(double)), 0)
        << "step " << half + i + 1 << ": " << a.losses[static_cast<size_t>(half + i)] << " vs " << b.losses[static_cast<size_t>(i)];
  EXPECT_EQ(std::memcmp(&a.final_validation_loss, &b.final_validation_loss, sizeof(double)), 0);
  EXPECT_TRUE(weights_bytes(a.run_folder) == weights_bytes(b.run_folder)) << "final weights differ";
  // The losses moved: the comparison is not between two untrained models.
  EXPECT_LT(a.losses.back(), a.losses.front());
}

TEST(Checkpoint, ResumeFromStepNIsBitIdenticalToAnUninterruptedRun) { expect_exact_resume(false); }

TEST(Checkpoint, AsyncWritesResumeBitIdentically) { expect_exact_resume(true); }

TEST(Checkpoint, AccumulatedMicrobatchesResumeBitIdentically) { expect_exact_resume(false, 6); }

TEST(Checkpoint, KeepsTheLatestKAndAutoResumesFromTheNewest) {
  TemporaryFolder folder;
  folder.write("data/corpus.txt", corpus(8, 8000));
  JobConfig config = tiny_config(folder, "prune", 6);
  config.checkpoint.enable = true;
  config.checkpoint.interval = 2;
  config.checkpoint.keep_latest_k = 2;
  std::ostringstream log;
  TrainResult first = train(config, log);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(first.run_folder) / "checkpoint")) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000004", "step-00000006"}));
  // Same run folder, more steps: it continues from step 6 instead of starting over.
  config.training.steps = 8;
  std::ostringstream again;
  TrainResult second = train(config, again);
  EXPECT_EQ(second.losses.size(), 2u) << again.str();
  EXPECT_NE(again.str().find("step-00000006 at step 6"), std::string::npos) << again.str();
}

class SavedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_.write("data/corpus.txt", corpus(9, 8000));
    config_ = tiny_config(folder_, "saved", 2);
    config_.checkpoint.enable = true;
    config_.checkpoint.interval = 2;
    std::ostringstream log;
    run_folder_ = train(config_, log).run_folder;
    checkpoint_ = fs::path(run_folder_) / "checkpoint" / checkpoint_name(2);
    model_ = load_model_weights_model();
  }
  ModelConfig load_model_weights_model() {
    std::ifstream in(checkpoint_ / "index.json");
    std::stringstream text;
    text << in.rdbuf();
    return model_config_from_json(parse_checkpoint_index(text.str(), "index").model_json, "index");
  }
  std::string expect_load_error(const std::string& path, const ModelConfig& model) {
    try {
      load_checkpoint(path, model);
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "loading " << path << " should have failed";
    return "";
  }
  TemporaryFolder folder_;
  JobConfig config_;
  std::string run_folder_;
  fs::path checkpoint_;
  ModelConfig model_;
};

TEST_F(SavedCheckpoint, LoadsAndMatchesTheSavedWeights) {
  LoadedCheckpoint loaded = load_checkpoint(checkpoint_.parent_path().string(), model_);  // folder: its newest
  EXPECT_EQ(loaded.progress.step, 2);
  EXPECT_EQ(loaded.progress.optimizer_steps, 2);
  const SafetensorsFile final_weights = load_safetensors(run_folder_ + "/model.safetensors");
  ASSERT_EQ(final_weights.data.size(), loaded.parameters.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(final_weights.data.data(), loaded.parameters.data(), final_weights.data.size()), 0);
  double moment = 0;
  for (float v : loaded.exp_avg_sq) moment += v;
  EXPECT_GT(moment, 0) << "the second moments were saved";
}

TEST_F(SavedCheckpoint, RefusesACorruptedFile) {
  const fs::path file = checkpoint_ / "optimizer.safetensors";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(fs::file_size(file) / 2));
  f.put('\x5a');
  f.close();
  EXPECT_NE(expect_load_error(checkpoint_.string(), model_).find("corrupted"), std::string::npos);
}

TEST_F(SavedCheckpoint, RefusesAnotherModel) {
  ModelConfig other = model_;
  other.dim = 128;
  const std::string message = expect_load_error(checkpoint_.string(), other);
  EXPECT_NE(message.find("dim 64 (saved) vs 128 (this run)"), std::string::npos) << message;
}

TEST_F(SavedCheckpoint, RefusesAnotherSmeltVersion) {
  std::ifstream in(checkpoint_ / "index.json");
  std::stringstream text;
  text << in.rdbuf();
  in.close();
  std::string json = text.str();
  const std::string current = "\"smelt_version\": \"" SMELT_VERSION "\"";
  ASSERT_NE(json.find(current), std::string::npos) << json.substr(0, 200);
  json.replace(json.find(current), current.size(), "\"smelt_version\": \"0.0.1-other\"");
  std::ofstream(checkpoint_ / "index.json") << json;
  EXPECT_NE(expect_load_error(checkpoint_.string(), model_).find("written by smelt 0.0.1-other"), std::string::npos);
}

TEST_F(SavedCheckpoint, AnIncompleteCheckpointIsNotTheNewest) {
  fs::copy(checkpoint_, checkpoint_.parent_path() / checkpoint_name(3), fs::copy_options::recursive);
  fs::resize_file(checkpoint_.parent_path() / checkpoint_name(3) / "model.safetensors", 100);
  EXPECT_EQ(find_newest_checkpoint(checkpoint_.parent_path().string()), checkpoint_.string());
}

TEST(CheckpointPaths, RelativePathsStayInsideTheRunFolder) {
  EXPECT_EQ(resolve_run_path("/runs/a", "checkpoint", "checkpoint.folder"), "/runs/a/checkpoint");
  EXPECT_EQ(resolve_run_path("/runs/a", "x/../y", "checkpoint.folder"), "/runs/a/y");
  EXPECT_EQ(resolve_run_path("/runs/a", "/elsewhere/ckpt", "checkpoint.folder"), "/elsewhere/ckpt");
  for (const char* escaping : {"..", "../b", "x/../../b"}) {
    try {
      resolve_run_path("/runs/a", escaping, "checkpoint.folder");
      ADD_FAILURE() << escaping << " should be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("leaves the run folder"), std::string::npos) << e.what();
    }
  }
}

TEST(CheckpointIndex, RoundTripsAndRejectsMalformedFields) {
  CheckpointIndex index;
  index.smelt_version = "1.2.3";
  index.model_json = R"({"dim": 8})";
  index.progress.step = 10;
  index.progress.optimizer_steps = 9;
  index.progress.skipped_steps = 1;
  index.progress.loader = {2, 17, 42};
  index.progress.loss_window = {3.5, 3.25};
  index.files = {{"model.safetensors", 1234, 0xfedcba9876543210ull}};
  const std::string json = checkpoint_index_to_json(index);
  CheckpointIndex back = parse_checkpoint_index(json, "test");
  EXPECT_EQ(back.progress.step, 10);
  EXPECT_EQ(back.progress.loader.position, 17u);
  EXPECT_EQ(back.progress.loss_window, index.progress.loss_window);
  ASSERT_EQ(back.files.size(), 1u);
  EXPECT_EQ(back.files[0].checksum, 0xfedcba9876543210ull);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"model.safetensors\"", "\"../model.safetensors\""},
           {"\"step\": 10", "\"step\": -1"},
           {"\"optimizer_steps\": 9", "\"optimizer_steps\": 11"},
           {"\"format\": 1", "\"format\": 2"},
           {"smelt-hash64:fedcba9876543210", "smelt-hash64:fedcba987654321x"}}) {
    std::string broken = json;
    ASSERT_NE(broken.find(from), std::string::npos) << from;
    broken.replace(broken.find(from), from.size(), to);
    EXPECT_THROW(parse_checkpoint_index(broken, "test"), Error) << to;
  }
}

// Earlier versions saved the validation loader's position; every evaluation now reads its split
// from the start, so the index no longer has one, and an old index's is checked but not used.
TEST(CheckpointIndex, ReadsAnEarlierVersionsValidationPositionAndWritesNone) {
  CheckpointIndex index;
  index.smelt_version = "1.2.3";
  index.model_json = R"({"dim": 8})";
  index.progress.step = 6;
  index.progress.optimizer_steps = 6;
  index.progress.loader = {1, 33, 7};
  index.files = {{"model.safetensors", 99, 0x0123456789abcdefull}};
  const std::string json = checkpoint_index_to_json(index);
  EXPECT_EQ(json.find("validation_loader"), std::string::npos) << json;

  const std::string anchor = "\"loss_window\"";
  ASSERT_NE(json.find(anchor), std::string::npos);
  auto with_validation = [&](const std::string& position) {
    std::string old = json;
    old.insert(old.find(anchor), "\"validation_loader\": {\"epoch\": 0, \"position\": " + position + ", \"seed\": 7}, ");
    return old;
  };
  const CheckpointIndex back = parse_checkpoint_index(with_validation("5"), "old index");
  EXPECT_EQ(back.progress.step, 6);
  EXPECT_EQ(back.progress.loader.epoch, 1u);
  EXPECT_EQ(back.progress.loader.position, 33u);
  EXPECT_EQ(back.progress.loader.seed, 7u);
  EXPECT_THROW(parse_checkpoint_index(with_validation("-5"), "old index"), Error);
  EXPECT_THROW(parse_checkpoint_index(with_validation("\"5\""), "old index"), Error);
}

TEST(CheckpointIndex, ShardedIndexRoundTripsAndRejectsInconsistentLayouts) {
  CheckpointIndex index;
  index.format = kShardedCheckpointFormat;
  index.smelt_version = "1.2.3";
  index.model_json = R"({"dim": 8})";
  index.sharding.world_size = 3;
  index.sharding.units = {{"tok_embeddings", 0, 100, 64}, {"norm+output", 100, 130, 64}};
  for (int64_t r = 0; r < 3; ++r) index.files.push_back({rank_file_name("model", r, 3), 100 + static_cast<uint64_t>(r), 7, r});
  EXPECT_EQ(rank_file_name("optimizer", 2, 4), "optimizer.rank-00002-of-00004.safetensors");
  const std::string json = checkpoint_index_to_json(index);
  const CheckpointIndex back = parse_checkpoint_index(json, "test");
  EXPECT_EQ(back.format, kShardedCheckpointFormat);
  EXPECT_EQ(back.sharding.world_size, 3);
  ASSERT_EQ(back.sharding.units.size(), 2u);
  EXPECT_EQ(back.sharding.units[1].name, "norm+output");
  EXPECT_EQ(back.sharding.units[1].offset, 100);
  EXPECT_EQ(back.sharding.units[1].length, 130);
  EXPECT_EQ(back.sharding.units[1].shard, 64);
  ASSERT_EQ(back.files.size(), 3u);
  EXPECT_EQ(back.files[2].rank, 2);
  EXPECT_EQ(back.files[2].name, "model.rank-00002-of-00003.safetensors");
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"world_size\": 3", "\"world_size\": 0"},
           {"\"offset\": 100", "\"offset\": 99"},      // units must tile the model
           {"\"length\": 130", "\"length\": 200"},     // 3 shards of 64 cannot hold 200
           {"\"length\": 130", "\"length\": 0"},
           {"\"rank\": 2", "\"rank\": 3"},             // a rank beyond the world size
           {"\"format\": 2", "\"format\": 1"},         // a sharding section needs format 2
           {"\"units\": [", "\"units\": 5, \"x\": ["}}) {
    std::string broken = json;
    ASSERT_NE(broken.find(from), std::string::npos) << from;
    broken.replace(broken.find(from), from.size(), to);
    EXPECT_THROW(parse_checkpoint_index(broken, "test"), Error) << to;
  }
}

TEST(Checksum, StreamingEqualsOneShotAndSeesEveryByte) {
  std::vector<unsigned char> bytes(1000);
  Random random(testing_support::fresh(5), 0);
  for (auto& b : bytes) b = static_cast<unsigned char>(random.next());
  const uint64_t whole = checksum64(bytes.data(), bytes.size());
  for (size_t split : {0, 1, 31, 32, 33, 999}) {
    Checksum c;
    c.update(bytes.data(), split);
    c.update(bytes.data() + split, bytes.size() - split);
    EXPECT_EQ(c.finish(), whole) << split;
  }
  for (size_t i : {0, 500, 999}) {
    bytes[i] ^= 1;
    EXPECT_NE(checksum64(bytes.data(), bytes.size()), whole) << i;
    bytes[i] ^= 1;
  }
  EXPECT_NE(checksum64(bytes.data(), 999), checksum64(bytes.data(), 1000));
}

}  // namespace
}  // namespace smelt
