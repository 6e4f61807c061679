// The loss chunk the planner picks when the config leaves it to it (training.loss_chunk_tokens = 0):
// the output head's GEMMs and cross-entropy run this many tokens at a time.
#pragma once
#include <cstdint>
#include <vector>

#include "plan/step_plan.h"

namespace smelt {

// The smallest chunk the planner considers, and its memory reference: 2048, or the step's tokens
// when fewer.
constexpr int64_t kBaseLossChunkTokens = 2048;
// The largest chunk the planner tries (each doubling holds another (chunk, V) bf16 logits buffer).
constexpr int64_t kLargestLossChunkTokens = 8192;

// A larger chunk may cost this much more memory than the base chunk (a fraction of its arena).
// Each chunk after the first reads back and rewrites the output projection's f32 gradient (and
// each later microbatch of an accumulated step reads it once more), about 1 ms per 2.1 GB
// gradient on the H200; with bf16 linear gradients one chunk writes it once, in bf16. On the 8B
// proxy (docs/benchmarks.md, sixteenth round) 4096-token chunks under 4-step accumulation are
// +1.0% tokens/s for +1.0% memory, and one chunk at batch 1 with bf16 gradients +0.8-3% for 1.1%.
constexpr double kLossChunkMemoryAllowance = 0.02;

// The chunks the planner considers for a step of `tokens`: the base chunk (at most the step's
// tokens), its doublings up to kLargestLossChunkTokens and the step's tokens, and the whole step
// (one chunk) when it has at most kLargestLossChunkTokens.
std::vector<int64_t> loss_chunk_candidates(int64_t tokens);

// The largest candidate whose plan's arena is at most kLossChunkMemoryAllowance above the base
// chunk's and, given budget_bytes > 0, within the budget (the base chunk when none is).
int64_t choose_loss_chunk(const ModelConfig& model, PlanOptions options, double budget_bytes = 0);

}  // namespace smelt
