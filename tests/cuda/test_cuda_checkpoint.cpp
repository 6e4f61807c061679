// Exact resume on the GPU: a run of 2N steps and a run of N steps + resume + N steps give
// bit-identical losses, validation loss and final weights on the CUDA backend — bf16 with the
// step replayed as a CUDA graph, fp8 tensorwise with async writes, and the FSDP schedule over
// NCCL (one rank, per-rank checkpoint files). Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <sstream>

#include "cuda/cuda_backend.h"
#include "dist/nccl_communicator.h"
#include "support/temporary_folder.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"
#include "train/source_corpus.h"
#include "train/trainer.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;
using testing_support::TemporaryFolder;

struct Variant {
  const char* name;
  const char* policy;
  const char* float8_recipe;
  bool async = false;
  bool fsdp = false;
};

JobConfig gpu_config(const TemporaryFolder& folder, const Variant& v, const std::string& name, int64_t steps) {
  JobConfig config;
  config.job.name = name;
  config.job.device = "cuda";
  config.job.dump_folder = folder.path("runs");
  config.training.dataset_path = folder.path("data");
  config.model.dim = 128;  // head dim 32; float8 GEMM shapes are multiples of 16
  config.model.n_layers = 2;
  config.model.n_heads = 4;
  config.model.n_kv_heads = 2;
  config.model.ffn_dim = 384;
  config.training.local_batch_size = 2;
  config.training.seq_len = 64;
  config.training.steps = steps;
  config.training.cuda_graph = true;
  config.activation_checkpoint.mode = v.policy;
  config.float8.recipe = v.float8_recipe;
  config.parallelism.shard_single_rank = v.fsdp;
  config.optimizer.lr = 3e-3;
  config.lr_scheduler.warmup_steps = 2;
  config.metrics.log_freq = 3;
  config.validation.enable = true;
  config.validation.freq = 3;
  config.validation.steps = 1;
  config.checkpoint.async = v.async;
  return config;
}

void expect_exact_resume_on_gpu(const Variant& v) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  if (v.fsdp && !nccl_available()) GTEST_SKIP() << "built without NCCL";
  TemporaryFolder folder;
  testing_support::write_source_corpus(folder.path("data"), {"docs", "src/train"});
  const int64_t half = 5;
  JobConfig full = gpu_config(folder, v, "full", 2 * half);
  full.checkpoint.enable = true;
  full.checkpoint.interval = half;
  full.checkpoint.keep_latest_k = 0;
  std::ostringstream log_full;
  const TrainResult a = train(full, log_full);
  ASSERT_EQ(a.losses.size(), size_t(2 * half)) << log_full.str();

  // A fresh run from the step-N files alone: new backend, arena, graph, loaders and optimizer.
  JobConfig resumed = gpu_config(folder, v, "resumed", 2 * half);
  resumed.checkpoint.load = fs::path(a.run_folder) / "checkpoint" / checkpoint_name(half);
  std::ostringstream log_resumed;
  const TrainResult b = train(resumed, log_resumed);
  ASSERT_EQ(b.losses.size(), size_t(half)) << log_resumed.str();
  EXPECT_NE(log_resumed.str().find("resumed from"), std::string::npos) << log_resumed.str();
  for (int64_t i = 0; i < half; ++i)
    EXPECT_EQ(std::memcmp(&a.losses[static_cast<size_t>(half + i)], &b.losses[static_cast<size_t>(i)], sizeof(double)), 0)
        << v.name << ", step " << half + i + 1 << ": " << a.losses[static_cast<size_t>(half + i)] << " uninterrupted vs "
        << b.losses[static_cast<size_t>(i)] << " resumed";
  EXPECT_EQ(std::memcmp(&a.final_validation_loss, &b.final_validation_loss, sizeof(double)), 0)
      << v.name << ": validation " << a.final_validation_loss << " vs " << b.final_validation_loss;
  const auto weights = [](const std::string& run) { return load_safetensors(run + "/model.safetensors").data; };
  EXPECT_TRUE(weights(a.run_folder) == weights(b.run_folder)) << v.name << ": final weights differ";
  EXPECT_LT(a.losses.back(), a.losses.front()) << v.name << ": the model did not train";
  if (!::testing::Test::HasFailure())
    std::printf("%s: steps %lld..%lld resumed bit-identically (loss %.6f -> %.6f)\n", v.name,
                static_cast<long long>(half + 1), static_cast<long long>(2 * half), a.losses.front(), a.losses.back());
}

TEST(CudaCheckpoint, Bfloat16GraphReplayResumesBitIdentically) {
  expect_exact_resume_on_gpu({"bf16 selective-op, CUDA graph", "selective-op", "none"});
}

TEST(CudaCheckpoint, Float8TensorwiseAsyncWritesResumeBitIdentically) {
  expect_exact_resume_on_gpu({"fp8 tensorwise, async writes", "none", "tensorwise", true});
}

TEST(CudaCheckpoint, FsdpOverNcclResumesBitIdentically) {
  expect_exact_resume_on_gpu({"FSDP schedule over NCCL (one rank), per-rank files", "full", "none", false, true});
}

}  // namespace
}  // namespace smelt
