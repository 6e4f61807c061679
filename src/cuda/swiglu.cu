// SwiGLU on the GPU: out = silu(gate) * up, and its backward, one element per thread.
#include "cuda/cuda_common.cuh"

namespace smelt::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void swiglu_forward_elements(const T* gate, const T* up, T* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load_float(gate, i);
    store_float(out, i, g * sigmoid(g) * load_float(up, i));
  }
}

// d up = dy * silu(g);  d gate = dy * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))).
template <typename T>
__global__ void swiglu_backward_elements(const T* gate, const T* up, const T* grad_out, T* grad_gate, T* grad_up,
                                         int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load_float(gate, i), u = load_float(up, i), dy = load_float(grad_out, i);
    const float sig = sigmoid(g);
    store_float(grad_up, i, dy * g * sig);
    store_float(grad_gate, i, dy * u * sig * (1.0f + g * (1.0f - sig)));
  }
}

}  // namespace

void swiglu_forward(CudaContext& context, const SwigluForwardArgs& args) {
  const char* op = "swiglu_forward";
  const int64_t count = args.gate.numel();
  for (const TensorView* t : {&args.gate, &args.up, &args.out}) {
    expect_device(*t, op, "gate/up/out");
    expect_dtype(*t, args.gate.dtype, op, "gate/up/out");
    expect_numel(*t, count, op, "gate/up/out");
  }
  dispatch_activation(args.gate.dtype, op, [&](auto element) {
    using T = decltype(element);
    swiglu_forward_elements<T><<<grid_for(count, 256, context.multiprocessors), 256, 0, context.stream>>>(
        args.gate.as<T>(), args.up.as<T>(), args.out.as<T>(), count);
    SMELT_CUDA_LAUNCH_CHECK("swiglu_forward_elements");
  });
}

void swiglu_backward(CudaContext& context, const SwigluBackwardArgs& args) {
  const char* op = "swiglu_backward";
  const int64_t count = args.gate.numel();
  for (const TensorView* t : {&args.gate, &args.up, &args.grad_out, &args.grad_gate, &args.grad_up}) {
    expect_device(*t, op, "gate/up/grad_out/grad_gate/grad_up");
    expect_dtype(*t, args.gate.dtype, op, "gate/up/grad_out/grad_gate/grad_up");
    expect_numel(*t, count, op, "gate/up/grad_out/grad_gate/grad_up");
  }
  dispatch_activation(args.gate.dtype, op, [&](auto element) {
    using T = decltype(element);
    swiglu_backward_elements<T><<<grid_for(count, 256, context.multiprocessors), 256, 0, context.stream>>>(
        args.gate.as<T>(), args.up.as<T>(), args.grad_out.as<T>(), args.grad_gate.as<T>(), args.grad_up.as<T>(), count);
    SMELT_CUDA_LAUNCH_CHECK("swiglu_backward_elements");
  });
}

}  // namespace smelt::cuda
