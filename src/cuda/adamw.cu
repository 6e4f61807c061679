// AdamW on the GPU: one pass over a flat f32 range (PyTorch's torch.optim.AdamW), with the
// gradient-clipping coefficient computed on the device from the gradients' sum of squares.
#include <cmath>

#include "cuda/cuda_common.cuh"

namespace smelt::cuda {
namespace {

struct AdamwConstants {
  double lr, beta1, beta2, eps, decay, step_size, bias_correction2_sqrt, max_norm;
};

// Per element in double, as the CPU reference: clip g in place, then the AdamW update.
__global__ void adamw_update(float* params, float* grads, float* exp_avg, float* exp_avg_sq,
                             const float* grad_sum_squares, int64_t count, AdamwConstants k) {
  double clip = 1.0;
  if (k.max_norm > 0) clip = fmin(1.0, k.max_norm / (sqrt(double(grad_sum_squares[0])) + 1e-6));
  const bool clipping = clip < 1.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    double g = grads[i];
    if (clipping) {
      const float clipped = float(g * clip);
      grads[i] = clipped;
      g = clipped;
    }
    const double m = k.beta1 * double(exp_avg[i]) + (1.0 - k.beta1) * g;
    const double v = k.beta2 * double(exp_avg_sq[i]) + (1.0 - k.beta2) * g * g;
    exp_avg[i] = float(m);
    exp_avg_sq[i] = float(v);
    const double denominator = sqrt(v) / k.bias_correction2_sqrt + k.eps;
    params[i] = float(double(params[i]) * k.decay - k.step_size * m / denominator);
  }
}

}  // namespace

void adamw(CudaContext& context, const AdamwArgs& args) {
  const char* op = "adamw";
  const int64_t count = args.params.numel();
  for (const TensorView* t : {&args.params, &args.grads, &args.exp_avg, &args.exp_avg_sq}) {
    expect_device(*t, op, "params/grads/exp_avg/exp_avg_sq");
    expect_dtype(*t, DType::f32, op, "params/grads/exp_avg/exp_avg_sq");
    expect_numel(*t, count, op, "params/grads/exp_avg/exp_avg_sq");
  }
  if (args.step < 1)
    fail(ErrorKind::internal, "cuda adamw: expected a 1-based step, found " + std::to_string(args.step) +
                                  "; count steps from 1");
  if (args.max_norm > 0) {
    expect_device(args.grad_sum_squares, op, "grad_sum_squares");
    expect_dtype(args.grad_sum_squares, DType::f32, op, "grad_sum_squares");
    expect_numel(args.grad_sum_squares, 1, op, "grad_sum_squares");
  }
  AdamwConstants k;
  k.lr = args.lr;
  k.beta1 = args.beta1;
  k.beta2 = args.beta2;
  k.eps = args.eps;
  k.decay = 1.0 - k.lr * double(args.weight_decay);
  const double bias_correction1 = 1.0 - std::pow(k.beta1, double(args.step));
  const double bias_correction2 = 1.0 - std::pow(k.beta2, double(args.step));
  k.step_size = k.lr / bias_correction1;
  k.bias_correction2_sqrt = std::sqrt(bias_correction2);
  k.max_norm = args.max_norm;
  if (count == 0) return;
  adamw_update<<<grid_for(count, 256, context.multiprocessors), 256, 0, context.stream>>>(
      args.params.as<float>(), args.grads.as<float>(), args.exp_avg.as<float>(), args.exp_avg_sq.as<float>(),
      args.max_norm > 0 ? args.grad_sum_squares.as<float>() : nullptr, count, k);
  SMELT_CUDA_LAUNCH_CHECK("adamw_update");
}

}  // namespace smelt::cuda
