// A small Llama trained on the CPU for a few steps, for tests of what reads trained weights
// (smelt eval, smelt generate).
#pragma once
#include <filesystem>
#include <sstream>
#include <string>

#include "support/fresh_random.h"
#include "support/temporary_folder.h"
#include "train/source_corpus.h"
#include "train/trainer.h"

namespace smelt::testing_support {

// A small Llama trained for a few steps on the project's text, with a fresh seed, validating at
// the end on `validation_steps` batches of the held-out part; in f32 unless told otherwise.
struct TrainedRun {
  testing_support::TemporaryFolder temporary;
  JobConfig config;
  TrainResult result;
  std::string log;
};

inline void train_small(TrainedRun& run, int64_t validation_steps, const std::string& precision = "float32",
                        const std::string& float8_recipe = "none") {
  testing_support::FreshRandom random;
  const std::filesystem::path folder = run.temporary.path();
  testing_support::write_source_corpus(folder / "data", {"docs", "src/plan"});
  JobConfig& c = run.config;
  c.job.name = "evaluated";
  c.job.dump_folder = (folder / "runs").string();
  c.model.n_layers = 2;
  c.model.dim = 64;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 2;
  c.training.dataset_path = (folder / "data").string();
  c.training.local_batch_size = 2;
  c.training.seq_len = 64;
  c.training.steps = 4;
  c.training.seed = static_cast<int64_t>(random.below(1000000));
  c.metrics.log_freq = 2;
  c.validation.enable = true;
  c.validation.freq = 4;
  c.validation.steps = validation_steps;
  c.training.mixed_precision_param = precision;
  c.float8.recipe = float8_recipe;
  std::ostringstream log;
  run.result = train(c, log);
  run.log = log.str();
}

}  // namespace smelt::testing_support
