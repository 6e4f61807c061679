// Llama-3 block ops: each forward and backward op as backend calls.
#include "model/llama_ops.h"

#include <cmath>

namespace smelt {

namespace {

using A = Activation;
using G = Gradient;
using W = LayerWeight;

const TensorView& act(const LayerViews& v, A a) { return v.activation[static_cast<int>(a)]; }
const TensorView& grad(const LayerViews& v, G g) { return v.gradient[static_cast<int>(g)]; }
const TensorView& weight(const LayerViews& v, W w) { return v.weight[static_cast<int>(w)]; }
const TensorView& weight_grad(const LayerViews& v, W w) { return v.weight_grad[static_cast<int>(w)]; }

bool float8(const LayerViews& v, const ModelContext& c, W w) {
  return c.float8_recipe != Float8Recipe::none && v.float8[static_cast<int>(w)];
}

// y = x @ W^T (+ addend)
void linear(Backend& backend, const TensorView& x, const TensorView& w, const TensorView& y,
            const TensorView& addend = {}) {
  GemmArgs g;
  g.a = x;
  g.b = w;
  g.transpose_b = true;
  g.out = y;
  g.addend = addend;
  backend.gemm(g);
}

// dx (=|+=) dy @ W ; dW (=|+=) dy^T @ x
void linear_backward(Backend& backend, const TensorView& x, const TensorView& w, const TensorView& dy,
                     const TensorView& dx, bool accumulate_dx, const TensorView& dw, bool accumulate_dw) {
  GemmArgs input_grad;
  input_grad.a = dy;
  input_grad.b = w;
  input_grad.out = dx;
  input_grad.accumulate = accumulate_dx;
  backend.gemm(input_grad);
  GemmArgs weight_grad_args;
  weight_grad_args.a = dy;
  weight_grad_args.transpose_a = true;
  weight_grad_args.b = x;
  weight_grad_args.out = dw;
  weight_grad_args.accumulate = accumulate_dw;
  backend.gemm(weight_grad_args);
}

// A block linear: in float8 when the plan says so, else in the compute dtype.
void linear(const LayerViews& v, const ModelContext& c, W w, const TensorView& x, const TensorView& y,
            const TensorView& addend = {}) {
  if (float8(v, c, w))
    float8_linear_forward(c.backend, c.float8_recipe, c.float8_scratch, v.float8_state[static_cast<int>(w)], x,
                          weight(v, w), y, addend, c.float8_reuse);
  else
    linear(c.backend, x, weight(v, w), y, addend);
}

void linear_backward(const LayerViews& v, const ModelContext& c, W w, const TensorView& x, const TensorView& dy,
                     const TensorView& dx, bool accumulate_dx) {
  if (float8(v, c, w))
    float8_linear_backward(c.backend, c.float8_recipe, c.float8_scratch, v.float8_state[static_cast<int>(w)], x,
                           weight(v, w), dy, dx, accumulate_dx, weight_grad(v, w), c.float8_reuse,
                           c.accumulate_gradients);
  else
    linear_backward(c.backend, x, weight(v, w), dy, dx, accumulate_dx, weight_grad(v, w), c.accumulate_gradients);
}

// A block norm's backward: its input gradient added to the residual gradient (with its amax
// when a float8 linear's dy), its weight gradient written or, accumulating, added to.
void norm_backward(const LayerViews& v, const ModelContext& c, A input, W norm, A rstd, G grad_out,
                   const TensorView& amax = {}) {
  RmsNormBackwardArgs r;
  r.input = act(v, input);
  r.weight = weight(v, norm);
  r.rstd = act(v, rstd);
  r.grad_out = grad(v, grad_out);
  r.grad_input = v.residual_gradient;
  r.accumulate = true;
  r.grad_weight = weight_grad(v, norm);
  r.accumulate_weight = c.accumulate_gradients;
  r.amax = amax;
  c.backend.rmsnorm_backward(r);
}

TensorView heads_view(const TensorView& x, int64_t heads, int64_t head_dim) {
  return x.reshaped(Shape{x.rows(), heads, head_dim});
}

TensorView bthd_view(const TensorView& x, const StepShape& s, int64_t heads, int64_t head_dim) {
  return x.reshaped(Shape{s.batch, s.seq_len, heads, head_dim});
}

void rope(const ModelContext& c, const TensorView& x, int64_t heads, bool inverse) {
  RopeArgs r;
  r.x = heads_view(x, heads, c.model.head_dim());
  r.frequencies = c.rope_frequencies;
  r.seq_len = c.shape.seq_len;
  r.inverse = inverse;
  c.backend.rope(r);
}

float attention_scale(const ModelConfig& m) { return 1.0f / std::sqrt(static_cast<float>(m.head_dim())); }

}  // namespace

void run_forward_op(ForwardOp op, const LayerViews& v, const ModelContext& c) {
  Backend& b = c.backend;
  const auto& m = c.model;
  switch (op) {
    case ForwardOp::attn_norm:
      b.rmsnorm_forward({act(v, A::layer_input), weight(v, W::attn_norm), act(v, A::attn_norm_out),
                         act(v, A::attn_rstd), static_cast<float>(m.norm_eps), v.attn_norm_amax});
      return;
    case ForwardOp::q_proj:
      linear(v, c, W::wq, act(v, A::attn_norm_out), act(v, A::query));
      rope(c, act(v, A::query), m.n_heads, false);
      return;
    case ForwardOp::k_proj:
      linear(v, c, W::wk, act(v, A::attn_norm_out), act(v, A::key));
      rope(c, act(v, A::key), m.n_kv_heads, false);
      return;
    case ForwardOp::v_proj: linear(v, c, W::wv, act(v, A::attn_norm_out), act(v, A::value)); return;
    case ForwardOp::attention: {
      AttentionForwardArgs a;
      a.q = bthd_view(act(v, A::query), c.shape, m.n_heads, m.head_dim());
      a.k = bthd_view(act(v, A::key), c.shape, m.n_kv_heads, m.head_dim());
      a.v = bthd_view(act(v, A::value), c.shape, m.n_kv_heads, m.head_dim());
      a.out = bthd_view(act(v, A::attn_out), c.shape, m.n_heads, m.head_dim());
      a.lse = act(v, A::attn_lse).reshaped(Shape{c.shape.batch, m.n_heads, c.shape.seq_len});
      a.scale = attention_scale(m);
      b.attention_forward(a);
      return;
    }
    case ForwardOp::o_proj:
      linear(v, c, W::wo, act(v, A::attn_out), act(v, A::attn_residual), act(v, A::layer_input));
      return;
    case ForwardOp::ffn_norm:
      b.rmsnorm_forward({act(v, A::attn_residual), weight(v, W::ffn_norm), act(v, A::ffn_norm_out),
                         act(v, A::ffn_rstd), static_cast<float>(m.norm_eps), v.ffn_norm_amax});
      return;
    case ForwardOp::gate_proj: linear(v, c, W::w1, act(v, A::ffn_norm_out), act(v, A::gate)); return;
    case ForwardOp::up_proj: linear(v, c, W::w3, act(v, A::ffn_norm_out), act(v, A::up)); return;
    case ForwardOp::swiglu:
      b.swiglu_forward({act(v, A::gate), act(v, A::up), act(v, A::swiglu_out), v.swiglu_amax});
      return;
    case ForwardOp::down_proj:
      linear(v, c, W::w2, act(v, A::swiglu_out), act(v, A::layer_output), act(v, A::attn_residual));
      return;
    case ForwardOp::count: break;
  }
  SMELT_CHECK(false, "unknown forward op");
}

void run_backward_op(BackwardOp op, const LayerViews& v, const ModelContext& c) {
  Backend& b = c.backend;
  const auto& m = c.model;
  switch (op) {
    case BackwardOp::down_proj:
      linear_backward(v, c, W::w2, act(v, A::swiglu_out), v.residual_gradient, grad(v, G::swiglu_out), false);
      return;
    case BackwardOp::swiglu:
      b.swiglu_backward({act(v, A::gate), act(v, A::up), grad(v, G::swiglu_out), grad(v, G::gate), grad(v, G::up),
                         v.gate_grad_amax, v.up_grad_amax});
      return;
    case BackwardOp::gate_proj:
      linear_backward(v, c, W::w1, act(v, A::ffn_norm_out), grad(v, G::gate), grad(v, G::ffn_norm_out), false);
      return;
    case BackwardOp::up_proj:
      linear_backward(v, c, W::w3, act(v, A::ffn_norm_out), grad(v, G::up), grad(v, G::ffn_norm_out), true);
      return;
    case BackwardOp::ffn_norm:  // its amax: wo's dy
      norm_backward(v, c, A::attn_residual, W::ffn_norm, A::ffn_rstd, G::ffn_norm_out, v.ffn_norm_grad_amax);
      return;
    case BackwardOp::o_proj:
      linear_backward(v, c, W::wo, act(v, A::attn_out), v.residual_gradient, grad(v, G::attn_out), false);
      return;
    case BackwardOp::attention: {
      AttentionBackwardArgs a;
      a.q = bthd_view(act(v, A::query), c.shape, m.n_heads, m.head_dim());
      a.k = bthd_view(act(v, A::key), c.shape, m.n_kv_heads, m.head_dim());
      a.v = bthd_view(act(v, A::value), c.shape, m.n_kv_heads, m.head_dim());
      a.out = bthd_view(act(v, A::attn_out), c.shape, m.n_heads, m.head_dim());
      a.lse = act(v, A::attn_lse).reshaped(Shape{c.shape.batch, m.n_heads, c.shape.seq_len});
      a.grad_out = bthd_view(grad(v, G::attn_out), c.shape, m.n_heads, m.head_dim());
      a.grad_q = bthd_view(grad(v, G::query), c.shape, m.n_heads, m.head_dim());
      a.grad_k = bthd_view(grad(v, G::key), c.shape, m.n_kv_heads, m.head_dim());
      a.grad_v = bthd_view(grad(v, G::value), c.shape, m.n_kv_heads, m.head_dim());
      a.scale = attention_scale(m);
      a.scratch = v.attention_scratch;
      b.attention_backward(a);
      return;
    }
    case BackwardOp::q_proj:
      rope(c, grad(v, G::query), m.n_heads, true);
      linear_backward(v, c, W::wq, act(v, A::attn_norm_out), grad(v, G::query), grad(v, G::attn_norm_out),
                      false);
      return;
    case BackwardOp::k_proj:
      rope(c, grad(v, G::key), m.n_kv_heads, true);
      linear_backward(v, c, W::wk, act(v, A::attn_norm_out), grad(v, G::key), grad(v, G::attn_norm_out),
                      true);
      return;
    case BackwardOp::v_proj:
      linear_backward(v, c, W::wv, act(v, A::attn_norm_out), grad(v, G::value), grad(v, G::attn_norm_out),
                      true);
      return;
    case BackwardOp::attn_norm:
      norm_backward(v, c, A::layer_input, W::attn_norm, A::attn_rstd, G::attn_norm_out);
      return;
    case BackwardOp::count: break;
  }
  SMELT_CHECK(false, "unknown backward op");
}

void embedding_forward(const HeadViews& v, const ModelContext& c) {
  c.backend.embedding_forward({v.tokens, v.embedding, v.first_residual});
}

void final_norm_forward(const HeadViews& v, const ModelContext& c) {
  c.backend.rmsnorm_forward(
      {v.final_input, v.final_norm_weight, v.final_norm_out, v.final_rstd, static_cast<float>(c.model.norm_eps)});
}

void output_head(const HeadViews& v, const ModelContext& c) {
  Backend& b = c.backend;
  const int64_t tokens = v.final_norm_out.rows();
  const int64_t chunk = v.logits.rows();
  SMELT_CHECK(v.loss_only || v.output_grad.dtype != DType::bf16 || (chunk >= tokens && c.microbatches == 1),
              "output head: a bf16 output-projection gradient needs one loss chunk and one microbatch (it is written "
              "once, never added to)");
  for (int64_t first = 0; first < tokens; first += chunk) {
    const int64_t rows = std::min(chunk, tokens - first);
    TensorView hidden = v.final_norm_out.row_slice(first, rows);
    TensorView logits = v.logits.row_slice(0, rows);
    TensorView grad_logits = v.grad_logits.row_slice(0, rows);
    linear(b, hidden, v.output_weight, logits);
    CrossEntropyArgs ce;
    ce.logits = logits;
    ce.targets = v.targets.reshaped(Shape{tokens, 1}).row_slice(first, rows).reshaped(Shape{rows});
    ce.losses = v.losses.reshaped(Shape{tokens, 1}).row_slice(first, rows).reshaped(Shape{rows});
    ce.grad_logits = grad_logits;
    ce.grad_scale = 1.0f / static_cast<float>(tokens * c.microbatches);  // the step's mean over every microbatch
    b.cross_entropy(ce);
    if (v.loss_only) continue;
    GemmArgs input_grad;  // d hidden = d logits @ W_out
    input_grad.a = grad_logits;
    input_grad.b = v.output_weight;
    input_grad.out = v.final_norm_out_grad.row_slice(first, rows);
    b.gemm(input_grad);
    GemmArgs weight_grad_args;  // d W_out (+)= d logits^T @ hidden
    weight_grad_args.a = grad_logits;
    weight_grad_args.transpose_a = true;
    weight_grad_args.b = hidden;
    weight_grad_args.out = v.output_grad;
    weight_grad_args.accumulate = first > 0 || c.accumulate_gradients;
    b.gemm(weight_grad_args);
  }
}

void final_norm_backward(const HeadViews& v, const ModelContext& c) {
  RmsNormBackwardArgs r;
  r.input = v.final_input;
  r.weight = v.final_norm_weight;
  r.rstd = v.final_rstd;
  r.grad_out = v.final_norm_out_grad;
  r.grad_input = v.residual_gradient;
  r.accumulate = false;
  r.grad_weight = v.final_norm_grad;
  r.accumulate_weight = c.accumulate_gradients;
  c.backend.rmsnorm_backward(r);
}

void embedding_backward(const HeadViews& v, const ModelContext& c) {
  c.backend.embedding_backward({v.tokens, v.residual_gradient, v.embedding_grad, c.accumulate_gradients});
}

}  // namespace smelt
