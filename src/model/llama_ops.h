// The math of the Llama-3 model, one op at a time, on views the planner hands
// in: block forward and backward ops, the embedding, the final norm and the
// chunked output head with cross-entropy. Written as if on one device; what is
// kept, recomputed or sharded is decided outside (plan/, dist/).
#pragma once
#include <array>

#include "model/fp8_linear.h"
#include "model/layer_graph.h"
#include "ops/backend.h"

namespace smelt {

struct ModelContext {
  const ModelConfig& model;
  StepShape shape;
  Backend& backend;
  TensorView rope_frequencies;  // (T, Dh/2, 2) f32
  Float8Recipe float8_recipe = Float8Recipe::none;
  Float8Scratch float8_scratch;  // shared by every float8 linear
  Float8InputReuse* float8_reuse = nullptr;  // null: every float8 linear quantises its own input
  // Gradient accumulation: a step of `microbatches` forward-backward passes. The loss gradient of
  // each weighs 1 / (its tokens x microbatches); accumulate_gradients: this pass adds its parameter
  // gradients to those already there (every microbatch after a step's first).
  int64_t microbatches = 1;
  bool accumulate_gradients = false;
};

// Views one block op needs; unused entries stay empty.
struct LayerViews {
  std::array<TensorView, kActivationCount> activation;
  std::array<TensorView, kGradientCount> gradient;
  TensorView residual_gradient;                           // (N, D): d loss / d residual stream
  std::array<TensorView, kLayerWeightCount> weight;       // compute dtype
  std::array<TensorView, kLayerWeightCount> weight_grad;  // f32
  std::array<bool, kLayerWeightCount> float8{};           // linears whose GEMMs run in float8
  std::array<Float8LinearState, kLayerWeightCount> float8_state;  // their weight copies and saved amax
  TensorView attention_scratch;  // backward: the attention backward's planned scratch (empty: the workspace's)
  // Float8 amax taken by their producers ([float8] fusion = "full", tensorwise; empty otherwise):
  // SwiGLU's output (w2's x), and its gradients d gate and d up (w1's and w3's dy); the norms'
  // outputs (wq's, wk's and wv's x; w1's and w3's x); the residual gradient after the FFN norm's
  // backward (wo's dy). The linears' float8_state points at the same floats.
  TensorView swiglu_amax, gate_grad_amax, up_grad_amax;
  TensorView attn_norm_amax, ffn_norm_amax, ffn_norm_grad_amax;
};

void run_forward_op(ForwardOp op, const LayerViews& views, const ModelContext& context);
void run_backward_op(BackwardOp op, const LayerViews& views, const ModelContext& context);

struct HeadViews {
  TensorView tokens;              // (N) i32
  TensorView targets;             // (N) i32
  TensorView embedding;           // (V, D) compute dtype
  TensorView embedding_grad;      // (V, D) f32
  TensorView final_input;         // (N, D): the last block's output
  TensorView final_norm_weight;   // (D) compute dtype
  TensorView final_norm_grad;     // (D) f32
  TensorView final_norm_out;      // (N, D)
  TensorView final_rstd;          // (N) f32
  TensorView output_weight;       // (V, D) compute dtype
  TensorView output_grad;         // (V, D) f32
  TensorView logits;              // (chunk, V) f32 scratch
  TensorView grad_logits;         // (chunk, V) compute dtype scratch (may alias logits)
  TensorView final_norm_out_grad; // (N, D)
  TensorView losses;              // (N) f32
  TensorView residual_gradient;   // (N, D)
  TensorView first_residual;      // (N, D): embedding output = block 0 input
  bool loss_only = false;         // forward-only plans: the output head computes the losses alone
};

void embedding_forward(const HeadViews& views, const ModelContext& context);
void final_norm_forward(const HeadViews& views, const ModelContext& context);
// Output projection and cross-entropy, forward and backward, `logits.rows()` tokens at a time:
// the full (N, V) logits never exist. Writes per-token losses, d final_norm_out and d output weight
// (with views.loss_only, the losses alone: no gradient views are read or written).
void output_head(const HeadViews& views, const ModelContext& context);
void final_norm_backward(const HeadViews& views, const ModelContext& context);
void embedding_backward(const HeadViews& views, const ModelContext& context);

}  // namespace smelt
