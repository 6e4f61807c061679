// The CUDA backend: one stream, cuBLASLt GEMMs, cuDNN attention, hand-written kernels
// for the rest. Every op is asynchronous on the backend's stream; ops never allocate
// and never wait for the device. Plain C++ header: callers need no CUDA headers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ops/backend.h"

namespace smelt {

// Number of usable CUDA devices; 0 when there is no driver or no GPU. Never throws.
int cuda_device_count();

// Free device memory in bytes as the driver reports it (cudaMemGetInfo); tests use it to
// prove that ops allocate nothing.
size_t cuda_free_device_memory();

// Device memory from cudaMalloc; counts allocations (the arena should be the only one).
class CudaMemoryResource : public MemoryResource {
 public:
  void* allocate(size_t bytes) override;  // throws Error(memory) when the device is full
  void deallocate(void* pointer) override;
  Device device() const override { return Device::cuda; }
  size_t limit_to(size_t bytes) override;  // one uncounted cudaMalloc of the rest, held until destruction
  ~CudaMemoryResource() override;

 private:
  void* held_back_ = nullptr;
};

// How the backend runs attention (see src/cuda/attention.cu).
enum class CudaAttention : uint8_t {
  automatic,  // cuDNN fused flash attention for bf16, the tiled kernel otherwise
  cudnn,      // cuDNN only (bf16); fails when cuDNN cannot build the graph
  tiled,      // the tiled kernel only (slow; the reference on the GPU)
};

struct CudaBackendOptions {
  int device = 0;
  CudaAttention attention = CudaAttention::automatic;
  // Time cuBLASLt's candidate algorithms for each GEMM shape on its first call (outside graph
  // capture, when the call overwrites its output) and keep the fastest; off: the heuristic's first
  // (the same in every process, which exact resume relies on).
  bool gemm_autotune = false;
};

struct CudaBackendState;  // stream, library handles, caches (cuda_backend.cu)

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::cuda; }
  std::string pci_bus_id() const override;
  std::string device_model() const override;
  MemoryResource& memory() override;
  // The backend's stream as a cudaStream_t (for CUDA events and graph capture by callers).
  void* stream() const;
  void set_attention(CudaAttention attention);

  size_t workspace_bytes(const WorkspaceShape& shape) const override;
  size_t attention_backward_scratch_bytes(const WorkspaceShape& shape) const override;
  void set_workspace(TensorView workspace) override;

  void gemm(const GemmArgs& args) override;
  void embedding_forward(const EmbeddingForwardArgs& args) override;
  void embedding_backward(const EmbeddingBackwardArgs& args) override;
  void rmsnorm_forward(const RmsNormForwardArgs& args) override;
  void rmsnorm_backward(const RmsNormBackwardArgs& args) override;
  void rope(const RopeArgs& args) override;
  void attention_forward(const AttentionForwardArgs& args) override;
  void attention_backward(const AttentionBackwardArgs& args) override;
  void swiglu_forward(const SwigluForwardArgs& args) override;
  void swiglu_backward(const SwigluBackwardArgs& args) override;
  void cross_entropy(const CrossEntropyArgs& args) override;
  void sum_squares(const SumSquaresArgs& args) override;
  void mean(const MeanArgs& args) override;
  void adamw(const AdamwArgs& args) override;
  void convert(const ConvertArgs& args) override;
  void amax(const AmaxArgs& args) override;
  void quantize(const QuantizeArgs& args) override;
  void quantize_blocks(const BlockQuantizeArgs& args) override;
  void dequantize(const DequantizeArgs& args) override;
  void transpose(const TransposeArgs& args) override;
  void scale_from_amax(const ScaleFromAmaxArgs& args) override;

  void copy_to_device(TensorView dst, const void* host_src) override;
  void copy_to_host(void* host_dst, TensorView src) override;
  void fill(TensorView dst, float value) override;
  void synchronize() override;

  void reserve_timing_marks(size_t count) override;
  void timing_mark(size_t index) override;
  double timing_elapsed_ms(size_t from, size_t to) override;
  void* timing_event(size_t index) override;
  bool begin_capture() override;
  bool end_capture() override;
  void replay() override;
  void range_push(const char* name) override;
  void range_pop() override;

 private:
  std::unique_ptr<CudaBackendState> state_;
};

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});

}  // namespace smelt
