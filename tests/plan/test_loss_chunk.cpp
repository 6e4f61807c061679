// The planner's loss chunk (training.loss_chunk_tokens = 0): the largest doubling of the base
// chunk whose plan needs no larger an arena than the base chunk's, or with bf16 linear gradients
// one chunk when it costs little more; checked against plans built here for every candidate, on
// random model shapes.
#include <gtest/gtest.h>


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

// The doubling rule's chunk: the largest of base, 2 base, ... (up to the largest chunk and the
// step's tokens) whose arena is no larger than the base's; `base_arena` receives the base's.
int64_t doubling_chunk(const ModelConfig& model, const PlanOptions& o, size_t& base_arena) {
  const int64_t tokens = o.shape.tokens();
  const int64_t base = std::min(kBaseLossChunkTokens, tokens);
  base_arena = arena_with_chunk(model, o, base);
  int64_t chunk = base;
  for (int64_t c = base * 2; c <= std::min(kLargestLossChunkTokens, tokens); c *= 2) {
    if (arena_with_chunk(model, o, c) > base_arena) break;
    chunk = c;
  }
  return chunk;
}

TEST(LossChunk, TheLargestDoublingThatRaisesNoPeakOnRandomShapes) {
  testing_support::FreshRandom random;
  int grown = 0, kept = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const RandomStep step = random_step(random, false);
    SCOPED_TRACE(step.what);
    const ModelConfig& model = step.model;
    const PlanOptions& o = step.options;
    const int64_t tokens = o.shape.tokens();
    const int64_t base = std::min(kBaseLossChunkTokens, tokens);
    size_t base_arena = 0;
    const int64_t expected = doubling_chunk(model, o, base_arena);
    const int64_t chosen = choose_loss_chunk(model, o);
    EXPECT_EQ(chosen, expected);
    EXPECT_LE(arena_with_chunk(model, o, chosen), base_arena);
    EXPECT_LE(chosen, std::min(kLargestLossChunkTokens, tokens));
    (chosen > base ? grown : kept) += 1;
  }
  RecordProperty("grown", grown);  // how many trials each way (in the XML report)
  RecordProperty("kept", kept);
}

// Where the head is the peak (a large vocabulary, one layer), the chunk stays at the base;
// where a deep stack without checkpointing peaks in the blocks, it grows.
TEST(LossChunk, StaysWhereTheHeadPeaksAndGrowsWhereTheBlocksDo) {
  const ModelConfig head_heavy = model_of(64, 1, 120000);
  const PlanOptions o = options_of(2, 8192, "full");
  EXPECT_LT(arena_with_chunk(head_heavy, o, kBaseLossChunkTokens), arena_with_chunk(head_heavy, o, 2 * kBaseLossChunkTokens));
  EXPECT_EQ(choose_loss_chunk(head_heavy, o), kBaseLossChunkTokens);

  const ModelConfig deep = model_of(256, 8, 512);
  const PlanOptions none = options_of(2, 8192, "none");
  EXPECT_GT(choose_loss_chunk(deep, none), kBaseLossChunkTokens);

  const PlanOptions short_step = options_of(1, 1024, "none");  // fewer tokens than the base chunk
  EXPECT_EQ(choose_loss_chunk(deep, short_step), 1024);
}

// With bf16 linear gradients one chunk writes the output projection's gradient once, in bf16: on
// random shapes the choice is the doubling rule's, or the step's tokens when they are at most the
// largest chunk and one chunk's arena is within the allowance above the base's (and the budget).
TEST(LossChunk, OneChunkWithinTheAllowanceWhenTheOutputGradientWouldBeBf16) {
  testing_support::FreshRandom random;
  int one_chunk = 0, doubled = 0;
  for (int trial = 0; trial < 24; ++trial) {  // small models, and wide ones where one chunk can pay
    const RandomStep step = random_step(random, trial % 2 == 1);
    SCOPED_TRACE(step.what);
    const ModelConfig& model = step.model;
    PlanOptions o = step.options;
    o.linear_grad_dtype = DType::bf16;
    const int64_t tokens = o.shape.tokens();
    size_t base_arena = 0;
    const int64_t doubling = doubling_chunk(model, o, base_arena);
    const double whole = tokens <= kLargestLossChunkTokens ? double(arena_with_chunk(model, o, tokens)) : 0.0;
    const bool fits = tokens <= kLargestLossChunkTokens && whole <= double(base_arena) * (1 + kOneChunkMemoryAllowance);
    EXPECT_EQ(choose_loss_chunk(model, o), fits ? tokens : doubling);
    if (fits && doubling < tokens) {
      ++one_chunk;
      EXPECT_EQ(choose_loss_chunk(model, o, whole - 1), doubling) << "a budget below one chunk's arena keeps the doubling";
      EXPECT_EQ(choose_loss_chunk(model, o, whole), tokens);
    } else {
      ++doubled;
    }
  }
  RecordProperty("one_chunk", one_chunk);
  RecordProperty("doubled", doubled);
}

// The 8B proxy at batch 1 (8 layers of Llama-3 8B; the head is the peak): f32 gradients keep the
// base chunk; bf16 ones take one chunk, whose arena is above the base's by less than the allowance.
TEST(LossChunk, The8bProxyTakesOneChunkWithBf16Gradients) {
  ModelSection section;
  section.flavor = "llama3_8b";
  section.n_layers = 8;
  section.vocab_size = 128256;
  const ModelConfig model = make_model_config(section, 0);
  PlanOptions o = options_of(1, 8192, "selective-op");
  EXPECT_EQ(choose_loss_chunk(model, o), kBaseLossChunkTokens);
  o.linear_grad_dtype = DType::bf16;
  const size_t base = arena_with_chunk(model, o, kBaseLossChunkTokens), whole = arena_with_chunk(model, o, 8192);
  ASSERT_GT(whole, base) << "one chunk must cost memory here, or the test proves nothing";
  ASSERT_LE(double(whole), double(base) * (1 + kOneChunkMemoryAllowance));
  EXPECT_EQ(choose_loss_chunk(model, o), 8192);
}

}  // namespace
}  // namespace smelt
