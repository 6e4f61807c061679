// The automatic policy: Pareto candidates per block, a dynamic programme over blocks
// whose state is the bytes kept so far, verification against the packed arena, and
// the search for the smallest change of the run that fits.
#include "plan/auto_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "plan/plan_report.h"

namespace smelt {

namespace {

size_t aligned(size_t bytes) { return (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment; }
size_t aligned_to(size_t bytes, size_t unit) { return (bytes + unit - 1) / unit * unit; }

StepPlan build_with(const ModelConfig& model, PlanOptions options, const std::vector<KeepSet>& keep_sets) {
  options.keep_sets = keep_sets;
  return build_step_plan(model, options);
}

StepPlan build_fixed(const ModelConfig& model, PlanOptions options, const std::string& policy) {
  options.policy = parse_checkpoint_policy(policy);
  options.keep_sets.clear();
  return build_step_plan(model, options);
}

std::vector<KeepSet> keep_sets_of(const StepPlan& plan) {
  std::vector<KeepSet> sets;
  for (const auto& layer : plan.layers) sets.push_back(layer.kept);
  return sets;
}

// Minimum total recompute time over blocks 0..L-1, choosing a candidate per block, such that
// at every block's backward the kept bytes of blocks 0..j plus block j's transient bytes stay
// within `limit`. Sizes are counted in units of `unit` bytes, rounded up (conservative).
// Returns the candidate index per block, or empty when no choice satisfies the limit.
std::vector<int> solve(const std::vector<KeepCandidate>& candidates, int64_t layers, double limit, size_t unit) {
  if (limit < 0) return {};
  const int64_t bins = static_cast<int64_t>(limit / static_cast<double>(unit));
  const size_t count = candidates.size();
  std::vector<int64_t> kept(count), transient(count);
  for (size_t c = 0; c < count; ++c) {
    kept[c] = static_cast<int64_t>((candidates[c].kept_bytes + unit - 1) / unit);
    transient[c] = static_cast<int64_t>((candidates[c].transient_bytes + unit - 1) / unit);
  }
  const double infinity = std::numeric_limits<double>::infinity();
  std::vector<double> cost(bins + 1, infinity), next(bins + 1);
  std::vector<std::vector<uint8_t>> choice(layers, std::vector<uint8_t>(bins + 1, 0));
  cost[0] = 0;
  for (int64_t layer = 0; layer < layers; ++layer) {
    std::fill(next.begin(), next.end(), infinity);
    for (int64_t used = 0; used <= bins; ++used) {
      if (cost[used] == infinity) continue;
      for (size_t c = 0; c < count; ++c) {
        const int64_t after = used + kept[c];
        if (after + transient[c] > bins) continue;
        const double total = cost[used] + candidates[c].recompute_seconds;
        if (total < next[after]) {
          next[after] = total;
          choice[layer][after] = static_cast<uint8_t>(c);
        }
      }
    }
    cost.swap(next);
  }
  int64_t best = -1;
  for (int64_t used = 0; used <= bins; ++used)
    if (cost[used] < infinity && (best < 0 || cost[used] < cost[best] * (1 - 1e-12))) best = used;
  if (best < 0) return {};
  std::vector<int> picks(layers);
  for (int64_t layer = layers - 1; layer >= 0; --layer) {
    picks[layer] = choice[layer][best];
    best -= kept[picks[layer]];
  }
  return picks;
}

}  // namespace

std::vector<KeepCandidate> keep_candidates(const ModelConfig& model, const PlanOptions& options, const CostModel& cost) {
  const KeepSet needed = needed_by_backward();
  std::vector<Activation> free;
  for (int a = 0; a < kActivationCount; ++a)
    if (needed[a] && static_cast<Activation>(a) != Activation::layer_input) free.push_back(static_cast<Activation>(a));
  std::array<double, kForwardOpCount> op_seconds{};
  for (int op = 0; op < kForwardOpCount; ++op)
    op_seconds[op] = cost.forward_op_seconds(static_cast<ForwardOp>(op), model, options);
  auto bytes = [&](Activation a) { return aligned(activation_spec(a, model, options.shape, options.compute_dtype).bytes()); };

  std::vector<KeepCandidate> all;
  for (uint32_t mask = 0; mask < (1u << free.size()); ++mask) {
    KeepCandidate c;
    c.kept[static_cast<int>(Activation::layer_input)] = true;
    for (size_t i = 0; i < free.size(); ++i)
      if (mask & (1u << i)) c.kept[static_cast<int>(free[i])] = true, c.kept_bytes += bytes(free[i]);
    const auto rerun = recompute_ops(c.kept);
    for (int op = 0; op < kForwardOpCount; ++op) {
      if (!rerun[op]) continue;
      c.recompute_seconds += op_seconds[op];
      for (Activation a : forward_op_info(static_cast<ForwardOp>(op)).outputs)
        if (!c.kept[static_cast<int>(a)]) c.transient_bytes += bytes(a);
    }
    all.push_back(c);
  }
  // Two frontiers: kept bytes against time (what every later block's peak sees) and kept plus
  // transient bytes against time (what the block's own backward sees); their union is the menu.
  std::vector<KeepCandidate> frontier;
  for (int pass = 0; pass < 2; ++pass) {
    auto weight = [&](const KeepCandidate& c) { return c.kept_bytes + (pass == 1 ? c.transient_bytes : 0); };
    std::stable_sort(all.begin(), all.end(), [&](const KeepCandidate& a, const KeepCandidate& b) {
      if (weight(a) != weight(b)) return weight(a) < weight(b);
      if (a.recompute_seconds != b.recompute_seconds) return a.recompute_seconds < b.recompute_seconds;
      return a.transient_bytes < b.transient_bytes;
    });
    double best = std::numeric_limits<double>::infinity();
    for (const auto& c : all) {
      if (!(c.recompute_seconds < best)) continue;
      best = c.recompute_seconds;
      if (std::none_of(frontier.begin(), frontier.end(), [&](const KeepCandidate& f) { return f.kept == c.kept; }))
        frontier.push_back(c);
    }
  }
  std::stable_sort(frontier.begin(), frontier.end(),
                   [](const KeepCandidate& a, const KeepCandidate& b) { return a.kept_bytes < b.kept_bytes; });
  SMELT_CHECK(frontier.size() < 256, "too many keep candidates for the choice table");
  return frontier;
}

AutoPolicyResult choose_automatic_policy(const ModelConfig& model, const PlanOptions& options, double budget_bytes,
                                         const CostModel& cost) {
  AutoPolicyResult result;
  auto consider = [&](StepPlan plan, const std::string& by) {
    ++result.plans_built;
    if (static_cast<double>(plan.memory.arena_bytes) > budget_bytes) return false;
    PlanTime time = cost.predict(plan);
    const bool better = result.plan.steps.empty() || time.seconds < result.time.seconds * (1 - 1e-9) ||
                        (time.seconds <= result.time.seconds * (1 + 1e-9) &&
                         plan.memory.arena_bytes < result.plan.memory.arena_bytes);
    if (better) {
      result.plan = std::move(plan);
      result.time = time;
      result.chosen_by = by;
    }
    return true;
  };

  // The least memory any choice needs: keep only block inputs.
  StepPlan least = build_fixed(model, options, "full");
  if (!consider(least, "full")) {
    const auto changes = changes_that_fit(model, options, budget_bytes, cost);
    fail(ErrorKind::memory, does_not_fit_message(least, budget_bytes, changes));
  }

  const std::vector<KeepCandidate> candidates = keep_candidates(model, options, cost);
  size_t most_kept = 0, most_transient = 0;
  for (const auto& c : candidates) {
    most_kept = std::max(most_kept, c.kept_bytes);
    most_transient = std::max(most_transient, c.transient_bytes);
  }
  // What the arena holds besides the blocks' kept and recomputed activations, read off the
  // `full` plan (nothing kept; its block transient is the largest candidate's).
  const double others = static_cast<double>(least.memory.arena_bytes) - static_cast<double>(candidates.front().transient_bytes);
  const double everything = static_cast<double>(most_kept) * static_cast<double>(model.n_layers) + static_cast<double>(most_transient);
  const size_t unit = std::max<size_t>(kBufferAlignment, aligned(static_cast<size_t>(everything / 4096) + 1));

  // Tighten / loosen the programme's limit until the packed arena is the largest that fits.
  // The programme's own estimate of a choice's peak (its footprint) is what a failed choice
  // pushes the limit below, so a choice that did not fit is never chosen again.
  auto footprint = [&](const std::vector<int>& picks) {
    double kept = 0, peak = 0;
    for (int p : picks) {
      kept += static_cast<double>(aligned_to(candidates[p].kept_bytes, unit));
      peak = std::max(peak, kept + static_cast<double>(aligned_to(candidates[p].transient_bytes, unit)));
    }
    return peak;
  };
  double fits_below = -1, fails_at = std::numeric_limits<double>::infinity();
  double limit = std::min(budget_bytes - others, everything + static_cast<double>(unit));
  std::vector<int> last_fitting;
  for (int round = 0; round < 24 && fails_at - fits_below > static_cast<double>(unit); ++round) {
    std::vector<int> picks = solve(candidates, model.n_layers, limit, unit);
    if (picks.empty()) {
      fits_below = std::max(fits_below, limit);
      limit = std::min(fails_at, limit + static_cast<double>(unit) * 64);
      continue;
    }
    if (picks == last_fitting) break;  // a looser limit chose the same blocks: nothing more to gain
    std::vector<KeepSet> sets;
    for (int p : picks) sets.push_back(candidates[p].kept);
    StepPlan plan = build_with(model, options, sets);
    const double arena = static_cast<double>(plan.memory.arena_bytes);
    if (consider(std::move(plan), "dynamic programme")) {
      last_fitting = picks;
      fits_below = std::max(fits_below, limit);
      if (budget_bytes - arena < static_cast<double>(unit) || limit >= everything) break;
      limit = std::min(limit + (budget_bytes - arena), (limit + fails_at) / 2);
    } else {
      const double tried = std::min(limit, footprint(picks));
      fails_at = std::min(fails_at, tried);
      limit = std::max(tried - (arena - budget_bytes) - static_cast<double>(unit), (tried + std::max(fits_below, 0.0)) / 2);
      limit = std::min(limit, tried - static_cast<double>(unit));
    }
  }
  // Never worse than a fixed policy that fits: the programme's memory model is an estimate.
  for (const char* policy : {"none", "selective-op", "selective-layer:2"}) consider(build_fixed(model, options, policy), policy);
  // The result is always expressed as keep-sets under the automatic policy.
  PlanOptions chosen = options;
  chosen.policy.mode = CheckpointMode::automatic;
  chosen.keep_sets = keep_sets_of(result.plan);
  result.plan = build_step_plan(model, chosen);
  result.time = cost.predict(result.plan);
  SMELT_CHECK(static_cast<double>(result.plan.memory.arena_bytes) <= budget_bytes, "automatic plan exceeds its budget");
  return result;
}

std::vector<std::string> changes_that_fit(const ModelConfig& model, const PlanOptions& options, double budget_bytes,
                                          const CostModel& cost) {
  std::vector<std::string> changes;
  const bool automatic = options.policy.mode == CheckpointMode::automatic;
  auto arena = [&](PlanOptions o) {
    if (automatic || !o.keep_sets.empty()) {
      o.policy = parse_checkpoint_policy("full");
      o.keep_sets.clear();
    }
    return static_cast<double>(build_step_plan(model, o).memory.arena_bytes);
  };
  auto note = [](const std::string& change, double bytes) {
    return change + " (arena " + format_bytes(static_cast<size_t>(bytes)) + ")";
  };
  // A policy: the fastest fixed one that fits, and auto when recomputing everything fits.
  if (!automatic) {
    double best_seconds = std::numeric_limits<double>::infinity();
    std::string best;
    double best_arena = 0;
    for (const char* policy : {"none", "selective-layer:2", "selective-op", "full"}) {
      StepPlan plan = build_fixed(model, options, policy);
      if (static_cast<double>(plan.memory.arena_bytes) > budget_bytes) continue;
      const double seconds = cost.predict(plan).seconds;
      if (seconds < best_seconds) best_seconds = seconds, best = policy, best_arena = static_cast<double>(plan.memory.arena_bytes);
    }
    if (!best.empty()) {
      changes.push_back(note("--activation_checkpoint.mode=" + best, best_arena));
      changes.push_back("--activation_checkpoint.mode=auto (the fastest keep/recompute choice under the budget)");
    }
  }
  // More shards: the smallest power-of-two multiple of the degree that fits.
  for (int64_t degree = options.shard_degree * 2; degree <= 4096; degree *= 2) {
    PlanOptions o = options;
    o.shard_degree = degree;
    const double bytes = arena(o);
    if (bytes <= budget_bytes) {
      changes.push_back(note("--parallelism.data_parallel_shard_degree=" + std::to_string(degree), bytes));
      break;
    }
  }
  // A smaller batch, then a shorter sequence: the largest that fits (memory grows with both).
  auto largest_fitting = [&](int64_t current, int64_t step, auto set) -> int64_t {
    int64_t low = 0, high = (current + step - 1) / step;  // fits at low*step (0: none known), not at high*step
    while (high - low > 1) {
      const int64_t middle = (low + high) / 2;
      PlanOptions o = options;
      set(o, middle * step);
      if (arena(o) <= budget_bytes) low = middle;
      else high = middle;
    }
    return low * step;
  };
  if (options.shape.batch > 1) {
    const int64_t batch = largest_fitting(options.shape.batch, 1, [](PlanOptions& o, int64_t v) { o.shape.batch = v; });
    if (batch > 0 && options.microbatches == 1) {  // (with accumulation, the global batch must stay a multiple)
      PlanOptions o = options;
      o.shape.batch = batch;
      changes.push_back(note("--training.local_batch_size=" + std::to_string(batch), arena(o)));
    }
    // The same sequences per step, in passes of a batch that fits, their gradients accumulated
    // (kept in f32, so the fitting batch may be smaller still). Per rank: the global batch is this
    // times the data-parallel ranks.
    const int64_t ranks = options.shard_degree * options.replicate_degree;
    const int64_t sequences = options.shape.batch * options.microbatches;
    for (int64_t pass = batch; pass >= 1; --pass) {
      if (sequences % pass != 0 || pass == sequences) continue;
      PlanOptions o = options;
      o.shape.batch = pass;
      o.microbatches = sequences / pass;
      const double bytes = arena(o);
      if (bytes > budget_bytes) continue;
      changes.push_back(note("--training.local_batch_size=" + std::to_string(pass) + " --training.global_batch_size=" +
                                 std::to_string(sequences * ranks) + " (" + std::to_string(o.microbatches) +
                                 " accumulated passes a step: the same " + std::to_string(sequences * ranks) +
                                 " sequences)",
                             bytes));
      break;
    }
  }
  const int64_t granule = std::min<int64_t>(256, options.shape.seq_len);
  if (options.shape.seq_len > granule) {
    const int64_t seq = largest_fitting(options.shape.seq_len, granule, [](PlanOptions& o, int64_t v) { o.shape.seq_len = v; });
    if (seq > 0) {
      PlanOptions o = options;
      o.shape.seq_len = seq;
      changes.push_back(note("--training.seq_len=" + std::to_string(seq), arena(o)));
    }
  }
  return changes;
}

std::string does_not_fit_message(const StepPlan& plan, double budget_bytes, const std::vector<std::string>& changes) {
  std::string text = "the step plan does not fit: expected an arena of at most " +
                     format_bytes(static_cast<size_t>(budget_bytes)) + " (the memory budget), found " +
                     format_bytes(plan.memory.arena_bytes) + " with the '" + plan.options.policy.str() +
                     "' policy, peak at '" + plan.steps[plan.memory.peak_step].name() + "'.\n  breakdown:";
  for (size_t c = 0; c < static_cast<size_t>(BufferClass::count); ++c) {
    const size_t bytes = plan.bytes_of(static_cast<BufferClass>(c));
    if (bytes == 0) continue;
    text += ' ';
    text += buffer_class_name(static_cast<BufferClass>(c));
    text += ' ';
    text += format_bytes(plan.memory.live_by_class[plan.memory.peak_step][c]);
    text += ';';
  }
  text += " (live at the peak)\n";
  if (changes.empty()) {
    text += "  no single change of policy, batch size, sequence length or shard degree fits; "
            "raise the budget (activation_checkpoint.memory_budget_gb) or use a device with more memory";
  } else {
    text += "  the smallest changes that fit, any one of:";
    for (const auto& change : changes) text += "\n    " + change;
  }
  return text;
}

}  // namespace smelt
