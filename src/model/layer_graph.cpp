// Tables of the Llama-3 block: op inputs/outputs, tensor shapes, FLOPs.
#include "model/layer_graph.h"

#include "core/error.h"

namespace smelt {

using A = Activation;
using G = Gradient;

const ForwardOpInfo& forward_op_info(ForwardOp op) {
  static const ForwardOpInfo table[kForwardOpCount] = {
      {"attention_norm", {A::layer_input}, {A::attn_norm_out, A::attn_rstd}, false},
      {"attention.wq", {A::attn_norm_out}, {A::query}, true},
      {"attention.wk", {A::attn_norm_out}, {A::key}, true},
      {"attention.wv", {A::attn_norm_out}, {A::value}, true},
      {"attention.sdpa", {A::query, A::key, A::value}, {A::attn_out, A::attn_lse}, false},
      {"attention.wo", {A::attn_out, A::layer_input}, {A::attn_residual}, true},
      {"ffn_norm", {A::attn_residual}, {A::ffn_norm_out, A::ffn_rstd}, false},
      {"feed_forward.w1", {A::ffn_norm_out}, {A::gate}, true},
      {"feed_forward.w3", {A::ffn_norm_out}, {A::up}, true},
      {"feed_forward.swiglu", {A::gate, A::up}, {A::swiglu_out}, false},
      {"feed_forward.w2", {A::swiglu_out, A::attn_residual}, {A::layer_output}, true},
  };
  return table[static_cast<int>(op)];
}

const BackwardOpInfo& backward_op_info(BackwardOp op) {
  static const BackwardOpInfo table[kBackwardOpCount] = {
      {"feed_forward.w2", {A::swiglu_out}, {}, {G::swiglu_out}},
      {"feed_forward.swiglu", {A::gate, A::up}, {G::swiglu_out}, {G::gate, G::up}},
      {"feed_forward.w1", {A::ffn_norm_out}, {G::gate}, {G::ffn_norm_out}},
      {"feed_forward.w3", {A::ffn_norm_out}, {G::up, G::ffn_norm_out}, {G::ffn_norm_out}},
      {"ffn_norm", {A::attn_residual, A::ffn_rstd}, {G::ffn_norm_out}, {}},
      {"attention.wo", {A::attn_out}, {}, {G::attn_out}},
      {"attention.sdpa", {A::query, A::key, A::value, A::attn_out, A::attn_lse}, {G::attn_out}, {G::query, G::key, G::value}},
      {"attention.wq", {A::attn_norm_out}, {G::query}, {G::attn_norm_out}},
      {"attention.wk", {A::attn_norm_out}, {G::key, G::attn_norm_out}, {G::attn_norm_out}},
      {"attention.wv", {A::attn_norm_out}, {G::value, G::attn_norm_out}, {G::attn_norm_out}},
      {"attention_norm", {A::layer_input, A::attn_rstd}, {G::attn_norm_out}, {}},
  };
  return table[static_cast<int>(op)];
}

std::optional<LayerWeight> linear_weight(ForwardOp op) {
  switch (op) {
    case ForwardOp::q_proj: return LayerWeight::wq;
    case ForwardOp::k_proj: return LayerWeight::wk;
    case ForwardOp::v_proj: return LayerWeight::wv;
    case ForwardOp::o_proj: return LayerWeight::wo;
    case ForwardOp::gate_proj: return LayerWeight::w1;
    case ForwardOp::up_proj: return LayerWeight::w3;
    case ForwardOp::down_proj: return LayerWeight::w2;
    default: return std::nullopt;
  }
}

ForwardOp forward_op_of(BackwardOp op) {
  switch (op) {
    case BackwardOp::down_proj: return ForwardOp::down_proj;
    case BackwardOp::swiglu: return ForwardOp::swiglu;
    case BackwardOp::gate_proj: return ForwardOp::gate_proj;
    case BackwardOp::up_proj: return ForwardOp::up_proj;
    case BackwardOp::ffn_norm: return ForwardOp::ffn_norm;
    case BackwardOp::o_proj: return ForwardOp::o_proj;
    case BackwardOp::attention: return ForwardOp::attention;
    case BackwardOp::q_proj: return ForwardOp::q_proj;
    case BackwardOp::k_proj: return ForwardOp::k_proj;
    case BackwardOp::v_proj: return ForwardOp::v_proj;
    case BackwardOp::attn_norm: return ForwardOp::attn_norm;
    case BackwardOp::count: break;
  }
  SMELT_CHECK(false, "bad backward op");
}

Activation linear_input(LayerWeight w) {
  switch (w) {
    case LayerWeight::wq:
    case LayerWeight::wk:
    case LayerWeight::wv: return A::attn_norm_out;
    case LayerWeight::wo: return A::attn_out;
    case LayerWeight::w1:
    case LayerWeight::w3: return A::ffn_norm_out;
    case LayerWeight::w2: return A::swiglu_out;
    default: break;
  }
  SMELT_CHECK(false, "linear_input: " + std::string(layer_weight_name(w)) + " is not a linear");
}

std::string_view activation_name(Activation a) {
  static const std::string_view names[kActivationCount] = {
      "input",    "attention_norm.out", "attention_norm.rstd", "attention.q",    "attention.k",
      "attention.v", "attention.out",   "attention.lse",       "attention.residual", "ffn_norm.out",
      "ffn_norm.rstd", "feed_forward.gate", "feed_forward.up", "feed_forward.swiglu", "output"};
  return names[static_cast<int>(a)];
}

std::string_view gradient_name(Gradient g) {
  static const std::string_view names[kGradientCount] = {
      "grad.feed_forward.swiglu", "grad.feed_forward.gate", "grad.feed_forward.up",
      "grad.ffn_norm.out",        "grad.attention.out",     "grad.attention.q",
      "grad.attention.k",         "grad.attention.v",       "grad.attention_norm.out"};
  return names[static_cast<int>(g)];
}

std::string_view layer_weight_name(LayerWeight w) {
  static const std::string_view names[kLayerWeightCount] = {
      "attention_norm.weight", "attention.wq.weight",    "attention.wk.weight",
      "attention.wv.weight",   "attention.wo.weight",    "ffn_norm.weight",
      "feed_forward.w1.weight", "feed_forward.w3.weight", "feed_forward.w2.weight"};
  return names[static_cast<int>(w)];
}

TensorSpec activation_spec(Activation a, const ModelConfig& m, const StepShape& s, DType compute) {
  const int64_t n = s.tokens();
  switch (a) {
    case A::layer_input:
    case A::attn_norm_out:
    case A::attn_residual:
    case A::ffn_norm_out:
    case A::layer_output: return {compute, {n, m.dim}};
    case A::attn_rstd:
    case A::ffn_rstd: return {statistics_dtype(compute), {n, 1}};
    case A::query:
    case A::attn_out: return {compute, {n, m.n_heads * m.head_dim()}};
    case A::key:
    case A::value: return {compute, {n, m.kv_dim()}};
    case A::attn_lse: return {statistics_dtype(compute), {s.batch * m.n_heads, s.seq_len}};
    case A::gate:
    case A::up:
    case A::swiglu_out: return {compute, {n, m.ffn_dim}};
    case A::count: break;
  }
  SMELT_CHECK(false, "bad activation");
}

TensorSpec gradient_spec(Gradient g, const ModelConfig& m, const StepShape& s, DType compute) {
  const int64_t n = s.tokens();
  switch (g) {
    case G::swiglu_out:
    case G::gate:
    case G::up: return {compute, {n, m.ffn_dim}};
    case G::ffn_norm_out:
    case G::attn_norm_out: return {compute, {n, m.dim}};
    case G::attn_out:
    case G::query: return {compute, {n, m.n_heads * m.head_dim()}};
    case G::key:
    case G::value: return {compute, {n, m.kv_dim()}};
    case G::count: break;
  }
  SMELT_CHECK(false, "bad gradient");
}

TensorSpec layer_weight_spec(LayerWeight w, const ModelConfig& m) {
  switch (w) {
    case LayerWeight::attn_norm:
    case LayerWeight::ffn_norm: return {DType::f32, {1, m.dim}};
    case LayerWeight::wq:
    case LayerWeight::wo: return {DType::f32, {m.dim, m.dim}};
    case LayerWeight::wk:
    case LayerWeight::wv: return {DType::f32, {m.kv_dim(), m.dim}};
    case LayerWeight::w1:
    case LayerWeight::w3: return {DType::f32, {m.ffn_dim, m.dim}};
    case LayerWeight::w2: return {DType::f32, {m.dim, m.ffn_dim}};
    case LayerWeight::count: break;
  }
  SMELT_CHECK(false, "bad weight");
}

static double attention_forward_flops(const ModelConfig& m, const StepShape& s) {
  // QK^T and PV over the causal half: 4 * B * H * T^2 * Dh / 2.
  return 2.0 * static_cast<double>(s.batch * m.n_heads) * static_cast<double>(s.seq_len) *
         static_cast<double>(s.seq_len) * static_cast<double>(m.head_dim());
}

double forward_op_flops(ForwardOp op, const ModelConfig& m, const StepShape& s) {
  const double n = static_cast<double>(s.tokens());
  const double d = static_cast<double>(m.dim), kv = static_cast<double>(m.kv_dim()), f = static_cast<double>(m.ffn_dim);
  switch (op) {
    case ForwardOp::q_proj:
    case ForwardOp::o_proj: return 2 * n * d * d;
    case ForwardOp::k_proj:
    case ForwardOp::v_proj: return 2 * n * d * kv;
    case ForwardOp::gate_proj:
    case ForwardOp::up_proj:
    case ForwardOp::down_proj: return 2 * n * d * f;
    case ForwardOp::attention: return attention_forward_flops(m, s);
    default: return 0;
  }
}

double backward_op_flops(BackwardOp op, const ModelConfig& m, const StepShape& s) {
  switch (op) {
    case BackwardOp::down_proj: return 2 * forward_op_flops(ForwardOp::down_proj, m, s);
    case BackwardOp::gate_proj: return 2 * forward_op_flops(ForwardOp::gate_proj, m, s);
    case BackwardOp::up_proj: return 2 * forward_op_flops(ForwardOp::up_proj, m, s);
    case BackwardOp::o_proj: return 2 * forward_op_flops(ForwardOp::o_proj, m, s);
    case BackwardOp::q_proj: return 2 * forward_op_flops(ForwardOp::q_proj, m, s);
    case BackwardOp::k_proj: return 2 * forward_op_flops(ForwardOp::k_proj, m, s);
    case BackwardOp::v_proj: return 2 * forward_op_flops(ForwardOp::v_proj, m, s);
    case BackwardOp::attention: return 2.5 * attention_forward_flops(m, s);
    default: return 0;
  }
}

}  // namespace smelt
