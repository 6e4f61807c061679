// GEMM on the GPU through cuBLASLt: out = op(a) @ op(b) (+ addend), row-major smelt views
// mapped onto column-major cuBLAS by swapping the operands (out^T = op(b)^T op(a)^T).
// bf16 or f32 inputs, fp32 accumulation (no TF32), out in the input dtype or f32.
// Matmul descriptors and the chosen algorithm are cached per shape on the host.
#include <cublasLt.h>

#include <cstring>
#include <map>
#include <tuple>

#include "cuda/cuda_common.cuh"

namespace smelt::cuda {
namespace {

void check_cublas(cublasStatus_t status, const char* call, const std::string& problem) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(ErrorKind::device, std::string("cuBLASLt call `") + call + "` returned status " +
                                std::to_string(static_cast<int>(status)) + " for " + problem +
                                "; expected CUBLAS_STATUS_SUCCESS. Check the shapes and dtypes, and that libcublasLt "
                                "matches the CUDA runtime");
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::e4m3: return CUDA_R_8F_E4M3;
    case DType::e5m2: return CUDA_R_8F_E5M2;
    default: break;
  }
  fail(ErrorKind::internal, "cuda gemm: no cuBLAS type for " + std::string(dtype_name(dtype)) +
                                "; the CUDA GEMM takes f32 or bf16 operands");
}

// Everything that selects a matmul plan. Alignment is the largest power of two (<= 256)
// dividing every pointer, since the heuristic picks kernels by it.
struct GemmKey {
  int64_t m, n, k;  // column-major: D (m x n) = A (m x k) * B (k x n)
  bool transpose_a, transpose_b;
  DType input, output;
  int alignment;
  auto tie() const { return std::tie(m, n, k, transpose_a, transpose_b, input, output, alignment); }
  bool operator<(const GemmKey& other) const { return tie() < other.tie(); }
};

struct GemmPlan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  ~GemmPlan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (operation) cublasLtMatmulDescDestroy(operation);
  }
};

class GemmCache final : public OpCache {
 public:
  std::map<GemmKey, std::unique_ptr<GemmPlan>> plans;
};

int pointer_alignment(std::initializer_list<const void*> pointers) {
  int alignment = 256;
  for (const void* p : pointers) {
    if (!p) continue;
    const auto address = reinterpret_cast<uintptr_t>(p);
    while (alignment > 1 && address % alignment != 0) alignment /= 2;
  }
  return alignment;
}

std::string describe(const GemmArgs& args) {
  return "a " + args.a.str() + (args.transpose_a ? "^T" : "") + " @ b " + args.b.str() + (args.transpose_b ? "^T" : "") +
         " -> out " + args.out.str();
}

std::unique_ptr<GemmPlan> build_plan(CudaContext& context, const GemmKey& key, const std::string& problem) {
  auto plan = std::make_unique<GemmPlan>();
  check_cublas(cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate",
               problem);
  const cublasOperation_t transpose_a = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t transpose_b = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, &transpose_a,
                                              sizeof transpose_a),
               "cublasLtMatmulDescSetAttribute(TRANSA)", problem);
  check_cublas(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, &transpose_b,
                                              sizeof transpose_b),
               "cublasLtMatmulDescSetAttribute(TRANSB)", problem);
  // Stored column-major shapes: A is (m x k) or (k x m) when transposed; B likewise.
  const uint64_t a_rows = key.transpose_a ? key.k : key.m, a_cols = key.transpose_a ? key.m : key.k;
  const uint64_t b_rows = key.transpose_b ? key.n : key.k, b_cols = key.transpose_b ? key.k : key.n;
  check_cublas(cublasLtMatrixLayoutCreate(&plan->a, cuda_type(key.input), a_rows, a_cols, int64_t(a_rows)),
               "cublasLtMatrixLayoutCreate(A)", problem);
  check_cublas(cublasLtMatrixLayoutCreate(&plan->b, cuda_type(key.input), b_rows, b_cols, int64_t(b_rows)),
               "cublasLtMatrixLayoutCreate(B)", problem);
  check_cublas(cublasLtMatrixLayoutCreate(&plan->c, cuda_type(key.output), key.m, key.n, key.m),
               "cublasLtMatrixLayoutCreate(C)", problem);

  cublasLtMatmulPreference_t preference = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate", problem);
  const uint64_t workspace = kGemmWorkspaceBytes;
  const uint32_t alignment = uint32_t(key.alignment);
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
  for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof alignment);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(context.cublas, plan->operation, plan->a, plan->b,
                                                               plan->c, plan->c, preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  check_cublas(status, "cublasLtMatmulAlgoGetHeuristic", problem);
  if (found == 0)
    fail(ErrorKind::device, "cuBLASLt found no algorithm for " + problem +
                                "; expected at least one. Check that the dtypes are supported together (bf16 or f32 "
                                "inputs, out in the input dtype or f32)");
  plan->algorithm = result.algo;
  return plan;
}

}  // namespace

