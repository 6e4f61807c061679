// CPU reductions: sum of squares (gradient norm) and mean (loss), in double over
// a fixed number of fixed chunks summed in order, so threads never change a bit.
#include <algorithm>
#include <string>

#include "cpu/kernels.h"
#include "cpu/storage.h"

namespace smelt::cpu {
namespace {

// The chunk boundaries depend only on the element count.
constexpr int64_t kChunks = 64;

template <typename Value, typename Term>
double chunked_sum(const Value* x, int64_t count, Term term) {
  double partial[kChunks] = {};
  const int64_t chunk = (count + kChunks - 1) / kChunks;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < kChunks; ++c) {
    const int64_t first = std::min(count, c * chunk), last = std::min(count, first + chunk);
    double sum = 0;
    for (int64_t i = first; i < last; ++i) sum += term(double(load(x, i)));
    partial[c] = sum;
  }
  double total = 0;
  for (int64_t c = 0; c < kChunks; ++c) total += partial[c];
  return total;
}

template <typename Term>
double sum_of(const TensorView& x, const char* op, Term term) {
  switch (x.dtype) {
    case DType::f64: return chunked_sum(x.as<double>(), x.numel(), term);
    case DType::f32: return chunked_sum(x.as<float>(), x.numel(), term);
    case DType::bf16: return chunked_sum(x.as<uint16_t>(), x.numel(), term);
    default:
      fail(ErrorKind::internal, std::string(op) + ": expected x in f32 (f64 in tests, or bf16), found " + x.str() +
                                    "; reduce a floating-point tensor");
  }
}

// out is f64 for f64 input, f32 otherwise.
void write(const TensorView& out, const TensorView& x, double value, bool accumulate, const char* op) {
  expect_host(out, op, "out");
  expect_numel(out, 1, op, "out");
  expect_dtype(out, x.dtype == DType::f64 ? DType::f64 : DType::f32, op, "out");
  if (out.dtype == DType::f64) *out.as<double>() = value + (accumulate ? *out.as<double>() : 0.0);
  else *out.as<float>() = float(value + (accumulate ? double(*out.as<float>()) : 0.0));
}

}  // namespace

void sum_squares(const SumSquaresArgs& args) {
  expect_host(args.x, "sum_squares", "x");
  const auto square = [](double v) { return v * v; };
  double value = sum_of(args.x, "sum_squares", square);
  for (const TensorView& also : args.also) {
    if (also.empty()) continue;
    expect_host(also, "sum_squares", "also");
    if ((also.dtype == DType::f64) != (args.x.dtype == DType::f64))
      fail(ErrorKind::internal, "sum_squares: expected also " + also.str() + " in f64 exactly when x " +
                                    args.x.str() + " is; the result's type follows both");
    value += sum_of(also, "sum_squares", square);
  }
  write(args.out, args.x, value, args.accumulate, "sum_squares");
}

void mean(const MeanArgs& args) {
  expect_host(args.x, "mean", "x");
  if (args.x.numel() == 0)
    fail(ErrorKind::internal, "mean: expected at least one element, found " + args.x.str() + "; skip empty reductions");
  const double value = sum_of(args.x, "mean", [](double v) { return v; }) / double(args.x.numel());
  write(args.out, args.x, args.weight * value, args.accumulate, "mean");
}

}  // namespace smelt::cpu
