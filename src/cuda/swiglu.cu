// SwiGLU on the GPU: out = silu(gate) * up, and its backward: 8 elements per thread through 16-byte
// loads and stores where the views allow it (one element per thread otherwise), with the optional
// amax of what they store reduced in the same pass (one atomicMax per block).
#include "cuda/cuda_common.cuh"
#include "cuda/vector_access.cuh"

namespace smelt::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float swiglu(float g, float u) { return g * sigmoid(g) * u; }

// d up = dy * silu(g);  d gate = dy * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))).
__device__ __forceinline__ void swiglu_grad(float g, float u, float dy, float& grad_gate, float& grad_up) {
  const float sig = sigmoid(g);
  grad_up = dy * g * sig;
  grad_gate = dy * u * sig * (1.0f + g * (1.0f - sig));
}


template <typename T, bool Vectorized>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* out, int64_t count, uint32_t* amax_bits) {
  uint32_t maximum = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (Vectorized) {
    for (int64_t v = first; v < count / kVector; v += stride) {
      float g[kVector], u[kVector], o[kVector];
      load_vector(gate + v * kVector, g);
      load_vector(up + v * kVector, u);
#pragma unroll
      for (int i = 0; i < kVector; ++i) {
        o[i] = swiglu(g[i], u[i]);
        maximum = max(maximum, magnitude_bits(stored_value(o[i], out)));
      }
      store_vector(out + v * kVector, o);
    }
  } else {
    for (int64_t i = first; i < count; i += stride) {
      const float o = swiglu(load_float(gate, i), load_float(up, i));
      store_float(out, i, o);
      maximum = max(maximum, magnitude_bits(stored_value(o, out)));
    }
  }
  publish_max(amax_bits, maximum);
}

template <typename T, bool Vectorized>
__global__ void swiglu_backward_kernel(const T* gate, const T* up, const T* grad_out, T* grad_gate, T* grad_up,
                                       int64_t count, uint32_t* gate_bits, uint32_t* up_bits) {
  uint32_t gate_maximum = 0, up_maximum = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (Vectorized) {
    for (int64_t v = first; v < count / kVector; v += stride) {
      float g[kVector], u[kVector], dy[kVector], dg[kVector], du[kVector];
      load_vector(gate + v * kVector, g);
      load_vector(up + v * kVector, u);
      load_vector(grad_out + v * kVector, dy);
#pragma unroll
      for (int i = 0; i < kVector; ++i) {
        swiglu_grad(g[i], u[i], dy[i], dg[i], du[i]);
        gate_maximum = max(gate_maximum, magnitude_bits(stored_value(dg[i], grad_gate)));
        up_maximum = max(up_maximum, magnitude_bits(stored_value(du[i], grad_up)));
      }
      store_vector(grad_gate + v * kVector, dg);
      store_vector(grad_up + v * kVector, du);
    }
  } else {
    for (int64_t i = first; i < count; i += stride) {
      float dg, du;
      swiglu_grad(load_float(gate, i), load_float(up, i), load_float(grad_out, i), dg, du);
      store_float(grad_gate, i, dg);
      store_float(grad_up, i, du);
      gate_maximum = max(gate_maximum, magnitude_bits(stored_value(dg, grad_gate)));
      up_maximum = max(up_maximum, magnitude_bits(stored_value(du, grad_up)));
    }
  }
  publish_max(gate_bits, gate_maximum);
  publish_max(up_bits, up_maximum);
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
  uint32_t* amax_bits = amax_target(context, args.amax, op, "amax");
  if (count == 0) return;
  const bool vectorized = count % kVector == 0 && aligned16(args.gate.data) && aligned16(args.up.data) &&
                          aligned16(args.out.data);
  dispatch_activation(args.gate.dtype, op, [&](auto element) {
    using T = decltype(element);
    const unsigned grid = grid_for(vectorized ? count / kVector : count, 256, context.multiprocessors);
    if (vectorized)
      swiglu_forward_kernel<T, true><<<grid, 256, 0, context.stream>>>(args.gate.as<T>(), args.up.as<T>(),
                                                                       args.out.as<T>(), count, amax_bits);
    else
      swiglu_forward_kernel<T, false><<<grid, 256, 0, context.stream>>>(args.gate.as<T>(), args.up.as<T>(),
                                                                        args.out.as<T>(), count, amax_bits);
    SMELT_CUDA_LAUNCH_CHECK("swiglu_forward_kernel");
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
  uint32_t* gate_bits = amax_target(context, args.amax_gate, op, "amax_gate");
  uint32_t* up_bits = amax_target(context, args.amax_up, op, "amax_up");
  if (count == 0) return;
  bool vectorized = count % kVector == 0;
  for (const TensorView* t : {&args.gate, &args.up, &args.grad_out, &args.grad_gate, &args.grad_up})
    vectorized = vectorized && aligned16(t->data);
  dispatch_activation(args.gate.dtype, op, [&](auto element) {
    using T = decltype(element);
    const unsigned grid = grid_for(vectorized ? count / kVector : count, 256, context.multiprocessors);
    if (vectorized)
      swiglu_backward_kernel<T, true><<<grid, 256, 0, context.stream>>>(
          args.gate.as<T>(), args.up.as<T>(), args.grad_out.as<T>(), args.grad_gate.as<T>(), args.grad_up.as<T>(),
          count, gate_bits, up_bits);
    else
      swiglu_backward_kernel<T, false><<<grid, 256, 0, context.stream>>>(
          args.gate.as<T>(), args.up.as<T>(), args.grad_out.as<T>(), args.grad_gate.as<T>(), args.grad_up.as<T>(),
          count, gate_bits, up_bits);
    SMELT_CUDA_LAUNCH_CHECK("swiglu_backward_kernel");
  });
}

}  // namespace smelt::cuda
