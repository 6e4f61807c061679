// Float8 linear layers: the recipes (which float8 dtype and scaling each operand of a linear's
// three GEMMs gets), the quantisation of weights (once per step) and activations (once per
// use, both layouts from one read), and the forward and backward of a linear with its GEMMs in
// float8. Scales never visit the host.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/layer_graph.h"
#include "model/model_config.h"
#include "ops/backend.h"

namespace smelt {

// torchao's recipes: tensorwise (dynamic per-tensor scales; inputs and weights e4m3,
// gradients e5m2), rowwise (a scale per row of the reduction dimension, e4m3 everywhere,
// scales rounded down to powers of two), rowwise_with_gw_hp (rowwise for the output and
// grad-input GEMMs, the grad-weight GEMM in the compute dtype) and DeepSeek-V3's blockwise
// (e4m3 everywhere; activations and gradients in 1x128 tiles along K, weights in 128x128
// blocks, fp32 scales: core/float8_blocks.h; no fast accumulation).
enum class Float8Recipe : uint8_t { none, tensorwise, rowwise, rowwise_with_gw_hp, blockwise };

// "none", "tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise"; any other name fails
// (ErrorKind::config) listing these.
Float8Recipe parse_float8_recipe(const std::string& name);
std::string_view float8_recipe_name(Float8Recipe recipe);

struct Float8Options {
  Float8Recipe recipe = Float8Recipe::none;
  // A linear whose fully qualified name ("layers.3.attention.wq", "output") contains any of
  // these strings stays in the compute dtype (torchao's module filter).
  std::vector<std::string> filter_fqns = {"output"};
  // An activation the block's backward reads only as float8 linears' input (the norms' outputs,
  // SwiGLU's) is kept for backward as the grad-weight GEMM's operand x^T in float8, written by
  // the forward in the same pass as x, instead of in the compute dtype. Same bytes as casting it
  // in the backward; recipes whose grad-weight GEMM is not in float8 keep the compute dtype.
  bool save_inputs_in_float8 = true;
  // Keep a float8 W^T copy of every float8 linear beside W (1 byte per parameter more) instead of
  // transposing W's codes into scratch at each backward use. Tensorwise only: W and W^T share the
  // scale, so the transpose is exact; the other recipes' W^T have scales of their own and are
  // always kept.
  bool keep_transposed_weights = false;
  // [float8] fusion = "full": the amax of a float8 linear's input or output gradient is taken by
  // the op that produces it, in the same pass (SwiGLU's output for w2; its gradients for w1 and
  // w3), and the linear's cast skips its own amax pass. Tensorwise only (one amax per tensor);
  // "linear" leaves every amax to the linears.
  bool fuse_amax_into_producers = true;
};

// True when producers take the amax of float8 linears' operands (tensorwise, fusion "full").
inline bool float8_fused_amax(const Float8Options& options) {
  return options.recipe == Float8Recipe::tensorwise && options.fuse_amax_into_producers;
}

// True when float8 linears' W^T copies are made at each backward use from W's codes (unsharded
// tensorwise plans without keep_transposed_weights).
inline bool float8_transposes_per_use(const Float8Options& options) {
  return options.recipe == Float8Recipe::tensorwise && !options.keep_transposed_weights;
}

// The filter_fqns entry that turns on the size filter (torchtitan's name for it).
inline constexpr std::string_view kFloat8AutoFilter = "auto_filter_small_kn";

// True when the linear named `fqn` runs in float8 under `options` (its name alone).
bool float8_linear_enabled(const Float8Options& options, const std::string& fqn);
// True when block linear `weight` of `layer` runs in float8: its name passes the filters and,
// when filter_fqns holds "auto_filter_small_kn", its shape is one float8 gains on. That rule
// (torchao's thresholds, W (out, in)): both dimensions multiples of 16; tensorwise keeps in
// bf16 a linear with out <= 4096 and in <= 1024; the other recipes one with in <= 2048, or
// out <= 1024, or in <= 4096 and out <= 2048.
bool float8_linear_enabled(const Float8Options& options, const ModelConfig& model, int64_t layer, LayerWeight weight);
// The shape rule alone.
bool float8_gains_on_shape(Float8Recipe recipe, int64_t out, int64_t in);

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

// False when the recipe runs this GEMM in the compute dtype (rowwise_with_gw_hp's grad-weight).
bool float8_gemm_enabled(Float8Recipe recipe, LinearGemm gemm);
GemmCast float8_gemm_cast(Float8Recipe recipe, LinearGemm gemm);

// How many scales an operand of (rows, K) has under `scaling`: 1, rows, or its tiles / blocks.
int64_t operand_scale_count(OperandScaling scaling, int64_t rows, int64_t cols);

// One quantised GEMM operand: `values` (rows, K) float8, `scale` f32 (operand_scale_count).
struct QuantizedOperand {
  TensorView values, scale;
  OperandScaling scaling = OperandScaling::tensorwise;
};

// A weight W (out, in) in float8 for one step: `rows` is W itself (K = in, the output GEMM's b),
// `transposed` is W^T (in, out) (K = out, the grad-input GEMM's b); empty when the backward
// transposes W's codes at each use (float8_transposes_per_use). Tensorwise: one scale, the
// same in both; rowwise: one per row of each; blockwise: one per 128x128 block of each (the
// same blocks, transposed).
struct Float8Weight {
  QuantizedOperand rows, transposed;
  bool empty() const { return rows.values.empty(); }
};

// One scratch slot: values (bytes), and the amax and scale(s) of what it holds (f32).
struct Float8Slot {
  TensorView values, amax, scale;
};

// Scratch every float8 linear reuses (one set of planned buffers for the whole step).
struct Float8Scratch {
  Float8Slot activation;             // x (N, in) or dy (N, out): the GEMMs' left operand, K-major
  Float8Slot activation_transposed;  // dy^T (out, N): the grad-weight GEMM's left operand
  Float8Slot input_transposed;       // x^T (in, N): the grad-weight GEMM's right operand
  // Only when weights are not quantised once per step (sharded plans): W and W^T per use; W^T also
  // when it is transposed from W's codes at each use.
  Float8Slot weight, weight_transposed;
};

// Element counts of the scratch, over the linears of one block with N = `tokens`. `per_use_weights`:
// the weight slots are needed (no planned float8 weight copies).
struct Float8ScratchSizes {
  int64_t activation = 0, activation_transposed = 0, input_transposed = 0, weight = 0, weight_transposed = 0;  // bytes
  int64_t scales = 0;  // floats per amax / scale view: the most scales any operand has
};
// `transposes_per_use`: the W^T slot is needed (W^T transposed from planned W copies at each use).
Float8ScratchSizes float8_scratch_sizes(const ModelConfig& model, int64_t tokens, Float8Recipe recipe,
                                        bool per_use_weights, bool transposes_per_use = false);
// The scratch as two planned buffers: the slots' values (bytes, each slot 256-byte aligned) and
// their amax and scales (floats).
int64_t float8_scratch_value_bytes(const Float8ScratchSizes& sizes);
int64_t float8_scratch_statistic_floats(const Float8ScratchSizes& sizes);
Float8Scratch float8_scratch_views(const Float8ScratchSizes& sizes, const TensorView& values,
                                   const TensorView& statistics);

// Where every float8 linear's weight copies (W then W^T, 256-byte aligned; W alone when
// `transposed` is false) and their scales live in two planned buffers; -1 for linears not in float8.
struct Float8WeightLayout {
  std::vector<std::array<int64_t, kLayerWeightCount>> value_offset, scale_offset;
  int64_t value_bytes = 0, scale_floats = 0;
};
Float8WeightLayout float8_weight_layout(const ModelConfig& model, Float8Recipe recipe,
                                        const std::vector<std::array<bool, kLayerWeightCount>>& float8,
                                        bool transposed = true);

// What one float8 linear keeps across the step besides its weight copies.
struct Float8LinearState {
  Float8Weight weight;   // planned copies (empty: quantised per use into the scratch weight slots)
  QuantizedOperand saved_input;  // x^T (in, N) kept for the grad-weight GEMM (Float8Options::
                                 // save_inputs_in_float8): the forward writes it, the backward reads
                                 // it instead of x (empty: x is kept and cast again there)
  TensorView input_amax; // (1) f32, tensorwise only: the forward's amax of x, reused for x^T in the
                         // grad-weight GEMM (empty: computed again there)
  bool input_amax_ready = false;  // input_amax already holds x's amax, taken by x's producer
  TensorView grad_amax;  // (1) f32, tensorwise only: dy's amax, taken by dy's producer (empty: an amax pass)
};

// x^T (in, tokens) as the grad-weight GEMM's right operand, kept from the forward to the backward:
// its bytes (values, then scales at a 256-byte boundary) and its views over a buffer of them.
int64_t float8_saved_input_bytes(Float8Recipe recipe, int64_t in, int64_t tokens);
QuantizedOperand float8_saved_input_view(Float8Recipe recipe, int64_t in, int64_t tokens, const TensorView& buffer);

// Quantises W (out, in) into both layouts of `copy` (W alone when copy.transposed is empty) with
// one amax pass and one cast pass; with `ready_amax` (tensorwise: W's amax, taken already, e.g. by
// AdamW) the cast pass alone.
// `amax` and `amax_transposed` are scratch of at least (out) and (in) floats.
void quantize_weight(Backend& backend, Float8Recipe recipe, const TensorView& weight, const Float8Weight& copy,
                     const TensorView& amax, const TensorView& amax_transposed, const TensorView& ready_amax = {});

// Views of a weight copy over planned memory: values (2 * out * in bytes: W then W^T; out * in
// without `transposed`) and scales (float8_weight_scale_count floats: W's then W^T's).
Float8Weight float8_weight_views(Float8Recipe recipe, int64_t out, int64_t in, const TensorView& values,
                                 const TensorView& scales, bool transposed = true);
int64_t float8_weight_scale_count(Float8Recipe recipe, int64_t out, int64_t in);

// Quantises src (rows, cols), or src^T when `transpose`, into the slot: one amax pass, one cast
// pass with the scale computed inside it. The result is K-major: (rows, cols), or (cols, rows).
// `amax_ready` (tensorwise): slot.amax already holds src's amax, so there is no amax pass.
QuantizedOperand quantize_operand(Backend& backend, const TensorView& source, bool transpose, const OperandCast& cast,
                                  const Float8Slot& slot, bool amax_ready = false);

// Linears that read the same input one after another (wq, wk, wv on the attention norm's output;
// w1, w3 on the FFN norm's) quantise it once. The first leaves x (forward) or x^T (backward) in
// the scratch and records it here; the next takes it from there when it is the same tensor in
// the same slot and it runs in the step right after (the caller numbers the steps it runs, so
// nothing can have written the input or the slot in between). Same bytes as quantising again.
struct Float8InputReuse {
  struct Record {
    const void* source = nullptr;  // the input's data
    Shape shape;
    const void* slot = nullptr;    // the scratch values it was cast into
    uint64_t step = 0;             // when
    TensorView amax;               // tensorwise forward: where its amax was written
    const void* saved = nullptr;   // forward: the saved x^T it also wrote (Float8LinearState::saved_input)
  };
  uint64_t step = 1;  // the step running now; the caller advances it before every step
  Record input, input_transposed;
  int64_t reused = 0;  // quantisations skipped (tests count them)

