// CPU causal grouped-query attention, forward and backward, exact and deterministic.
// Query head h reads key/value head h / (H / KV). Forward keeps one row of scores
// per (batch, head) task; backward recomputes P from the saved log-sum-exp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cpu/kernels.h"
#include "cpu/storage.h"

namespace smelt::cpu {
namespace {

struct AttentionShape {
  int64_t batch = 0, seq_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t group() const { return heads / kv_heads; }
};

// Scratch per task, in accumulator elements.
int64_t forward_task_elements(int64_t seq_len, int64_t head_dim) { return seq_len + 2 * head_dim; }
int64_t backward_task_elements(int64_t seq_len, int64_t head_dim) { return 3 * head_dim + 2 * seq_len * head_dim; }

AttentionShape validate(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& lse, const char* op) {
  for (const TensorView* t : {&q, &k, &v, &out, &lse}) expect_host(*t, op, "argument");
  if (q.shape.rank != 4 || k.shape.rank != 4)
    fail(ErrorKind::internal, std::string(op) + ": expected q (B, T, H, Dh) and k (B, T, KV, Dh), found q " + q.str() +
                                  " and k " + k.str() + "; reshape them to rank 4 before the call");
  AttentionShape s{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  if (k.shape[0] != s.batch || k.shape[1] != s.seq_len || k.shape[3] != s.head_dim || s.kv_heads <= 0 ||
      s.heads % s.kv_heads != 0)
    fail(ErrorKind::internal, std::string(op) + ": expected k of (B, T, KV, Dh) with KV dividing H for q " + q.str() +
                                  ", found k " + k.str() + "; check the model's head counts");
  expect_same_shape(v, k, op, "v", "k");
  expect_same_shape(out, q, op, "out", "q");
  expect_numel(lse, s.batch * s.heads * s.seq_len, op, "lse");
  for (const TensorView* t : {&k, &v, &out}) expect_dtype(*t, q.dtype, op, "k/v/out");
  return s;
}

template <typename Storage>
void check_workspace(const TensorView& workspace, int64_t elements, const char* op) {
  const size_t need = size_t(elements) * sizeof(Accumulator<Storage>);
  if (workspace.empty() || workspace.bytes() < need)
    fail(ErrorKind::internal, std::string(op) + ": expected a workspace of at least " + std::to_string(need) +
                                  " bytes, found " + std::to_string(workspace.empty() ? 0 : workspace.bytes()) +
                                  "; size it with workspace_bytes() for this batch, sequence length and head count");
}

template <typename Acc, typename Storage>
inline Acc dot(const Acc* a, const Storage* b, int64_t n) {
  Acc sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < n; ++d) sum += a[d] * load(b, d);
  return sum;
}

template <typename Storage>
void forward(const AttentionForwardArgs& args, const AttentionShape& s, TensorView workspace) {
  using Acc = Accumulator<Storage>;
  const int64_t T = s.seq_len, Dh = s.head_dim, H = s.heads, KV = s.kv_heads, group = s.group();
  const Storage* q = args.q.as<Storage>();
  const Storage* k = args.k.as<Storage>();
  const Storage* v = args.v.as<Storage>();
  Storage* out = args.out.as<Storage>();
  Acc* lse = args.lse.as<Acc>();
  const Acc scale = Acc(args.scale);
  const int64_t per_task = forward_task_elements(T, Dh), tasks = s.batch * H;
  Acc* scratch = workspace.as<Acc>();
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t b = task / H, h = task % H, kv_head = h / group;
    Acc* scores = scratch + task * per_task;  // (T) one row of scores, then probabilities
    Acc* query = scores + T;                  // (Dh)
    Acc* accumulated = query + Dh;            // (Dh)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t row = (b * T + i) * H + h;
      for (int64_t d = 0; d < Dh; ++d) query[d] = load(q, row * Dh + d);
      Acc maximum = -std::numeric_limits<Acc>::infinity();
      for (int64_t j = 0; j <= i; ++j) {
        scores[j] = scale * dot(query, k + ((b * T + j) * KV + kv_head) * Dh, Dh);
        maximum = std::max(maximum, scores[j]);
      }
      Acc total = 0;
      for (int64_t d = 0; d < Dh; ++d) accumulated[d] = 0;
      for (int64_t j = 0; j <= i; ++j) {
        const Acc p = std::exp(scores[j] - maximum);
        total += p;
        const Storage* value = v + ((b * T + j) * KV + kv_head) * Dh;
        for (int64_t d = 0; d < Dh; ++d) accumulated[d] += p * load(value, d);
      }
      const Acc inverse = Acc(1) / total;
      for (int64_t d = 0; d < Dh; ++d) store(out, row * Dh + d, accumulated[d] * inverse);
      lse[(b * H + h) * T + i] = maximum + std::log(total);
    }
  }
}

