// The planner's loss chunk (training.loss_chunk_tokens = 0): the largest of the base chunk, its
// doublings and the whole step whose plan's arena is within the allowance above the base chunk's
// (and the budget); checked against plans built here for every candidate, on random model shapes.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/random.h"
#include "support/fresh_random.h"
#include "model/model_fixture.h"
#include "plan/loss_chunk.h"

namespace smelt {
namespace {

// A debugmodel-flavoured Llama, its FFN width derived from dim as the preset does.
ModelConfig model_of(int64_t dim, int64_t layers, int64_t vocabulary) {
  return testing::debug_model(dim, layers, /*ffn_dim=*/0, vocabulary);
}

PlanOptions options_of(int64_t batch, int64_t seq, const std::string& policy) {
  PlanOptions o;
  o.shape = {batch, seq};
  o.compute_dtype = DType::bf16;
  o.policy = parse_checkpoint_policy(policy);
  o.loss_chunk_tokens = 1;  // ignored: the choice sets its own
  return o;
}

size_t arena_with_chunk(const ModelConfig& model, PlanOptions o, int64_t chunk) {
  o.loss_chunk_tokens = chunk;
  return build_step_plan(model, o).memory.arena_bytes;
}

// A random model and step: small (dim 64-256, up to 6 layers, vocabulary up to 40k) or, when
// `wide`, 1B- to 8B-wide (dim 1024-4096, 2-8 layers, vocabulary 32k-128k); batch 1-2, seq
// 1024-8192, any policy. `what` names it for the failure messages.
struct RandomStep {
  ModelConfig model;
  PlanOptions options;
  std::string what;
};

RandomStep random_step(Random& random, bool wide) {
  static const char* policies[] = {"none", "selective-op", "full"};
  const int64_t dim = wide ? 1024 * (1 + int64_t(random.below(4))) : 64 * (1 + int64_t(random.below(4)));
  const int64_t layers = wide ? 2 + int64_t(random.below(7)) : 1 + int64_t(random.below(6));
  const int64_t vocabulary = wide ? 32000 + int64_t(random.below(96257)) : 256 + int64_t(random.below(40000));
  const int64_t batch = 1 + int64_t(random.below(2));
  const int64_t seq = int64_t(1) << (10 + random.below(4));  // 1024 .. 8192
  const std::string policy = policies[random.below(3)];
  return {model_of(dim, layers, vocabulary), options_of(batch, seq, policy),
          "dim " + std::to_string(dim) + " layers " + std::to_string(layers) + " vocabulary " +
              std::to_string(vocabulary) + " batch " + std::to_string(batch) + " seq " + std::to_string(seq) + " " +
              policy};
}

// The chunk the rule must pick, from plans built here: the largest candidate whose arena is within
// the allowance above the first's and, given budget > 0, within the budget.
int64_t expected_chunk(const ModelConfig& model, const PlanOptions& o, double budget) {
  const std::vector<int64_t> candidates = loss_chunk_candidates(o.shape.tokens());
  const double base = double(arena_with_chunk(model, o, candidates.front()));
  int64_t expected = candidates.front();
  for (int64_t chunk : candidates) {
    const double arena = double(arena_with_chunk(model, o, chunk));
    if (arena <= base * (1 + kLossChunkMemoryAllowance) && (budget <= 0 || arena <= budget)) expected = chunk;
  }
  return expected;
}

TEST(LossChunk, CandidatesAreTheBaseItsDoublingsAndTheWholeStep) {
  EXPECT_EQ(loss_chunk_candidates(1000), (std::vector<int64_t>{1000}));
  EXPECT_EQ(loss_chunk_candidates(2048), (std::vector<int64_t>{2048}));
  EXPECT_EQ(loss_chunk_candidates(6144), (std::vector<int64_t>{2048, 4096, 6144}));
  EXPECT_EQ(loss_chunk_candidates(8192), (std::vector<int64_t>{2048, 4096, 8192}));
  EXPECT_EQ(loss_chunk_candidates(12288), (std::vector<int64_t>{2048, 4096, 8192}));
  EXPECT_EQ(loss_chunk_candidates(16384), (std::vector<int64_t>{2048, 4096, 8192}));
  testing_support::FreshRandom random;
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t tokens = 1 + int64_t(random.below(40000));
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    const std::vector<int64_t> c = loss_chunk_candidates(tokens);
    ASSERT_FALSE(c.empty());
    EXPECT_EQ(c.front(), std::min(kBaseLossChunkTokens, tokens));
    EXPECT_LE(c.back(), std::min(kLargestLossChunkTokens, tokens));
    EXPECT_EQ(std::find(c.begin(), c.end(), tokens) != c.end(), tokens <= kLargestLossChunkTokens);
    for (size_t i = 1; i < c.size(); ++i) {
      EXPECT_GT(c[i], c[i - 1]);
      if (c[i] != tokens) {
        EXPECT_EQ(c[i], 2 * c[i - 1]);
      }
    }
  }
}

TEST(LossChunk, TheLargestCandidateWithinTheAllowanceOnRandomShapes) {
  testing_support::FreshRandom random;
  int grown = 0, kept = 0;
  for (int trial = 0; trial < 24; ++trial) {  // small models, and wide ones where a larger chunk can pay
    const RandomStep step = random_step(random, trial % 2 == 1);
    SCOPED_TRACE(step.what);
    PlanOptions o = step.options;
    if (random.below(2)) o.linear_grad_dtype = DType::bf16;
    const int64_t chosen = choose_loss_chunk(step.model, o);
    EXPECT_EQ(chosen, expected_chunk(step.model, o, 0));
    const int64_t base = loss_chunk_candidates(o.shape.tokens()).front();
    EXPECT_LE(double(arena_with_chunk(step.model, o, chosen)),
              double(arena_with_chunk(step.model, o, base)) * (1 + kLossChunkMemoryAllowance));
    if (chosen > base) {
      ++grown;
      // A budget just below the chosen chunk's arena takes a smaller chunk.
      const double budget = double(arena_with_chunk(step.model, o, chosen)) - 1;
      const int64_t smaller = choose_loss_chunk(step.model, o, budget);
      EXPECT_LT(smaller, chosen);
      EXPECT_EQ(smaller, expected_chunk(step.model, o, budget));
      EXPECT_EQ(choose_loss_chunk(step.model, o, budget + 1), chosen);
    } else {
      ++kept;
    }
  }
  RecordProperty("grown", grown);  // how many trials each way (in the XML report)
  RecordProperty("kept", kept);
}

// Where the head is the peak of a small model (a large vocabulary, one layer) a doubling costs far
// more than the allowance and the chunk stays at the base; where a deep stack without
// checkpointing peaks in the blocks, it grows.
TEST(LossChunk, StaysWhereTheHeadPeaksAndGrowsWhereTheBlocksDo) {
  const ModelConfig head_heavy = model_of(64, 1, 120000);
  const PlanOptions o = options_of(2, 8192, "full");
  EXPECT_GT(double(arena_with_chunk(head_heavy, o, 2 * kBaseLossChunkTokens)),
            double(arena_with_chunk(head_heavy, o, kBaseLossChunkTokens)) * (1 + kLossChunkMemoryAllowance));
  EXPECT_EQ(choose_loss_chunk(head_heavy, o), kBaseLossChunkTokens);

  const ModelConfig deep = model_of(256, 8, 512);
  const PlanOptions none = options_of(2, 8192, "none");
  EXPECT_GT(choose_loss_chunk(deep, none), kBaseLossChunkTokens);

  const PlanOptions short_step = options_of(1, 1024, "none");  // fewer tokens than the base chunk
  EXPECT_EQ(choose_loss_chunk(deep, short_step), 1024);
}

// The 8B proxy at batch 1 (8 layers of Llama-3 8B; the head is the peak): with bf16 linear
// gradients one chunk, whose arena is above the base's by less than the allowance; with f32 ones,
// and under gradient accumulation (f32 gradients added to), 4096-token chunks: one chunk would
// cost more than the allowance.
TEST(LossChunk, The8bProxyTakesTheLargestChunkWithinTheAllowance) {
  ModelSection section;
  section.flavor = "llama3_8b";
  section.n_layers = 8;
  section.vocab_size = 128256;
  const ModelConfig model = make_model_config(section, 0);
  PlanOptions o = options_of(1, 8192, "selective-op");
  const double allowed = double(arena_with_chunk(model, o, kBaseLossChunkTokens)) * (1 + kLossChunkMemoryAllowance);
  ASSERT_LE(double(arena_with_chunk(model, o, 4096)), allowed);
  ASSERT_GT(double(arena_with_chunk(model, o, 8192)), allowed);
  EXPECT_EQ(choose_loss_chunk(model, o), 4096);
  PlanOptions accumulated = o;
  accumulated.microbatches = 4;
  EXPECT_EQ(choose_loss_chunk(model, accumulated), 4096);

  o.linear_grad_dtype = DType::bf16;
  const size_t base = arena_with_chunk(model, o, kBaseLossChunkTokens), whole = arena_with_chunk(model, o, 8192);
  ASSERT_GT(whole, base) << "one chunk must cost memory here, or the test proves nothing";
  ASSERT_LE(double(whole), double(base) * (1 + kLossChunkMemoryAllowance));
  EXPECT_EQ(choose_loss_chunk(model, o), 8192);
}

}  // namespace
}  // namespace smelt
