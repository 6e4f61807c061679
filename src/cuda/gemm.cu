// GEMM on the GPU through cuBLASLt: out = op(a) @ op(b) (+ addend), row-major smelt views
// mapped onto column-major cuBLAS by swapping the operands (out^T = op(b)^T op(a)^T).
// bf16 or f32 inputs, fp32 accumulation (no TF32), out in the input dtype or f32; float8
// operands (e4m3/e5m2) in the TN form out = a @ b^T, tensorwise or outer-vector (rowwise) scales, or
// the blockwise recipe's 1x128-tile / 128x128-block scales (core/float8_blocks.h).
// Matmul descriptors and the chosen algorithm are cached per shape on the host. With autotuning
// on, the first call of a shape that overwrites its output (no addend, outside graph capture) times
// cuBLASLt's candidate algorithms on the real operands and keeps the fastest; the choice is shared
// by every backend in the process, so two runs in one process pick the same kernels.
#include <cublasLt.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "core/float8_blocks.h"
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
  DType input_a;  // cuBLAS A's dtype (smelt's b); differs from `input` (cuBLAS B) only for float8
  // Float8 scalings (none otherwise): cuBLAS A's (smelt b's) and cuBLAS B's (smelt a's).
  OperandScaling scaling_a, scaling_b;
  bool fast_accumulation;
  auto tie() const {
    return std::tie(m, n, k, transpose_a, transpose_b, input, output, alignment, input_a, scaling_a, scaling_b,
                    fast_accumulation);
  }
  bool operator<(const GemmKey& other) const { return tie() < other.tie(); }
};

// How many of the heuristic's algorithms autotuning times per shape.
constexpr int kTuningCandidates = 8;

struct GemmPlan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  cublasLtMatmulHeuristicResult_t candidates[kTuningCandidates]{};  // the heuristic's, best first
  int candidate_count = 0;
  bool tuned = false;  // `algorithm` was chosen by timing (or taken from the process's table)
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

// Algorithms chosen by timing, per key, for the whole process (first decision wins).
struct TunedAlgorithms {
  std::mutex mutex;
  std::map<GemmKey, cublasLtMatmulAlgo_t> chosen;
};

TunedAlgorithms& tuned_algorithms() {
  static TunedAlgorithms table;
  return table;
}

bool find_tuned(const GemmKey& key, cublasLtMatmulAlgo_t& algorithm) {
  TunedAlgorithms& table = tuned_algorithms();
  std::lock_guard<std::mutex> lock(table.mutex);
  auto found = table.chosen.find(key);
  if (found == table.chosen.end()) return false;
  algorithm = found->second;
  return true;
}

// The tail of the GEMM workspace holds the reciprocals of float8 scales (cuBLASLt multiplies by
// the scale it is given; smelt's scale is what the codes were multiplied by).
constexpr size_t kInverseScaleFloats = size_t(1) << 18;  // per operand
constexpr size_t kCublasWorkspaceBytes = kGemmWorkspaceBytes - 2 * kInverseScaleFloats * sizeof(float);

__global__ void reciprocals(const float* scale, float* inverse, int64_t count) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count) inverse[i] = 1.0f / scale[i];
}

const float* inverse_scales(CudaContext& context, const TensorView& scale, int slot, const std::string& problem) {
  const int64_t count = scale.numel();
  if (count > int64_t(kInverseScaleFloats))
    fail(ErrorKind::internal, "cuda gemm: expected at most " + std::to_string(kInverseScaleFloats) +
                                  " float8 scales per operand, found " + std::to_string(count) + " (" + problem +
                                  "); use tensorwise scaling or raise kInverseScaleFloats");
  float* inverse = reinterpret_cast<float*>(static_cast<char*>(context.gemm_workspace()) + kCublasWorkspaceBytes) +
                   size_t(slot) * kInverseScaleFloats;
  reciprocals<<<unsigned((count + 255) / 256), 256, 0, context.stream>>>(scale.as<float>(), inverse, count);
  SMELT_CUDA_LAUNCH_CHECK("reciprocals");
  return inverse;
}

