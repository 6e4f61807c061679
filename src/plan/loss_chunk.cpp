#include "plan/loss_chunk.h"

#include <algorithm>
#include <vector>

namespace smelt {

std::vector<int64_t> loss_chunk_candidates(int64_t tokens) {
  const int64_t base = std::min(kBaseLossChunkTokens, tokens);
  std::vector<int64_t> candidates{base};
  for (int64_t chunk = base * 2; chunk <= std::min(kLargestLossChunkTokens, tokens); chunk *= 2) candidates.push_back(chunk);
  if (tokens <= kLargestLossChunkTokens && candidates.back() < tokens) candidates.push_back(tokens);  // one chunk
  return candidates;
}

int64_t choose_loss_chunk(const ModelConfig& model, PlanOptions options, double budget_bytes) {
  const std::vector<int64_t> candidates = loss_chunk_candidates(options.shape.tokens());
  options.loss_chunk_tokens = candidates.front();
  const double base_arena = static_cast<double>(build_step_plan(model, options).memory.arena_bytes);
  int64_t chosen = candidates.front();
  for (size_t i = 1; i < candidates.size(); ++i) {
    options.loss_chunk_tokens = candidates[i];
    const double arena = static_cast<double>(build_step_plan(model, options).memory.arena_bytes);
    if (arena <= base_arena * (1 + kLossChunkMemoryAllowance) && (budget_bytes <= 0 || arena <= budget_bytes))
      chosen = candidates[i];
  }
  return chosen;
}

}  // namespace smelt
