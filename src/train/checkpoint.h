// Training checkpoints: fp32 master weights, AdamW moments and training progress written as
// safetensors files plus index.json (checksums), atomically, optionally on a background thread;
// sharded runs write a pair of files per rank; finding the newest complete one, verifying and
// loading it (or a Hugging Face folder).
#pragma once
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "data/loader.h"
#include "model/model_config.h"
#include "train/checkpoint_index.h"
#include "train/executor.h"

namespace smelt {

// A path from a config key: absolute paths as given; relative ones inside `run_folder`, which
// they may not leave (a config error naming `key` otherwise).
std::string resolve_run_path(const std::string& run_folder, const std::string& path, const std::string& key);

// "step-00000100": checkpoints sort by name in step order.
std::string checkpoint_name(int64_t step);
// The newest complete checkpoint (index present, every listed file present with its size) in
// `folder`; "" when there is none.
std::string find_newest_checkpoint(const std::string& folder);

struct LoadedCheckpoint {
  std::string path;
  bool from_hf = false;  // weights only: training starts at step 0 with zeroed moments
  // The arrays hold one rank's local shards (ShardLayout::local_total() floats each), not the
  // whole model (load_checkpoint_shards of a sharded checkpoint).
  bool local_shards = false;
  TrainingProgress progress;
  std::vector<float> parameters, exp_avg, exp_avg_sq;  // flat ParameterLayout order; moments empty when from_hf
};

// index.json of the checkpoint folder `folder`, validated, every listed file present with its
// size (checksums are verified when the files are read); Error(input) saying what is wrong.
CheckpointIndex read_checkpoint_index(const std::string& folder);

// `path`: a checkpoint, a folder of checkpoints (its newest), or a Hugging Face Llama folder.
// Every file's size and checksum is verified; a checkpoint of another model or smelt version is
// refused with a message saying what differs. Nothing is half-loaded: the result is complete or an error.
// A sharded checkpoint is assembled from every rank's files.
LoadedCheckpoint load_checkpoint(const std::string& path, const ModelConfig& model);
// What rank `rank` of the sharded layout `shards` loads: from a sharded checkpoint only the
// ranges it owns, read from the rank files that hold them (the same world size reads its own
// files; another one reshards); otherwise as load_checkpoint.
LoadedCheckpoint load_checkpoint_shards(const std::string& path, const ModelConfig& model, const ShardLayout& shards,
                                        int64_t rank);
// A sharded checkpoint's whole model, from every rank's model file (checksums verified); the
// metadata of rank 0's model file (smelt.model, smelt.tokenizer, smelt.seq_len) into `metadata`.
std::vector<float> read_sharded_parameters(const std::string& folder, const CheckpointIndex& index,
                                           const ModelConfig& model, std::map<std::string, std::string>* metadata);
// Copies weights (and moments) into the executor's arena (local shards: load_local_shards).
void restore_checkpoint(Executor& executor, const LoadedCheckpoint& checkpoint);

struct CheckpointOptions {
  std::string folder;        // absolute
  int64_t keep_latest_k = 2;  // 0 keeps all
  bool async = false;
  std::map<std::string, std::string> model_metadata;  // safetensors metadata of model.safetensors
  std::string model_json, config_json;
  // Sharded runs (a ShardLayout of several ranks): every rank writes its own files and rank 0 the
  // index; the ranks agree through `communicator`, so save(), poll() and finish() are collective
  // (every rank calls them at the same steps). With HSDP only the first shard group writes.
  const ShardLayout* shards = nullptr;
  Communicator* communicator = nullptr;
};

// Every rank's `problem` ("" when it has none); when any rank has one, every rank fails with the
// first (its kind and message, naming the rank). Collective.
void agree_on_problems(Communicator& communicator, const std::string& problem, ErrorKind kind = ErrorKind::input);

// Writes checkpoints. The host staging buffer (weights and both moments) is allocated once, here
// (sharded: this rank's shards only). save() copies from the device and returns; with async the
// files are written by a background thread while training continues (the next save waits for it).
// Errors surface at the next save or finish(). Sharded async writes are completed (the index
// written) by the first poll() after every rank's files are durable, or by finish().
class CheckpointWriter {
 public:
  CheckpointWriter(CheckpointOptions options, const ParameterLayout& layout);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void save(Executor& executor, const TrainingProgress& progress);
  void finish();  // waits for a background write; rethrows its error
  // Sharded async: completes a pending checkpoint once every rank's files are written (one
  // exchange per call while one is pending); true when it did. Collective; false otherwise.
  bool poll();
  bool sharded() const { return options_.shards != nullptr; }

