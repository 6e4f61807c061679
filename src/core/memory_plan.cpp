// Interval packing of buffers into one arena.
#include "core/memory_plan.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace smelt {

std::string_view buffer_class_name(BufferClass c) {
  switch (c) {
    case BufferClass::parameters: return "parameters";
    case BufferClass::gradients: return "gradients";
    case BufferClass::optimizer_state: return "optimizer state";
    case BufferClass::compute_weights: return "compute weights";
    case BufferClass::activations: return "activations";
    case BufferClass::recompute: return "recompute";
    case BufferClass::activation_gradients: return "activation gradients";
    case BufferClass::loss: return "loss head";
    case BufferClass::workspace: return "workspace";
    case BufferClass::data: return "data";
    case BufferClass::communication: return "communication";
    case BufferClass::count: break;
  }
  return "?";
}

static size_t align_up(size_t v) { return (v + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment; }

MemoryPlan pack_buffers(const std::vector<BufferRequest>& requests, int step_count) {
  MemoryPlan plan;
  const size_t n = requests.size();
  plan.offsets.assign(n, 0);
  for (const auto& r : requests)
    SMELT_CHECK(r.first_step >= 0 && r.first_step <= r.last_step && r.last_step < step_count,
                "buffer '" + r.name + "' has live range [" + std::to_string(r.first_step) + ", " +
                    std::to_string(r.last_step) + "] outside the plan's " + std::to_string(step_count) + " steps");

  // Placement order: long-lived and large first, which keeps persistent state at
  // the bottom of the arena and lets short-lived activations reuse the space above.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& x = requests[a];
    const auto& y = requests[b];
    int lx = x.last_step - x.first_step, ly = y.last_step - y.first_step;
    if (lx == step_count - 1 || ly == step_count - 1) {
      if ((lx == step_count - 1) != (ly == step_count - 1)) return lx == step_count - 1;
    }
    if (align_up(x.bytes) != align_up(y.bytes)) return align_up(x.bytes) > align_up(y.bytes);
    return x.first_step < y.first_step;
  });

  struct Placed {
    size_t offset, end;
    int first, last;
  };
  std::vector<Placed> placed;
  placed.reserve(n);
  for (size_t index : order) {
    const auto& r = requests[index];
    size_t size = align_up(r.bytes);
    // Occupied ranges among buffers whose lifetimes overlap this one.
    std::vector<std::pair<size_t, size_t>> busy;
    for (const auto& p : placed)
      if (p.first <= r.last_step && r.first_step <= p.last) busy.emplace_back(p.offset, p.end);
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (offset + size <= begin) break;
      offset = std::max(offset, end);
    }
    plan.offsets[index] = offset;
    placed.push_back({offset, offset + size, r.first_step, r.last_step});
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
  }

  const size_t classes = static_cast<size_t>(BufferClass::count);
  plan.live_by_class.assign(step_count, std::vector<size_t>(classes, 0));
  std::vector<size_t> live(step_count, 0);
  for (const auto& r : requests)
    for (int s = r.first_step; s <= r.last_step; ++s) {
      live[s] += align_up(r.bytes);
      plan.live_by_class[s][static_cast<size_t>(r.kind)] += align_up(r.bytes);
    }
  for (int s = 0; s < step_count; ++s)
    if (live[s] > plan.peak_live_bytes) {
      plan.peak_live_bytes = live[s];
      plan.peak_step = s;
    }
  return plan;
}

}  // namespace smelt
