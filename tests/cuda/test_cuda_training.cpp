// A whole training run of a small model on the CUDA backend against the CPU
// reference: the same losses over 20 steps and the same final weights, within
// bf16 / f32 tolerances; float8 recipes against the CPU emulation (with AC none, the inputs kept
// as float8 x^T from forward to backward); bf16 selective-op and the tensorwise and rowwise runs
// keep the block linears' weight gradients in bf16, the others in f32; gradient accumulation (three
// microbatches a step, the later ones replayed as a CUDA graph on the GPU); evaluation's
// forward-only plan against the training plan's loss. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/random.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "support/fresh_random.h"
#include "train/executor.h"

namespace smelt {
namespace {

ModelConfig small_model() {
  ModelSection s;
  s.flavor = "debugmodel";
  s.dim = 128;
  s.n_layers = 3;
  s.n_heads = 4;   // head dim 32
  s.n_kv_heads = 2;
  s.ffn_dim = 320;
  s.vocab_size = 300;
  return make_model_config(s, 0);
}

struct Run {
  std::unique_ptr<Backend> backend;
  StepPlan plan;
  std::unique_ptr<Executor> executor;
};

Run make_run(std::unique_ptr<Backend> backend, DType compute, const char* policy, Float8Recipe recipe,
             DType linear_grads, int64_t loss_chunk, int64_t microbatches, bool forward_only = false) {
  Run r;
  r.backend = std::move(backend);
  ModelConfig model = small_model();
  PlanOptions o;
  o.shape = {2, 64};
  o.compute_dtype = compute;
  o.policy = parse_checkpoint_policy(policy);
  o.float8.recipe = recipe;
  o.linear_grad_dtype = linear_grads;
  o.loss_chunk_tokens = loss_chunk;
  o.microbatches = microbatches;
  o.forward_only = forward_only;
  WorkspaceShape w;
  w.tokens = 128;
  w.seq_len = 64;
  w.batch = 2;
  w.max_rows = w.max_inner = w.max_cols = 320;
  w.heads = model.n_heads;
  w.kv_heads = model.n_kv_heads;
  w.head_dim = model.head_dim();
  w.compute_dtype = compute;
  w.attention_backward_planned = true;  // as the trainer plans it: a scratch buffer per backward attention step
  o.backend_workspace_bytes = r.backend->workspace_bytes(w);
  o.attention_backward_scratch_bytes = r.backend->attention_backward_scratch_bytes(w);
  r.plan = build_step_plan(model, o);
  r.executor = std::make_unique<Executor>(r.plan, *r.backend);
  r.executor->enable_graph(microbatches > 1);  // the later microbatches of a step: one graph, replayed
  std::vector<float> host(static_cast<size_t>(r.executor->layout().total()));
  initialize_parameters(r.executor->layout(), model, testing_support::fresh(123), host.data());
  r.executor->load_parameters(host.data());
  r.executor->reset_optimizer_state();
  return r;
}

// linear_grads: the block linears' weight gradients in bf16 (as bf16 training runs keep them by
// default) or f32. The loss chunk of 48 does not divide 128 tokens: it exercises the last partial
// chunk; one of 128 (one chunk) puts the output projection's gradient in bf16 too.
void compare_training(DType compute, const char* policy, double loss_tolerance, double weight_tolerance,
                      Float8Recipe recipe = Float8Recipe::none, DType linear_grads = DType::f32, int64_t loss_chunk = 48,
                      int64_t microbatches = 1) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  Run cpu = make_run(make_cpu_backend(), compute, policy, recipe, linear_grads, loss_chunk, microbatches);
  Run gpu = make_run(make_cuda_backend(), compute, policy, recipe, linear_grads, loss_chunk, microbatches);
  ASSERT_EQ(gpu.plan.linear_gradients >= 0, linear_grads == DType::bf16);
  if (recipe != Float8Recipe::none && std::string(policy) == "none") {
    int saved = 0;
    for (const auto& lb : gpu.plan.layers)
      for (int id : lb.float8_saved) saved += id >= 0;
    ASSERT_EQ(saved, 3 * 3) << "the norms' and SwiGLU's outputs of 3 blocks kept as float8 x^T";
  }
  OptimizerSettings optimizer;
  optimizer.lr = 1e-3f;
  optimizer.weight_decay = 0.1f;
  optimizer.max_norm = 1.0f;
  Random random(testing_support::fresh(77));
  const int64_t n = 128;
  std::vector<int32_t> inputs(n), targets(n);
  for (int step = 1; step <= 20; ++step) {
    optimizer.step = step;
    for (int64_t microbatch = 0; microbatch < microbatches; ++microbatch) {
      for (auto& t : inputs) t = static_cast<int32_t>(random.below(300));
      for (int64_t i = 0; i < n; ++i) targets[i] = (inputs[i] * 7 + 3) % 300;  // learnable
      for (Run* r : {&cpu, &gpu}) {
        r->executor->load_batch(inputs.data(), targets.data());
        r->executor->run_microbatch(optimizer, microbatch);
      }
    }
    for (Run* r : {&cpu, &gpu}) r->executor->run_update(optimizer);
    const double a = cpu.executor->loss(), b = gpu.executor->loss();
    ASSERT_TRUE(std::isfinite(b)) << "step " << step;
    EXPECT_NEAR(b, a, loss_tolerance * std::fabs(a)) << "step " << step;
    EXPECT_NEAR(gpu.executor->gradient_norm(), cpu.executor->gradient_norm(),
                (recipe == Float8Recipe::none ? 0.05 : 0.1) * cpu.executor->gradient_norm())
        << "step " << step;
  }
  std::vector<float> wa(static_cast<size_t>(cpu.executor->layout().total())), wb(wa.size());
  cpu.executor->read_parameters(wa.data());
  gpu.executor->read_parameters(wb.data());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < wa.size(); ++i) {
    ASSERT_TRUE(std::isfinite(wb[i]));
    diff += (double(wa[i]) - wb[i]) * (double(wa[i]) - wb[i]);
    norm += double(wa[i]) * wa[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), weight_tolerance);
}

