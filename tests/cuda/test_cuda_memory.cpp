// The CUDA backend allocates nothing after start-up: once the arena exists (and each op has
// run once to build its cached plans), running every op again leaves the allocation count
// of CudaMemoryResource and the driver's free memory unchanged. The workspace it asks for is what
// `smelt plan` predicts without a GPU.
#include "cuda_test_support.h"
#include "model/model_config.h"
#include "plan/step_plan.h"
#include "train/run_setup.h"

namespace smelt::test {
namespace {

class CudaMemory : public CudaOpsTest {};

TEST_F(CudaMemory, OpsAllocateNothingAfterStartUp) {
  const int64_t rows = 256, dim = 128, vocabulary = 512, ffn = 384;
  const int64_t batch = 2, seq_len = 128, heads = 4, kv_heads = 2, head_dim = 32;
  const DType dtype = DType::bf16;
  TensorView x = upload(random_tensor(dtype, Shape{rows, dim}, 1)), weight = upload(random_tensor(dtype, Shape{dim}, 2));
  TensorView w = upload(random_tensor(dtype, Shape{ffn, dim}, 3)), y = poisoned(dtype, Shape{rows, ffn});
  TensorView y32 = poisoned(DType::f32, Shape{rows, ffn}), dw = poisoned(DType::f32, Shape{ffn, dim});
  TensorView tokens = upload(random_ids(Shape{rows}, 4, int32_t(vocabulary)));
  TensorView table = upload(random_tensor(dtype, Shape{vocabulary, dim}, 5));
  TensorView table_grad = poisoned(DType::f32, Shape{vocabulary, dim});
  TensorView rstd = poisoned(DType::f32, Shape{rows}), normed = poisoned(dtype, Shape{rows, dim});
  TensorView grad_x = poisoned(dtype, Shape{rows, dim}), grad_weight = poisoned(DType::f32, Shape{dim});
  HostTensor frequencies(DType::f32, Shape{seq_len, head_dim / 2, 2});
  for (int64_t i = 0; i < frequencies.numel(); ++i) frequencies.set(i, std::cos(0.01 * double(i)));
  TensorView device_frequencies = upload(frequencies);
  const Shape q_shape{batch, seq_len, heads, head_dim}, kv_shape{batch, seq_len, kv_heads, head_dim};
  TensorView q = upload(random_tensor(dtype, q_shape, 6)), k = upload(random_tensor(dtype, kv_shape, 7));
  TensorView v = upload(random_tensor(dtype, kv_shape, 8)), out = poisoned(dtype, q_shape);
  TensorView lse = poisoned(DType::f32, Shape{batch, heads, seq_len});
  TensorView grad_q = poisoned(dtype, q_shape), grad_k = poisoned(dtype, kv_shape), grad_v = poisoned(dtype, kv_shape);
  TensorView logits = upload(random_tensor(DType::f32, Shape{rows, vocabulary}, 9));
  TensorView losses = poisoned(DType::f32, Shape{rows}), grad_logits = poisoned(dtype, Shape{rows, vocabulary});
  TensorView gate = upload(random_tensor(dtype, Shape{rows, ffn}, 10)), grad_gate = poisoned(dtype, Shape{rows, ffn});
  TensorView params = upload(random_tensor(DType::f32, Shape{4096}, 11)), grads = upload(random_tensor(DType::f32, Shape{4096}, 12));
  TensorView moment1 = upload(random_tensor(DType::f32, Shape{4096}, 13)), moment2 = poisoned(DType::f32, Shape{4096});
  cuda_->fill(moment2, 0.01f);
  TensorView norm = poisoned(DType::f32, Shape{1}), scale = poisoned(DType::f32, Shape{1});
  TensorView float8 = poisoned(DType::e4m3, Shape{rows, dim}), restored = poisoned(dtype, Shape{rows, dim});
  TensorView x32 = poisoned(DType::f32, Shape{rows, dim});

  auto run_every_op = [&] {
    cuda_->gemm(gemm_args(x, false, w, true, y));
    cuda_->gemm(gemm_args(x, false, w, true, y32));
    cuda_->gemm(gemm_args(y, true, x, false, dw));
    cuda_->embedding_forward({tokens, table, grad_x});
    cuda_->embedding_backward({tokens, grad_x, table_grad});
    cuda_->rmsnorm_forward({x, weight, normed, rstd, 1e-5f});
    cuda_->rmsnorm_backward({x, weight, rstd, normed, grad_x, false, grad_weight});
    cuda_->rope({q, device_frequencies, seq_len, false});
    cuda_->rope({q, device_frequencies, seq_len, true});
    cuda_->attention_forward({q, k, v, out, lse, 0.125f});
    cuda_->attention_backward({q, k, v, out, lse, out, grad_q, grad_k, grad_v, 0.125f});
    cuda_->swiglu_forward({gate, y, grad_gate});
    cuda_->swiglu_backward({gate, y, grad_gate, grad_gate, y});
    cuda_->cross_entropy({logits, tokens, losses, grad_logits, 1.0f / rows});
    cuda_->sum_squares({grads, norm, false});
    cuda_->mean({losses, norm});
    cuda_->sum_squares({grads, norm, false});
    AdamwArgs adamw{params, grads, moment1, moment2, norm};
    adamw.lr = 1e-3f;
    adamw.max_norm = 1.0f;
    cuda_->adamw(adamw);
    cuda_->convert({x, x32});
    cuda_->amax({x, scale, false});
    cuda_->fill(scale, 2.0f);
    cuda_->quantize({x, float8, scale, false});
    cuda_->dequantize({float8, restored, scale, false});
  };
  run_every_op();  // first use builds the cached GEMM and attention plans
  cuda_->synchronize();
  const int64_t allocations = cuda_->memory().allocation_count();
  const size_t free_memory = cuda_free_device_memory();
  for (int repeat = 0; repeat < 3; ++repeat) run_every_op();
  cuda_->synchronize();
  EXPECT_EQ(cuda_->memory().allocation_count(), allocations) << "an op allocated through the memory resource";
  EXPECT_EQ(cuda_free_device_memory(), free_memory) << "an op allocated device memory after start-up";
  EXPECT_EQ(allocations, 1) << "the arena should be the only allocation";
}

// The workspace the backend asks for equals the offline estimate (planning on a machine without a
// GPU), for bf16 (cuDNN attention) and f32 shapes of the proxy and the small models.
TEST_F(CudaMemory, WorkspaceEqualsThePlanningEstimate) {
  for (const char* flavor : {"llama3_8b", "debugmodel"})
    for (DType compute : {DType::bf16, DType::f32})
      for (int64_t batch : {1, 2}) {
        ModelSection section;
        section.flavor = flavor;
        const ModelConfig model = make_model_config(section, 128256);
        PlanOptions options;
        options.shape = {batch, 2048};
        options.compute_dtype = compute;
        const WorkspaceShape shape = workspace_shape(model, options);
        EXPECT_EQ(cuda_->workspace_bytes(shape), estimated_workspace_bytes("cuda", shape))
            << flavor << " " << dtype_name(compute) << " batch " << batch;
        EXPECT_GT(cuda_->workspace_bytes(shape), size_t(40) << 20);
      }
}

}  // namespace
}  // namespace smelt::test
