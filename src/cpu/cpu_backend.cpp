// CpuBackend: binds the CPU kernels to the Backend interface, owns the host
// memory resource, and holds the workspace view that ops take scratch from.
#include "cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <vector>
#include <cstring>
#include <string>

#include "core/numerics.h"
#include "cpu/convert.h"
#include "cpu/fp8.h"
#include "cpu/kernels.h"

namespace smelt {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::cpu; }
  MemoryResource& memory() override { return memory_; }

  size_t workspace_bytes(const WorkspaceShape& shape) const override {
    return std::max(cpu::gemm_workspace_bytes(shape), cpu::attention_workspace_bytes(shape));
  }
  void set_workspace(TensorView workspace) override { workspace_ = workspace; }

  void gemm(const GemmArgs& args) override { cpu::gemm(args, workspace_); }
  void embedding_forward(const EmbeddingForwardArgs& args) override { cpu::embedding_forward(args); }
  void embedding_backward(const EmbeddingBackwardArgs& args) override { cpu::embedding_backward(args); }
  void rmsnorm_forward(const RmsNormForwardArgs& args) override { cpu::rmsnorm_forward(args); }
  void rmsnorm_backward(const RmsNormBackwardArgs& args) override { cpu::rmsnorm_backward(args); }
  void rope(const RopeArgs& args) override { cpu::rope(args); }
  void attention_forward(const AttentionForwardArgs& args) override { cpu::attention_forward(args, workspace_); }
  void attention_backward(const AttentionBackwardArgs& args) override { cpu::attention_backward(args, workspace_); }
  void swiglu_forward(const SwigluForwardArgs& args) override { cpu::swiglu_forward(args); }
  void swiglu_backward(const SwigluBackwardArgs& args) override { cpu::swiglu_backward(args); }
  void cross_entropy(const CrossEntropyArgs& args) override { cpu::cross_entropy(args); }
  void sum_squares(const SumSquaresArgs& args) override { cpu::sum_squares(args); }
  void mean(const MeanArgs& args) override { cpu::mean(args); }
  void adamw(const AdamwArgs& args) override { cpu::adamw(args); }
  void convert(const ConvertArgs& args) override { cpu::convert(args); }
  void amax(const AmaxArgs& args) override { cpu::amax(args); }
  void quantize(const QuantizeArgs& args) override { cpu::quantize(args); }
  void quantize_blocks(const BlockQuantizeArgs& args) override { cpu::quantize_blocks(args); }
  void dequantize(const DequantizeArgs& args) override { cpu::dequantize(args); }
  void transpose(const TransposeArgs& args) override { cpu::transpose(args); }
  void scale_from_amax(const ScaleFromAmaxArgs& args) override { cpu::scale_from_amax(args); }

  void copy_to_device(TensorView dst, const void* host_src) override {
    check_host(dst, "copy_to_device");
    if (dst.bytes() > 0) std::memcpy(dst.data, host_src, dst.bytes());
  }
  void copy_to_host(void* host_dst, TensorView src) override {
    check_host(src, "copy_to_host");
    if (src.bytes() > 0) std::memcpy(host_dst, src.data, src.bytes());
  }
  void fill(TensorView dst, float value) override {
    check_host(dst, "fill");
    const int64_t count = dst.numel();
    switch (dst.dtype) {
      case DType::f64: std::fill_n(dst.as<double>(), count, double(value)); return;
      case DType::f32: std::fill_n(dst.as<float>(), count, value); return;
      case DType::bf16: std::fill_n(dst.as<uint16_t>(), count, float_to_bf16(value)); return;
      case DType::i32: std::fill_n(dst.as<int32_t>(), count, int32_t(value)); return;
      case DType::e4m3:
      case DType::e5m2:
        fail(ErrorKind::internal, "fill: expected an f64, f32, bf16 or i32 view, found " + dst.str() +
                                      "; fill a float8 tensor by quantizing a filled f32 one");
    }
  }
  void synchronize() override {}

  void reserve_timing_marks(size_t count) override { marks_.assign(count, {}); }
  void timing_mark(size_t index) override { marks_.at(index) = std::chrono::steady_clock::now(); }
  double timing_elapsed_ms(size_t from, size_t to) override {
    return std::chrono::duration<double, std::milli>(marks_.at(to) - marks_.at(from)).count();
  }

 private:
  static void check_host(const TensorView& view, const char* op) {
    if (view.device != Device::cpu)
      fail(ErrorKind::internal, std::string(op) + ": expected a host view, found " + view.str() +
                                    "; the CPU backend only touches host memory");
  }

  HostMemoryResource memory_;
  std::vector<std::chrono::steady_clock::time_point> marks_;
  TensorView workspace_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace smelt
