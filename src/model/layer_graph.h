// The Llama-3 block as data: the activations one block produces, the forward
// ops that produce them, and the backward ops that read them. The planner
// decides from this table what to keep and what to recompute; the model code
// (llama_ops.cpp) runs one op at a time on views the planner hands it.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"

namespace smelt {

// Activations of one block. layer_input is the residual stream entering the
// block (the previous block's output); layer_output is the next block's input.
enum class Activation : uint8_t {
  layer_input,    // (N, D)
  attn_norm_out,  // (N, D)       rmsnorm(layer_input)
  attn_rstd,      // (N) f32
  query,          // (N, H*Dh)    after RoPE
  key,            // (N, KV*Dh)   after RoPE
  value,          // (N, KV*Dh)
  attn_out,       // (N, H*Dh)
  attn_lse,       // (B, H, T) f32
  attn_residual,  // (N, D)       layer_input + attn_out @ wo^T
  ffn_norm_out,   // (N, D)
  ffn_rstd,       // (N) f32
  gate,           // (N, F)       ffn_norm_out @ w1^T
  up,             // (N, F)       ffn_norm_out @ w3^T
  swiglu_out,     // (N, F)       silu(gate) * up
  layer_output,   // (N, D)       attn_residual + swiglu_out @ w2^T
  count,
};
constexpr int kActivationCount = static_cast<int>(Activation::count);

// Gradients flowing through one block's backward (temporaries). The residual
// gradient is one buffer for the whole backward, accumulated in place.
enum class Gradient : uint8_t {
  swiglu_out,     // (N, F)
  gate,           // (N, F)
  up,             // (N, F)
  ffn_norm_out,   // (N, D)
  attn_out,       // (N, H*Dh)
  query,          // (N, H*Dh)
  key,            // (N, KV*Dh)
  value,          // (N, KV*Dh)
  attn_norm_out,  // (N, D)
  count,
};
constexpr int kGradientCount = static_cast<int>(Gradient::count);

// Weights of one block, in their order in the flat parameter buffer.
enum class LayerWeight : uint8_t { attn_norm, wq, wk, wv, wo, ffn_norm, w1, w3, w2, count };
constexpr int kLayerWeightCount = static_cast<int>(LayerWeight::count);
// The block's linears (q, k, v, o, w1, w3, w2): every weight but the two norms.
constexpr bool is_linear(LayerWeight weight) {
  return weight != LayerWeight::attn_norm && weight != LayerWeight::ffn_norm;
}

enum class ForwardOp : uint8_t {
  attn_norm,   // layer_input -> attn_norm_out, attn_rstd
  q_proj,      // attn_norm_out -> query (GEMM, then RoPE in place)
  k_proj,      // attn_norm_out -> key (GEMM, then RoPE in place)
  v_proj,      // attn_norm_out -> value
  attention,   // query, key, value -> attn_out, attn_lse
  o_proj,      // attn_out, layer_input -> attn_residual (GEMM with the residual as addend)
  ffn_norm,    // attn_residual -> ffn_norm_out, ffn_rstd
  gate_proj,   // ffn_norm_out -> gate
  up_proj,     // ffn_norm_out -> up
  swiglu,      // gate, up -> swiglu_out
  down_proj,   // swiglu_out, attn_residual -> layer_output
  count,
};
constexpr int kForwardOpCount = static_cast<int>(ForwardOp::count);

enum class BackwardOp : uint8_t {
  down_proj,  // d residual, swiglu_out -> d swiglu_out, grad w2
  swiglu,     // d swiglu_out, gate, up -> d gate, d up
  gate_proj,  // d gate, ffn_norm_out -> d ffn_norm_out (written), grad w1
  up_proj,    // d up, ffn_norm_out -> d ffn_norm_out (added), grad w3
  ffn_norm,   // d ffn_norm_out, attn_residual, ffn_rstd -> d residual (added), grad ffn_norm
  o_proj,     // d residual, attn_out -> d attn_out, grad wo
  attention,  // d attn_out, query, key, value, attn_out, attn_lse -> d query, d key, d value
  q_proj,     // d query (RoPE inverse in place), attn_norm_out -> d attn_norm_out (written), grad wq
  k_proj,     // d key (RoPE inverse in place), attn_norm_out -> d attn_norm_out (added), grad wk
  v_proj,     // d value, attn_norm_out -> d attn_norm_out (added), grad wv
  attn_norm,  // d attn_norm_out, layer_input, attn_rstd -> d residual (added), grad attn_norm
  count,
};
constexpr int kBackwardOpCount = static_cast<int>(BackwardOp::count);

struct ForwardOpInfo {
  std::string_view name;
  std::vector<Activation> inputs;
  std::vector<Activation> outputs;
  bool is_matmul;  // for selective-op's "every second matmul" rule
};

struct BackwardOpInfo {
  std::string_view name;
  std::vector<Activation> reads;
  std::vector<Gradient> gradient_reads;
  std::vector<Gradient> gradient_writes;
};

const ForwardOpInfo& forward_op_info(ForwardOp op);
const BackwardOpInfo& backward_op_info(BackwardOp op);
// The weight of a linear's forward op (nullopt for the other ops), and the forward op a backward
// op differentiates.
std::optional<LayerWeight> linear_weight(ForwardOp op);
ForwardOp forward_op_of(BackwardOp op);
// The activation a block linear reads as its input x (y = x W^T).
Activation linear_input(LayerWeight w);
std::string_view activation_name(Activation a);
std::string_view gradient_name(Gradient g);
std::string_view layer_weight_name(LayerWeight w);  // "attention_norm", "attention.wq", ... (torchtitan names)

// Geometry of one step: tokens and shapes shared by every op.
struct StepShape {
  int64_t batch = 0, seq_len = 0;
  int64_t tokens() const { return batch * seq_len; }
};

// Statistics (norm rstd, attention lse, logits, losses) and master weights / weight
// gradients are f32, or f64 when the whole computation is f64 (finite-difference tests).
inline DType statistics_dtype(DType compute) { return compute == DType::f64 ? DType::f64 : DType::f32; }
inline DType master_dtype(DType compute) { return compute == DType::f64 ? DType::f64 : DType::f32; }

// Shape and dtype of an activation / gradient given the compute dtype (statistics are f32).
struct TensorSpec {
  DType dtype;
  std::array<int64_t, 2> dims;  // rows, cols (lse is stored as (B*H, T))
  size_t bytes() const { return static_cast<size_t>(dims[0] * dims[1]) * dtype_size(dtype); }
};
TensorSpec activation_spec(Activation a, const ModelConfig& model, const StepShape& step, DType compute);
TensorSpec gradient_spec(Gradient g, const ModelConfig& model, const StepShape& step, DType compute);
TensorSpec layer_weight_spec(LayerWeight w, const ModelConfig& model);  // dtype field unused (f32 master)

// Matmul / attention FLOPs of one forward op (the causal half for attention), and of
// one backward op; element-wise ops count 0 here (their cost is memory traffic).
double forward_op_flops(ForwardOp op, const ModelConfig& model, const StepShape& step);
double backward_op_flops(BackwardOp op, const ModelConfig& model, const StepShape& step);

}  // namespace smelt