bool is_block_scaling(OperandScaling scaling) {
  return scaling == OperandScaling::tile_1x128 || scaling == OperandScaling::block_128x128;
}

// How many f32 scales a float8 operand of (rows, inner) K-major elements has under `scaling`.
int64_t scale_count(OperandScaling scaling, int64_t rows, int64_t inner) {
  switch (scaling) {
    case OperandScaling::tensorwise: return 1;
    case OperandScaling::rowwise: return rows;
    case OperandScaling::tile_1x128: return tile_scale_count(rows, inner);
    case OperandScaling::block_128x128: return block_scale_count(rows, inner);
    case OperandScaling::none: break;
  }
  return 0;
}

// The cuBLASLt scale mode of an operand scaling, as the int32_t the attribute takes. Block scales
// are laid out as cuBLASLt reads them (core/float8_blocks.h), so no conversion is needed.
int32_t cublas_scale_mode(OperandScaling scaling) {
  switch (scaling) {
    case OperandScaling::rowwise: return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case OperandScaling::tile_1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case OperandScaling::block_128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}

const char* scale_mode_name(OperandScaling scaling) {
  switch (scaling) {
    case OperandScaling::rowwise: return "OUTER_VEC_32F";
    case OperandScaling::tile_1x128: return "VEC128_32F";
    case OperandScaling::block_128x128: return "BLK128x128_32F";
    default: return "SCALAR_32F";
  }
}

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

// The float8 set-up the heuristic is asked about, for error messages.
std::string describe_float8(const GemmKey& key, bool has_addend) {
  return std::string("cuBLAS A (smelt b) ") + std::string(dtype_name(key.input_a)) + " " + std::to_string(key.m) + "x" +
         std::to_string(key.k) + (key.transpose_a ? " op T" : " op N") + ", cuBLAS B (smelt a) " +
         std::string(dtype_name(key.input)) + " " + std::to_string(key.k) + "x" + std::to_string(key.n) +
         (key.transpose_b ? " op T" : " op N") + ", C/D " + std::string(dtype_name(key.output)) +
         ", compute 32F, A_SCALE_MODE = " + scale_mode_name(key.scaling_a) + " (" +
         std::to_string(scale_count(key.scaling_a, key.m, key.k)) + " floats), B_SCALE_MODE = " +
         scale_mode_name(key.scaling_b) + " (" + std::to_string(scale_count(key.scaling_b, key.n, key.k)) +
         " floats; scale pointers set before the heuristic), FAST_ACCUM = " + (key.fast_accumulation ? "1" : "0") +
         ", beta = " + (has_addend ? "1 (addend C)" : "0") + ", alignment " + std::to_string(key.alignment) + " bytes";
}

// Scale pointers of a float8 GEMM: cuBLAS A is smelt's b, cuBLAS B is smelt's a. Vector scale modes
// need them set before cublasLtMatmulAlgoGetHeuristic (a NULL pointer there is INVALID_VALUE),
// and they are set again before every cublasLtMatmul.
void set_scale_pointers(cublasLtMatmulDesc_t operation, const float* cublas_a_scale, const float* cublas_b_scale,
                        const std::string& problem) {
  check_cublas(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &cublas_a_scale,
                                              sizeof cublas_a_scale),
               "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)", problem);
  check_cublas(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &cublas_b_scale,
                                              sizeof cublas_b_scale),
               "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)", problem);
}

