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

// The largest of kBaseLossChunkTokens, twice that, ... up to kLargestLossChunkTokens (and at most
// the step's tokens) whose plan needs no larger an arena than the base chunk's. Each doubling
// halves the chunks that accumulate into the output projection's f32 gradient (a read of it per
// chunk), so a larger chunk is faster wherever the head is not where the step peaks.
int64_t choose_loss_chunk(const ModelConfig& model, PlanOptions options);

}  // namespace smelt