  // The record, when `x` in `slot` was quantised by the step just before this one.
  const Record* find(const Record& r, const TensorView& x, const Float8Slot& slot) const {
    const bool hit = r.source == x.data && r.shape == x.shape && r.slot == slot.values.data && r.step + 1 == step;
    return hit ? &r : nullptr;
  }
};

// y = x W^T (+ addend), both operands in float8 under `recipe`. `weight` is the compute-dtype
// weight (read only when state.weight is empty). `reuse` (may be null): see Float8InputReuse.
void float8_linear_forward(Backend& backend, Float8Recipe recipe, const Float8Scratch& scratch,
                           const Float8LinearState& state, const TensorView& x, const TensorView& weight,
                           const TensorView& y, const TensorView& addend, Float8InputReuse* reuse = nullptr);
// dx (=|+=) dy W ; dW = dy^T x. dy is read once for both of its float8 layouts.
void float8_linear_backward(Backend& backend, Float8Recipe recipe, const Float8Scratch& scratch,
                            const Float8LinearState& state, const TensorView& x, const TensorView& weight,
                            const TensorView& grad_output, const TensorView& grad_input, bool accumulate_grad_input,
                            const TensorView& grad_weight, Float8InputReuse* reuse = nullptr,
                            bool accumulate_grad_weight = false);

}  // namespace smelt
