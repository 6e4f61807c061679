// Causal grouped-query attention through cuDNN's fused flash attention, built with the
// cuDNN 9 backend graph API (matmul, scale, causal mask, softmax with statistics, matmul;
// and the matching backward graph). K/V are read with their own head count: no repeats.
// Plans are built once per shape and cached; every launch is asynchronous on the stream.
#include <cudnn.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>
#include <vector>

#include "cuda/attention_cudnn.h"

namespace smelt::cuda {
namespace {

void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS)
    fail(ErrorKind::device, std::string("cuDNN attention: ") + what + " returned " + cudnnGetErrorString(status) +
                                "; expected CUDNN_STATUS_SUCCESS. cuDNN 9 with a Hopper or newer GPU is needed for "
                                "the fused kernels; set the attention implementation to `tiled` to run without them");
}

// Owner of one backend descriptor.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    check_cudnn(cudnnBackendCreateDescriptor(type, &handle_), "cudnnBackendCreateDescriptor");
  }
  ~Descriptor() {
    if (handle_) cudnnBackendDestroyDescriptor(handle_);
  }
  Descriptor(Descriptor&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return handle_; }

  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values,
                  const char* what) {
    check_cudnn(cudnnBackendSetAttribute(handle_, name, type, count, values), what);
    return *this;
  }
  Descriptor& set_descriptor(cudnnBackendAttributeName_t name, const Descriptor& value, const char* what) {
    cudnnBackendDescriptor_t handle = value.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &handle, what);
  }
  Descriptor& finalize(const char* what) {
    check_cudnn(cudnnBackendFinalize(handle_), what);
    return *this;
  }

 private:
  cudnnBackendDescriptor_t handle_ = nullptr;
};

using Dims = std::vector<int64_t>;

// Builds the operations of one graph; tensors get consecutive unique ids.
class GraphBuilder {
 public:
  GraphBuilder() = default;

