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

  // First-fit placement in each of a few orders, keeping the smallest arena. Every order puts the
  // buffers live for the whole step first (persistent state at the bottom of the arena); then
  // large before small (short-lived activations reuse the space above), or long-lived before
  // short-lived, or in order of first use (a staircase of buffers live to the step's end, such as
  // per-unit gradients, packs best so). Ties keep the request order, so the plan is deterministic;
  // an order that packs into the live peak ends the search.
  const auto whole_step = [&](const BufferRequest& r) { return r.last_step - r.first_step == step_count - 1; };
  using Before = bool (*)(const BufferRequest&, const BufferRequest&);
  const Before by_size = [](const BufferRequest& x, const BufferRequest& y) {
    if (align_up(x.bytes) != align_up(y.bytes)) return align_up(x.bytes) > align_up(y.bytes);
    return x.first_step < y.first_step;
  };
  const Before by_span = [](const BufferRequest& x, const BufferRequest& y) {
    if (x.last_step - x.first_step != y.last_step - y.first_step) return x.last_step - x.first_step > y.last_step - y.first_step;
    return align_up(x.bytes) > align_up(y.bytes);
  };
  const Before by_first_use = [](const BufferRequest& x, const BufferRequest& y) {
    if (x.first_step != y.first_step) return x.first_step < y.first_step;
    return align_up(x.bytes) > align_up(y.bytes);
  };
  struct Placed {
    size_t offset, end;
    int first, last;
  };
  std::vector<Placed> placed;
  placed.reserve(n);
  std::vector<std::pair<size_t, size_t>> busy;
  std::vector<size_t> offsets(n);
  bool first_order = true;
  for (Before before : {by_size, by_span, by_first_use}) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const auto &x = requests[a], &y = requests[b];
      if (whole_step(x) != whole_step(y)) return whole_step(x);
      return before(x, y);
    });
    placed.clear();
    size_t arena = 0;
    for (size_t index : order) {
      const auto& r = requests[index];
      const size_t size = align_up(r.bytes);
      // Occupied ranges among buffers whose lifetimes overlap this one.
      busy.clear();
      for (const auto& p : placed)
        if (p.first <= r.last_step && r.first_step <= p.last) busy.emplace_back(p.offset, p.end);
      std::sort(busy.begin(), busy.end());
      size_t offset = 0;
      for (const auto& [begin, end] : busy) {
        if (offset + size <= begin) break;
        offset = std::max(offset, end);
      }
      offsets[index] = offset;
      placed.push_back({offset, offset + size, r.first_step, r.last_step});
      arena = std::max(arena, offset + size);
    }
    if (first_order || arena < plan.arena_bytes) {
      plan.arena_bytes = arena;
      plan.offsets = offsets;
    }
    first_order = false;
    if (plan.arena_bytes == plan.peak_live_bytes) break;  // no order packs below the live peak
  }

  return plan;
}

}  // namespace smelt