// Per (batch, kv head) task, over its query heads and rows in order:
// P = exp(S*scale - lse), dV += P^T dO, dP = dO V^T, D = rowsum(dO * O),
// dS = P * (dP - D), dQ = scale dS K, dK += scale dS^T Q.
template <typename Storage>
void backward(const AttentionBackwardArgs& args, const AttentionShape& s, TensorView workspace) {
  using Acc = Accumulator<Storage>;
  const int64_t T = s.seq_len, Dh = s.head_dim, H = s.heads, KV = s.kv_heads, group = s.group();
  const Storage* q = args.q.as<Storage>();
  const Storage* k = args.k.as<Storage>();
  const Storage* v = args.v.as<Storage>();
  const Storage* out = args.out.as<Storage>();
  const Storage* grad_out = args.grad_out.as<Storage>();
  const Acc* lse = args.lse.as<Acc>();
  Storage* grad_q = args.grad_q.as<Storage>();
  Storage* grad_k = args.grad_k.as<Storage>();
  Storage* grad_v = args.grad_v.as<Storage>();
  const Acc scale = Acc(args.scale);
  const int64_t per_task = backward_task_elements(T, Dh), tasks = s.batch * KV;
  Acc* scratch = workspace.as<Acc>();
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t b = task / KV, kv_head = task % KV;
    Acc* query = scratch + task * per_task;  // (Dh)
    Acc* grad_out_row = query + Dh;          // (Dh)
    Acc* grad_query = grad_out_row + Dh;     // (Dh)
    Acc* grad_key = grad_query + Dh;         // (T, Dh)
    Acc* grad_value = grad_key + T * Dh;     // (T, Dh)
    for (int64_t e = 0; e < 2 * T * Dh; ++e) grad_key[e] = 0;
    for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const int64_t row = (b * T + i) * H + h;
        for (int64_t d = 0; d < Dh; ++d) {
          query[d] = load(q, row * Dh + d);
          grad_out_row[d] = load(grad_out, row * Dh + d);
          grad_query[d] = 0;
        }
        const Acc delta = dot(grad_out_row, out + row * Dh, Dh);
        const Acc row_lse = lse[(b * H + h) * T + i];
        for (int64_t j = 0; j <= i; ++j) {
          const Storage* key = k + ((b * T + j) * KV + kv_head) * Dh;
          const Storage* value = v + ((b * T + j) * KV + kv_head) * Dh;
          const Acc p = std::exp(scale * dot(query, key, Dh) - row_lse);
          const Acc grad_p = dot(grad_out_row, value, Dh);
          const Acc grad_score = scale * p * (grad_p - delta);
          Acc* grad_value_row = grad_value + j * Dh;
          Acc* grad_key_row = grad_key + j * Dh;
          for (int64_t d = 0; d < Dh; ++d) {
            grad_value_row[d] += p * grad_out_row[d];
            grad_query[d] += grad_score * load(key, d);
            grad_key_row[d] += grad_score * query[d];
          }
        }
        for (int64_t d = 0; d < Dh; ++d) store(grad_q, row * Dh + d, grad_query[d]);
      }
    }
    for (int64_t j = 0; j < T; ++j) {
      const int64_t row = (b * T + j) * KV + kv_head;
      for (int64_t d = 0; d < Dh; ++d) {
        store(grad_k, row * Dh + d, grad_key[j * Dh + d]);
        store(grad_v, row * Dh + d, grad_value[j * Dh + d]);
      }
    }
  }
}

}  // namespace

size_t attention_workspace_bytes(const WorkspaceShape& shape) {
  const size_t element = shape.compute_dtype == DType::f64 ? sizeof(double) : sizeof(float);
  const int64_t forward_elements = shape.batch * shape.heads * forward_task_elements(shape.seq_len, shape.head_dim);
  const int64_t backward_elements = shape.batch * shape.kv_heads * backward_task_elements(shape.seq_len, shape.head_dim);
  return size_t(std::max(forward_elements, backward_elements)) * element;
}

void attention_forward(const AttentionForwardArgs& args, TensorView workspace) {
  const char* op = "attention_forward";
  const AttentionShape s = validate(args.q, args.k, args.v, args.out, args.lse, op);
  dispatch_activation(args.q.dtype, op, [&](auto storage) {
    using Storage = decltype(storage);
    expect_dtype(args.lse, storage_dtype<Accumulator<Storage>>(), op, "lse");
    check_workspace<Storage>(workspace, s.batch * s.heads * forward_task_elements(s.seq_len, s.head_dim), op);
    forward<Storage>(args, s, workspace);
  });
}

void attention_backward(const AttentionBackwardArgs& args, TensorView workspace) {
  const char* op = "attention_backward";
  const AttentionShape s = validate(args.q, args.k, args.v, args.out, args.lse, op);
  for (const TensorView* t : {&args.grad_out, &args.grad_q, &args.grad_k, &args.grad_v}) expect_host(*t, op, "gradient");
  expect_same_shape(args.grad_out, args.q, op, "grad_out", "q");
  expect_same_shape(args.grad_q, args.q, op, "grad_q", "q");
  expect_same_shape(args.grad_k, args.k, op, "grad_k", "k");
  expect_same_shape(args.grad_v, args.k, op, "grad_v", "k");
  for (const TensorView* t : {&args.grad_out, &args.grad_q, &args.grad_k, &args.grad_v})
    expect_dtype(*t, args.q.dtype, op, "gradient");
  dispatch_activation(args.q.dtype, op, [&](auto storage) {
    using Storage = decltype(storage);
    expect_dtype(args.lse, storage_dtype<Accumulator<Storage>>(), op, "lse");
    check_workspace<Storage>(workspace, s.batch * s.kv_heads * backward_task_elements(s.seq_len, s.head_dim), op);
    backward<Storage>(args, s, workspace);
  });
}

}  // namespace smelt::cpu
