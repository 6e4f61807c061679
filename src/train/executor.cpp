// Executor: binds plan buffers to arena views and dispatches steps to the model code.
#include "train/executor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/numerics.h"

namespace smelt {

Executor::Executor(const StepPlan& plan, Backend& backend, Communicator* communicator)
    : plan_(plan),
      backend_(backend),
      layout_(plan.model),
      arena_(std::make_unique<Arena>(backend.memory(), plan.memory.arena_bytes)),
      context_{plan_.model, plan.options.shape, backend, TensorView(), Float8Recipe::none, Float8Scratch{}},
      communicator_(communicator) {
  setup_sharding();
  SMELT_CHECK(plan_.options.microbatches >= 1, "executor: a plan of " + std::to_string(plan_.options.microbatches) +
                                                   " microbatches per step");
  context_.microbatches = plan_.options.microbatches;
  context_.rope_frequencies = view(plan_.rope_frequencies);
  if (plan_.embedding_gradient >= 0) {  // AdamW's second call: the runs after the embedding's (run_adamw_split)
    const ParameterRun& embedding = plan_.compute_copy_ranges.front();
    SMELT_CHECK(embedding.own_grad && embedding.begin == 0, "executor: the embedding's run has no gradient buffer of its own");
    SMELT_CHECK(embedding.amax_slot < 0, "executor: the embedding's run has an amax slot");
    if (embedding.copied()) embedding_run_.push_back({0, embedding.count, embedding.copy_offset});
    for (size_t r = 1; r < plan_.compute_copy_ranges.size(); ++r) {
      ParameterRun run = plan_.compute_copy_ranges[r];
      run.begin -= embedding.count;
      runs_after_embedding_.push_back(run);
    }
  }
  if (plan_.workspace >= 0) backend_.set_workspace(view(plan_.workspace));
  setup_float8();
  std::vector<float> rope(static_cast<size_t>(view(plan_.rope_frequencies).numel()));
  rope_frequencies(plan_.model, plan_.options.shape.seq_len, rope.data());
  backend_.copy_to_device(view(plan_.rope_frequencies), rope.data());
}

TensorView Executor::view(int buffer) const {
  const auto& b = plan_.buffers.at(static_cast<size_t>(buffer));
  return arena_->view(plan_.memory.offsets[static_cast<size_t>(buffer)], b.dtype, b.shape);
}

TensorView Executor::weight_view(const ParameterInfo& info, const Step& step) const {
  if (sharded()) return unit_view(step.gathered_weights, info, step);
  // The compute copy where the parameter has one; the master weights otherwise (no copy, the
  // embedding, float8 linears: their readers round or quantise the master values themselves).
  const int64_t copy_offset = plan_.compute_copy_offset(info);
  if (copy_offset < 0) return ParameterLayout::slice(view(plan_.parameters), info);
  ParameterInfo in_copy = info;
  in_copy.offset = copy_offset;
  return ParameterLayout::slice(view(plan_.compute_weights), in_copy);
}

void Executor::fill_compute_copy() {
  if (plan_.compute_weights < 0) return;
  const TensorView parameters = view(plan_.parameters), copy = view(plan_.compute_weights);
  if (plan_.compute_copy_ranges.empty()) return backend_.convert({parameters, copy});
  for (const ParameterRun& range : plan_.compute_copy_ranges)
    if (range.copied())
      backend_.convert({parameters.elements(range.begin, range.count), copy.elements(range.copy_offset, range.count)});
}

TensorView Executor::grad_view(const ParameterInfo& info, const Step& step) const {
  if (sharded()) return unit_view(step.unit_gradients, info, step);
  const StepPlan::GradientPlace place = plan_.gradient_place(info);
  ParameterInfo in_buffer = info;
  in_buffer.offset = place.offset;
  return ParameterLayout::slice(view(place.buffer), in_buffer);
}

void Executor::load_parameters(const float* host) {
  if (sharded()) {
    scatter_to_shards(host, plan_.parameters);
    if (plan_.compute_weights >= 0) backend_.convert({view(plan_.parameters), view(plan_.compute_weights)});
    return;
  }
  TensorView parameters = view(plan_.parameters);
  if (parameters.dtype == DType::f64) {  // f64 master weights (finite-difference tests)
    std::vector<double> wide(host, host + parameters.numel());
    backend_.copy_to_device(parameters, wide.data());
  } else if (parameters.dtype == DType::bf16) {  // forward-only: the weights rounded as a compute copy is
    std::vector<uint16_t> rounded(static_cast<size_t>(parameters.numel()));
    for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = float_to_bf16(host[i]);
    backend_.copy_to_device(parameters, rounded.data());
  } else {
    backend_.copy_to_device(parameters, host);
  }
  fill_compute_copy();
  quantize_float8_weights();
}

void Executor::read_parameters(float* host) {
  if (sharded()) return gather_from_shards(plan_.parameters, host);
  if (!host) return;
  TensorView parameters = view(plan_.parameters);
  SMELT_CHECK(parameters.dtype != DType::bf16, "executor: a forward-only plan's bf16 weights are not the master weights");
  if (parameters.dtype == DType::f64) {
    std::vector<double> wide(static_cast<size_t>(parameters.numel()));
    backend_.copy_to_host(wide.data(), parameters);
    for (size_t i = 0; i < wide.size(); ++i) host[i] = static_cast<float>(wide[i]);
  } else {
    backend_.copy_to_host(host, parameters);
  }
}

void Executor::reset_optimizer_state() {
  if (plan_.options.forward_only) return;  // nothing to reset
  backend_.fill(view(plan_.exp_avg), 0.0f);
  backend_.fill(view(plan_.exp_avg_sq), 0.0f);
  backend_.fill(view(plan_.gradients), 0.0f);
  if (plan_.linear_gradients >= 0) backend_.fill(view(plan_.linear_gradients), 0.0f);
}

void Executor::load_batch(const int32_t* inputs, const int32_t* targets) {
  backend_.copy_to_device(view(plan_.tokens), inputs);
  backend_.copy_to_device(view(plan_.targets), targets);
}

LayerViews Executor::layer_views(const Step& step) const {
  LayerViews v;
  const auto& lb = plan_.layers.at(static_cast<size_t>(step.layer));
  const auto& ids = step.kind == StepKind::layer_forward ? lb.forward : lb.backward;
  for (int a = 0; a < kActivationCount; ++a) v.activation[a] = view(ids[a]);
  if (step.kind == StepKind::layer_backward) {
    for (int g = 0; g < kGradientCount; ++g) v.gradient[g] = view(lb.gradient[g]);
    v.residual_gradient = view(plan_.residual_gradient);
    if (lb.attention_scratch >= 0) v.attention_scratch = view(lb.attention_scratch);
  }
  v.float8 = lb.float8;
  v.float8_state = float8_states(step.layer);
  if (plan_.float8_gathered()) gathered_float8_states(step, v.float8_state);
  if (step.kind != StepKind::layer_recompute) {
    // Inputs kept as float8 x^T: the forward writes them beside x; the backward reads them instead
    // of x, whose buffer is not live there (an empty view, so nothing can read it by mistake).
    for (int w = 0; w < kLayerWeightCount; ++w) {
      if (!lb.float8[w]) continue;
      const int x = static_cast<int>(linear_input(static_cast<LayerWeight>(w)));
      if (lb.float8_saved[x] < 0) continue;
      const TensorView& input = v.activation[x];
      v.float8_state[w].saved_input = float8_saved_input_view(plan_.options.float8.recipe, input.cols(), input.rows(),
                                                             view(lb.float8_saved[x]));
    }
    if (step.kind == StepKind::layer_backward)
      for (int a = 0; a < kActivationCount; ++a)
        if (lb.float8_saved[a] >= 0) v.activation[a] = TensorView();
  }
  if (plan_.float8_producer_amax >= 0) {
    // SwiGLU takes the amax of its output for w2's cast, and of its gradients for w1's and w3's;
    // the norms take the amax of their outputs for the QKV and FFN inputs' casts, and the FFN
    // norm's backward that of the residual gradient it leaves, wo's dy.
    const TensorView all = view(plan_.float8_producer_amax);
    auto slot = [&](int index) {
      return TensorView(all.as<float>() + step.layer * kProducerAmaxPerBlock + index, DType::f32, Shape{1},
                        all.device);
    };
    const auto at = [](LayerWeight w) { return static_cast<int>(w); };
    // x's amax from its producer, for every float8 linear reading x (the same float, so a linear
    // that takes x from the one before it needs no copy of the amax).
    auto input_from = [&](TensorView amax, std::initializer_list<LayerWeight> readers) {
      bool any = false;
      for (LayerWeight w : readers) {
        if (!lb.float8[at(w)]) continue;
        v.float8_state[at(w)].input_amax = amax;
        v.float8_state[at(w)].input_amax_ready = true;
        any = true;
      }
      return any ? amax : TensorView();
    };
    v.swiglu_amax = input_from(slot(0), {LayerWeight::w2});
    v.attn_norm_amax = input_from(slot(3), {LayerWeight::wq, LayerWeight::wk, LayerWeight::wv});
    v.ffn_norm_amax = input_from(slot(4), {LayerWeight::w1, LayerWeight::w3});
    if (step.kind == StepKind::layer_backward) {
      if (lb.float8[at(LayerWeight::w1)]) v.gate_grad_amax = v.float8_state[at(LayerWeight::w1)].grad_amax = slot(1);
      if (lb.float8[at(LayerWeight::w3)]) v.up_grad_amax = v.float8_state[at(LayerWeight::w3)].grad_amax = slot(2);
      if (lb.float8[at(LayerWeight::wo)])
        v.ffn_norm_grad_amax = v.float8_state[at(LayerWeight::wo)].grad_amax = slot(5);
    }
  }
  for (int w = 0; w < kLayerWeightCount; ++w) {
    const auto& info = layout_.layer(step.layer, static_cast<LayerWeight>(w));
    v.weight[w] = weight_view(info, step);
    if (!plan_.options.forward_only) v.weight_grad[w] = grad_view(info, step);
  }
  return v;
}

HeadViews Executor::head_views(const Step& step) const {
  HeadViews v;
  v.tokens = view(plan_.tokens);
  v.targets = view(plan_.targets);
  v.embedding = weight_view(layout_.embedding(), step);
  v.final_input = view(plan_.residual.back());
  v.final_norm_weight = weight_view(layout_.final_norm(), step);
  v.final_norm_out = view(plan_.final_norm_out);
  v.final_rstd = view(plan_.final_rstd);
  v.output_weight = plan_.output_weight >= 0 ? view(plan_.output_weight) : weight_view(layout_.output(), step);
  v.logits = view(plan_.logits);
  v.grad_logits = view(plan_.grad_logits);
  v.losses = view(plan_.losses);
  v.first_residual = view(plan_.residual.front());
  v.loss_only = plan_.options.forward_only;
  if (v.loss_only) return v;  // no gradients planned
  v.embedding_grad = grad_view(layout_.embedding(), step);
  v.final_norm_grad = grad_view(layout_.final_norm(), step);
  v.output_grad = grad_view(layout_.output(), step);
  v.final_norm_out_grad = view(plan_.final_norm_out_grad);
  v.residual_gradient = view(plan_.residual_gradient);
  return v;
}

void Executor::run_step(const Step& step, const OptimizerSettings& optimizer) {
  ++float8_reuse_.step;  // a float8 input is reused only by the step right after the one that cast it
  if (data_parallel()) wait_for_buffers(step);
  switch (step.kind) {
    case StepKind::embedding_forward: embedding_forward(head_views(step), context_); return;
    case StepKind::layer_forward:
    case StepKind::layer_recompute:
      select_float8_scratch(step);
      run_forward_op(static_cast<ForwardOp>(step.op), layer_views(step), context_);
      return;
    case StepKind::final_norm_forward: final_norm_forward(head_views(step), context_); return;
    case StepKind::output_head:
      if (plan_.output_weight >= 0)  // the output projection's bf16 copy, for this step only
        backend_.convert({ParameterLayout::slice(view(plan_.parameters), layout_.output()), view(plan_.output_weight)});
      output_head(head_views(step), context_);
      return;
    case StepKind::final_norm_backward: final_norm_backward(head_views(step), context_); return;
    case StepKind::layer_backward:
      select_float8_scratch(step);
      run_backward_op(static_cast<BackwardOp>(step.op), layer_views(step), context_);
      return;
    case StepKind::embedding_backward:
      if (plan_.embedding_gradient >= 0) {  // its buffer is not held across steps: zero the padding after the table
        const TensorView all = view(plan_.embedding_gradient);
        const int64_t used = layout_.embedding().numel();
        if (all.numel() > used) backend_.fill(all.elements(used, all.numel() - used), 0.0f);
      }
      embedding_backward(head_views(step), context_);
      return;
    case StepKind::gradient_norm: {
      // The embedding's own buffer and the block linears' bf16 one join the f32 gradients in one
      // reduction: one rounding to f32 whichever buffers a plan splits its gradients over.
      SumSquaresArgs norm{view(plan_.gradients), view(plan_.grad_sum_squares), false};
      if (plan_.embedding_gradient >= 0) norm.also[0] = view(plan_.embedding_gradient);
      if (plan_.linear_gradients >= 0) norm.also[1] = view(plan_.linear_gradients);
      backend_.sum_squares(norm);
      return;
    }
    case StepKind::optimizer: {
      AdamwArgs a;
      a.params = view(plan_.parameters);
      a.grads = view(plan_.gradients);
      if (plan_.linear_gradients >= 0) a.low_grads = view(plan_.linear_gradients);
      a.exp_avg = view(plan_.exp_avg);
      a.exp_avg_sq = view(plan_.exp_avg_sq);
      a.grad_sum_squares = view(plan_.grad_sum_squares);
      a.lr = optimizer.lr;
      a.beta1 = optimizer.beta1;
      a.beta2 = optimizer.beta2;
      a.eps = optimizer.eps;
      a.weight_decay = optimizer.weight_decay;
      a.max_norm = optimizer.max_norm;
      a.step = optimizer.step;
      if (plan_.compute_weights >= 0) {  // the cast, fused (unsharded: over the runs that have a copy)
        a.compute_copy = view(plan_.compute_weights);
        a.copy_ranges = plan_.compute_copy_ranges;
      }
      if (plan_.float8_weight_amax >= 0) a.weight_amax = view(plan_.float8_weight_amax);
      if (plan_.embedding_gradient >= 0) return run_adamw_split(a);
      backend_.adamw(a);
      return;
    }
    case StepKind::cast_weights: quantize_float8_weights(true); return;
    case StepKind::loss_reduce: {  // a microbatch's mean weighs 1 / microbatches of the step's loss
      const bool whole = evaluating_ || plan_.options.microbatches == 1;
      backend_.mean({view(plan_.losses), view(plan_.loss), !whole && microbatch_ > 0,
                     whole ? 1.0 : 1.0 / static_cast<double>(plan_.options.microbatches)});
      return;
    }
    case StepKind::all_gather:
    case StepKind::reduce_scatter:
    case StepKind::all_reduce_gradients:
    case StepKind::all_reduce_gradient_norm:
    case StepKind::all_reduce_loss:
    case StepKind::float8_shard_amax:
    case StepKind::all_reduce_float8_amax:
    case StepKind::float8_shard_cast: run_collective(step); return;
  }
  SMELT_CHECK(false, "unknown step kind");
}

void Executor::run_indexed(size_t i, const OptimizerSettings& optimizer) {
  if (!timing_) return run_step(plan_.steps[i], optimizer);
  timed_order_.push_back(i);
  backend_.timing_mark(i);
  backend_.range_push(step_names_[i].c_str());
  const std::vector<Communicator*> groups = communicators();
  std::vector<CollectiveHandle> before;
  for (Communicator* c : groups) before.push_back(c->issued());
  run_step(plan_.steps[i], optimizer);
  issued_[i].clear();
  for (size_t g = 0; g < groups.size(); ++g)
    if (groups[g]->issued() > before[g]) issued_[i].push_back({groups[g], before[g], groups[g]->issued()});
  backend_.range_pop();
}

std::vector<Communicator*> Executor::communicators() const {
  std::vector<Communicator*> all;
  for (Communicator* c : {communicator_, shard_group_, replica_group_})
    if (c && std::find(all.begin(), all.end(), c) == all.end()) all.push_back(c);
  return all;
}

void Executor::enable_timing(bool enabled) {
  timing_ = enabled;
  for (Communicator* c : communicators()) c->enable_timing(enabled);
  if (!enabled) return;
  backend_.reserve_timing_marks(plan_.steps.size() + 1);
  step_names_.clear();
  for (const auto& step : plan_.steps) step_names_.push_back(step.name());
  issued_.assign(plan_.steps.size(), {});
}

std::vector<std::pair<double, double>> Executor::collective_windows() {
  SMELT_CHECK(timing_, "collective_windows needs enable_timing(true) before run()");
  std::vector<std::pair<double, double>> windows(plan_.steps.size(), {-1.0, -1.0});
  void* reference = backend_.timing_event(0);
  if (!reference) return windows;
  for (Communicator* c : communicators()) c->synchronize();
  for (size_t i = 0; i < issued_.size(); ++i) {
    double first = -1, last = -1;
    for (const IssuedCollectives& run : issued_[i])
      for (CollectiveHandle h = run.first; h < run.end; ++h) {
        double start = 0, end = 0;
        if (!run.by->collective_window_ms(h, reference, &start, &end)) continue;
        first = first < 0 ? start : std::min(first, start);
        last = std::max(last, end);
      }
    if (first >= 0) windows[i] = {first, last};
  }
  return windows;
}

std::vector<double> Executor::step_milliseconds() {
  SMELT_CHECK(timing_, "step_milliseconds needs enable_timing(true) before run()");
  backend_.synchronize();
  // Each step's time runs from its mark to the next mark recorded after it, in the order the
  // steps last ran (updates after the loss; with several microbatches, the last one's steps and
  // then the gradient norm), then the end mark.
  std::vector<size_t> order = timed_order_;
  order.push_back(plan_.steps.size());
  std::vector<double> ms(plan_.steps.size(), 0.0);
  for (size_t k = 0; k + 1 < order.size(); ++k) ms[order[k]] = backend_.timing_elapsed_ms(order[k], order[k + 1]);
  return ms;
}

bool Executor::is_update(const Step& step) { return in_set(StepSet::updates, step.kind); }

bool Executor::in_set(StepSet set, StepKind kind) {
  const bool update = kind == StepKind::optimizer || kind == StepKind::cast_weights;
  switch (set) {
    case StepSet::gradients: return !update;
    case StepSet::microbatch: return !runs_once_per_step(kind);
    case StepSet::gradient_norm: return runs_once_per_step(kind) && !update;
    case StepSet::updates: return update;
  }
  return false;
}

void Executor::run_steps(StepSet set, const OptimizerSettings& optimizer) {
  // Replicas all-reduce the gradients a step accumulated once, in its last microbatch.
  const bool last = microbatch_ + 1 == plan_.options.microbatches;
  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    const StepKind kind = plan_.steps[i].kind;
    if (!in_set(set, kind) || (set == StepSet::microbatch && kind == StepKind::all_reduce_gradients && !last)) continue;
    run_indexed(i, optimizer);
  }
  if (timing_ && set == StepSet::updates) backend_.timing_mark(plan_.steps.size());
}

