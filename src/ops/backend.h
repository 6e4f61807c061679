// Backend: the interface both the CPU reference and the CUDA backend implement,
// one method per op. Ops never allocate; scratch they need comes from the
// workspace the plan reserved (workspace_bytes), bound once with set_workspace.
#pragma once
#include <memory>
#include <string>

#include "core/arena.h"
#include "ops/op_args.h"

namespace smelt {

// The largest shapes a run uses, so a backend can size its workspace.
struct WorkspaceShape {
  int64_t tokens = 0;       // N = B*T
  int64_t seq_len = 0;      // T
  int64_t batch = 0;        // B
  int64_t max_rows = 0;     // largest GEMM M / N
  int64_t max_inner = 0;    // largest GEMM K
  int64_t max_cols = 0;     // largest GEMM N
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  DType compute_dtype = DType::f32;
  // The caller plans the attention backward's scratch itself (a buffer per backward step, passed
  // in AttentionBackwardArgs::scratch), so the workspace need not hold it for the whole step.
  bool attention_backward_planned = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  virtual MemoryResource& memory() = 0;
  // The GPU's PCI bus id ("0000:18:00.0"), to find it in NVML; empty on the CPU.
  virtual std::string pci_bus_id() const { return {}; }
  // What the device is, as its driver names it ("NVIDIA H200"); the backend's name on the CPU.
  virtual std::string device_model() const { return name(); }

  virtual size_t workspace_bytes(const WorkspaceShape& shape) const = 0;
  virtual void set_workspace(TensorView workspace) = 0;
  // Bytes of AttentionBackwardArgs::scratch the attention backward wants (0: it needs none).
  virtual size_t attention_backward_scratch_bytes(const WorkspaceShape& shape) const {
    (void)shape;
    return 0;
  }

  virtual void gemm(const GemmArgs& args) = 0;
  virtual void embedding_forward(const EmbeddingForwardArgs& args) = 0;
  virtual void embedding_backward(const EmbeddingBackwardArgs& args) = 0;
  virtual void rmsnorm_forward(const RmsNormForwardArgs& args) = 0;
  virtual void rmsnorm_backward(const RmsNormBackwardArgs& args) = 0;
  virtual void rope(const RopeArgs& args) = 0;
  virtual void attention_forward(const AttentionForwardArgs& args) = 0;
  virtual void attention_backward(const AttentionBackwardArgs& args) = 0;
  virtual void swiglu_forward(const SwigluForwardArgs& args) = 0;
  virtual void swiglu_backward(const SwigluBackwardArgs& args) = 0;
  virtual void cross_entropy(const CrossEntropyArgs& args) = 0;
  virtual void sum_squares(const SumSquaresArgs& args) = 0;
  virtual void mean(const MeanArgs& args) = 0;
  virtual void adamw(const AdamwArgs& args) = 0;
  virtual void convert(const ConvertArgs& args) = 0;
  virtual void amax(const AmaxArgs& args) = 0;
  virtual void quantize(const QuantizeArgs& args) = 0;
  virtual void quantize_blocks(const BlockQuantizeArgs& args) = 0;
  virtual void dequantize(const DequantizeArgs& args) = 0;
  virtual void transpose(const TransposeArgs& args) = 0;
  virtual void scale_from_amax(const ScaleFromAmaxArgs& args) = 0;

  // Host <-> backend copies (start-up, logging, checkpoints; never inside a step's math).
  virtual void copy_to_device(TensorView dst, const void* host_src) = 0;
  virtual void copy_to_host(void* host_dst, TensorView src) = 0;
  virtual void fill(TensorView dst, float value) = 0;
  virtual void synchronize() = 0;

  // Timing marks for traces. timing_mark(i) records when the work queued before it
  // finishes (a CUDA event on the stream; the host clock on the CPU, whose ops are
  // synchronous); timing_elapsed_ms(a, b) is valid after synchronize(). Marks are
  // created once by reserve_timing_marks, at start-up.
  virtual void reserve_timing_marks(size_t count) = 0;
  virtual void timing_mark(size_t index) = 0;
  virtual double timing_elapsed_ms(size_t from, size_t to) = 0;
  // The device event behind mark `index` (a cudaEvent_t on CUDA), which other streams' timing
  // events are measured against (the communication stream's collectives); null on the CPU.
  virtual void* timing_event(size_t /*index*/) { return nullptr; }
  // Whole-step graphs: the ops issued between begin_capture() and end_capture() are
  // recorded once, not run, and replay() runs them again. begin_capture returns false
  // where graphs are not supported (the CPU); end_capture returns false when the capture
  // failed (an op that cannot be captured), leaving the backend as before.
  virtual bool begin_capture() { return false; }
  virtual bool end_capture() { return false; }
  virtual void replay() {}

  // Named ranges for profilers (NVTX on CUDA); nothing on the CPU.
  virtual void range_push(const char* name) { (void)name; }
  virtual void range_pop() {}
};

}  // namespace smelt
