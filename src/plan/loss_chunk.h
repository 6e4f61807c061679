// The loss chunk the planner picks when the config leaves it to it (training.loss_chunk_tokens = 0):
// the output head's GEMMs and cross-entropy run this many tokens at a time.
#pragma once
#include <cstdint>

#include "plan/step_plan.h"

namespace smelt {

// The chunk of an unset training.loss_chunk_tokens when the step's peak is elsewhere: 2048, or the
// step's tokens when fewer.
constexpr int64_t kBaseLossChunkTokens = 2048;
// The largest chunk the planner tries (each doubling holds another (chunk, V) bf16 logits buffer).
constexpr int64_t kLargestLossChunkTokens = 8192;

// One chunk for the whole step may cost this much more memory than the base chunk (a fraction of
// its arena): with bf16 linear gradients it writes the output projection's gradient once, in bf16,
// instead of accumulating it in f32 chunk by chunk. On the 8B proxy at batch 1 that is 0.53 GB
// (1.1%) for 0.8-3% more tokens/s (docs/benchmarks.md, thirteenth round).
constexpr double kOneChunkMemoryAllowance = 0.02;

// The largest of kBaseLossChunkTokens, twice that, ... up to kLargestLossChunkTokens (and at most
// the step's tokens) whose plan needs no larger an arena than the base chunk's. Each doubling
// halves the chunks that accumulate into the output projection's f32 gradient (a read of it per
// chunk), so a larger chunk is faster wherever the head is not where the step peaks. When the
// output projection's gradient would be bf16 in one chunk (low_precision_linear_grads, and at most
// kLargestLossChunkTokens tokens per step), one chunk is taken if its arena is at most
// kOneChunkMemoryAllowance above the base chunk's and, given budget_bytes > 0, within it.
int64_t choose_loss_chunk(const ModelConfig& model, PlanOptions options, double budget_bytes = 0);

}  // namespace smelt