void Executor::run_graphed(StepSet set, const OptimizerSettings& optimizer) {
  // Collectives join the capture when the communicator allows it (NCCL); host-synchronous ones
  // (ranks as threads) keep the step eager.
  const bool collectives_capturable = !data_parallel() || communicator_->capturable();
  const bool use_graph = graph_wanted_ && !graph_failed_ && !timing_ && collectives_capturable;
  if (!use_graph || (!graph_captured_ && eager_runs_ < 1)) {
    ++eager_runs_;  // the first run is eager: library caches and plans get built
    run_steps(set, optimizer);
    return;
  }
  if (!graph_captured_) {
    if (!backend_.begin_capture()) {
      graph_failed_ = true;
      run_steps(set, optimizer);
      return;
    }
    try {
      run_steps(set, optimizer);
    } catch (const Error&) {
      backend_.end_capture();
      graph_failed_ = true;
    }
    if (!graph_failed_) graph_captured_ = backend_.end_capture();
    if (!graph_captured_) {
      graph_failed_ = true;
      std::fprintf(stderr, "smelt: the step could not be captured as a CUDA graph; running it op by op\n");
      run_steps(set, optimizer);
      return;
    }
  }
  backend_.replay();
}

void Executor::run_gradients(const OptimizerSettings& optimizer) {
  SMELT_CHECK(!plan_.options.forward_only, "executor: a forward-only plan computes losses (run_loss), not gradients");
  SMELT_CHECK(plan_.options.microbatches == 1,
              "run_gradients runs a step of one microbatch; this plan has " +
                  std::to_string(plan_.options.microbatches) + ": call run_microbatch for each");
  timed_order_.clear();
  run_graphed(StepSet::gradients, optimizer);
}