  // A tensor; virtual ones live only inside the fused kernel.
  int64_t tensor(const Dims& dims, const Dims& strides, cudnnDataType_t type, bool is_virtual, bool by_value = false) {
    Descriptor descriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t uid = next_uid_++, alignment = 16;
    const bool virtual_flag = is_virtual;
    descriptor.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type")
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, int64_t(dims.size()), dims.data(), "tensor dimensions")
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, int64_t(strides.size()), strides.data(), "tensor strides")
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id")
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment")
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virtual_flag, "tensor virtual flag");
    if (by_value) {
      const bool flag = true;
      descriptor.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &flag, "tensor by-value flag");
    }
    descriptor.finalize("tensor finalize");
    tensors_.emplace(uid, std::move(descriptor));
    dims_[uid] = dims;
    return uid;
  }
  int64_t scalar() { return tensor({1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true); }
  // A virtual float tensor with dense strides.
  int64_t virtual_like(const Dims& dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    Dims strides(dims.size(), 1);
    for (int i = int(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
    return tensor(dims, strides, type, true);
  }
  const Dims& dims(int64_t uid) const { return dims_.at(uid); }

  void matmul(int64_t a, int64_t b, int64_t c) {
    Descriptor description(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    description.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "matmul compute type")
        .finalize("matmul descriptor finalize");
    Descriptor operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    operation.set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_ADESC, tensors_.at(a), "matmul A")
        .set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_BDESC, tensors_.at(b), "matmul B")
        .set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_CDESC, tensors_.at(c), "matmul C")
        .set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_DESC, description, "matmul descriptor")
        .finalize("matmul operation finalize");
    operations_.push_back(std::move(operation));
  }

  // y = mode(x [, b [, t]]); axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t b, int64_t t, int64_t y,
                 cudnnDataType_t compute = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Descriptor description(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    description.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode")
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute, "pointwise precision");
    if (axis >= 0) description.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    description.finalize("pointwise descriptor finalize");
    Descriptor operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, description, "pointwise descriptor")
        .set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tensors_.at(x), "pointwise x");
    if (b >= 0) operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tensors_.at(b), "pointwise b");
    if (t >= 0) operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tensors_.at(t), "pointwise t");
    operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, tensors_.at(y), "pointwise y")
        .finalize("pointwise operation finalize");
    operations_.push_back(std::move(operation));
  }
  // Convenience: a new virtual float output shaped like `like`.
  int64_t pointwise_new(cudnnPointwiseMode_t mode, int64_t x, int64_t b = -1, const Dims* shape = nullptr) {
    const int64_t y = virtual_like(shape ? *shape : dims(x));
    pointwise(mode, x, b, -1, y);
    return y;
  }

  void reduction(cudnnReduceTensorOp_t mode, int64_t x, int64_t y) {
    Descriptor description(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    description.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction mode")
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "reduction precision")
        .finalize("reduction descriptor finalize");
    Descriptor operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    operation.set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, tensors_.at(x), "reduction x")
        .set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, tensors_.at(y), "reduction y")
        .set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_DESC, description, "reduction descriptor")
        .finalize("reduction operation finalize");
    operations_.push_back(std::move(operation));
  }

  void reshape(int64_t x, int64_t y) {
    Descriptor operation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    operation.set_descriptor(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tensors_.at(x), "reshape x")
        .set_descriptor(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, tensors_.at(y), "reshape y")
        .finalize("reshape operation finalize");
    operations_.push_back(std::move(operation));
  }

  // Causal mask on scores (B, H, Tq, Tk): keeps row >= column, the rest becomes -inf.
  int64_t causal_mask(int64_t scores, int64_t negative_infinity) {
    const Dims& shape = dims(scores);
    const int64_t row = virtual_like(shape, CUDNN_DATA_INT32), column = virtual_like(shape, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, -1, -1, row, CUDNN_DATA_FLOAT, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, -1, -1, column, CUDNN_DATA_FLOAT, 3);
    const int64_t keep = virtual_like(shape, CUDNN_DATA_BOOLEAN);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, column, -1, keep, CUDNN_DATA_BOOLEAN);
    const int64_t masked = virtual_like(shape);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, negative_infinity, keep, masked);
    return masked;
  }

  // Finalizes the graph and the first engine configuration the heuristics offer that builds.
  AttentionPlan build(cudnnHandle_t handle) {
    std::vector<cudnnBackendDescriptor_t> operations;
    for (auto& operation : operations_) operations.push_back(operation.get());
    Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle")
        .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(operations.size()),
             operations.data(), "graph operations")
        .finalize("operation graph finalize (cuDNN did not accept the attention graph)");
    Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heuristics.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph")
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode")
        .finalize("engine heuristics finalize");
    int64_t count = 0;
    check_cudnn(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                         0, &count, nullptr),
                "engine heuristics count");
    std::vector<Descriptor> configs;
    std::vector<cudnnBackendDescriptor_t> config_handles;
    for (int64_t i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      config_handles.push_back(configs.back().get());
    }
    int64_t returned = 0;
    if (count > 0)
      check_cudnn(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, config_handles.data()),
                  "engine heuristics results");
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    for (int64_t i = 0; i < returned; ++i) {
      auto plan = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle")
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config_handles[i],
               "plan engine config");
      last = cudnnBackendFinalize(plan->get());
      if (last != CUDNN_STATUS_SUCCESS) continue;
      AttentionPlan result;
      int64_t workspace = 0, got = 0;
      check_cudnn(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                           &got, &workspace),
                  "plan workspace size");
      result.workspace_bytes = size_t(workspace);
      result.plan = std::shared_ptr<void>(plan.release(), [](void* p) { delete static_cast<Descriptor*>(p); });
      return result;
    }
    check_cudnn(returned == 0 ? CUDNN_STATUS_NOT_SUPPORTED : last,
                "building an execution plan (no engine configuration of the heuristics finalized)");
    return {};
  }

 private:
  int64_t next_uid_ = 1;
  std::map<int64_t, Descriptor> tensors_;
  std::map<int64_t, Dims> dims_;
  std::vector<Descriptor> operations_;
};

// Strides of a (B, T, heads, Dh) tensor seen as dims (B, heads, T, Dh).
Dims bshd_strides(const AttentionShape& s, int64_t heads) {
  return {s.seq_len * heads * s.head_dim, s.head_dim, heads * s.head_dim, 1};
}

}  // namespace