  double last_copy_seconds() const { return copy_seconds_; }  // the part training waits for
  double last_write_seconds();                                // files, fsync, rename (waits)
  uint64_t last_bytes();                                      // bytes written by the last save (waits)

 private:
  void write(const TrainingProgress& progress);  // the files, from the staging buffer
  // Index last, fsync, rename of the partial folder, pruning to keep_latest_k.
  void publish(const std::string& name, const std::filesystem::path& partial, const CheckpointIndex& index);
  void worker();
  void wait_idle();  // the background job (if any) is done; errors stay pending
  void run_job(std::function<void()> job);  // on the background thread with async, else here
  // Sharded half (checkpoint_sharded.cpp).
  void save_sharded(Executor& executor, const TrainingProgress& progress);
  void write_rank_files_now();  // this rank's files into the partial folder; failures into rank_problem_
  void commit();                // collective: every rank's files -> rank 0 publishes the index
  std::filesystem::path sharded_partial(int64_t step) const;

  CheckpointOptions options_;
  const ParameterLayout& layout_;
  std::vector<float> staging_;  // (3 * P) fp32: parameters, exp_avg, exp_avg_sq
  double copy_seconds_ = 0, write_seconds_ = 0;
  uint64_t bytes_ = 0;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool busy_ = false, stopping_ = false;
  std::function<void()> job_;
  std::exception_ptr error_;
  std::thread thread_;

  // Sharded only.
  CheckpointSharding sharding_;
  int64_t rank_ = 0, shard_rank_ = 0;
  bool writes_files_ = false;      // the first shard group (HSDP replicas hold the same shards)
  bool commit_pending_ = false;    // a save whose index is not written yet
  TrainingProgress progress_;      // of that save
  std::vector<CheckpointFile> rank_files_;
  std::string rank_problem_;
};

// What the trainer calls: resume at start-up, save every `interval` steps and at the end.
class Checkpointer {
 public:
  // `tokenizer` and `seq_len` go into model.safetensors' metadata (so `smelt generate` reads a checkpoint).
  // `shards` and `communicator` (sharded runs of several ranks): every rank has a Checkpointer and
  // calls resume, after_step and finish at the same points; each writes its own files.
  Checkpointer(const JobConfig& config, const std::string& run_folder, const ModelConfig& model,
               const ParameterLayout& layout, const std::string& tokenizer, int64_t seq_len,
               const ShardLayout* shards = nullptr, Communicator* communicator = nullptr);
  // checkpoint.load when set, else (when enabled) the newest checkpoint in the folder; else step 0.
  // Restores the training data position; validation keeps none (each evaluation reads its split
  // from the start).
  TrainingProgress resume(Executor& executor, DataLoader& train, std::ostream& log);
  // Saves when `step` is due (every interval, and the last step).
  void after_step(Executor& executor, TrainingProgress& progress, bool last, std::ostream& log);
  // Waits for a background write and logs its size and time.
  void finish(std::ostream& log);
  const std::string& folder() const { return folder_; }

 private:
  void report_write(int64_t step, std::ostream& log);   // size and time of the last write
  void report_background_write(std::ostream& log);      // the pending background write's, once

  const JobConfig& config_;
  std::string run_folder_, folder_;
  const ModelConfig& model_;
  const ShardLayout* shards_ = nullptr;
  Communicator* communicator_ = nullptr;
  bool leader() const { return !communicator_ || communicator_->rank() == 0; }
  DataLoader* train_ = nullptr;
  std::unique_ptr<CheckpointWriter> writer_;
  int64_t background_step_ = -1;  // step of a background write not yet reported
};

}  // namespace smelt