void Executor::run_microbatch(const OptimizerSettings& optimizer, int64_t index) {
  SMELT_CHECK(!plan_.options.forward_only, "executor: a forward-only plan computes losses (run_loss), not gradients");
  const int64_t count = plan_.options.microbatches;
  SMELT_CHECK(index >= 0 && index < count, "run_microbatch: microbatch " + std::to_string(index) +
                                               " of a step of " + std::to_string(count));
  if (count == 1) return run_gradients(optimizer);
  timed_order_.clear();  // a trace times the step's last microbatch
  microbatch_ = index;
  // The backward adds to the gradients where they persist across passes (one rank's whole model,
  // or a shard written in place); sharded with collectives, a unit's gradients are written to a
  // passing buffer and its received shard is added instead (the reduce-scatter step).
  context_.accumulate_gradients = index > 0 && (!sharded() || plan_.collectives_in_place);
  try {
    // The first microbatch writes the gradients: op by op. The later ones all add: one graph
    // (data parallel: op by op, the last pass also all-reduces replicas).
    if (index == 0 || data_parallel()) run_steps(StepSet::microbatch, optimizer);
    else run_graphed(StepSet::microbatch, optimizer);
  } catch (...) {
    context_.accumulate_gradients = false;
    microbatch_ = 0;
    throw;
  }
  context_.accumulate_gradients = false;
  if (index == count - 1) {
    run_steps(StepSet::gradient_norm, optimizer);
    microbatch_ = 0;
  }
}

