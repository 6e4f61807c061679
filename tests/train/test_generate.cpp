// `smelt generate`: greedy decoding takes the most likely token (against the training plan's
// per-token losses) and is consistent with itself (the continuation of a prompt extended by the
// first tokens it produced is the rest of what it produced), sampling follows its seed, a Hugging Face folder of the same weights generates the same text, and bad options fail.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "support/expect_error.h"
#include "train/backends.h"
#include "train/executor.h"
#include "train/run_setup.h"
#include "train/generate.h"
#include "train/hf_weights.h"
#include "train/model_weights.h"
#include "train/small_run.h"

namespace smelt {
namespace {

using testing_support::expect_error;
using testing_support::TrainedRun;
using testing_support::train_small;

std::string generated(GenerateOptions options) {
  std::string streamed;
  const std::string text = generate(options, [&](const std::string& piece) { streamed += piece; });
  EXPECT_EQ(streamed, text) << "the pieces streamed should make up the text returned";
  return text;
}

// -log p(v | context) for every token v of the vocabulary, from the training plan's per-token
// losses: one forward pass of V copies of the context (padded with EOS after it, which causal
// attention ignores), row v's target at the context's last position being v.
class NextTokenLosses {
 public:
  explicit NextTokenLosses(const SavedModel& saved)
      : V_(saved.model.vocab_size), T_(saved.seq_len), backend_(make_backend("cpu")), plan_(plan_for(saved, *backend_)),
        executor_(plan_, *backend_) {
    executor_.load_parameters(saved.parameters.data());
  }

  std::vector<double> operator()(const std::vector<int32_t>& context, int32_t pad) {
    const auto length = static_cast<int64_t>(context.size());
    EXPECT_LE(length, T_);
    std::vector<int32_t> inputs(static_cast<size_t>(V_ * T_), pad), targets(inputs.size(), 0);
    for (int64_t v = 0; v < V_; ++v) {
      std::copy(context.begin(), context.end(), inputs.begin() + v * T_);
      targets[static_cast<size_t>(v * T_ + length - 1)] = static_cast<int32_t>(v);
    }
    executor_.load_batch(inputs.data(), targets.data());
    OptimizerSettings unused;
    executor_.run_loss(unused);
    std::vector<float> losses(static_cast<size_t>(V_ * T_));
    backend_->copy_to_host(losses.data(), executor_.view(plan_.losses));
    std::vector<double> out(static_cast<size_t>(V_));
    for (int64_t v = 0; v < V_; ++v) out[static_cast<size_t>(v)] = losses[static_cast<size_t>(v * T_ + length - 1)];
    return out;
  }

 private:
  static StepPlan plan_for(const SavedModel& saved, const Backend& backend) {
    PlanOptions o;
    o.shape = {saved.model.vocab_size, saved.seq_len};
    o.compute_dtype = DType::f32;
    o.loss_chunk_tokens = o.shape.tokens();
    size_workspaces("cpu", saved.model, o, &backend);
    return build_step_plan(saved.model, o);
  }

