// CudaBackend: owns the stream, the cuBLASLt and cuDNN handles and the per-shape plan
// caches, binds the workspace, and forwards each op to its file (gemm.cu, rmsnorm.cu, ...).
// Also the status-check helpers and argument checks shared by the op files.
#include "cuda/cuda_backend.h"

#include <nvtx3/nvToolsExt.h>
#include <vector>

#include <cublasLt.h>
#include <cudnn.h>

#include <cstdlib>

#include "cuda/cuda_common.cuh"

namespace smelt {
namespace cuda {

void fail_cuda_call(const char* call, cudaError_t status, const char* file, int line) {
  fail(ErrorKind::device, std::string(file) + ":" + std::to_string(line) + ": CUDA call `" + call + "` returned " +
                              cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                              "); expected cudaSuccess. Check that the GPU is visible (nvidia-smi), that the "
                              "driver matches the CUDA runtime, and rerun with CUDA_LAUNCH_BLOCKING=1 to find the "
                              "failing kernel");
}

void CudaContext::require_workspace(const char* op) const {
  if (workspace == nullptr)
    fail(ErrorKind::internal, std::string("cuda ") + op +
                                  ": the workspace is not bound; call Backend::set_workspace with a view of "
                                  "workspace_bytes() bytes before running ops");
}

void expect_device(const TensorView& t, const char* op, const char* name) {
  if (t.empty() || t.device != Device::cuda)
    fail(ErrorKind::internal, std::string("cuda ") + op + ": expected `" + name + "` in device memory, found " +
                                  (t.empty() ? std::string("an empty view") : t.str()) +
                                  "; take it from an Arena on the CUDA backend's memory()");
}

void expect_dtype(const TensorView& t, DType dtype, const char* op, const char* name) {
  if (t.dtype != dtype)
    fail(ErrorKind::internal, std::string("cuda ") + op + ": expected `" + name + "` in " +
                                  std::string(dtype_name(dtype)) + ", found " + t.str() +
                                  "; pass it in the dtype the op documents (ops/op_args.h)");
}

void expect_numel(const TensorView& t, int64_t numel, const char* op, const char* name) {
  if (t.empty() || t.numel() != numel)
    fail(ErrorKind::internal, std::string("cuda ") + op + ": expected `" + name + "` with " + std::to_string(numel) +
                                  " elements, found " + (t.empty() ? std::string("an empty view") : t.str()) +
                                  "; check the shapes the caller passes (ops/op_args.h)");
}

}  // namespace cuda

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" status
    return 0;
  }
  return count;
}

size_t cuda_free_device_memory() {
  size_t free_bytes = 0, total_bytes = 0;
  SMELT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

void* CudaMemoryResource::allocate(size_t bytes) {
  void* pointer = nullptr;
  cudaError_t status = cudaMalloc(&pointer, bytes == 0 ? 256 : bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    fail(ErrorKind::memory, "device allocation of " + std::to_string(bytes) + " bytes failed (" +
                                cudaGetErrorName(status) + "); the device has " + std::to_string(free_bytes) +
                                " bytes free of " + std::to_string(total_bytes) +
                                ". Use a checkpointing policy, a smaller batch or a shorter sequence (smelt plan shows "
                                "the breakdown)");
  }
  ++allocations_;
  return pointer;
}

void CudaMemoryResource::deallocate(void* pointer) {
  if (pointer) cudaFree(pointer);
}

size_t CudaMemoryResource::limit_to(size_t bytes) {
  if (held_back_) fail(ErrorKind::internal, "CudaMemoryResource::limit_to called twice; the cap is set once per run");
  size_t free_bytes = 0, total_bytes = 0;
  SMELT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes <= bytes) return 0;
  const size_t rest = free_bytes - bytes;
  SMELT_CUDA_CHECK(cudaMalloc(&held_back_, rest));
  return rest;
}

CudaMemoryResource::~CudaMemoryResource() {
  if (held_back_) cudaFree(held_back_);
}

namespace {

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(ErrorKind::device, std::string("cuBLASLt call `") + call + "` returned status " +
                                std::to_string(static_cast<int>(status)) +
                                "; expected success. Check that libcublasLt matches the CUDA runtime");
}

void check_cudnn(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS)
    fail(ErrorKind::device, std::string("cuDNN call `") + call + "` returned " + cudnnGetErrorString(status) +
                                "; expected success. Check that libcudnn (9.x) is on LD_LIBRARY_PATH");
}

}  // namespace

struct CudaBackendState {
  CudaMemoryResource memory;
  CudaAttention attention = CudaAttention::automatic;
  int device = 0;
  cuda::CudaContext context;
  std::unique_ptr<cuda::OpCache> gemm_cache;
  std::unique_ptr<cuda::OpCache> attention_cache;
  std::vector<cudaEvent_t> marks;  // timing marks, created once
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graph_exec = nullptr;
};

