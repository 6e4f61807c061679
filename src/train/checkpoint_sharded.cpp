// The sharded half of CheckpointWriter: each rank copies its own shards and writes its own pair of
// files (on its background thread with async); the ranks then exchange their files' sizes and
// checksums and rank 0 writes the index, last, and renames the folder into place.
#include <chrono>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "train/checkpoint.h"
#include "train/checkpoint_shards.h"

namespace smelt {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A rank's record for the exchange: "ok" and a line per file (name, bytes, checksum), or the problem.
std::string files_record(const std::vector<CheckpointFile>& files) {
  std::ostringstream record;
  record << "ok\n";
  for (const auto& f : files) record << f.name << '\t' << f.bytes << '\t' << f.checksum << '\t' << f.rank << '\n';
  return record.str();
}

std::vector<CheckpointFile> parse_files_record(const std::string& record) {
  std::istringstream in(record.substr(3));
  std::vector<CheckpointFile> files;
  CheckpointFile f;
  while (std::getline(in, f.name, '\t') && in >> f.bytes >> f.checksum >> f.rank) {
    in.ignore(1);
    files.push_back(f);
  }
  return files;
}

}  // namespace

void agree_on_problems(Communicator& communicator, const std::string& problem, ErrorKind kind) {
  const std::string mine = problem.empty() ? "" : std::to_string(static_cast<int>(kind)) + "\n" + problem;
  const std::vector<std::string> all = communicator.exchange_text(mine);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    const size_t split = all[r].find('\n');
    const auto first_kind = static_cast<ErrorKind>(std::stoi(all[r].substr(0, split)));
    const std::string message = all[r].substr(split + 1);
    fail(first_kind, static_cast<int>(r) == communicator.rank() ? message : "rank " + std::to_string(r) + ": " + message);
  }
}

fs::path CheckpointWriter::sharded_partial(int64_t step) const {
  return fs::path(options_.folder) / (".partial-" + checkpoint_name(step) + "-sharded");
}

void CheckpointWriter::save_sharded(Executor& executor, const TrainingProgress& progress) {
  finish();  // collective: the previous save is complete on every rank and the staging buffer free
  const auto start = Clock::now();
  const int64_t local = options_.shards->local_total();
  float* parameters = staging_.data();
  std::string problem;
  try {
    SMELT_CHECK(executor.sharded() && executor.shard_layout()->local_total() == local,
                "the executor's shards do not match the checkpoint writer's layout");
    executor.read_local_shards(parameters, parameters + local, parameters + 2 * local);
    for (int64_t i = 0; i < local && problem.empty(); ++i)
      if (!std::isfinite(parameters[i]))
        problem = "refusing to checkpoint step " + std::to_string(progress.step) + ": element " + std::to_string(i) +
                  " of this rank's parameter shards is " + std::to_string(parameters[i]) +
                  "; the last good checkpoint is kept. Lower optimizer.lr or use training.on_nonfinite = \"skip\"";
    if (rank_ == 0 && problem.empty()) {  // before any rank writes into it (the exchange below orders them)
      fs::remove_all(sharded_partial(progress.step));
      fs::create_directories(sharded_partial(progress.step));
    }
  } catch (const Error& e) {
    problem = e.what();
  }
  agree_on_problems(*options_.communicator, problem, ErrorKind::internal);
  copy_seconds_ = seconds_since(start);
  progress_ = progress;
  commit_pending_ = true;
  rank_files_.clear();
  rank_problem_.clear();
  run_job([this] { write_rank_files_now(); });
  if (!options_.async) commit();
}

void CheckpointWriter::write_rank_files_now() {
  const auto start = Clock::now();
  if (!writes_files_) return;  // an HSDP replica: the first shard group writes these shards
  try {
    const int64_t local = options_.shards->local_total();
    rank_files_ = write_rank_files(sharded_partial(progress_.step), layout_, sharding_, shard_rank_, staging_.data(),
                                   staging_.data() + local, staging_.data() + 2 * local, options_.model_metadata);
  } catch (const std::exception& e) {
    rank_problem_ = e.what();
  }
  write_seconds_ = seconds_since(start);
}

bool CheckpointWriter::poll() {
  if (!commit_pending_) return false;
  std::unique_lock lock(mutex_);
  const bool done = !busy_;
  lock.unlock();
  for (const auto& answer : options_.communicator->exchange_text(done ? "1" : "0"))
    if (answer != "1") return false;
  commit();
  return true;
}

void CheckpointWriter::commit() {
  wait_idle();
  commit_pending_ = false;
  const std::vector<std::string> records =
      options_.communicator->exchange_text(rank_problem_.empty() ? files_record(rank_files_) : rank_problem_);
  std::vector<CheckpointFile> files;
  for (size_t r = 0; r < records.size(); ++r) {
    if (records[r].rfind("ok\n", 0) != 0)
      fail(ErrorKind::input, "checkpoint " + checkpoint_name(progress_.step) + ": rank " + std::to_string(r) +
                                 " could not write its files: " + records[r] + "; the previous checkpoint is kept");
    for (const auto& f : parse_files_record(records[r])) files.push_back(f);
  }
  if (rank_ != 0) return;
  CheckpointIndex index;
  index.format = kShardedCheckpointFormat;
  index.smelt_version = SMELT_VERSION;
  index.model_json = options_.model_json;
  index.config_json = options_.config_json;
  index.progress = progress_;
  index.sharding = sharding_;
  index.files = files;
  SMELT_CHECK(index.files.size() == static_cast<size_t>(2 * sharding_.world_size),
              "expected two files from each of " + std::to_string(sharding_.world_size) + " ranks, got " +
                  std::to_string(index.files.size()));
  const double rank_seconds = write_seconds_;
  run_job([this, index, rank_seconds] {
    const auto start = Clock::now();
    publish(checkpoint_name(index.progress.step), sharded_partial(index.progress.step), index);
    write_seconds_ = rank_seconds + seconds_since(start);
  });
}

}  // namespace smelt
