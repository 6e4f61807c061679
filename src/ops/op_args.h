// Argument structs of the backend ops, one per op. Shapes are commented where
// declared (N = tokens B*T, D = model dim, H/KV = query/key-value heads,
// Dh = head dim, F = FFN dim, V = vocabulary); see docs/glossary.md.
// Activations are f32 or bf16 (the run's compute dtype, or f64 in tests);
// weight gradients, norms, statistics and losses are f32 (f64 in tests); the block linears'
// weight gradients may be bf16 (PlanOptions::linear_grad_dtype).
#pragma once
#include <array>
#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace smelt {

// Scaling of a float8 GEMM operand (float8 issue); `none` for bf16/f32 operands. tensorwise and
// rowwise scales are quantisation factors (code = value * scale); the block scalings
// (blockwise recipe) hold dequantisation factors laid out as core/float8_blocks.h says.
enum class OperandScaling : uint8_t { none, tensorwise, rowwise, tile_1x128, block_128x128 };

// out = op(a) @ op(b) (+ addend) with op(x) = x or x^T, row-major.
// Linear layer forward: a = x (N, in), b = W (out, in), transpose_b = true.
// Grad of input:        a = dy (N, out), b = W (out, in).
// Grad of weight:       a = dy (N, out), transpose_a = true, b = x (N, in).
struct GemmArgs {
  TensorView a;
  bool transpose_a = false;
  TensorView b;
  bool transpose_b = false;
  TensorView out;
  TensorView addend;        // optional, same shape as out (may alias out): out = a@b + addend
  bool accumulate = false;  // out += a@b (same as addend = out)
  // float8 operands: their scales (f32: one, one per row, or per tile / block; see OperandScaling).
  TensorView scale_a, scale_b;
  OperandScaling scaling_a = OperandScaling::none, scaling_b = OperandScaling::none;
  bool fast_accumulation = false;
};

// out[n] = table[tokens[n]]. The table is in out's dtype, or f32 with a bf16 out (the master
// rows, each element rounded once to bf16: the same bits as gathering a bf16 copy of the table).
struct EmbeddingForwardArgs {
  TensorView tokens;  // (N) i32
  TensorView table;   // (V, D) out's dtype, or f32 when out is bf16
  TensorView out;     // (N, D)
};

struct EmbeddingBackwardArgs {
  TensorView tokens;       // (N) i32
  TensorView grad_out;     // (N, D)
  TensorView grad_table;   // (V, D) f32: overwritten, or added to when accumulate
  bool accumulate = false;  // gradient accumulation: add this microbatch's rows to what is there
};

struct RmsNormForwardArgs {
  TensorView input;   // (N, D)
  TensorView weight;  // (D)
  TensorView out;     // (N, D)
  TensorView rstd;    // (N) f32: 1 / sqrt(mean(x^2) + eps)
  float eps = 1e-5f;
  TensorView amax;    // optional (1) f32: the amax of `out` as stored (float8 fusion; NaN if any is NaN)
};

struct RmsNormBackwardArgs {
  TensorView input;        // (N, D) the forward input
  TensorView weight;       // (D)
  TensorView rstd;         // (N) f32 from the forward
  TensorView grad_out;     // (N, D)
  TensorView grad_input;   // (N, D): written, or added to when accumulate
  bool accumulate = false;
  TensorView grad_weight;  // (D) f32: overwritten, or added to when accumulate_weight
  bool accumulate_weight = false;  // gradient accumulation: add this microbatch's sum to what is there
  TensorView amax;         // optional (1) f32: the amax of grad_input as stored (after the add)
};

// Rotary embedding on (N, heads, Dh) in place, pairs (2i, 2i+1) rotated by
// position * frequency[i]; position = row % seq_len. Inverse rotates back
// (the backward of the forward rotation).
struct RopeArgs {
  TensorView x;          // (N, heads, Dh), in place
  TensorView frequencies;  // (seq_len, Dh/2, 2) f32: cos, sin
  int64_t seq_len = 0;
  bool inverse = false;
};

// Causal grouped-query attention. Query head h reads key/value head h / (H / KV).
struct AttentionForwardArgs {
  TensorView q;    // (B, T, H, Dh)
  TensorView k;    // (B, T, KV, Dh)
  TensorView v;    // (B, T, KV, Dh)
  TensorView out;  // (B, T, H, Dh)
  TensorView lse;  // (B, H, T) f32: log-sum-exp of the scaled scores per query
  float scale = 0;  // usually 1/sqrt(Dh)
};

