// CPU softmax cross-entropy, forward and backward in one pass per row:
// loss = logsumexp(logits) - logits[target]; grad = (softmax - onehot) * grad_scale.
// Rows with a negative target are ignored (loss 0, gradient 0). Logits f32 (f64 in tests), or bf16
// (a bf16 GEMM's output) with f32 math and losses.
#include <algorithm>
#include <cmath>
#include <string>

#include "cpu/kernels.h"
#include "cpu/storage.h"

namespace smelt::cpu {
namespace {

// Logit: the math, double (f64 tests) or float; Stored: the logits' storage (Logit, or uint16_t
// for bf16); Gradient: storage of grad_logits (may alias logits: each element is read before it
// is written).
template <typename Logit, typename Stored, typename Gradient>
void compute(const CrossEntropyArgs& args) {
  const int64_t rows = args.logits.rows(), vocabulary = args.logits.cols();
  const Stored* logits = args.logits.as<Stored>();
  const int32_t* targets = args.targets.as<int32_t>();
  Logit* losses = args.losses.as<Logit>();
  Gradient* grad = args.grad_logits.empty() ? nullptr : args.grad_logits.as<Gradient>();
  const Logit grad_scale = Logit(args.grad_scale);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const Stored* stored = logits + r * vocabulary;
    const auto row = [stored](int64_t c) { return Logit(load(stored, c)); };
    const int32_t target = targets[r];
    if (target < 0) {
      losses[r] = 0;
      if (grad)
        for (int64_t c = 0; c < vocabulary; ++c) store(grad, r * vocabulary + c, Logit(0));
      continue;
    }
    Logit maximum = row(0);
    for (int64_t c = 1; c < vocabulary; ++c) maximum = std::max(maximum, row(c));
    Logit total = 0;
    for (int64_t c = 0; c < vocabulary; ++c) total += std::exp(row(c) - maximum);
    const Logit lse = maximum + std::log(total);
    losses[r] = lse - row(target);  // read before the gradient may overwrite the row
    if (!grad) continue;
    for (int64_t c = 0; c < vocabulary; ++c) {
      const Logit probability = std::exp(row(c) - lse);
      store(grad, r * vocabulary + c, (probability - (c == target ? Logit(1) : Logit(0))) * grad_scale);
    }
  }
}

}  // namespace

void cross_entropy(const CrossEntropyArgs& args) {
  const char* op = "cross_entropy";
  for (const TensorView* t : {&args.logits, &args.targets, &args.losses, &args.grad_logits}) expect_host(*t, op, "argument");
  const int64_t rows = args.logits.rows(), vocabulary = args.logits.cols();
  expect_dtype(args.targets, DType::i32, op, "targets");
  expect_numel(args.targets, rows, op, "targets");
  expect_numel(args.losses, rows, op, "losses");
  expect_dtype(args.losses, args.logits.dtype == DType::bf16 ? DType::f32 : args.logits.dtype, op, "losses");
  if (!args.grad_logits.empty()) expect_same_shape(args.grad_logits, args.logits, op, "grad_logits", "logits");
  const int32_t* targets = args.targets.as<int32_t>();
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] >= vocabulary)
      fail(ErrorKind::input, "cross_entropy: expected targets below the vocabulary size " + std::to_string(vocabulary) +
                                 ", found " + std::to_string(targets[r]) + " at row " + std::to_string(r) +
                                 "; the data was tokenized with a larger vocabulary than the model's vocab_size");
  const DType gradient = args.grad_logits.empty() ? args.logits.dtype : args.grad_logits.dtype;
  if (args.logits.dtype == DType::f64 && gradient == DType::f64) return compute<double, double, double>(args);
  if (args.logits.dtype == DType::f32 && gradient == DType::f32) return compute<float, float, float>(args);
  if (args.logits.dtype == DType::f32 && gradient == DType::bf16) return compute<float, float, uint16_t>(args);
  if (args.logits.dtype == DType::bf16 && gradient == DType::bf16) return compute<float, uint16_t, uint16_t>(args);
  fail(ErrorKind::internal, "cross_entropy: expected logits f32 with grad_logits f32 or bf16, bf16 with bf16 (or both "
                            "f64), found logits " + args.logits.str() + " and grad_logits " + args.grad_logits.str());
}

}  // namespace smelt::cpu
