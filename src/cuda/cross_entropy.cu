// Softmax cross-entropy on the GPU, forward and backward at once: one block per row,
// an online max/sum pass, then the loss and (optionally) the gradient written in place.
// Logits f32, or bf16 (a bf16 GEMM's output, as autocast gives PyTorch), the math in f32. Rows
// whose length is a multiple of 8 (16-byte aligned) move 8 logits per thread through 16-byte
// loads and stores; others one at a time.
#include "cuda/cuda_common.cuh"
#include "cuda/vector_access.cuh"

namespace smelt::cuda {
namespace {

constexpr int kThreads = 512;

// Folds logit v into a thread's online softmax statistics (running maximum, sum of exp(x - max)).
__device__ __forceinline__ void online_softmax(float v, float& maximum, float& total) {
  if (v > maximum) {
    total = total * expf(maximum - v) + 1.0f;
    maximum = v;
  } else {
    total += expf(v - maximum);
  }
}

// logits (rows, V) in L; gradient (rows, V) in G (may alias logits when G is L: each thread reads
// an element before it writes the same element).
template <typename L, typename G, bool Vectorized>
__global__ void cross_entropy_rows(const L* logits, const int32_t* targets, float* losses, G* gradient,
                                   int64_t vocabulary, float grad_scale) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const L* x = logits + row * vocabulary;
  const int32_t target = targets[row];
  if (target < 0 || target >= vocabulary) {
    // Ignored row (negative target); an out-of-range target gives NaN so the bad data shows.
    if (threadIdx.x == 0) losses[row] = target < 0 ? 0.0f : NAN;
    if (gradient)
      for (int64_t c = threadIdx.x; c < vocabulary; c += blockDim.x)
        store_float(gradient + row * vocabulary, c, target < 0 ? 0.0f : NAN);
    return;
  }
  // Online softmax statistics per thread, then merged across the block.
  float maximum = -INFINITY, total = 0.0f;
  if (Vectorized) {
    for (int64_t v = threadIdx.x; v < vocabulary / kVector; v += blockDim.x) {
      float a[kVector];
      load_vector(x + v * kVector, a);
#pragma unroll
      for (int i = 0; i < kVector; ++i) online_softmax(a[i], maximum, total);
    }
  } else {
    for (int64_t c = threadIdx.x; c < vocabulary; c += blockDim.x) online_softmax(load_float(x, c), maximum, total);
  }
  const float row_maximum = block_max(maximum, shared);
  total = maximum == -INFINITY ? 0.0f : total * expf(maximum - row_maximum);
  const float row_total = block_sum(total, shared);
  const float lse = row_maximum + logf(row_total);
  const float target_logit = load_float(x, target);
  __syncthreads();  // every thread has read x[target] before any gradient write may overwrite it
  if (threadIdx.x == 0) losses[row] = lse - target_logit;
  if (!gradient) return;
  G* grad = gradient + row * vocabulary;
  if (Vectorized) {
    for (int64_t v = threadIdx.x; v < vocabulary / kVector; v += blockDim.x) {
      float a[kVector];
      load_vector(x + v * kVector, a);
#pragma unroll
      for (int i = 0; i < kVector; ++i)
        a[i] = (expf(a[i] - lse) - (v * kVector + i == target ? 1.0f : 0.0f)) * grad_scale;
      store_vector(grad + v * kVector, a);
    }
  } else {
    for (int64_t c = threadIdx.x; c < vocabulary; c += blockDim.x) {
      const float probability = expf(load_float(x, c) - lse);
      store_float(grad, c, (probability - (c == target ? 1.0f : 0.0f)) * grad_scale);
    }
  }
}

}  // namespace

void cross_entropy(CudaContext& context, const CrossEntropyArgs& args) {
  const char* op = "cross_entropy";
  expect_device(args.logits, op, "logits");
  expect_device(args.targets, op, "targets");
  expect_device(args.losses, op, "losses");
  expect_dtype(args.targets, DType::i32, op, "targets");
  expect_dtype(args.losses, DType::f32, op, "losses");
  const int64_t rows = args.logits.rows(), vocabulary = args.logits.cols();
  expect_numel(args.targets, rows, op, "targets");
  expect_numel(args.losses, rows, op, "losses");
  if (rows == 0) return;
  if (args.logits.dtype != DType::f32 && args.logits.dtype != DType::bf16)
    fail(ErrorKind::internal, "cuda cross_entropy: expected f32 or bf16 logits, found " + args.logits.str());
  if (!args.grad_logits.empty()) {
    expect_device(args.grad_logits, op, "grad_logits");
    expect_numel(args.grad_logits, rows * vocabulary, op, "grad_logits");
    if (args.logits.dtype == DType::bf16) expect_dtype(args.grad_logits, DType::bf16, op, "grad_logits");
  }
  const auto launch = [&](auto logit, auto gradient_element, void* gradient) {
    using L = decltype(logit);
    using G = decltype(gradient_element);
    const bool vectorized = vocabulary % kVector == 0 && aligned16(args.logits.data) && aligned16(gradient);
    auto kernel = vectorized ? cross_entropy_rows<L, G, true> : cross_entropy_rows<L, G, false>;
    kernel<<<unsigned(rows), kThreads, 0, context.stream>>>(args.logits.as<L>(), args.targets.as<int32_t>(),
                                                            args.losses.as<float>(), static_cast<G*>(gradient),
                                                            vocabulary, args.grad_scale);
    SMELT_CUDA_LAUNCH_CHECK("cross_entropy_rows");
  };
  if (args.logits.dtype == DType::bf16) return launch(__nv_bfloat16{}, __nv_bfloat16{}, args.grad_logits.data);
  if (args.grad_logits.empty()) return launch(float{}, float{}, nullptr);
  dispatch_activation(args.grad_logits.dtype, op, [&](auto element) { launch(float{}, element, args.grad_logits.data); });
}

}  // namespace smelt::cuda
