// Training checkpoints: fp32 master weights, AdamW moments and training progress written as
// safetensors files plus index.json (checksums), atomically, optionally on a background thread;
// finding the newest complete one, verifying and loading it (or a Hugging Face folder).
#pragma once
#include <condition_variable>
#include <exception>
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
  TrainingProgress progress;
  std::vector<float> parameters, exp_avg, exp_avg_sq;  // flat ParameterLayout order; moments empty when from_hf
};

// `path`: a checkpoint, a folder of checkpoints (its newest), or a Hugging Face Llama folder.
// Every file's size and checksum is verified; a checkpoint of another model or smelt version is
// refused with a message saying what differs. Nothing is half-loaded: the result is complete or an error.
LoadedCheckpoint load_checkpoint(const std::string& path, const ModelConfig& model);
// Copies weights (and moments) into the executor's arena.
void restore_checkpoint(Executor& executor, const LoadedCheckpoint& checkpoint);

struct CheckpointOptions {
  std::string folder;        // absolute
  int64_t keep_latest_k = 2;  // 0 keeps all
  bool async = false;
  std::map<std::string, std::string> model_metadata;  // safetensors metadata of model.safetensors
  std::string model_json, config_json;
};

// Writes checkpoints. The host staging buffer (weights and both moments) is allocated once, here.
// save() copies from the device and returns; with async the files are written by a background
// thread while training continues (the next save waits for it). Errors surface at the next save or finish().
class CheckpointWriter {
 public:
  CheckpointWriter(CheckpointOptions options, const ParameterLayout& layout);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void save(Executor& executor, const TrainingProgress& progress);
  void finish();  // waits for a background write; rethrows its error

  double last_copy_seconds() const { return copy_seconds_; }  // the part training waits for
  double last_write_seconds();                                // files, fsync, rename (waits)
  uint64_t last_bytes();                                      // bytes written by the last save (waits)

 private:
  void write(const TrainingProgress& progress);  // the files, from the staging buffer
  void worker();

  CheckpointOptions options_;
  const ParameterLayout& layout_;
  std::vector<float> staging_;  // (3 * P) fp32: parameters, exp_avg, exp_avg_sq
  double copy_seconds_ = 0, write_seconds_ = 0;
  uint64_t bytes_ = 0;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool busy_ = false, stopping_ = false;
  TrainingProgress pending_;
  std::exception_ptr error_;
  std::thread thread_;
};

// What the trainer calls: resume at start-up, save every `interval` steps and at the end.
class Checkpointer {
 public:
  // `tokenizer` and `seq_len` go into model.safetensors' metadata (so `smelt generate` reads a checkpoint).
  Checkpointer(const JobConfig& config, const std::string& run_folder, const ModelConfig& model,
               const ParameterLayout& layout, const std::string& tokenizer, int64_t seq_len);
  // checkpoint.load when set, else (when enabled) the newest checkpoint in the folder; else step 0.
  TrainingProgress resume(Executor& executor, DataLoader& train, DataLoader* validation, std::ostream& log);
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
  DataLoader* train_ = nullptr;
  DataLoader* validation_ = nullptr;
  std::unique_ptr<CheckpointWriter> writer_;
  int64_t background_step_ = -1;  // step of a background write not yet reported
};

}  // namespace smelt
