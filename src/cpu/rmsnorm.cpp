// CPU RMSNorm: y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps) per row,
// and its backward (grad of input per row; grad of weight summed over rows in
// row order, column block by column block, so it is independent of threads).
#include <algorithm>
#include <cmath>

#include "cpu/fp8.h"
#include "cpu/kernels.h"
#include "cpu/storage.h"

namespace smelt::cpu {
namespace {

constexpr int64_t kColumnBlock = 64;

template <typename Storage>
void forward(const RmsNormForwardArgs& args) {
  using Acc = Accumulator<Storage>;
  const int64_t rows = args.input.rows(), dim = args.input.cols();
  const Storage* x = args.input.as<Storage>();
  const Storage* w = args.weight.as<Storage>();
  Storage* y = args.out.as<Storage>();
  Acc* rstd = args.rstd.as<Acc>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const Storage* xr = x + r * dim;
    Acc sum = 0;
    for (int64_t d = 0; d < dim; ++d) {
      Acc v = load(xr, d);
      sum += v * v;
    }
    Acc inverse = Acc(1) / std::sqrt(sum / Acc(dim) + Acc(args.eps));
    rstd[r] = inverse;
    for (int64_t d = 0; d < dim; ++d) store(y + r * dim, d, load(xr, d) * inverse * load(w, d));
  }
}

// dx = rstd * (w*dy - x * rstd^2 * mean(x * w*dy));  dw = sum over rows of dy * x * rstd.
template <typename Storage>
void backward(const RmsNormBackwardArgs& args) {
  using Acc = Accumulator<Storage>;
  const int64_t rows = args.input.rows(), dim = args.input.cols();
  const Storage* x = args.input.as<Storage>();
  const Storage* w = args.weight.as<Storage>();
  const Storage* dy = args.grad_out.as<Storage>();
  const Acc* rstd = args.rstd.as<Acc>();
  Storage* dx = args.grad_input.as<Storage>();
  Acc* dw = args.grad_weight.as<Acc>();
  const bool accumulate = args.accumulate;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t offset = r * dim;
    Acc dot = 0;
    for (int64_t d = 0; d < dim; ++d) dot += load(x, offset + d) * load(w, d) * load(dy, offset + d);
    const Acc inverse = rstd[r];
    const Acc correction = inverse * inverse * dot / Acc(dim);
    for (int64_t d = 0; d < dim; ++d) {
      Acc value = inverse * (load(w, d) * load(dy, offset + d) - load(x, offset + d) * correction);
      if (accumulate) value += load(dx, offset + d);
      store(dx, offset + d, value);
    }
  }
  const int64_t blocks = (dim + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t first = block * kColumnBlock, last = std::min(dim, first + kColumnBlock);
    Acc sums[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const Acc inverse = rstd[r];
      for (int64_t d = first; d < last; ++d) sums[d - first] += load(dy, r * dim + d) * load(x, r * dim + d) * inverse;
    }
    // Gradient accumulation adds this microbatch's whole sum to what is there.
    for (int64_t d = first; d < last; ++d) dw[d] = sums[d - first] + (args.accumulate_weight ? dw[d] : Acc(0));
  }
}

}  // namespace

void rmsnorm_forward(const RmsNormForwardArgs& args) {
  const char* op = "rmsnorm_forward";
  for (const TensorView* t : {&args.input, &args.weight, &args.out, &args.rstd}) expect_host(*t, op, "argument");
  expect_numel(args.weight, args.input.cols(), op, "weight");
  expect_same_shape(args.out, args.input, op, "out", "input");
  expect_numel(args.rstd, args.input.rows(), op, "rstd");
  dispatch_activation(args.input.dtype, op, [&](auto storage) {
    using Storage = decltype(storage);
    expect_dtype(args.weight, args.input.dtype, op, "weight");
    expect_dtype(args.out, args.input.dtype, op, "out");
    expect_dtype(args.rstd, storage_dtype<Accumulator<Storage>>(), op, "rstd");
    forward<Storage>(args);
  });
  if (!args.amax.empty()) amax_of(args.out, args.amax);
}

void rmsnorm_backward(const RmsNormBackwardArgs& args) {
  const char* op = "rmsnorm_backward";
  for (const TensorView* t : {&args.input, &args.weight, &args.rstd, &args.grad_out, &args.grad_input, &args.grad_weight})
    expect_host(*t, op, "argument");
  expect_numel(args.weight, args.input.cols(), op, "weight");
  expect_numel(args.rstd, args.input.rows(), op, "rstd");
  expect_same_shape(args.grad_out, args.input, op, "grad_out", "input");
  expect_numel(args.grad_input, args.input.numel(), op, "grad_input");
  expect_numel(args.grad_weight, args.input.cols(), op, "grad_weight");
  dispatch_activation(args.input.dtype, op, [&](auto storage) {
    using Storage = decltype(storage);
    using Acc = Accumulator<Storage>;
    for (const TensorView* t : {&args.weight, &args.grad_out, &args.grad_input}) expect_dtype(*t, args.input.dtype, op, "activation");
    expect_dtype(args.rstd, storage_dtype<Acc>(), op, "rstd");
    expect_dtype(args.grad_weight, storage_dtype<Acc>(), op, "grad_weight");
    backward<Storage>(args);
  });
  if (!args.amax.empty()) amax_of(args.grad_input.reshaped(args.input.shape), args.amax);
}

}  // namespace smelt::cpu
