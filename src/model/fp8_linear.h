// Float8 linear layers: the recipes (which float8 dtype and scaling each operand of a linear's
// three GEMMs gets), the device-side quantisation of one operand into planned scratch, and the
// forward and backward of a linear with every GEMM in float8. Scales never visit the host.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/model_config.h"
#include "ops/backend.h"

namespace smelt {

// torchao's recipes: tensorwise (dynamic per-tensor scales; inputs and weights e4m3,
// gradients e5m2) and rowwise (a scale per row of the reduction dimension, e4m3 everywhere,
// scales rounded down to powers of two).
enum class Float8Recipe : uint8_t { none, tensorwise, rowwise };

// "none", "tensorwise", "rowwise"; any other name fails (ErrorKind::config) listing these.
Float8Recipe parse_float8_recipe(const std::string& name);
std::string_view float8_recipe_name(Float8Recipe recipe);

struct Float8Options {
  Float8Recipe recipe = Float8Recipe::none;
  // A linear whose fully qualified name ("layers.3.attention.wq", "output") contains any of
  // these strings stays in the compute dtype (torchao's module filter).
  std::vector<std::string> filter_fqns = {"output"};
};

// True when the linear named `fqn` runs in float8 under `options`.
bool float8_linear_enabled(const Float8Options& options, const std::string& fqn);

// The three GEMMs of a linear y = x W^T: output (y = x W^T), grad-input (dx = dy W) and
// grad-weight (dW = dy^T x).
enum class LinearGemm : uint8_t { output, grad_input, grad_weight };

// How one GEMM operand is cast: its float8 dtype, its scaling (rowwise: one scale per row of
// the K-major copy, i.e. along the GEMM's reduction dimension), whether scales are powers of two.
struct OperandCast {
  DType dtype = DType::e4m3;
  OperandScaling scaling = OperandScaling::tensorwise;
  bool round_scale_to_power_of_two = false;
};

struct GemmCast {
  OperandCast a, b;
  bool fast_accumulation = false;
};

GemmCast float8_gemm_cast(Float8Recipe recipe, LinearGemm gemm);

// Scratch every float8 linear reuses (one set of planned buffers for the whole step).
struct Float8Scratch {
  TensorView operand_a;  // (largest M*K) bytes: the quantised left operand, K-major
  TensorView operand_b;  // (largest N*K) bytes: the quantised right operand, K-major
  TensorView scale_a;    // (largest M) f32: amax, then the scale(s) of operand a
  TensorView scale_b;    // (largest N) f32
};

// Element counts of the scratch, over the linears of one block with N = `tokens`.
struct Float8ScratchSizes {
  int64_t operand_a = 0, operand_b = 0, scale_a = 0, scale_b = 0;
};
Float8ScratchSizes float8_scratch_sizes(const ModelConfig& model, int64_t tokens);

// One quantised GEMM operand: `values` (rows, K) float8, `scale` (1) or (rows) f32.
struct QuantizedOperand {
  TensorView values, scale;
  OperandScaling scaling = OperandScaling::tensorwise;
};

// Quantises src (rows, cols), or src^T when `transpose`, into the scratch views: amax,
// scale_from_amax, quantize (three backend ops on the device). The result is K-major:
// (rows, cols), or (cols, rows) when transposed.
QuantizedOperand quantize_operand(Backend& backend, const TensorView& source, bool transpose, const OperandCast& cast,
                                  const TensorView& values_scratch, const TensorView& scale_scratch);

// y = x W^T (+ addend), both operands quantised under `recipe`.
void float8_linear_forward(Backend& backend, Float8Recipe recipe, const Float8Scratch& scratch, const TensorView& x,
                           const TensorView& weight, const TensorView& y, const TensorView& addend);
// dx (=|+=) dy W ; dW = dy^T x, each GEMM with both operands quantised under `recipe`.
void float8_linear_backward(Backend& backend, Float8Recipe recipe, const Float8Scratch& scratch, const TensorView& x,
                            const TensorView& weight, const TensorView& grad_output, const TensorView& grad_input,
                            bool accumulate_grad_input, const TensorView& grad_weight);

}  // namespace smelt