CudaBackend::CudaBackend(const CudaBackendOptions& options) : state_(std::make_unique<CudaBackendState>()) {
  if (cuda_device_count() <= options.device)
    fail(ErrorKind::device, "CUDA device " + std::to_string(options.device) + " was asked for, found " +
                                std::to_string(cuda_device_count()) +
                                " devices; run on a machine with a GPU or use the CPU backend (--backend cpu)");
  SMELT_CUDA_CHECK(cudaSetDevice(options.device));
  state_->attention = options.attention;
  state_->device = options.device;
  auto& context = state_->context;
  SMELT_CUDA_CHECK(cudaDeviceGetAttribute(&context.multiprocessors, cudaDevAttrMultiProcessorCount, options.device));
  SMELT_CUDA_CHECK(cudaStreamCreateWithFlags(&context.stream, cudaStreamNonBlocking));
  check_cublas(cublasLtCreate(&context.cublas), "cublasLtCreate");
  check_cudnn(cudnnCreate(&context.cudnn), "cudnnCreate");
  check_cudnn(cudnnSetStream(context.cudnn, context.stream), "cudnnSetStream");
  state_->gemm_cache = cuda::make_gemm_cache();
  state_->attention_cache = cuda::make_attention_cache();
  context.gemm_cache = state_->gemm_cache.get();
  context.gemm_autotune = options.gemm_autotune;
  context.attention_cache = state_->attention_cache.get();
}

std::string CudaBackend::pci_bus_id() const {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof id, state_->device) != cudaSuccess) return {};
  return id;
}

std::string CudaBackend::device_model() const {
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, state_->device) != cudaSuccess) return "cuda";
  return properties.name;
}

CudaBackend::~CudaBackend() {
  auto& context = state_->context;
  if (context.stream) cudaStreamSynchronize(context.stream);
  for (cudaEvent_t e : state_->marks) cudaEventDestroy(e);
  if (state_->graph_exec) cudaGraphExecDestroy(state_->graph_exec);
  if (state_->graph) cudaGraphDestroy(state_->graph);
  state_->attention_cache.reset();  // plans before the handle they were built on
  state_->gemm_cache.reset();
  if (context.cudnn) cudnnDestroy(context.cudnn);
  if (context.cublas) cublasLtDestroy(context.cublas);
  if (context.stream) cudaStreamDestroy(context.stream);
}

MemoryResource& CudaBackend::memory() { return state_->memory; }

void CudaBackend::reserve_timing_marks(size_t count) {
  while (state_->marks.size() < count) {
    cudaEvent_t event;
    SMELT_CUDA_CHECK(cudaEventCreate(&event));
    state_->marks.push_back(event);
  }
}

void CudaBackend::timing_mark(size_t index) {
  SMELT_CHECK(index < state_->marks.size(), "timing mark " + std::to_string(index) + " was not reserved");
  SMELT_CUDA_CHECK(cudaEventRecord(state_->marks[index], state_->context.stream));
}

double CudaBackend::timing_elapsed_ms(size_t from, size_t to) {
  float ms = 0;
  SMELT_CUDA_CHECK(cudaEventElapsedTime(&ms, state_->marks.at(from), state_->marks.at(to)));
  return ms;
}

void* CudaBackend::timing_event(size_t index) {
  SMELT_CHECK(index < state_->marks.size(), "timing mark " + std::to_string(index) + " was not reserved");
  return static_cast<void*>(state_->marks[index]);
}

bool CudaBackend::begin_capture() {
  SMELT_CUDA_CHECK(cudaStreamBeginCapture(state_->context.stream, cudaStreamCaptureModeThreadLocal));
  return true;
}

bool CudaBackend::end_capture() {
  cudaGraph_t graph = nullptr;
  cudaError_t status = cudaStreamEndCapture(state_->context.stream, &graph);
  if (status != cudaSuccess || graph == nullptr) {
    cudaGetLastError();  // clear the capture error; the stream is usable again
    if (graph) cudaGraphDestroy(graph);
    return false;
  }
  cudaGraphExec_t exec = nullptr;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(graph);
    return false;
  }
  if (state_->graph_exec) cudaGraphExecDestroy(state_->graph_exec);
  if (state_->graph) cudaGraphDestroy(state_->graph);
  state_->graph = graph;
  state_->graph_exec = exec;
  return true;
}

void CudaBackend::replay() {
  SMELT_CHECK(state_->graph_exec != nullptr, "replay() before a successful capture");
  SMELT_CUDA_CHECK(cudaGraphLaunch(state_->graph_exec, state_->context.stream));
}

void CudaBackend::range_push(const char* name) { nvtxRangePushA(name); }
void CudaBackend::range_pop() { nvtxRangePop(); }
void* CudaBackend::stream() const { return state_->context.stream; }
void CudaBackend::set_attention(CudaAttention attention) { state_->attention = attention; }

