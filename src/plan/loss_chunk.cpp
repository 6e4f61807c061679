#include "plan/loss_chunk.h"

#include <algorithm>

namespace smelt {

int64_t choose_loss_chunk(const ModelConfig& model, PlanOptions options, double budget_bytes) {
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
  if (chosen < tokens && tokens <= kLargestLossChunkTokens && low_precision_linear_grads(options)) {
    options.loss_chunk_tokens = tokens;  // one chunk: the output projection's gradient written once, in bf16
    const double arena = static_cast<double>(build_step_plan(model, options).memory.arena_bytes);
    if (arena <= static_cast<double>(base_arena) * (1 + kOneChunkMemoryAllowance) && (budget_bytes <= 0 || arena <= budget_bytes))
      chosen = tokens;
  }
  return chosen;
}

}  // namespace smelt