std::unique_ptr<GemmPlan> build_plan(CudaContext& context, const GemmKey& key, const std::string& problem,
                                     const float* cublas_a_scale, const float* cublas_b_scale, bool has_addend,
                                     int candidates) {
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
  if (key.scaling_a != OperandScaling::none) {
    // The scale-mode attributes are int32_t (cublasLt.h), the fast-accumulation flag int8_t.
    const int32_t mode_a = cublas_scale_mode(key.scaling_a), mode_b = cublas_scale_mode(key.scaling_b);
    check_cublas(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a,
                                                sizeof mode_a),
                 "cublasLtMatmulDescSetAttribute(A_SCALE_MODE)", problem);
    check_cublas(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b,
                                                sizeof mode_b),
                 "cublasLtMatmulDescSetAttribute(B_SCALE_MODE)", problem);
    const int8_t fast = key.fast_accumulation ? 1 : 0;
    check_cublas(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast),
                 "cublasLtMatmulDescSetAttribute(FAST_ACCUM)", problem);
    set_scale_pointers(plan->operation, cublas_a_scale, cublas_b_scale, problem);
  }
  check_cublas(cublasLtMatrixLayoutCreate(&plan->a, cuda_type(key.input_a), a_rows, a_cols, int64_t(a_rows)),
               "cublasLtMatrixLayoutCreate(A)", problem);
  check_cublas(cublasLtMatrixLayoutCreate(&plan->b, cuda_type(key.input), b_rows, b_cols, int64_t(b_rows)),
               "cublasLtMatrixLayoutCreate(B)", problem);
  check_cublas(cublasLtMatrixLayoutCreate(&plan->c, cuda_type(key.output), key.m, key.n, key.m),
               "cublasLtMatrixLayoutCreate(C)", problem);

  cublasLtMatmulPreference_t preference = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate", problem);
  const uint64_t workspace = kCublasWorkspaceBytes;
  const uint32_t alignment = uint32_t(key.alignment);
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
  for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof alignment);
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(context.cublas, plan->operation, plan->a, plan->b, plan->c, plan->c, preference,
                                     std::min(candidates, kTuningCandidates), plan->candidates, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  const bool float8 = key.scaling_a != OperandScaling::none;
  check_cublas(status, "cublasLtMatmulAlgoGetHeuristic",
               float8 ? problem + " [" + describe_float8(key, has_addend) + "]" : problem);
  if (found == 0 && float8)
    fail(ErrorKind::device, "cuBLASLt found no float8 algorithm for " + problem + " [" + describe_float8(key, has_addend) +
                                "]; expected at least one (K and the leading dimensions multiples of 16, at most one "
                                "e5m2 operand, bf16 or f32 out; block scales: fast accumulation off, at most one "
                                "128x128-block operand)");
  if (found == 0)
    fail(ErrorKind::device, "cuBLASLt found no algorithm for " + problem +
                                "; expected at least one. Check that the dtypes are supported together (bf16 or f32 "
                                "inputs, out in the input dtype or f32; float8: a @ b^T, not both e5m2, K and the "
                                "leading dimensions multiples of 16)");
  plan->candidate_count = found;
  plan->algorithm = plan->candidates[0].algo;
  return plan;
}