size_t CudaBackend::workspace_bytes(const WorkspaceShape& shape) const {
  return cuda_workspace_bytes(shape);  // ops/cuda_workspace.h: what planning without a GPU predicts too
}

size_t CudaBackend::attention_backward_scratch_bytes(const WorkspaceShape& shape) const {
  return cuda_attention_workspace_bytes(shape);
}

void CudaBackend::set_workspace(TensorView workspace) {
  cuda::expect_device(workspace, "set_workspace", "workspace");
  if (reinterpret_cast<uintptr_t>(workspace.data) % 256 != 0)
    fail(ErrorKind::internal, "cuda set_workspace: expected a 256-byte aligned workspace, found " + workspace.str() +
                                  "; align the workspace buffer in the memory plan");
  state_->context.workspace = static_cast<char*>(workspace.data);
  state_->context.workspace_bytes = workspace.bytes();
}

namespace {
cuda::AttentionImplementation implementation_of(CudaAttention attention) {
  switch (attention) {
    case CudaAttention::cudnn: return cuda::AttentionImplementation::cudnn;
    case CudaAttention::tiled: return cuda::AttentionImplementation::tiled;
    case CudaAttention::automatic: break;
  }
  return cuda::AttentionImplementation::automatic;
}
}  // namespace

void CudaBackend::gemm(const GemmArgs& args) { cuda::gemm(state_->context, args); }
void CudaBackend::embedding_forward(const EmbeddingForwardArgs& args) { cuda::embedding_forward(state_->context, args); }
void CudaBackend::embedding_backward(const EmbeddingBackwardArgs& args) { cuda::embedding_backward(state_->context, args); }
void CudaBackend::rmsnorm_forward(const RmsNormForwardArgs& args) { cuda::rmsnorm_forward(state_->context, args); }
void CudaBackend::rmsnorm_backward(const RmsNormBackwardArgs& args) { cuda::rmsnorm_backward(state_->context, args); }
void CudaBackend::rope(const RopeArgs& args) { cuda::rope(state_->context, args); }
void CudaBackend::attention_forward(const AttentionForwardArgs& args) {
  cuda::attention_forward(state_->context, args, implementation_of(state_->attention));
}
void CudaBackend::attention_backward(const AttentionBackwardArgs& args) {
  cuda::attention_backward(state_->context, args, implementation_of(state_->attention));
}
void CudaBackend::swiglu_forward(const SwigluForwardArgs& args) { cuda::swiglu_forward(state_->context, args); }
void CudaBackend::swiglu_backward(const SwigluBackwardArgs& args) { cuda::swiglu_backward(state_->context, args); }
void CudaBackend::cross_entropy(const CrossEntropyArgs& args) { cuda::cross_entropy(state_->context, args); }
void CudaBackend::sum_squares(const SumSquaresArgs& args) { cuda::sum_squares(state_->context, args); }
void CudaBackend::mean(const MeanArgs& args) { cuda::mean(state_->context, args); }
void CudaBackend::adamw(const AdamwArgs& args) { cuda::adamw(state_->context, args); }
void CudaBackend::convert(const ConvertArgs& args) { cuda::convert(state_->context, args); }
void CudaBackend::amax(const AmaxArgs& args) { cuda::amax(state_->context, args); }
void CudaBackend::quantize(const QuantizeArgs& args) { cuda::quantize(state_->context, args); }
void CudaBackend::quantize_blocks(const BlockQuantizeArgs& args) { cuda::quantize_blocks(state_->context, args); }
void CudaBackend::dequantize(const DequantizeArgs& args) { cuda::dequantize(state_->context, args); }
void CudaBackend::transpose(const TransposeArgs& args) { cuda::transpose(state_->context, args); }
void CudaBackend::scale_from_amax(const ScaleFromAmaxArgs& args) { cuda::scale_from_amax(state_->context, args); }
void CudaBackend::fill(TensorView dst, float value) { cuda::fill(state_->context, dst, value); }

// Host <-> device copies are outside a step's math: they wait for the stream.
void CudaBackend::copy_to_device(TensorView dst, const void* host_src) {
  cuda::expect_device(dst, "copy_to_device", "dst");
  SMELT_CUDA_CHECK(cudaMemcpyAsync(dst.data, host_src, dst.bytes(), cudaMemcpyHostToDevice, state_->context.stream));
  SMELT_CUDA_CHECK(cudaStreamSynchronize(state_->context.stream));
}

void CudaBackend::copy_to_host(void* host_dst, TensorView src) {
  cuda::expect_device(src, "copy_to_host", "src");
  SMELT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, state_->context.stream));
  SMELT_CUDA_CHECK(cudaStreamSynchronize(state_->context.stream));
}

void CudaBackend::synchronize() { SMELT_CUDA_CHECK(cudaStreamSynchronize(state_->context.stream)); }

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

}  // namespace smelt