  int64_t V_, T_;
  std::unique_ptr<Backend> backend_;
  StepPlan plan_;
  Executor executor_;
};

// Greedy decoding picks, at every position, the most likely token (up to rounding: generation
// computes one row of logits, the loss path the whole chunk).
TEST(Generate, GreedyPicksTheMostLikelyTokenAtEveryPosition) {
  TrainedRun run;
  train_small(run, 1);
  const SavedModel saved = load_model_weights(run.result.run_folder);
  const auto tokenizer = load_tokenizer(saved.tokenizer);
  GenerateOptions greedy;
  greedy.checkpoint = run.result.run_folder;
  greedy.prompt = "The plan's";
  greedy.max_tokens = 12;
  greedy.temperature = 0;
  const std::string text = generated(greedy);
  std::vector<int32_t> context = {tokenizer->bos_id()};
  for (int32_t id : tokenizer->encode(greedy.prompt)) context.push_back(id);
  const std::vector<int32_t> produced = tokenizer->encode(text);
  ASSERT_FALSE(produced.empty());
  NextTokenLosses next_token_losses(saved);
  for (size_t k = 0; k < produced.size(); ++k) {
    const std::vector<double> losses = next_token_losses(context, tokenizer->eos_id());
    double best = losses[0];
    for (double l : losses) best = std::min(best, l);
    EXPECT_LE(losses[static_cast<size_t>(produced[k])], best + 1e-4) << "token " << k << " of '" << text << "'";
    context.push_back(produced[k]);
  }
}

TEST(Generate, GreedyContinuationsAgreeAndSamplingFollowsItsSeed) {
  TrainedRun run;
  train_small(run, 1);
  GenerateOptions greedy;
  greedy.checkpoint = run.result.run_folder;
  greedy.max_tokens = 24;
  greedy.temperature = 0;
  // A model trained for 4 steps often ends a continuation within a few bytes (end of text): take
  // the longest of several prompts' continuations; the property below needs two bytes.
  std::string whole;
  for (const char* prompt : {"The plan ", "A step ", "the ", "Memory ", "In ", "float", "We "}) {
    GenerateOptions candidate = greedy;
    candidate.prompt = prompt;
    const std::string text = generated(candidate);
    if (text.size() > whole.size()) {
      whole = text;
      greedy.prompt = prompt;
    }
    if (whole.size() >= 8) break;
  }
  ASSERT_GE(whole.size(), 2u) << "the byte-level model should produce text for one of the prompts";
  // The prompt extended by the first k bytes it produced continues with the rest (byte
  // tokenizer: text and tokens correspond one to one; the context stays under seq_len).
  for (size_t k : {size_t(1), whole.size() / 2}) {
    GenerateOptions extended = greedy;
    extended.prompt = greedy.prompt + whole.substr(0, k);
    extended.max_tokens = static_cast<int64_t>(whole.size() - k);
    EXPECT_EQ(generated(extended), whole.substr(k)) << "after " << k << " bytes";
  }

  GenerateOptions sampled = greedy;
  sampled.temperature = 1.5;
  sampled.top_p = 1;
  sampled.max_tokens = 40;
  sampled.seed = 7;
  const std::string first = generated(sampled);
  EXPECT_EQ(generated(sampled), first);
  sampled.seed = 8;
  const std::string other = generated(sampled);
  sampled.seed = 9;
  EXPECT_TRUE(other != first || generated(sampled) != first) << "three seeds gave the same 40 sampled bytes";

  // The same weights as a Hugging Face folder, the tokenizer named.
  const SavedModel saved = load_model_weights(run.result.run_folder);
  const std::string hf = run.temporary.path("hf");
  save_hf_folder(hf, saved.model, saved.parameters.data(), DType::f32, saved.seq_len);
  GenerateOptions from_hf = greedy;
  from_hf.checkpoint = hf;
  expect_error(ErrorKind::config, [&] { generated(from_hf); }, {"--tokenizer"});
  from_hf.tokenizer = "byte";
  EXPECT_EQ(generated(from_hf), whole);
}

TEST(Generate, RefusesBadOptions) {
  TrainedRun run;
  train_small(run, 1);
  GenerateOptions options;
  options.checkpoint = run.result.run_folder;
  options.max_tokens = -1;
  expect_error(ErrorKind::config, [&] { generated(options); }, {"--max-tokens"});
  options.max_tokens = 4;
  options.top_p = 0;
  expect_error(ErrorKind::config, [&] { generated(options); }, {"--top-p"});
  options.top_p = 0.9;
  options.checkpoint = run.temporary.path("missing");
  expect_error(ErrorKind::input, [&] { generated(options); }, {"--checkpoint", options.checkpoint});
}

}  // namespace
}  // namespace smelt
