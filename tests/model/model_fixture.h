// A tiny Llama model planned, allocated and initialised on the CPU backend, for
// whole-model tests: gradients, policy equivalence, allocation counts.
#pragma once
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/numerics.h"
#include "core/random.h"
#include "cpu/cpu_backend.h"
#include "support/fresh_random.h"
#include "train/executor.h"

namespace smelt::testing {

// A debugmodel-flavoured Llama of the given sizes (4 heads, 2 KV heads): the small models the
// CPU whole-model tests train.
inline ModelConfig debug_model(int64_t dim, int64_t layers, int64_t ffn_dim, int64_t vocab_size) {
  ModelSection s;
  s.flavor = "debugmodel";
  s.dim = dim;
  s.n_layers = layers;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.ffn_dim = ffn_dim;
  s.vocab_size = vocab_size;
  return make_model_config(s, 0);
}

inline ModelConfig tiny_model(int64_t layers = 2) { return debug_model(16, layers, 24, 11); }

struct TinyRun {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  StepPlan plan;
  std::unique_ptr<Executor> executor;

  TinyRun(const ModelConfig& model, DType compute, const std::string& policy, int64_t batch, int64_t seq,
          int64_t loss_chunk = 3) {
    PlanOptions o;
    o.shape = {batch, seq};
    o.compute_dtype = compute;
    o.policy = parse_checkpoint_policy(policy);
    o.loss_chunk_tokens = loss_chunk;
    WorkspaceShape w;
    w.tokens = batch * seq;
    w.seq_len = seq;
    w.batch = batch;
    w.max_rows = std::max({w.tokens, model.vocab_size, model.ffn_dim, model.dim});
    w.max_inner = w.max_rows;
    w.max_cols = w.max_rows;
    w.heads = model.n_heads;
    w.kv_heads = model.n_kv_heads;
    w.head_dim = model.head_dim();
    w.compute_dtype = compute;
    o.backend_workspace_bytes = backend->workspace_bytes(w);
    plan = build_step_plan(model, o);
    executor = std::make_unique<Executor>(plan, *backend);
  }

  // Plans and builds the executor again with float8 linears (those named in `filters` stay in
  // the compute dtype).
  void use_float8(Float8Recipe recipe, std::vector<std::string> filters = {"output"}) {
    PlanOptions options = plan.options;
    options.float8.recipe = recipe;
    options.float8.filter_fqns = std::move(filters);
    replan(options);
  }

  // Plans and builds the executor again with other options (same model).
  void replan(const PlanOptions& options) {
    executor.reset();
    plan = build_step_plan(plan.model, options);
    executor = std::make_unique<Executor>(plan, *backend);
  }

  void initialise(uint64_t seed) {
    std::vector<float> host(static_cast<size_t>(executor->layout().total()));
    initialize_parameters(executor->layout(), plan.model, testing_support::fresh(seed), host.data());
    // Norm weights of 1 would hide errors in their gradients: perturb them.
    Random random(testing_support::fresh(seed), 99);
    for (const auto& p : executor->layout().parameters())
      if (p.name.find("norm") != std::string::npos)
        for (int64_t i = 0; i < p.numel(); ++i) host[static_cast<size_t>(p.offset + i)] = 1.0f + 0.3f * float(random.normal());
    executor->load_parameters(host.data());
    executor->reset_optimizer_state();
  }

  void load_random_batch(uint64_t seed) {
    const int64_t n = plan.options.shape.tokens();
    std::vector<int32_t> inputs(static_cast<size_t>(n)), targets(static_cast<size_t>(n));
    Random random(testing_support::fresh(seed), 5);
    for (auto& t : inputs) t = static_cast<int32_t>(random.below(static_cast<uint64_t>(plan.model.vocab_size)));
    for (auto& t : targets) t = static_cast<int32_t>(random.below(static_cast<uint64_t>(plan.model.vocab_size)));
    executor->load_batch(inputs.data(), targets.data());
  }