AttentionPlan build_cudnn_forward(cudnnHandle_t handle, const AttentionShape& s, AttentionForwardUids& uids) {
  GraphBuilder g;
  const int64_t B = s.batch, H = s.heads, KV = s.kv_heads, T = s.seq_len, Dh = s.head_dim;
  uids.q = g.tensor({B, H, T, Dh}, bshd_strides(s, H), CUDNN_DATA_BFLOAT16, false);
  const Dims k_strides = bshd_strides(s, KV);
  uids.k = g.tensor({B, KV, Dh, T}, {k_strides[0], k_strides[1], k_strides[3], k_strides[2]}, CUDNN_DATA_BFLOAT16, false);
  uids.v = g.tensor({B, KV, T, Dh}, k_strides, CUDNN_DATA_BFLOAT16, false);
  uids.out = g.tensor({B, H, T, Dh}, bshd_strides(s, H), CUDNN_DATA_BFLOAT16, false);
  uids.lse = g.tensor({B, H, T, 1}, {H * T, T, 1, 1}, CUDNN_DATA_FLOAT, false);
  uids.scale = g.scalar();
  uids.negative_infinity = g.scalar();

  const Dims score_shape{B, H, T, T}, row_shape{B, H, T, 1};
  const int64_t scores = g.virtual_like(score_shape);
  g.matmul(uids.q, uids.k, scores);
  const int64_t scaled = g.pointwise_new(CUDNN_POINTWISE_MUL, scores, uids.scale);
  const int64_t masked = g.causal_mask(scaled, uids.negative_infinity);
  const int64_t maximum = g.virtual_like(row_shape);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, maximum);
  const int64_t shifted = g.pointwise_new(CUDNN_POINTWISE_SUB, masked, maximum);
  const int64_t exponent = g.pointwise_new(CUDNN_POINTWISE_EXP, shifted);
  const int64_t total = g.virtual_like(row_shape);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, exponent, total);
  const int64_t log_total = g.pointwise_new(CUDNN_POINTWISE_LOG, total);
  g.pointwise(CUDNN_POINTWISE_ADD, maximum, log_total, -1, uids.lse);
  const int64_t probabilities = g.virtual_like(score_shape, CUDNN_DATA_BFLOAT16);
  g.pointwise(CUDNN_POINTWISE_DIV, exponent, total, -1, probabilities);
  g.matmul(probabilities, uids.v, uids.out);
  return g.build(handle);
}

