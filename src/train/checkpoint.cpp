// Writing checkpoints: staging copy, safetensors files with checksums, index last, atomic rename,
// pruning to keep_latest_k; and the trainer-facing Checkpointer (resume and periodic saves).
// The sharded writer's per-rank half is in checkpoint_sharded.cpp.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <ostream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/checkpoint_shards.h"

namespace smelt {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kWriteChunkBytes = size_t(64) << 20;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void write_all(int fd, const void* data, size_t bytes, const std::string& path, Checksum& checksum) {
  const auto* p = static_cast<const char*>(data);
  checksum.update(p, bytes);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min(bytes, kWriteChunkBytes));
    if (n <= 0) {
      ::close(fd);
      fail(ErrorKind::input, "writing checkpoint file '" + path + "' failed (disk full?); free space or change checkpoint.folder");
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

int open_for_writing(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(ErrorKind::input, "cannot create checkpoint file '" + path + "'; check that the folder is writable");
  return fd;
}

void sync_and_close(int fd, const std::string& path) {
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail(ErrorKind::input, "fsync of '" + path + "' failed; the checkpoint is not durable, check the disk");
  }
  ::close(fd);
}

void sync_folder(const fs::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::vector<int64_t> shape_of(const ParameterInfo& p) {
  return p.rows == 1 ? std::vector<int64_t>{p.cols} : std::vector<int64_t>{p.rows, p.cols};
}

bool is_checkpoint_name(const std::string& name) {
  return name.size() == 13 && name.rfind("step-", 0) == 0 &&
         std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Removes a folder by renaming it first, so a kill never leaves half a checkpoint under a step name.
void remove_checkpoint_folder(const fs::path& folder) {
  const fs::path doomed = folder.parent_path() / (".deleting-" + folder.filename().string() + "-" + std::to_string(::getpid()));
  fs::rename(folder, doomed);
  fs::remove_all(doomed);
}

}  // namespace

// One safetensors file, streamed from the staging buffer, with its checksum.
CheckpointFile write_tensor_file(const fs::path& path, const std::vector<TensorSource>& tensors,
                                 const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string json = header.dump();
  while (json.size() % 8) json += ' ';
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[static_cast<size_t>(i)] = static_cast<char>((uint64_t(json.size()) >> (8 * i)) & 0xff);
  prefix += json;
  Checksum checksum;
  const int fd = open_for_writing(path.string());
  write_all(fd, prefix.data(), prefix.size(), path.string(), checksum);
  for (const auto& t : tensors) write_all(fd, t.data, t.bytes, path.string(), checksum);
  sync_and_close(fd, path.string());
  return {path.filename().string(), prefix.size() + offset, checksum.finish()};
}

std::string checkpoint_name(int64_t step) {
  std::string digits = std::to_string(step);
  return "step-" + std::string(digits.size() < 8 ? 8 - digits.size() : 0, '0') + digits;
}

std::string resolve_run_path(const std::string& run_folder, const std::string& path, const std::string& key) {
  if (path.empty()) return "";
  const fs::path given(path);
  if (given.is_absolute()) return given.lexically_normal().string();
  const fs::path base = fs::absolute(run_folder).lexically_normal();
  const fs::path joined = (base / given).lexically_normal();
  const fs::path inside = joined.lexically_relative(base);
  if (inside.empty() || *inside.begin() == "..")
    fail(ErrorKind::config, key + " = \"" + path + "\" leaves the run folder '" + base.string() +
                                "'; expected a path inside it, or give an absolute path");
  return joined.string();
}

CheckpointWriter::CheckpointWriter(CheckpointOptions options, const ParameterLayout& layout)
    : options_(std::move(options)), layout_(layout) {
  if (sharded()) {
    SMELT_CHECK(options_.communicator != nullptr, "a sharded CheckpointWriter needs the ranks' communicator");
    sharding_ = describe_sharding(*options_.shards);
    rank_ = options_.communicator->rank();
    shard_rank_ = rank_ % sharding_.world_size;  // shard groups are runs of consecutive ranks
    writes_files_ = rank_ < sharding_.world_size;
    staging_.resize(static_cast<size_t>(3 * options_.shards->local_total()));
  } else {
    staging_.resize(static_cast<size_t>(3 * layout.total()));
  }
  fs::create_directories(options_.folder);
  // Leftovers of a run that was killed while writing or deleting: never complete, safe to drop.
  // Sharded runs: rank 0 alone, before any rank writes (the first save is after collectives).
  if (!sharded() || rank_ == 0)
    for (const auto& entry : fs::directory_iterator(options_.folder)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(".partial-", 0) == 0 || name.rfind(".deleting-", 0) == 0) fs::remove_all(entry.path());
    }
  if (options_.async) thread_ = std::thread([this] { worker(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return !busy_; });
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::wait_idle() {
  std::unique_lock lock(mutex_);
  wake_.wait(lock, [&] { return !busy_; });
}

void CheckpointWriter::run_job(std::function<void()> job) {
  if (!options_.async) {
    job();
    return;
  }
  {
    std::lock_guard lock(mutex_);
    job_ = std::move(job);
    busy_ = true;
  }
  wake_.notify_all();
}

void CheckpointWriter::finish() {
  if (sharded()) {
    wait_idle();
    if (commit_pending_) commit();  // collective: every rank is here
  }
  std::unique_lock lock(mutex_);
  wake_.wait(lock, [&] { return !busy_; });
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

double CheckpointWriter::last_write_seconds() {
  if (sharded()) {
    wait_idle();  // not collective: finish() has completed the save
    return write_seconds_;
  }
  finish();
  return write_seconds_;
}

uint64_t CheckpointWriter::last_bytes() {
  if (sharded()) {
    wait_idle();
    return bytes_;
  }
  finish();
  return bytes_;
}

void CheckpointWriter::save(Executor& executor, const TrainingProgress& progress) {
  if (sharded()) return save_sharded(executor, progress);
  finish();  // the staging buffer is free once the previous write is done
  const auto start = Clock::now();
  const int64_t total = layout_.total();
  const TensorView exp_avg = executor.view(executor.plan().exp_avg), exp_avg_sq = executor.view(executor.plan().exp_avg_sq);
  if (exp_avg.dtype != DType::f32 || exp_avg_sq.dtype != DType::f32)
    fail(ErrorKind::config, "checkpoints hold fp32 AdamW moments, found " + std::string(dtype_name(exp_avg.dtype)) +
                                "; use fp32 master weights or disable checkpoint.enable");
  // Whole-model arrays; collective when sharded (the other ranks take part: Trainer, take_part_in_checkpoint).
  executor.read_parameters(staging_.data());
  executor.read_optimizer_state(staging_.data() + total, staging_.data() + 2 * total);
  for (int64_t i = 0; i < total; ++i)
    if (!std::isfinite(staging_[static_cast<size_t>(i)]))
      fail(ErrorKind::internal, "refusing to checkpoint step " + std::to_string(progress.step) + ": parameter " +
                                    std::to_string(i) + " is " + std::to_string(staging_[static_cast<size_t>(i)]) +
                                    "; the last good checkpoint is kept. Lower optimizer.lr or use training.on_nonfinite = \"skip\"");
  copy_seconds_ = seconds_since(start);
  run_job([this, progress] { write(progress); });
}

void CheckpointWriter::worker() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return busy_ || stopping_; });
    if (!busy_ && stopping_) return;
    std::function<void()> job = std::move(job_);
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    busy_ = false;
    wake_.notify_all();
  }
}

