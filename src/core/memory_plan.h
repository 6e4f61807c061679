// MemoryPlan: every buffer of a training step, with the plan steps between which
// it is live, packed into offsets of one arena before the first step runs.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace smelt {

enum class BufferClass {
  parameters,            // fp32 master weights
  gradients,             // fp32 weight gradients
  optimizer_state,       // AdamW first and second moments
  compute_weights,       // bf16 / fp8 copies of the weights used by the GEMMs
  activations,           // forward activations (kept for backward or transient)
  recompute,             // activations rebuilt before a layer's backward
  activation_gradients,  // gradients flowing backward through activations
  loss,                  // output head chunk buffers, per-token losses
  workspace,             // backend / library scratch
  data,                  // token ids and targets
  communication,         // collective buffers
  count,
};

std::string_view buffer_class_name(BufferClass c);

struct BufferRequest {
  std::string name;  // "layers.3.attention.out"
  size_t bytes = 0;
  int first_step = 0;  // first plan step that writes or reads it
  int last_step = 0;   // last plan step that reads it (inclusive)
  BufferClass kind = BufferClass::activations;
};

struct MemoryPlan {
  std::vector<size_t> offsets;  // one per request, aligned
  size_t arena_bytes = 0;       // what the arena allocates: max(offset + bytes)
  size_t peak_live_bytes = 0;   // max over steps of the bytes live at that step (lower bound on arena_bytes)
  int peak_step = 0;            // the step at which peak_live_bytes occurs
  // Live bytes at each step, by class: live[step][class].
  std::vector<std::vector<size_t>> live_by_class;
};

constexpr size_t kBufferAlignment = 256;

// Packs buffers so that two share memory only if their live ranges are disjoint.
// Greedy: largest (bytes x lifetime) first, each at the lowest offset that fits.
MemoryPlan pack_buffers(const std::vector<BufferRequest>& requests, int step_count);

}  // namespace smelt