// Times each candidate algorithm of `plan` on the call's own operands (the output is overwritten
// by every run, and by the real call after) and returns the fastest: one warm-up run, then the
// median of three timed runs each. Candidates that fail to launch are skipped.
cublasLtMatmulAlgo_t fastest_algorithm(CudaContext& context, const GemmPlan& plan, const void* a, const void* b,
                                       void* out) {
  cudaEvent_t start = nullptr, stop = nullptr;
  SMELT_CUDA_CHECK(cudaEventCreate(&start));
  SMELT_CUDA_CHECK(cudaEventCreate(&stop));
  const float alpha = 1.0f, beta = 0.0f;
  auto launch = [&](const cublasLtMatmulAlgo_t& algorithm) {
    return cublasLtMatmul(context.cublas, plan.operation, &alpha, a, plan.a, b, plan.b, &beta, out, plan.c, out,
                          plan.c, &algorithm, context.gemm_workspace(), kCublasWorkspaceBytes, context.stream);
  };
  cublasLtMatmulAlgo_t best = plan.candidates[0].algo;
  float best_ms = -1;
  for (int c = 0; c < plan.candidate_count; ++c) {
    const cublasLtMatmulHeuristicResult_t& candidate = plan.candidates[c];
    if (candidate.state != CUBLAS_STATUS_SUCCESS || launch(candidate.algo) != CUBLAS_STATUS_SUCCESS) continue;
    float times[3] = {0, 0, 0};
    int timed = 0;
    for (; timed < 3; ++timed) {
      SMELT_CUDA_CHECK(cudaEventRecord(start, context.stream));
      const cublasStatus_t status = launch(candidate.algo);
      SMELT_CUDA_CHECK(cudaEventRecord(stop, context.stream));
      SMELT_CUDA_CHECK(cudaEventSynchronize(stop));
      if (status != CUBLAS_STATUS_SUCCESS) break;
      SMELT_CUDA_CHECK(cudaEventElapsedTime(&times[timed], start, stop));
    }
    if (timed < 3) continue;
    std::sort(times, times + 3);
    if (best_ms < 0 || times[1] < best_ms) {
      best_ms = times[1];
      best = candidate.algo;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  SMELT_CUDA_CHECK(cudaGetLastError());
  return best;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SMELT_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// The float8 scaling pairs cuBLASLt runs on Hopper: tensorwise or rowwise on both operands, or
// block scales (1x128 tiles on at least one side) with fast accumulation off.
template <typename Reject>
void check_float8_scalings(const GemmArgs& args, Reject&& reject) {
  const bool blocks_a = is_block_scaling(args.scaling_a), blocks_b = is_block_scaling(args.scaling_b);
  if (!blocks_a && !blocks_b) {
    if (args.scaling_a == OperandScaling::none || args.scaling_a != args.scaling_b)
      reject("expected the same tensorwise or rowwise scaling on both float8 operands, or block scalings on both");
    return;
  }
  if (!blocks_a || !blocks_b)
    reject("expected block scalings (tile_1x128 or block_128x128) on both float8 operands or on neither");
  if (args.scaling_a == OperandScaling::block_128x128 && args.scaling_b == OperandScaling::block_128x128)
    reject("expected at most one block_128x128 operand: cuBLASLt has no kernel with 128x128-block scales on both "
           "(quantise the activation side in 1x128 tiles)");
  if (args.fast_accumulation)
    reject("expected fast_accumulation off with block scaling: cuBLASLt supports 1x128 / 128x128 scales only with "
           "FAST_ACCUM = 0");
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
  const bool float8 = is_float8(args.a.dtype) || is_float8(args.b.dtype);
  if (float8) {
    if (!is_float8(args.a.dtype) || !is_float8(args.b.dtype)) reject("expected both operands float8");
    if (args.a.dtype == DType::e5m2 && args.b.dtype == DType::e5m2) reject("expected at most one e5m2 operand");
    if (args.transpose_a || !args.transpose_b)
      reject("expected the float8 TN form out = a @ b^T (a and b both K-major); quantise the operand transposed");
    check_float8_scalings(args, reject);
    expect_device(args.scale_a, op, "scale_a");
    expect_device(args.scale_b, op, "scale_b");
    expect_dtype(args.scale_a, DType::f32, op, "scale_a");
    expect_dtype(args.scale_b, DType::f32, op, "scale_b");
    expect_numel(args.scale_a, scale_count(args.scaling_a, rows, inner), op, "scale_a");
    expect_numel(args.scale_b, scale_count(args.scaling_b, cols, inner), op, "scale_b");
    if (args.out.dtype != DType::bf16 && args.out.dtype != DType::f32) reject("expected float8 GEMM out in bf16 or f32");
  } else {
    if (args.scaling_a != OperandScaling::none || args.scaling_b != OperandScaling::none)
      reject("expected no scaling for non-float8 operands");
    if (args.a.dtype != args.b.dtype) reject("expected a and b of the same dtype");
    if (args.a.dtype != DType::f32 && args.a.dtype != DType::bf16) reject("expected f32 or bf16 operands");
    if (args.out.dtype != args.a.dtype && args.out.dtype != DType::f32) reject("expected out in the input dtype or f32");
  }
  if (!args.addend.empty()) {
    expect_device(args.addend, op, "addend");
    if (args.accumulate) reject("expected either addend or accumulate, found both");
    if (args.addend.dtype != args.out.dtype || args.addend.numel() != args.out.numel()) reject("expected addend like out");
  }
  if (rows == 0 || cols == 0) return;

  // Column-major view: D^T (N x M) = op(b)^T (N x K) @ op(a)^T (K x M); cuBLAS A = b, B = a.
  const void* addend = args.accumulate ? args.out.data : (args.addend.empty() ? nullptr : args.addend.data);
  GemmKey key{cols, rows, inner, args.transpose_b, args.transpose_a, args.a.dtype, args.out.dtype,
              pointer_alignment({args.a.data, args.b.data, args.out.data, addend}), args.b.dtype,
              float8 ? args.scaling_b : OperandScaling::none, float8 ? args.scaling_a : OperandScaling::none,
              float8 && args.fast_accumulation};
  // Float8: cuBLAS A is smelt's b (outer vector of N floats: one per row of b, i.e. per row of
  // D^T), cuBLAS B is smelt's a (M floats). Tensorwise and rowwise scales are inverted into the
  // workspace first; block scales are already what cuBLASLt multiplies by and go in as they are.
  // Either way the pointers exist before the plan is built: vector and block scale modes need
  // real scale pointers during the heuristic.
  const float* scale_cublas_a = nullptr;  // smelt b's
  const float* scale_cublas_b = nullptr;  // smelt a's
  if (float8 && is_block_scaling(args.scaling_a)) {
    scale_cublas_a = args.scale_b.as<float>();
    scale_cublas_b = args.scale_a.as<float>();
  } else if (float8) {
    scale_cublas_a = inverse_scales(context, args.scale_b, 0, problem);
    scale_cublas_b = inverse_scales(context, args.scale_a, 1, problem);
  }
  auto& plans = static_cast<GemmCache*>(context.gemm_cache)->plans;
  auto found = plans.find(key);
  if (found == plans.end())
    found = plans.emplace(key, build_plan(context, key, problem, scale_cublas_a, scale_cublas_b, addend != nullptr,
                                          context.gemm_autotune ? kTuningCandidates : 1)).first;
  GemmPlan& plan = *found->second;
  if (float8) set_scale_pointers(plan.operation, scale_cublas_a, scale_cublas_b, problem);
  if (context.gemm_autotune && !plan.tuned) {
    if (find_tuned(key, plan.algorithm)) {
      plan.tuned = true;
    } else if (addend == nullptr && !capturing(context.stream)) {
      const cublasLtMatmulAlgo_t fastest = plan.candidate_count > 1
                                               ? fastest_algorithm(context, plan, args.b.data, args.a.data,
                                                                   args.out.data)
                                               : plan.algorithm;
      TunedAlgorithms& table = tuned_algorithms();
      std::lock_guard<std::mutex> lock(table.mutex);
      plan.algorithm = table.chosen.emplace(key, fastest).first->second;  // another backend's choice wins
      plan.tuned = true;
    }
  }
  const float alpha = 1.0f, beta = addend ? 1.0f : 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(context.cublas, plan.operation, &alpha, args.b.data, plan.a, args.a.data, plan.b, &beta,
                     addend ? addend : args.out.data, plan.c, args.out.data, plan.c, &plan.algorithm,
                     context.gemm_workspace(), kCublasWorkspaceBytes, context.stream);
  if (status != CUBLAS_STATUS_SUCCESS)  // the float8 set-up is described only on failure
    check_cublas(status, "cublasLtMatmul",
                 float8 ? problem + " [" + describe_float8(key, addend != nullptr) + "]" : problem);
}

}  // namespace smelt::cuda