void Executor::run_update(const OptimizerSettings& optimizer) { run_steps(StepSet::updates, optimizer); }

void Executor::run_loss(const OptimizerSettings& optimizer) {
  evaluating_ = true;
  struct Restore {
    bool& flag;
    ~Restore() { flag = false; }
  } restore{evaluating_};
  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    const StepKind kind = plan_.steps[i].kind;
    const bool forward_gather = kind == StepKind::all_gather && plan_.steps[i].op == 0;
    if (kind == StepKind::embedding_forward || kind == StepKind::layer_forward ||
        kind == StepKind::final_norm_forward || kind == StepKind::output_head || kind == StepKind::loss_reduce ||
        forward_gather || kind == StepKind::all_reduce_loss || kind == StepKind::float8_shard_amax ||
        kind == StepKind::all_reduce_float8_amax || kind == StepKind::float8_shard_cast)
      run_indexed(i, optimizer);
  }
}

void Executor::run(const OptimizerSettings& optimizer) {
  run_gradients(optimizer);
  run_update(optimizer);
}

static double read_scalar(Backend& backend, const TensorView& v) {
  if (v.dtype == DType::f64) {
    double value = 0;
    backend.copy_to_host(&value, v);
    return value;
  }
  float value = 0;
  backend.copy_to_host(&value, v);
  return value;
}