  // The plan's gradient buffers: the shared one, and where the plan has them the bf16 linears' and
  // the embedding's own.
  std::vector<int> gradient_buffers() const {
    std::vector<int> ids;
    for (int id : {plan.gradients, plan.linear_gradients, plan.embedding_gradient})
      if (id >= 0) ids.push_back(id);
    return ids;
  }
  // The plan's buffer requests (live ranges and sizes as planned), to alter and pass to repack.
  std::vector<BufferRequest> buffer_requests() const {
    std::vector<BufferRequest> requests;
    for (const auto& b : plan.buffers) requests.push_back(b.request);
    return requests;
  }
  // Packs the arena again from `requests` (one per plan buffer) and builds the executor over it.
  void repack(const std::vector<BufferRequest>& requests) {
    executor.reset();
    plan.memory = pack_buffers(requests, int(plan.steps.size()));
    executor = std::make_unique<Executor>(plan, *backend);
  }

  // Sets every byte of every gradient buffer (a gradient nobody writes then shows).
  void poison_gradients(uint8_t byte) {
    for (int id : gradient_buffers()) {
      const TensorView v = executor->view(id);
      std::memset(v.data, byte, v.bytes());
    }
  }
  // The bytes of every gradient buffer, one after another.
  std::vector<uint8_t> gradient_bytes() const {
    std::vector<uint8_t> bytes;
    for (int id : gradient_buffers()) {
      const TensorView v = executor->view(id);
      const auto* begin = static_cast<const uint8_t*>(v.data);
      bytes.insert(bytes.end(), begin, begin + v.bytes());
    }
    return bytes;
  }
  // Element i of parameter p's gradient, wherever the plan keeps it (f64, f32 or bf16).
  double gradient(const ParameterInfo& p, int64_t i) const {
    const StepPlan::GradientPlace place = plan.gradient_place(p);
    const TensorView buffer = executor->view(place.buffer);
    switch (buffer.dtype) {
      case DType::f64: return buffer.as<double>()[place.offset + i];
      case DType::bf16: return bf16_to_float(buffer.as<uint16_t>()[place.offset + i]);
      default: return buffer.as<float>()[place.offset + i];
    }
  }

  // Forward, backward and the loss, without the optimizer.
  void forward_backward() {
    OptimizerSettings unused;
    for (const auto& step : plan.steps)
      if (step.kind != StepKind::optimizer && step.kind != StepKind::cast_weights) executor->run_step(step, unused);
  }
  // Forward only, up to the loss.
  double loss_only() {
    OptimizerSettings unused;
    executor->run_loss(unused);
    return executor->loss();
  }
};

// What a few training steps leave: per-step losses and gradient norms, then the master weights
// and AdamW moments, for tests that expect two runs to agree bit for bit.
struct Trajectory {
  std::vector<double> losses, norms;
  std::vector<float> parameters, exp_avg, exp_avg_sq;
};

// Trains `run` (initialised) for `steps` steps on random batches seeded first_batch_seed + 1, + 2, ...
inline Trajectory train_steps(TinyRun& run, OptimizerSettings optimizer, int steps, uint64_t first_batch_seed) {
  Trajectory t;
  for (int step = 1; step <= steps; ++step) {
    run.load_random_batch(first_batch_seed + uint64_t(step));
    optimizer.step = step;
    run.executor->run(optimizer);
    t.losses.push_back(run.executor->loss());
    t.norms.push_back(run.executor->gradient_norm());
  }
  const size_t total = static_cast<size_t>(run.executor->layout().total());
  t.parameters.resize(total);
  t.exp_avg.resize(total);
  t.exp_avg_sq.resize(total);
  run.executor->read_parameters(t.parameters.data());
  std::memcpy(t.exp_avg.data(), run.executor->view(run.plan.exp_avg).data, total * sizeof(float));
  std::memcpy(t.exp_avg_sq.data(), run.executor->view(run.plan.exp_avg_sq).data, total * sizeof(float));
  return t;
}

}  // namespace smelt::testing
