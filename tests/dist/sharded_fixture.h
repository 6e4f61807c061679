// Sharded training on the CPU for tests: N ranks as threads (LocalGroup), each with its own
// backend, plan and executor, training on its slice of a global batch; and the one-rank run
// on the whole batch they are compared against.
#pragma once
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/random.h"
#include "cpu/cpu_backend.h"
#include "dist/communicator.h"
#include "model/model_fixture.h"
#include "support/fresh_random.h"
#include "train/executor.h"

namespace smelt::testing {

inline ModelConfig small_model(int64_t layers = 2) { return debug_model(32, layers, 48, 37); }

struct ShardedCase {
  std::string policy = "none";
  DType compute = DType::f32;
  DType reduce = DType::f32;
  Float8Recipe float8 = Float8Recipe::none;
  int64_t batch_per_rank = 2, seq_len = 8;
  int steps = 3;
  bool shard_single_rank = false;  // the FSDP schedule over a communicator of one rank
  // Replicas over the world (1: FSDP over every rank; the world: plain data parallel; between: HSDP).
  int64_t replicate = 1;
  bool float8_all_gather = false;  // gather float8 linears' weights in e4m3 (tensorwise, sharded)
  bool reshard_after_forward = true;  // false: each block's gathered weights kept for its backward
  // Gradient accumulation: passes per step on every rank of a data-parallel run (the single-rank
  // reference takes the whole step's sequences in one pass).
  int64_t microbatches = 1;
};

// `world`: the ranks the run has (1: the single-rank reference, never replicated).
inline PlanOptions sharded_plan_options(const ModelConfig& model, const ShardedCase& c, int64_t batch, int64_t world,
                                        const Backend& backend, int64_t microbatches = 1) {
  PlanOptions o;
  o.microbatches = microbatches;
  o.replicate_degree = world > 1 ? c.replicate : 1;
  const int64_t degree = world / o.replicate_degree;
  o.float8_all_gather = c.float8_all_gather;
  o.shape = {batch, c.seq_len};
  o.compute_dtype = c.compute;
  o.policy = parse_checkpoint_policy(c.policy);
  o.loss_chunk_tokens = 5;  // several chunks: the output gradient accumulates
  o.shard_degree = degree;
  o.reduce_dtype = c.reduce;
  o.float8.recipe = c.float8;
  o.shard_single_rank = c.shard_single_rank;
  o.reshard_after_forward = c.reshard_after_forward;
  WorkspaceShape w;
  w.tokens = batch * c.seq_len;
  w.seq_len = c.seq_len;
  w.batch = batch;
  w.max_rows = std::max({w.tokens, model.vocab_size, model.ffn_dim, model.dim});
  w.max_inner = w.max_rows;
  w.max_cols = w.max_rows;
  w.heads = model.n_heads;
  w.kv_heads = model.n_kv_heads;
  w.head_dim = model.head_dim();
  w.compute_dtype = c.compute;
  o.backend_workspace_bytes = backend.workspace_bytes(w);
  return o;
}

// Initial weights, norms perturbed away from 1 (ones would hide errors in their gradients).
inline std::vector<float> initial_weights(const ModelConfig& model, uint64_t seed) {
  const ParameterLayout layout(model);
  std::vector<float> host(static_cast<size_t>(layout.total()), 0.0f);
  initialize_parameters(layout, model, testing_support::fresh(seed), host.data());
  Random random(testing_support::fresh(seed), 99);
  for (const auto& p : layout.parameters())
    if (p.name.find("norm") != std::string::npos)
      for (int64_t i = 0; i < p.numel(); ++i) host[static_cast<size_t>(p.offset + i)] = 1.0f + 0.3f * float(random.normal());
  return host;
}

// Token ids of `steps` global batches of (ranks * B * microbatches, T), inputs then targets per step.
struct GlobalBatches {
  std::vector<std::vector<int32_t>> inputs, targets;
};

inline GlobalBatches random_batches(const ModelConfig& model, int64_t tokens, int steps, uint64_t seed) {
  GlobalBatches g;
  Random random(testing_support::fresh(seed), 5);
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> inputs(static_cast<size_t>(tokens)), targets(static_cast<size_t>(tokens));
    for (auto& t : inputs) t = static_cast<int32_t>(random.below(static_cast<uint64_t>(model.vocab_size)));
    for (auto& t : targets) t = static_cast<int32_t>(random.below(static_cast<uint64_t>(model.vocab_size)));
    g.inputs.push_back(std::move(inputs));
    g.targets.push_back(std::move(targets));
  }
  return g;
}