AttentionPlan build_cudnn_backward(cudnnHandle_t handle, const AttentionShape& s, AttentionBackwardUids& uids) {
  GraphBuilder g;
  const int64_t B = s.batch, H = s.heads, KV = s.kv_heads, T = s.seq_len, Dh = s.head_dim;
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16;
  const Dims q_strides = bshd_strides(s, H), k_strides = bshd_strides(s, KV);
  const Dims kt_strides{k_strides[0], k_strides[1], k_strides[3], k_strides[2]};
  uids.q = g.tensor({B, H, T, Dh}, q_strides, bf16, false);
  uids.k = g.tensor({B, KV, Dh, T}, kt_strides, bf16, false);  // K^T
  uids.v = g.tensor({B, KV, Dh, T}, kt_strides, bf16, false);  // V^T
  uids.out = g.tensor({B, H, T, Dh}, q_strides, bf16, false);
  uids.grad_out = g.tensor({B, H, T, Dh}, q_strides, bf16, false);
  uids.lse = g.tensor({B, H, T, 1}, {H * T, T, 1, 1}, CUDNN_DATA_FLOAT, false);
  uids.grad_q = g.tensor({B, H, T, Dh}, q_strides, bf16, false);
  uids.grad_k = g.tensor({B, KV, T, Dh}, k_strides, bf16, false);
  uids.grad_v = g.tensor({B, KV, T, Dh}, k_strides, bf16, false);
  uids.scale = g.scalar();
  uids.negative_infinity = g.scalar();
  uids.one = g.scalar();
  const Dims score_shape{B, H, T, T}, row_shape{B, H, T, 1}, head_shape{B, H, T, Dh};
  const Dims transposed_scores{H * T * T, T * T, 1, T};

  // softmax_sum = rowsum(dO * O), kept in the workspace (non-virtual).
  const int64_t product = g.tensor(head_shape, {H * T * Dh, T * Dh, H * Dh, 1}, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_MUL, uids.grad_out, uids.out, -1, product);
  const int64_t row_sum = g.virtual_like(row_shape);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, product, row_sum);
  uids.softmax_sum = g.tensor(row_shape, {H * T, T, 1, 1}, CUDNN_DATA_FLOAT, false);
  g.pointwise(CUDNN_POINTWISE_MUL, row_sum, uids.one, -1, uids.softmax_sum);

  // P = exp(mask(scale * Q K^T) - lse)
  const int64_t scores = g.virtual_like(score_shape);
  g.matmul(uids.q, uids.k, scores);
  const int64_t scaled = g.pointwise_new(CUDNN_POINTWISE_MUL, scores, uids.scale);
  const int64_t shifted = g.pointwise_new(CUDNN_POINTWISE_SUB, scaled, uids.lse);
  const int64_t masked = g.causal_mask(shifted, uids.negative_infinity);
  const int64_t probabilities = g.pointwise_new(CUDNN_POINTWISE_EXP, masked);

  // dV = P^T dO (summed over the query heads of each group)
  const int64_t probabilities_t = g.tensor(score_shape, transposed_scores, bf16, true);
  g.reshape(probabilities, probabilities_t);
  if (H == KV) {
    g.matmul(probabilities_t, uids.grad_out, uids.grad_v);
  } else {
    const int64_t full = g.tensor(head_shape, {H * T * Dh, T * Dh, Dh, 1}, bf16, true);
    g.matmul(probabilities_t, uids.grad_out, full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, uids.grad_v);
  }

  // dS = scale * P * (dO V^T - softmax_sum)
  const int64_t grad_probabilities = g.virtual_like(score_shape);
  g.matmul(uids.grad_out, uids.v, grad_probabilities);
  const int64_t centered = g.pointwise_new(CUDNN_POINTWISE_SUB, grad_probabilities, uids.softmax_sum);
  const int64_t grad_scores = g.pointwise_new(CUDNN_POINTWISE_MUL, centered, probabilities);
  const int64_t grad_scaled = g.pointwise_new(CUDNN_POINTWISE_MUL, grad_scores, uids.scale);

  // dK = dS^T Q (summed over each group)
  const int64_t grad_scaled_t = g.tensor(score_shape, transposed_scores, bf16, true);
  g.reshape(grad_scaled, grad_scaled_t);
  if (H == KV) {
    g.matmul(grad_scaled_t, uids.q, uids.grad_k);
  } else {
    const int64_t full = g.tensor(head_shape, {H * T * Dh, T * Dh, Dh, 1}, bf16, true);
    g.matmul(grad_scaled_t, uids.q, full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, uids.grad_k);
  }

  // dQ = dS K, accumulated in f32 in the workspace, then converted.
  const int64_t k_plain = g.tensor({B, KV, T, Dh}, k_strides, bf16, true);
  g.reshape(uids.k, k_plain);
  uids.grad_q_accumulator = g.tensor(head_shape, {H * T * Dh, T * Dh, Dh, 1}, CUDNN_DATA_FLOAT, false);
  g.matmul(grad_scaled, k_plain, uids.grad_q_accumulator);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, uids.grad_q_accumulator, -1, -1, uids.grad_q);
  return g.build(handle);
}

void execute_cudnn_plan(cudnnHandle_t handle, const AttentionPlan& plan, const std::vector<int64_t>& uids,
                        const std::vector<void*>& pointers, void* workspace) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data(), "variant ids")
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()), pointers.data(),
           "variant pointers")
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "variant workspace")
      .finalize("variant pack finalize");
  auto* descriptor = static_cast<Descriptor*>(plan.plan.get());
  check_cudnn(cudnnBackendExecute(handle, descriptor->get(), pack.get()), "cudnnBackendExecute");
}

}  // namespace smelt::cuda