TEST(CudaTraining, Float32MatchesTheCpuReference) { compare_training(DType::f32, "none", 1e-4, 2e-3); }
TEST(CudaTraining, Bfloat16SelectiveOpMatchesTheCpuReference) {
  compare_training(DType::bf16, "selective-op", 1e-2, 2e-2, Float8Recipe::none, DType::bf16);
}
TEST(CudaTraining, Bfloat16OneLossChunkMatchesTheCpuReference) {
  compare_training(DType::bf16, "none", 1e-2, 2e-2, Float8Recipe::none, DType::bf16, 128);
}
TEST(CudaTraining, Bfloat16FullCheckpointMatchesTheCpuReference) { compare_training(DType::bf16, "full", 1e-2, 2e-2); }

// Float8: quantised operands are bit-identical to the emulation's (tests/cuda/test_cuda_fp8_*),
// so only GEMM summation order (and tensorwise's fast accumulation) differs, and what rounding it
// shifts downstream.
TEST(CudaTraining, Float8TensorwiseNoCheckpointMatchesTheCpuEmulation) {
  compare_training(DType::bf16, "none", 2e-2, 5e-2, Float8Recipe::tensorwise, DType::bf16);
}
TEST(CudaTraining, Float8RowwiseSelectiveOpMatchesTheCpuEmulation) {
  compare_training(DType::bf16, "selective-op", 2e-2, 5e-2, Float8Recipe::rowwise, DType::bf16);
}
TEST(CudaTraining, Float8BlockwiseNoCheckpointMatchesTheCpuEmulation) {
  compare_training(DType::bf16, "none", 2e-2, 5e-2, Float8Recipe::blockwise);
}

// Gradient accumulation: every gradient the step writes is added to by the later microbatches
// (the GEMMs' beta, the norms' and embedding's accumulate flags, the loss's weighted mean).
TEST(CudaTraining, AccumulatedMicrobatchesMatchTheCpuReference) {
  compare_training(DType::f32, "none", 1e-4, 2e-3, Float8Recipe::none, DType::f32, 48, 3);
}
TEST(CudaTraining, Float8TensorwiseAccumulatedSelectiveOpMatchesTheCpuEmulation) {
  compare_training(DType::bf16, "selective-op", 2e-2, 5e-2, Float8Recipe::tensorwise, DType::f32, 48, 3);
}

// Evaluation's forward-only plan on the GPU: the loss of the training plan's forward (what
// validation computes) bit for bit, in bf16 and float8, and the CPU's within rounding.
TEST(CudaEvaluation, ForwardOnlyPlanGivesTheTrainingPlansLoss) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  Random random(testing_support::fresh(78));
  std::vector<int32_t> inputs(128), targets(128);
  for (auto& t : inputs) t = static_cast<int32_t>(random.below(300));
  for (auto& t : targets) t = static_cast<int32_t>(random.below(300));
  for (Float8Recipe recipe : {Float8Recipe::none, Float8Recipe::tensorwise, Float8Recipe::rowwise}) {
    SCOPED_TRACE(std::string(float8_recipe_name(recipe)));
    smelt::Run training = make_run(make_cuda_backend(), DType::bf16, "selective-op", recipe, DType::bf16, 48, 1);
    smelt::Run forward = make_run(make_cuda_backend(), DType::bf16, "selective-op", recipe, DType::bf16, 48, 1, true);
    smelt::Run cpu = make_run(make_cpu_backend(), DType::bf16, "selective-op", recipe, DType::bf16, 48, 1, true);
    ASSERT_LT(forward.plan.memory.arena_bytes, training.plan.memory.arena_bytes);
    OptimizerSettings unused;
    double losses[3];
    int k = 0;
    for (smelt::Run* r : {&training, &forward, &cpu}) {
      r->executor->load_batch(inputs.data(), targets.data());
      r->executor->run_loss(unused);
      losses[k++] = r->executor->loss();
    }
    ASSERT_TRUE(std::isfinite(losses[1]));
    EXPECT_EQ(losses[1], losses[0]);
    EXPECT_NEAR(losses[1], losses[2], 1e-2 * std::fabs(losses[2]));
  }
}

}  // namespace
}  // namespace smelt