struct AttentionBackwardArgs {
  TensorView q, k, v, out, lse;  // as in the forward
  TensorView grad_out;           // (B, T, H, Dh)
  TensorView grad_q;             // (B, T, H, Dh), overwritten
  TensorView grad_k, grad_v;     // (B, T, KV, Dh), overwritten
  float scale = 0;
  // Optional device bytes (Backend::attention_backward_scratch_bytes) planned for this call;
  // empty: the backend's workspace holds the scratch.
  TensorView scratch;
};

// out = silu(gate) * up
// Optional amax outputs ((1) f32, overwritten): max |v| over what the op stores (NaN if any is),
// the same value an amax op over the output would give; a float8 tensorwise cast of that output
// then needs no amax pass of its own ([float8] fusion = "full").
struct SwigluForwardArgs {
  TensorView gate, up;  // (N, F)
  TensorView out;       // (N, F)
  TensorView amax;      // optional: of out
};

struct SwigluBackwardArgs {
  TensorView gate, up, grad_out;  // (N, F)
  TensorView grad_gate, grad_up;  // (N, F), overwritten
  TensorView amax_gate, amax_up;  // optional: of grad_gate and of grad_up
};

// Softmax cross-entropy on a chunk of rows, forward and backward at once:
// losses[r] = logsumexp(logits[r]) - logits[r][target[r]];
// grad_logits = (softmax(logits) - onehot(target)) * grad_scale.
// Rows whose target is negative are ignored (loss 0, gradient 0).
struct CrossEntropyArgs {
  TensorView logits;       // (n, V) f32
  TensorView targets;      // (n) i32
  TensorView losses;       // (n) f32
  TensorView grad_logits;  // (n, V) compute dtype; may alias logits when dtypes match
  float grad_scale = 1;    // 1 / (number of counted tokens in the step)
};

// Sum of squares of x, written to out[0] (f32); deterministic order.
struct SumSquaresArgs {
  TensorView x;    // (n) f32
  TensorView out;  // (1) f32
  bool accumulate = false;  // out[0] += ...
  // Up to two more inputs, f32 or bf16, each optional: their squares join x's in double before
  // the one rounding to f32, so a sum split over several buffers rounds like the sum over one
  // (the gradient norm over the f32 gradients, the embedding's own buffer and the block linears'
  // bf16 ones: StepPlan::embedding_gradient, StepPlan::linear_gradients).
  std::array<TensorView, 2> also{};
};

// weight * mean of x over n elements into out[0], or added to it (a step's loss over its
// microbatches: each weighs 1 / microbatches).
struct MeanArgs {
  TensorView x;    // (n) f32
  TensorView out;  // (1) f32
  bool accumulate = false;  // out[0] += ...
  double weight = 1;
};

// One run of a flat parameter range: elements [begin, begin + count), whose compute-dtype copy
// starts at element `copy_offset` of the copy buffer, or that have none (copy_offset -1), and
// whose gradients start at element `grad_offset` of the f32 gradients, or with `low_grad` of the
// bf16 ones (the block linears' weight gradients, which their grad-weight GEMM writes once).
struct ParameterRun {
  int64_t begin = 0, count = 0, copy_offset = -1;
  // >= 0: AdamW also takes max |p| over the run's updated parameters into weight_amax[amax_slot]
  // (a float8 weight's tensorwise amax, so its cast needs no amax pass of its own).
  int32_t amax_slot = -1;
  bool low_grad = false;    // the gradients are in AdamwArgs::low_grads (bf16), not grads
  int64_t grad_offset = -1;  // -1: at `begin` of grads (a gradient buffer laid out like the parameters)
  // The gradients have a buffer of their own (StepPlan::embedding_gradient), from grad_offset 0:
  // AdamW is called for such a run alone, with that buffer as grads; a run list handed to AdamW
  // holds none.
  bool own_grad = false;
  bool copied() const { return copy_offset >= 0; }
  int64_t gradient_offset() const { return grad_offset >= 0 ? grad_offset : begin; }
};

// AdamW over one flat range (PyTorch semantics: decoupled decay, bias correction),
// gradients scaled by min(1, max_norm / (sqrt(sum_squares) + 1e-6)) when max_norm > 0.
struct AdamwArgs {
  // grads are read, never written (clipped in registers): (n) f32 laid out like params, or with
  // copy_ranges where each run's grad_offset says, in grads (f32) or low_grads (bf16, below).
  TensorView params, grads, exp_avg, exp_avg_sq;  // (n) f32
  TensorView grad_sum_squares;  // (1) f32: from SumSquares over all gradients
  // Optional bf16: receives the updated parameters, rounded (the GEMMs' weights). Without
  // copy_ranges it is (n), one copy of every element.
  TensorView compute_copy;
  // Optional: [0, n) as consecutive runs in order (each begin, count, copy_offset and grad_offset a
  // multiple of 4), each copied into compute_copy at its copy_offset or not at all, its gradients
  // read where it says. Every element gets the same update either way (the clip factor comes from
  // grad_sum_squares).
  std::span<const ParameterRun> copy_ranges;
  // Needed when a copy run has an amax_slot: (slots) f32; slot s receives the largest |p| after the
  // update over the runs naming s (NaN when one is NaN), 0 when no run names it.
  TensorView weight_amax;
  TensorView low_grads;  // bf16: the gradients of the runs with low_grad
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  float max_norm = 0;
  int64_t step = 1;  // 1-based
};