std::unique_ptr<OpCache> make_gemm_cache() { return std::make_unique<GemmCache>(); }

void gemm(CudaContext& context, const GemmArgs& args) {
  const char* op = "gemm";
  expect_device(args.a, op, "a");
  expect_device(args.b, op, "b");
  expect_device(args.out, op, "out");
  context.require_workspace(op);
  const std::string problem = describe(args);
  const int64_t rows = args.transpose_a ? args.a.cols() : args.a.rows();   // M
  const int64_t inner = args.transpose_a ? args.a.rows() : args.a.cols();  // K
  const int64_t b_inner = args.transpose_b ? args.b.cols() : args.b.rows();
  const int64_t cols = args.transpose_b ? args.b.rows() : args.b.cols();   // N
  auto reject = [&](const std::string& what) {
    fail(ErrorKind::internal, "cuda gemm: " + what + " (" + problem + "); fix the shapes or dtypes the caller passes");
  };
  if (b_inner != inner) reject("expected op(a) and op(b) to share the inner dimension");
  if (args.out.rows() != rows || args.out.cols() != cols) reject("expected out of (M, N) = (" + std::to_string(rows) + ", " + std::to_string(cols) + ")");
  if (args.a.dtype != args.b.dtype) reject("expected a and b of the same dtype");
  if (is_float8(args.a.dtype) || args.scaling_a != OperandScaling::none || args.scaling_b != OperandScaling::none)
    reject("float8 operands are not supported by the CUDA GEMM yet; dequantize them or run the CPU backend");
  if (args.a.dtype != DType::f32 && args.a.dtype != DType::bf16) reject("expected f32 or bf16 operands");
  if (args.out.dtype != args.a.dtype && args.out.dtype != DType::f32) reject("expected out in the input dtype or f32");
  if (!args.addend.empty()) {
    expect_device(args.addend, op, "addend");
    if (args.accumulate) reject("expected either addend or accumulate, found both");
    if (args.addend.dtype != args.out.dtype || args.addend.numel() != args.out.numel()) reject("expected addend like out");
  }
  if (rows == 0 || cols == 0) return;

  // Column-major view: D^T (N x M) = op(b)^T (N x K) @ op(a)^T (K x M); cuBLAS A = b, B = a.
  const void* addend = args.accumulate ? args.out.data : (args.addend.empty() ? nullptr : args.addend.data);
  GemmKey key{cols, rows, inner, args.transpose_b, args.transpose_a, args.a.dtype, args.out.dtype,
              pointer_alignment({args.a.data, args.b.data, args.out.data, addend})};
  auto& plans = static_cast<GemmCache*>(context.gemm_cache)->plans;
  auto found = plans.find(key);
  if (found == plans.end()) found = plans.emplace(key, build_plan(context, key, problem)).first;
  const GemmPlan& plan = *found->second;
  const float alpha = 1.0f, beta = addend ? 1.0f : 0.0f;
  check_cublas(cublasLtMatmul(context.cublas, plan.operation, &alpha, args.b.data, plan.a, args.a.data, plan.b, &beta,
                              addend ? addend : args.out.data, plan.c, args.out.data, plan.c, &plan.algorithm,
                              context.gemm_workspace(), kGemmWorkspaceBytes, context.stream),
               "cublasLtMatmul", problem);
}

}  // namespace smelt::cuda