void CheckpointWriter::write(const TrainingProgress& progress) {
  const auto start = Clock::now();
  const fs::path folder = options_.folder;
  const std::string name = checkpoint_name(progress.step);
  const fs::path partial = folder / (".partial-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(partial);
  fs::create_directories(partial);

  const int64_t total = layout_.total();
  std::vector<TensorSource> weights, moments;
  for (const auto& p : layout_.parameters()) {
    const size_t bytes = static_cast<size_t>(p.numel()) * sizeof(float);
    weights.push_back({p.name, shape_of(p), staging_.data() + p.offset, bytes});
    moments.push_back({"exp_avg." + p.name, shape_of(p), staging_.data() + total + p.offset, bytes});
  }
  for (const auto& p : layout_.parameters())
    moments.push_back({"exp_avg_sq." + p.name, shape_of(p), staging_.data() + 2 * total + p.offset,
                       static_cast<size_t>(p.numel()) * sizeof(float)});

  CheckpointIndex index;
  index.smelt_version = SMELT_VERSION;
  index.model_json = options_.model_json;
  index.config_json = options_.config_json;
  index.progress = progress;
  index.files.push_back(write_tensor_file(partial / "model.safetensors", weights, options_.model_metadata));
  index.files.push_back(write_tensor_file(partial / "optimizer.safetensors", moments, {{"format", "pt"}}));
  publish(name, partial, index);
  write_seconds_ = seconds_since(start);
}

void CheckpointWriter::publish(const std::string& name, const fs::path& partial, const CheckpointIndex& index) {
  const fs::path folder = options_.folder;
  const std::string json = checkpoint_index_to_json(index);
  Checksum unused;
  const std::string index_path = (partial / "index.json").string();
  const int fd = open_for_writing(index_path);
  write_all(fd, json.data(), json.size(), index_path, unused);
  sync_and_close(fd, index_path);
  sync_folder(partial);

  // The step name appears only once everything under it is durable.
  const fs::path final_path = folder / name;
  if (fs::exists(final_path)) remove_checkpoint_folder(final_path);
  fs::rename(partial, final_path);
  sync_folder(folder);

  uint64_t bytes = json.size();
  for (const auto& f : index.files) bytes += f.bytes;
  bytes_ = bytes;

  if (options_.keep_latest_k > 0) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(folder))
      if (entry.is_directory() && is_checkpoint_name(entry.path().filename().string()))
        names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    const size_t keep = static_cast<size_t>(options_.keep_latest_k);
    for (size_t i = 0; i + keep < names.size(); ++i)
      if (names[i] != name) remove_checkpoint_folder(folder / names[i]);
  }
}