// Element-wise dtype conversion (f32 <-> bf16 <-> f64), same element count.
struct ConvertArgs {
  TensorView src, dst;
  // dst += src (converted): gradient accumulation adds a received gradient shard to the shard.
  // Into f32 (f64 on the CPU) only.
  bool accumulate = false;
};

// Float8 quantisation: dst = saturate(src * scale) in e4m3/e5m2; scales are
// what to multiply src by (a GEMM multiplies the result by 1/scale).
struct AmaxArgs {
  TensorView x;       // (rows, cols)
  TensorView amax;    // (1) or (rows) f32; (cols) when rowwise and transpose; may be empty with column_amax
  bool rowwise = false;
  bool transpose = false;  // rowwise over the rows of x^T (one amax per column of x)
  // Optional (cols) f32: the amax of every column of x, in the same pass as `amax` (the rowwise
  // scales of x and of x^T from one read).
  TensorView column_amax;
};

// One read of src, up to two float8 outputs. The scale either comes in (`scale`, as computed
// before) or is computed in the kernel from `amax` (scale = amax_to_scale(amax, dst format,
// round_scale_to_power_of_two), written to `scale` for the GEMM): no separate scale launch.
struct QuantizeArgs {
  TensorView src;      // (rows, cols) f32 / bf16
  TensorView dst;      // (rows, cols) e4m3 / e5m2; (cols, rows) when transpose
  TensorView scale;    // (1) or (dst rows) f32: read, or written when `amax` is given
  bool rowwise = false;
  bool transpose = false;  // dst = quantized src^T (the K-major copy a float8 GEMM needs)
  TensorView amax;     // optional, like `scale`: the scale is computed from it in the kernel
  bool round_scale_to_power_of_two = false;
  // Optional second output, written in the same pass (needs transpose = false): src^T (cols, rows)
  // in its own float8 dtype, scaled per src column when rowwise. amax_transposed and
  // scale_transposed are (1) or (cols) and play the roles of amax and scale for it.
  TensorView dst_transposed, amax_transposed, scale_transposed;
};

// scale[i] = amax_to_scale(amax[i], format, round_to_power_of_two) (core/numerics.h), on the
// device: no host sync. scale may alias amax (computed in place).
struct ScaleFromAmaxArgs {
  TensorView amax;     // (n) f32
  TensorView scale;    // (n) f32
  DType format = DType::e4m3;  // the float8 dtype amax is mapped onto: e4m3 (448) or e5m2 (57344)
  bool round_to_power_of_two = false;
};

// Block-scaled quantisation (the blockwise recipe), one read of src for up to two outputs, each
// amax taken and each scale computed inside the kernel (core/float8_blocks.h):
//   weight_blocks = false (activations): dst (rows, cols) in 1x128 tiles along cols, and
//     dst_transposed = src^T (cols, rows) in 1x128 tiles along rows (src's 128x1 tiles);
//   weight_blocks = true (weights): 128x128 blocks; dst_transposed's blocks are dst's
//     transposed, with the same scales (the scale grid transposed).
// Either output may be empty (not both). Scales are dequantisation factors (f32).
struct BlockQuantizeArgs {
  TensorView src;                            // (rows, cols) f32 / bf16
  TensorView dst, scale;                     // (rows, cols) e4m3 / e5m2; its scales
  TensorView dst_transposed, scale_transposed;  // (cols, rows) e4m3 / e5m2; its scales
  bool weight_blocks = false;
};

// dst = src^T for float8 codes, byte for byte: a tensorwise weight's W^T from its W (both layouts
// share the one scale, so transposing the codes gives exactly the codes a transposed cast writes).
struct TransposeArgs {
  TensorView src;  // (rows, cols) e4m3 / e5m2
  TensorView dst;  // (cols, rows), the same dtype
};

struct DequantizeArgs {
  TensorView src;      // (rows, cols) e4m3 / e5m2
  TensorView dst;      // (rows, cols) f32 / bf16
  TensorView scale;    // (1) or (rows) f32: dst = src / scale
  bool rowwise = false;
};

}  // namespace smelt