double Executor::loss() { return read_scalar(backend_, view(plan_.loss)); }

void Executor::run_adamw_split(const AdamwArgs& all) {
  // The embedding, whose gradient has a buffer of its own: its own call, over the first run (its
  // gradients laid out like its parameters; copied only where a plan gives it a copy).
  const ParameterRun& embedding = plan_.compute_copy_ranges.front();
  const auto over = [&](int64_t begin, int64_t count) {  // the update's arguments for [begin, begin + count)
    AdamwArgs part = all;
    for (TensorView AdamwArgs::*state : {&AdamwArgs::params, &AdamwArgs::exp_avg, &AdamwArgs::exp_avg_sq})
      part.*state = (all.*state).elements(begin, count);
    return part;
  };
  AdamwArgs first = over(0, embedding.count);
  first.grads = view(plan_.embedding_gradient);
  first.low_grads = first.weight_amax = TensorView();
  first.copy_ranges = embedding_run_;
  if (!embedding.copied()) first.compute_copy = TensorView();
  backend_.adamw(first);
  // Everything after it, with the runs counted from the embedding's end (their copy and gradient
  // offsets are into buffers that never held the embedding).
  AdamwArgs second = over(embedding.count, all.params.numel() - embedding.count);
  second.copy_ranges = runs_after_embedding_;
  backend_.adamw(second);
}

double Executor::gradient_norm() {
  SMELT_CHECK(plan_.grad_sum_squares >= 0, "executor: a forward-only plan has no gradient norm");
  return std::sqrt(read_scalar(backend_, view(plan_.grad_sum_squares)));
}

}  // namespace smelt
