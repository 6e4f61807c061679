#include "plan/loss_chunk.h"

#include <algorithm>

namespace smelt {

int64_t choose_loss_chunk(const ModelConfig& model, PlanOptions options) {
  const int64_t tokens = options.shape.tokens();
  const int64_t base = std::min(kBaseLossChunkTokens, tokens);
  options.loss_chunk_tokens = base;
  const size_t base_arena = build_step_plan(model, options).memory.arena_bytes;
  int64_t chosen = base;
  for (int64_t chunk = base * 2; chunk <= std::min(kLargestLossChunkTokens, tokens); chunk *= 2) {
    options.loss_chunk_tokens = chunk;
    if (build_step_plan(model, options).memory.arena_bytes > base_arena) break;
    chosen = chunk;
  }
  return chosen;
}

}  // namespace smelt
