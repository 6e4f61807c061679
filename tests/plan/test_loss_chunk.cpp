// The planner's loss chunk (training.loss_chunk_tokens = 0): the largest doubling of the base
// chunk whose plan needs no larger an arena than the base chunk's, checked against plans built
// here for every candidate, on random model shapes.
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

TEST(LossChunk, TheLargestDoublingThatRaisesNoPeakOnRandomShapes) {
  testing_support::FreshRandom random;
  const char* policies[] = {"none", "selective-op", "full"};
  int grown = 0, kept = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t dim = 64 * (1 + int64_t(random.below(4)));
    const int64_t layers = 1 + int64_t(random.below(6));
    const int64_t vocabulary = 256 + int64_t(random.below(40000));
    const int64_t batch = 1 + int64_t(random.below(2));
    const int64_t seq = int64_t(1) << (10 + random.below(4));  // 1024 .. 8192
    const std::string policy = policies[random.below(3)];
    SCOPED_TRACE("dim " + std::to_string(dim) + " layers " + std::to_string(layers) + " vocabulary " +
                 std::to_string(vocabulary) + " batch " + std::to_string(batch) + " seq " + std::to_string(seq) + " " +
                 policy);
    const ModelConfig model = model_of(dim, layers, vocabulary);
    const PlanOptions o = options_of(batch, seq, policy);
    const int64_t tokens = batch * seq;
    const int64_t base = std::min(kBaseLossChunkTokens, tokens);
    const size_t base_arena = arena_with_chunk(model, o, base);
    int64_t expected = base;
    for (int64_t c = base * 2; c <= std::min(kLargestLossChunkTokens, tokens); c *= 2) {
      if (arena_with_chunk(model, o, c) > base_arena) break;
      expected = c;
    }
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

}  // namespace
}  // namespace smelt
