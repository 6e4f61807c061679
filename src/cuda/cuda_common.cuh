// Shared by the CUDA op files: status checks that throw smelt::Error, element
// load/store for the activation dtypes (f32, bf16), argument checks, and the
// context (stream, library handles, workspace) every op receives.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/backend.h"
#include "ops/op_args.h"
#include "ops/cuda_workspace.h"

typedef struct cublasLtContext* cublasLtHandle_t;
typedef struct cudnnContext* cudnnHandle_t;

namespace smelt::cuda {

[[noreturn]] void fail_cuda_call(const char* call, cudaError_t status, const char* file, int line);

// Checks a CUDA runtime status; on failure throws Error(device) naming the call and the status.
#define SMELT_CUDA_CHECK(call)                                                                  \
  do {                                                                                          \
    const cudaError_t smelt_cuda_status_ = (call);                                              \
    if (smelt_cuda_status_ != cudaSuccess)                                                      \
      ::smelt::cuda::fail_cuda_call(#call, smelt_cuda_status_, __FILE__, __LINE__);             \
  } while (0)

// After a kernel launch: reports a bad launch configuration or an earlier asynchronous fault.
#define SMELT_CUDA_LAUNCH_CHECK(kernel_name) SMELT_CUDA_CHECK(cudaPeekAtLastError())

// Scratch that the per-shape caches of the library-backed ops hold on the host.
class OpCache {
 public:
  virtual ~OpCache() = default;
};

// Workspace layout (fixed, so set_workspace needs no shape):
// [cuBLASLt workspace][reduction scratch][attention region: cuDNN plans' workspace + tensors].
// Sizes: ops/cuda_workspace.h (shared with planning on machines without a GPU).
constexpr size_t kGemmWorkspaceBytes = kCudaGemmWorkspaceBytes;
constexpr size_t kReduceScratchBytes = kCudaReduceScratchBytes;

struct CudaContext {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;
  int multiprocessors = 0;
  char* workspace = nullptr;
  size_t workspace_bytes = 0;
  OpCache* gemm_cache = nullptr;
  bool gemm_autotune = false;  // time cuBLASLt's candidates per GEMM shape on first use (gemm.cu)
  OpCache* attention_cache = nullptr;

  void* gemm_workspace() const { return workspace; }
  float* reduce_scratch() const { return reinterpret_cast<float*>(workspace + kGemmWorkspaceBytes); }
  char* attention_region() const { return workspace + kGemmWorkspaceBytes + kReduceScratchBytes; }
  size_t attention_region_bytes() const {
    size_t fixed = kGemmWorkspaceBytes + kReduceScratchBytes;
    return workspace_bytes > fixed ? workspace_bytes - fixed : 0;
  }
  // Fails (internal) when set_workspace was not called yet.
  void require_workspace(const char* op) const;
};

// ---- element access -------------------------------------------------------------------------

__device__ __forceinline__ float load_float(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_float(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store_float(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_float(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// Fixed order, so the result is deterministic. `shared` holds 32 floats.
__device__ __forceinline__ float block_sum(float value, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  value = warp_sum(value);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : 0.0f;
  return warp_sum(value);
}

__device__ __forceinline__ float block_max(float value, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  value = warp_max(value);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(value);
}

// Calls body(Element{}) with float or __nv_bfloat16 for an activation dtype.
template <typename Body>
void dispatch_activation(DType dtype, const char* op, Body&& body) {
  switch (dtype) {
    case DType::f32: body(float{}); return;
    case DType::bf16: body(__nv_bfloat16{}); return;
    default:
      fail(ErrorKind::internal, std::string("cuda ") + op + ": expected activations in f32 or bf16, found " +
                                    std::string(dtype_name(dtype)) + "; the CUDA backend runs f32 or bf16 (f64 is CPU only)");
  }
}

// ---- argument checks ------------------------------------------------------------------------

void expect_device(const TensorView& t, const char* op, const char* name);
void expect_dtype(const TensorView& t, DType dtype, const char* op, const char* name);
void expect_numel(const TensorView& t, int64_t numel, const char* op, const char* name);

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, capped.
inline unsigned grid_for(int64_t n, int threads, int multiprocessors) {
  int64_t blocks = (n + threads - 1) / threads;
  int64_t cap = int64_t(multiprocessors > 0 ? multiprocessors : 132) * 8;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// ---- the ops (one file each, named like src/cpu) --------------------------------------------

std::unique_ptr<OpCache> make_gemm_cache();
void gemm(CudaContext& context, const GemmArgs& args);

void embedding_forward(CudaContext& context, const EmbeddingForwardArgs& args);
void embedding_backward(CudaContext& context, const EmbeddingBackwardArgs& args);
void rmsnorm_forward(CudaContext& context, const RmsNormForwardArgs& args);
void rmsnorm_backward(CudaContext& context, const RmsNormBackwardArgs& args);
void rope(CudaContext& context, const RopeArgs& args);

// Attention: cuDNN's fused flash attention for bf16 (graph API), a tiled kernel for f32 and
// as the fallback; `implementation` picks one explicitly (tests and benchmarks compare both).
enum class AttentionImplementation : uint8_t { automatic, cudnn, tiled };
std::unique_ptr<OpCache> make_attention_cache();
void attention_forward(CudaContext& context, const AttentionForwardArgs& args, AttentionImplementation implementation);
void attention_backward(CudaContext& context, const AttentionBackwardArgs& args, AttentionImplementation implementation);

void swiglu_forward(CudaContext& context, const SwigluForwardArgs& args);
void swiglu_backward(CudaContext& context, const SwigluBackwardArgs& args);
void cross_entropy(CudaContext& context, const CrossEntropyArgs& args);
void sum_squares(CudaContext& context, const SumSquaresArgs& args);
void mean(CudaContext& context, const MeanArgs& args);
void adamw(CudaContext& context, const AdamwArgs& args);
void convert(CudaContext& context, const ConvertArgs& args);
void amax(CudaContext& context, const AmaxArgs& args);
void quantize(CudaContext& context, const QuantizeArgs& args);
void quantize_blocks(CudaContext& context, const BlockQuantizeArgs& args);  // fp8_blocks.cu
void dequantize(CudaContext& context, const DequantizeArgs& args);
void transpose(CudaContext& context, const TransposeArgs& args);
void scale_from_amax(CudaContext& context, const ScaleFromAmaxArgs& args);
void fill(CudaContext& context, TensorView destination, float value);

}  // namespace smelt::cuda