inline OptimizerSettings test_optimizer(int64_t step) {
  OptimizerSettings o;
  o.lr = 3e-3f;
  o.weight_decay = 0.1f;
  // Below the first gradients' norm, so clipping (and so the global norm) matters: that norm falls
  // with the tokens a step averages over; with 4 ranks accumulating 3 passes it was 0.45-0.5 over
  // a dozen draws (0.7 and up without accumulation).
  o.max_norm = 0.25f;
  o.step = step;
  return o;
}

struct RunResult {
  std::vector<double> losses, gradient_norms;
  std::vector<float> parameters, exp_avg, exp_avg_sq;  // whole model, after the last step
};

// One rank's training: `ranks` ranks each take rows [rank * B*T, (rank + 1) * B*T) of every global batch
// (with c.microbatches passes, pass k takes the k-th ranks * B*T of them); without a communicator,
// the whole global batch in one pass.
// `resume` (optional): start from its weights and moments after `first_step` steps (a checkpoint).
inline RunResult train_one_rank(const ModelConfig& model, const ShardedCase& c, int ranks, Communicator* communicator,
                                const std::vector<float>& initial, const GlobalBatches& batches,
                                const RunResult* resume = nullptr, int first_step = 0,
                                const std::function<std::unique_ptr<Backend>()>& make_backend = {}) {
  auto backend = make_backend ? make_backend() : make_cpu_backend();
  const int64_t degree = communicator ? communicator->world_size() : 1;
  const int rank = communicator ? communicator->rank() : 0;
  const int64_t microbatches = communicator ? c.microbatches : 1;
  const int64_t batch = c.batch_per_rank * (communicator ? 1 : ranks * c.microbatches);
  const StepPlan plan = build_step_plan(model, sharded_plan_options(model, c, batch, degree, *backend, microbatches));
  Executor executor(plan, *backend, communicator);
  executor.reset_optimizer_state();
  if (resume) {
    executor.load_parameters(resume->parameters.data());
    executor.load_optimizer_state(resume->exp_avg.data(), resume->exp_avg_sq.data());
  } else {
    executor.load_parameters(initial.data());
  }
  const size_t tokens = static_cast<size_t>(batch * c.seq_len);
  RunResult result;
  for (int s = first_step; s < c.steps; ++s) {
    for (int64_t k = 0; k < microbatches; ++k) {
      const size_t first = static_cast<size_t>(k * ranks + rank) * tokens;
      executor.load_batch(batches.inputs[static_cast<size_t>(s)].data() + first,
                          batches.targets[static_cast<size_t>(s)].data() + first);
      executor.run_microbatch(test_optimizer(s + 1), k);
    }
    executor.run_update(test_optimizer(s + 1));
    result.losses.push_back(executor.loss());
    result.gradient_norms.push_back(executor.gradient_norm());
  }
  const size_t total = static_cast<size_t>(executor.layout().total());
  result.parameters.assign(total, 0.0f);
  result.exp_avg.assign(total, 0.0f);
  result.exp_avg_sq.assign(total, 0.0f);
  executor.read_parameters(result.parameters.data());
  executor.read_optimizer_state(result.exp_avg.data(), result.exp_avg_sq.data());
  return result;
}

// Runs body(communicator) on `world` threads; rethrows the first failure (the others are released).
template <typename Body>
void run_ranks(int world, Body body) {
  LocalGroup group(world);
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::exception_ptr failure;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        body(group.communicator(r));
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!failure) failure = std::current_exception();
        group.abandon();
      }
    });
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

// Every rank's result of a sharded run (rank order).
inline std::vector<RunResult> train_sharded(const ModelConfig& model, const ShardedCase& c, int ranks,
                                            const std::vector<float>& initial, const GlobalBatches& batches,
                                            const RunResult* resume = nullptr, int first_step = 0) {
  std::vector<RunResult> results(static_cast<size_t>(ranks));
  run_ranks(ranks, [&](Communicator& communicator) {
    results[static_cast<size_t>(communicator.rank())] =
        train_one_rank(model, c, ranks, &communicator, initial, batches, resume, first_step);
  });
  return results;
}

}  // namespace smelt::testing
