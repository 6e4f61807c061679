// CPU AdamW over one flat range, as torch.optim.AdamW (decoupled weight decay,
// bias correction), after gradient clipping as torch.nn.utils.clip_grad_norm_.
// The gradients are only read: the clip factor scales each one in registers, and the buffer keeps
// the unclipped values (nothing reads gradients after the optimizer, and not writing them back
// saves a pass over them on the GPU). The optional bf16 compute copy is written for every element
// or for the runs that have one; runs may keep their gradients in bf16 (the block linears').
#include <algorithm>
#include <cmath>

#include "core/numerics.h"
#include <string>

#include "cpu/fp8.h"
#include "cpu/kernels.h"
#include "cpu/storage.h"
#include "ops/op_checks.h"

namespace smelt::cpu {
namespace {

// Elements [first, first + count), their gradients at grads[i] (the master dtype, or bf16 as
// uint16_t); `copy` (null: none) receives element first + i at copy[i].
// Value: double (tests) or float; the per-element arithmetic is done in double.
template <typename Value, typename Gradient>
void update(const AdamwArgs& args, double clip, int64_t first, int64_t count, const Gradient* grads, uint16_t* copy) {
  Value* params = args.params.as<Value>() + first;
  Value* exp_avg = args.exp_avg.as<Value>() + first;
  Value* exp_avg_sq = args.exp_avg_sq.as<Value>() + first;
  const double lr = args.lr, beta1 = args.beta1, beta2 = args.beta2, eps = args.eps;
  const double decay = 1.0 - lr * double(args.weight_decay);
  const double bias_correction1 = 1.0 - std::pow(beta1, double(args.step));
  const double bias_correction2 = 1.0 - std::pow(beta2, double(args.step));
  const double step_size = lr / bias_correction1, bias_correction2_sqrt = std::sqrt(bias_correction2);
  const bool clipping = clip < 1.0;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    double g = double(load(grads, i));
    if (clipping) g = double(Value(g * clip));  // rounded as the GPU's float product
    const double m = beta1 * double(exp_avg[i]) + (1.0 - beta1) * g;
    const double v = beta2 * double(exp_avg_sq[i]) + (1.0 - beta2) * g * g;
    exp_avg[i] = Value(m);
    exp_avg_sq[i] = Value(v);
    const double denominator = std::sqrt(v) / bias_correction2_sqrt + eps;
    params[i] = Value(double(params[i]) * decay - step_size * m / denominator);
    if (copy) copy[i] = float_to_bf16(static_cast<float>(params[i]));
  }
}

}  // namespace

void adamw(const AdamwArgs& args) {
  const char* op = "adamw";
  const int64_t count = args.params.numel();
  const DType dtype = args.params.dtype;
  if (dtype != DType::f32 && dtype != DType::f64)
    fail(ErrorKind::internal, "adamw: expected f32 master parameters (f64 in tests), found " + args.params.str() +
                                  "; keep the optimizer state in f32");
  for (const TensorView* t : {&args.params, &args.exp_avg, &args.exp_avg_sq}) {
    expect_host(*t, op, "argument");
    expect_dtype(*t, dtype, op, "exp_avg/exp_avg_sq");
    expect_numel(*t, count, op, "exp_avg/exp_avg_sq");
  }
  expect_host(args.grads, op, "grads");
  expect_dtype(args.grads, dtype, op, "grads");
  if (!args.low_grads.empty()) expect_host(args.low_grads, op, "low_grads");
  if (args.step < 1)
    fail(ErrorKind::internal, "adamw: expected a 1-based step, found " + std::to_string(args.step) +
                                  "; count steps from 1");
  if (!args.compute_copy.empty()) {
    expect_host(args.compute_copy, op, "compute_copy");
    expect_dtype(args.compute_copy, DType::bf16, op, "compute_copy");
  }
  expect_copy_ranges(args.copy_ranges, count, args.compute_copy.empty() ? 0 : args.compute_copy.numel(), 4, op);
  expect_gradient_runs(args, 4, op);
  double clip = 1.0;
  if (args.max_norm > 0) {
    expect_host(args.grad_sum_squares, op, "grad_sum_squares");
    expect_numel(args.grad_sum_squares, 1, op, "grad_sum_squares");
    expect_dtype(args.grad_sum_squares, dtype, op, "grad_sum_squares");
    const double sum_squares = dtype == DType::f64 ? *args.grad_sum_squares.as<double>()
                                                   : double(*args.grad_sum_squares.as<float>());
    clip = std::min(1.0, double(args.max_norm) / (std::sqrt(sum_squares) + 1e-6));
  }
  expect_amax_slots(args.copy_ranges, args.weight_amax, op);
  if (!args.weight_amax.empty()) {
    expect_host(args.weight_amax, op, "weight_amax");
    std::fill_n(args.weight_amax.as<float>(), args.weight_amax.numel(), 0.0f);
  }
  uint16_t* copy = args.compute_copy.empty() ? nullptr : args.compute_copy.as<uint16_t>();
  auto run = [&](const ParameterRun& range, uint16_t* run_copy) {
    const int64_t first = range.begin, n = range.count, g = range.gradient_offset();
    if (range.low_grad) {
      const uint16_t* grads = args.low_grads.as<uint16_t>() + g;
      if (dtype == DType::f64) update<double>(args, clip, first, n, grads, run_copy);
      else update<float>(args, clip, first, n, grads, run_copy);
    } else if (dtype == DType::f64) {
      update<double>(args, clip, first, n, args.grads.as<double>() + g, run_copy);
    } else {
      update<float>(args, clip, first, n, args.grads.as<float>() + g, run_copy);
    }
  };
  if (args.copy_ranges.empty()) return run(ParameterRun{0, count}, copy);
  for (const ParameterRun& range : args.copy_ranges) {
    run(range, range.copied() ? copy + range.copy_offset : nullptr);
    if (range.amax_slot >= 0) {  // the updated parameters' largest magnitude, folded into the slot
      float run_amax = 0;
      amax_of(args.params.reshaped(Shape{count, 1}).row_slice(range.begin, range.count),
              TensorView(&run_amax, DType::f32, Shape{1}));
      float& slot = args.weight_amax.as<float>()[range.amax_slot];
      if (std::isnan(run_amax) || run_amax > slot) slot = run_amax;  // NaN sticks, as in the amax op
    }
  }
}

}  // namespace smelt::cpu