Checkpointer::Checkpointer(const JobConfig& config, const std::string& run_folder, const ModelConfig& model,
                           const ParameterLayout& layout, const std::string& tokenizer, int64_t seq_len,
                           const ShardLayout* shards, Communicator* communicator)
    : config_(config), run_folder_(run_folder), model_(model), shards_(shards), communicator_(communicator) {
  SMELT_CHECK((shards_ == nullptr) == (communicator_ == nullptr), "sharded checkpoints need both the layout and the ranks");
  folder_ = resolve_run_path(run_folder, config.checkpoint.folder, "checkpoint.folder");
  if (!config.checkpoint.enable) return;
  CheckpointOptions options;
  options.folder = folder_;
  options.keep_latest_k = config.checkpoint.keep_latest_k;
  options.async = config.checkpoint.async;
  options.model_json = model_config_to_json(model);
  options.config_json = config_to_json(config);
  options.model_metadata = {{"format", "pt"},
                            {"smelt.version", SMELT_VERSION},
                            {"smelt.model", options.model_json},
                            {"smelt.tokenizer", tokenizer},
                            {"smelt.seq_len", std::to_string(seq_len)}};
  options.shards = shards_;
  options.communicator = communicator_;
  writer_ = std::make_unique<CheckpointWriter>(std::move(options), layout);
}

TrainingProgress Checkpointer::resume(Executor& executor, DataLoader& train, std::ostream& log) {
  train_ = &train;
  std::string source, problem;
  if (leader()) {  // sharded runs: every rank resumes from what rank 0 chose
    try {
      source = resolve_run_path(run_folder_, config_.checkpoint.load, "checkpoint.load");
      if (source.empty() && config_.checkpoint.enable) source = find_newest_checkpoint(folder_);
    } catch (const Error& e) {
      if (!communicator_) throw;
      problem = e.what();
    }
  }
  if (communicator_) {
    agree_on_problems(*communicator_, problem, ErrorKind::config);
    source = communicator_->exchange_text(source).at(0);
  }
  TrainingProgress progress;
  if (source.empty()) return progress;
  LoadedCheckpoint checkpoint;
  if (!communicator_) {
    checkpoint = load_checkpoint(source, model_);
    restore_checkpoint(executor, checkpoint);
  } else {  // each rank reads its own ranges; a failure on any rank stops every rank
    ErrorKind kind = ErrorKind::input;
    try {
      checkpoint = load_checkpoint_shards(source, model_, *shards_, communicator_->rank() % shards_->ranks());
      restore_checkpoint(executor, checkpoint);
    } catch (const Error& e) {
      problem = e.what();
      kind = e.kind();
    }
    agree_on_problems(*communicator_, problem, kind);
  }
  if (checkpoint.from_hf) {
    log << "checkpoint: weights from the Hugging Face folder " << checkpoint.path << "; training starts at step 0\n";
    return progress;
  }
  train.restore(checkpoint.progress.loader);
  log << "checkpoint: resumed from " << checkpoint.path << " at step " << checkpoint.progress.step
      << (checkpoint.local_shards ? " (this rank's shards)" : "") << "\n";
  return checkpoint.progress;
}

void Checkpointer::after_step(Executor& executor, TrainingProgress& progress, bool last, std::ostream& log) {
  if (!writer_) return;
  if (!last && progress.step % config_.checkpoint.interval != 0) {
    if (writer_->sharded() && writer_->poll() && leader())
      log << "checkpoint: every rank's files of " << checkpoint_name(background_step_) << " are written; index published\n";
    return;
  }
  progress.loader = train_->state();
  if (writer_->sharded()) writer_->finish();  // collective: completes the previous save on every rank
  report_background_write(log);  // waits for the previous write, as save() would
  writer_->save(executor, progress);
  if (leader())
    log << "checkpoint: step " << progress.step << " -> " << folder_ << "/" << checkpoint_name(progress.step)
        << (config_.checkpoint.async ? " (writing in the background)" : "") << ", training paused "
        << writer_->last_copy_seconds() + (config_.checkpoint.async ? 0.0 : writer_->last_write_seconds()) << " s\n";
  if (config_.checkpoint.async) {
    background_step_ = progress.step;
  } else {
    report_write(progress.step, log);
  }
}

void Checkpointer::report_write(int64_t step, std::ostream& log) {
  if (!leader()) return;
  const double seconds = writer_->last_write_seconds();
  const double gigabytes = static_cast<double>(writer_->last_bytes()) / 1e9;
  log << "checkpoint: " << checkpoint_name(step) << " written: " << gigabytes << " GB in " << seconds << " s ("
      << (seconds > 0 ? gigabytes / seconds : 0.0) << " GB/s)\n";
}

void Checkpointer::report_background_write(std::ostream& log) {
  if (background_step_ < 0) return;
  report_write(background_step_, log);
  background_step_ = -1;
}

void Checkpointer::finish(std::ostream& log) {
  if (!writer_) return;
  writer_->finish();
  report_background_write(log);
}

}  // namespace smelt
