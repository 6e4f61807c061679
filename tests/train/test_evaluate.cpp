// `smelt eval`: a run's final weights evaluated on its validation data give the run's final
// validation loss, bit for bit, from the run folder and from the same weights as a Hugging Face
// folder; asking for more batches than the data holds reads it all once; bad input is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "support/expect_error.h"
#include "train/evaluate.h"
#include "train/hf_weights.h"
#include "train/model_weights.h"
#include "train/small_run.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;
using testing_support::expect_error;
using testing_support::TrainedRun;
using testing_support::train_small;

TEST(Evaluate, RunWeightsGiveTheRunsFinalValidationLoss) {
  TrainedRun run;
  train_small(run, 3);
  ASSERT_GT(run.result.final_validation_loss, 0) << run.log;
  ASSERT_NE(run.result.final_validation_loss, run.result.first_validation_loss) << "the run should have learned";

  EvaluateOptions options;
  options.weights = run.result.run_folder;
  std::ostringstream log;
  const EvaluateResult r = evaluate(run.config, options, log);
  EXPECT_EQ(r.loss, run.result.final_validation_loss) << log.str();
  EXPECT_EQ(r.batches, 3);
  EXPECT_EQ(r.tokens, 3 * 2 * 64);
  EXPECT_FALSE(r.all_data);
  EXPECT_DOUBLE_EQ(r.perplexity, std::exp(r.loss));
  EXPECT_DOUBLE_EQ(r.bits_per_token, r.loss / std::log(2.0));
  EXPECT_NE(log.str().find("held-out part of " + run.config.training.dataset_path), std::string::npos) << log.str();

  // The same weights as a Hugging Face folder (f32: the q/k row permutation there and back is
  // exact), with the tokenizer named since such a folder records none.
  const SavedModel saved = load_model_weights(run.result.run_folder);
  const std::string hf = run.temporary.path("hf");
  save_hf_folder(hf, saved.model, saved.parameters.data(), DType::f32, 64);
  EvaluateOptions from_hf;
  from_hf.weights = hf;
  expect_error(ErrorKind::config, [&] { evaluate(run.config, from_hf, log); }, {"--tokenizer", hf});
  from_hf.tokenizer = saved.tokenizer;
  EXPECT_EQ(evaluate(run.config, from_hf, log).loss, run.result.final_validation_loss);

  // Weights of another model than the config's: the weights' shapes win (the config's model is
  // not the one evaluated).
  JobConfig other = run.config;
  other.model.n_layers = 5;
  other.model.dim = 128;
  EXPECT_EQ(evaluate(other, options, log).loss, run.result.final_validation_loss);

  // The config's policy and budget describe training steps: an automatic policy under a budget no
  // training step fits neither searches nor refuses here.
  JobConfig tight = run.config;
  tight.activation_checkpoint.mode = "auto";
  tight.activation_checkpoint.memory_budget_gb = 0.001;
  EXPECT_EQ(evaluate(tight, options, log).loss, run.result.final_validation_loss);
}

// The forward-only plan computes what the training plan's validation computed, in every
// precision: bf16 (compute copies, the output projection's kept), float8 (the forward GEMMs in
// e4m3 without the inputs saved for a backward).
TEST(Evaluate, EveryPrecisionGivesTheRunsValidationLoss) {
  for (const auto& [precision, recipe] : std::vector<std::pair<std::string, std::string>>{
           {"bfloat16", "none"}, {"bfloat16", "tensorwise"}, {"bfloat16", "rowwise"}, {"bfloat16", "blockwise"}}) {
    SCOPED_TRACE(precision + " " + recipe);
    TrainedRun run;
    train_small(run, 2, precision, recipe);
    ASSERT_GT(run.result.final_validation_loss, 0) << run.log;
    EvaluateOptions options;
    options.weights = run.result.run_folder;
    std::ostringstream log;
    const EvaluateResult r = evaluate(run.config, options, log);
    EXPECT_EQ(r.loss, run.result.final_validation_loss) << log.str();
    EXPECT_NE(log.str().find("forward only"), std::string::npos) << log.str();
    // The same weights evaluated in f32 give a loss near it, not equal (another rounding).
    JobConfig wide = run.config;
    wide.training.mixed_precision_param = "float32";
    wide.float8.recipe = "none";
    const double f32 = evaluate(wide, options, log).loss;
    EXPECT_NE(f32, r.loss);
    EXPECT_NEAR(f32, r.loss, 0.05 * r.loss);
  }
}

TEST(Evaluate, MoreBatchesThanTheDataHoldsReadItAllOnce) {
  TrainedRun run;
  train_small(run, 1);
  ASSERT_GT(run.result.final_validation_loss, 0) << run.log;
  // A small validation file of its own: a known number of whole batches.
  const std::string held = run.temporary.path("held.txt");
  {
    std::ofstream out(held);
    for (int i = 0; i < 40; ++i) out << "line " << i << " of the text evaluated on its own.\n";
  }
  JobConfig config = run.config;
  config.validation.dataset_path = held;
  EvaluateOptions options;
  options.weights = run.result.run_folder;
  options.batches = 100000;
  std::ostringstream log;
  const EvaluateResult all = evaluate(config, options, log);
  EXPECT_TRUE(all.all_data);
  EXPECT_GT(all.batches, 1);
  EXPECT_LT(all.batches, 100000);
  EXPECT_NE(all.data.find("validation: " + held), std::string::npos) << all.data;
  // One batch more would have wrapped around: the batches read are all the whole ones.
  options.batches = all.batches;
  const EvaluateResult exact = evaluate(config, options, log);
  EXPECT_FALSE(exact.all_data);
  EXPECT_EQ(exact.loss, all.loss);
  options.batches = all.batches - 1;
  EXPECT_NE(evaluate(config, options, log).loss, all.loss);
}

TEST(Evaluate, RefusesWhatItCannotEvaluate) {
  TrainedRun run;
  train_small(run, 1);
  std::ostringstream log;
  EvaluateOptions missing;
  missing.weights = run.temporary.path("no_such_run");
  expect_error(ErrorKind::input, [&] { evaluate(run.config, missing, log); }, {"--weights", missing.weights});
  EvaluateOptions empty_folder;
  empty_folder.weights = run.temporary.path("data");  // a folder of text, no weights
  expect_error(ErrorKind::input, [&] { evaluate(run.config, empty_folder, log); }, {"no model.safetensors"});

  EvaluateOptions options;
  options.weights = run.result.run_folder;
  const std::string tiny = run.temporary.path("tiny.txt");
  std::ofstream(tiny) << "too short";
  JobConfig config = run.config;
  config.validation.dataset_path = tiny;
  expect_error(ErrorKind::input, [&] { evaluate(config, options, log); }, {tiny, "sequence"});
  config = run.config;
  config.training.local_batch_size = 100000;  // more sequences than the held-out part holds
  expect_error(ErrorKind::input, [&] { evaluate(config, options, log); }, {"local_batch_size"});
}

}  // namespace
}  // namespace smelt
