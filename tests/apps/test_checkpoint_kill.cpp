// The real `smelt train` binary, checkpointing every step, is SIGKILLed at random moments many
// times; after every kill the newest complete checkpoint loads (checksums verified), progress never
// goes backwards, and a final run resumes from it and finishes.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "model/model_config.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"
#include "train/checkpoint.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;
using testing_support::TemporaryFolder;

// Starts smelt with `arguments`, output to `log`; returns the process id.
pid_t spawn_smelt(const std::vector<std::string>& arguments, const std::string& log) {
  const std::string binary = std::string(SMELT_BINARY_DIR) + "/smelt";
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::FILE* out = std::freopen(log.c_str(), "w", stdout);
    (void)out;
    ::dup2(::fileno(stdout), 2);
    std::vector<char*> argv = {const_cast<char*>(binary.c_str())};
    for (const auto& a : arguments) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::setenv("OMP_NUM_THREADS", "1", 1);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(CheckpointKill, ResumesFromTheNewestCompleteCheckpointAfterEveryKill) {
  TemporaryFolder folder;
  std::string text;
  std::mt19937 words(static_cast<uint32_t>(testing_support::fresh(3)));
  const char* vocabulary[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"};
  for (int i = 0; i < 20000; ++i) text += std::string(vocabulary[words() % 8]) + " ";
  folder.write("data/corpus.txt", text);
  const std::vector<std::string> common = {
      "train", "--job.dump_folder=" + folder.path("runs"), "--job.name=killed",
      "--training.dataset_path=" + folder.path("data"), "--model.dim=64", "--model.n_layers=2", "--model.n_heads=4",
      "--model.n_kv_heads=2", "--training.local_batch_size=2", "--training.seq_len=32", "--metrics.log_freq=1",
      "--checkpoint.enable=true", "--checkpoint.interval=1", "--checkpoint.keep_latest_k=2"};
  const std::string checkpoints = folder.path("runs/killed/checkpoint");

  std::mt19937 random(static_cast<uint32_t>(testing_support::fresh(20240607)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  int64_t newest_step = 0;
  int kills = 0;
  ModelConfig model;
  bool have_model = false;
  for (int round = 0; round < 20 && std::chrono::steady_clock::now() < deadline; ++round) {
    std::vector<std::string> arguments = common;
    arguments.push_back("--training.steps=100000");
    const pid_t pid = spawn_smelt(arguments, folder.path("log.txt"));
    ASSERT_GT(pid, 0);
    // Start-up takes a while (longer on a loaded machine): the first round waits until a first
    // checkpoint exists (30 s at most), then kills at a random moment like the others.
    if (round == 0) {
      const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (find_newest_checkpoint(checkpoints).empty() && std::chrono::steady_clock::now() < limit)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const int wait_ms = 150 + static_cast<int>(random() % 400);
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "smelt exited on its own:\n" << read_text(folder.path("log.txt"));
    ++kills;
    const std::string newest = find_newest_checkpoint(checkpoints);
    if (newest.empty()) {
      ASSERT_EQ(newest_step, 0) << "a complete checkpoint disappeared after kill " << kills;
      continue;
    }
    if (!have_model) {
      std::stringstream index;
      index << std::ifstream(newest + "/index.json").rdbuf();
      model = model_config_from_json(parse_checkpoint_index(index.str(), newest).model_json, newest);
      have_model = true;
    }
    LoadedCheckpoint loaded;
    ASSERT_NO_THROW(loaded = load_checkpoint(newest, model)) << "kill " << kills;
    ASSERT_GE(loaded.progress.step, newest_step) << "progress went backwards: the run restarted instead of resuming";
    newest_step = loaded.progress.step;
  }
  ASSERT_GT(newest_step, 0) << "no checkpoint was ever completed:\n" << read_text(folder.path("log.txt"));
  EXPECT_GE(kills, 5);

  // The last word: a run that resumes and finishes three steps later.
  std::vector<std::string> arguments = common;
  arguments.push_back("--training.steps=" + std::to_string(newest_step + 3));
  const pid_t pid = spawn_smelt(arguments, folder.path("final.txt"));
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string log = read_text(folder.path("final.txt"));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
  EXPECT_EQ(find_newest_checkpoint(checkpoints), checkpoints + "/" + checkpoint_name(newest_step + 3));
}

}  // namespace
}  // namespace smelt
