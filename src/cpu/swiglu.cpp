// CPU SwiGLU: out = silu(gate) * up, silu(g) = g * sigmoid(g), and its backward; the optional
// amax of what they store (the reference for the GPU's fused one).
#include <cmath>

#include "cpu/fp8.h"
#include "cpu/kernels.h"
#include "cpu/storage.h"

namespace smelt::cpu {
namespace {

template <typename Acc>
inline Acc sigmoid(Acc x) { return Acc(1) / (Acc(1) + std::exp(-x)); }

template <typename Storage>
void forward(const SwigluForwardArgs& args) {
  using Acc = Accumulator<Storage>;
  const int64_t count = args.gate.numel();
  const Storage* gate = args.gate.as<Storage>();
  const Storage* up = args.up.as<Storage>();
  Storage* out = args.out.as<Storage>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const Acc g = load(gate, i);
    store(out, i, g * sigmoid(g) * load(up, i));
  }
}

// d up = dy * silu(g);  d gate = dy * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))).
template <typename Storage>
void backward(const SwigluBackwardArgs& args) {
  using Acc = Accumulator<Storage>;
  const int64_t count = args.gate.numel();
  const Storage* gate = args.gate.as<Storage>();
  const Storage* up = args.up.as<Storage>();
  const Storage* grad_out = args.grad_out.as<Storage>();
  Storage* grad_gate = args.grad_gate.as<Storage>();
  Storage* grad_up = args.grad_up.as<Storage>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const Acc g = load(gate, i), u = load(up, i), dy = load(grad_out, i);
    const Acc sig = sigmoid(g);
    store(grad_up, i, dy * g * sig);
    store(grad_gate, i, dy * u * sig * (Acc(1) + g * (Acc(1) - sig)));
  }
}

}  // namespace

void swiglu_forward(const SwigluForwardArgs& args) {
  const char* op = "swiglu_forward";
  for (const TensorView* t : {&args.gate, &args.up, &args.out}) {
    expect_host(*t, op, "argument");
    expect_dtype(*t, args.gate.dtype, op, "up/out");
  }
  expect_same_shape(args.up, args.gate, op, "up", "gate");
  expect_same_shape(args.out, args.gate, op, "out", "gate");
  dispatch_activation(args.gate.dtype, op, [&](auto storage) { forward<decltype(storage)>(args); });
  if (!args.amax.empty()) amax_of(args.out, args.amax);
}

void swiglu_backward(const SwigluBackwardArgs& args) {
  const char* op = "swiglu_backward";
  for (const TensorView* t : {&args.gate, &args.up, &args.grad_out, &args.grad_gate, &args.grad_up}) {
    expect_host(*t, op, "argument");
    expect_dtype(*t, args.gate.dtype, op, "up/grad_out/grad_gate/grad_up");
    expect_same_shape(*t, args.gate, op, "up/grad_out/grad_gate/grad_up", "gate");
  }
  dispatch_activation(args.gate.dtype, op, [&](auto storage) { backward<decltype(storage)>(args); });
  if (!args.amax_gate.empty()) amax_of(args.grad_gate, args.amax_gate);
  if (!args.amax_up.empty()) amax_of(args.grad_up, args.amax_up);
}

}  // namespace smelt::cpu
