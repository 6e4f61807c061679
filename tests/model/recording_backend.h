// A backend for tests that forwards every op to the CPU backend and records each GEMM's
// arguments, float8 operands, scales and f32 result (the float8 linear tests read them back),
// and the transpose those tests build their reference operands with.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"

namespace smelt::testing {

// Forwards every op to the CPU backend and records each GEMM's operands, scales and result.
struct RecordedGemm {
  GemmArgs args;
  std::vector<uint8_t> a, b;
  std::vector<float> scale_a, scale_b, out;
};

class RecordingBackend final : public Backend {
 public:
  std::unique_ptr<Backend> inner = make_cpu_backend();
  std::vector<RecordedGemm> gemms;
  int64_t amax_calls = 0;  // standalone amax passes

  std::string name() const override { return "recording cpu"; }
  Device device() const override { return inner->device(); }
  MemoryResource& memory() override { return inner->memory(); }
  size_t workspace_bytes(const WorkspaceShape& s) const override { return inner->workspace_bytes(s); }
  void set_workspace(TensorView w) override { inner->set_workspace(w); }
  void gemm(const GemmArgs& args) override {
    inner->gemm(args);
    RecordedGemm r;
    r.args = args;
    if (is_float8(args.a.dtype)) {
      auto bytes = [](const TensorView& v) {
        const auto* p = v.as<const uint8_t>();
        return std::vector<uint8_t>(p, p + v.numel());
      };
      auto floats = [](const TensorView& v) {
        const auto* p = v.as<const float>();
        return std::vector<float>(p, p + v.numel());
      };
      r.a = bytes(args.a);
      r.b = bytes(args.b);
      r.scale_a = floats(args.scale_a);
      r.scale_b = floats(args.scale_b);
      if (args.out.dtype == DType::f32) r.out = floats(args.out);
    }
    gemms.push_back(std::move(r));
  }
  void embedding_forward(const EmbeddingForwardArgs& a) override { inner->embedding_forward(a); }
  void embedding_backward(const EmbeddingBackwardArgs& a) override { inner->embedding_backward(a); }
  void rmsnorm_forward(const RmsNormForwardArgs& a) override { inner->rmsnorm_forward(a); }
  void rmsnorm_backward(const RmsNormBackwardArgs& a) override { inner->rmsnorm_backward(a); }
  void rope(const RopeArgs& a) override { inner->rope(a); }
  void attention_forward(const AttentionForwardArgs& a) override { inner->attention_forward(a); }
  void attention_backward(const AttentionBackwardArgs& a) override { inner->attention_backward(a); }
  void swiglu_forward(const SwigluForwardArgs& a) override { inner->swiglu_forward(a); }
  void swiglu_backward(const SwigluBackwardArgs& a) override { inner->swiglu_backward(a); }
  void cross_entropy(const CrossEntropyArgs& a) override { inner->cross_entropy(a); }
  void sum_squares(const SumSquaresArgs& a) override { inner->sum_squares(a); }
  void mean(const MeanArgs& a) override { inner->mean(a); }
  void adamw(const AdamwArgs& a) override { inner->adamw(a); }
  void convert(const ConvertArgs& a) override { inner->convert(a); }
  void amax(const AmaxArgs& a) override {
    ++amax_calls;
    inner->amax(a);
  }
  void quantize(const QuantizeArgs& a) override { inner->quantize(a); }
  void quantize_blocks(const BlockQuantizeArgs& a) override { inner->quantize_blocks(a); }
  void dequantize(const DequantizeArgs& a) override { inner->dequantize(a); }
  void transpose(const TransposeArgs& a) override { inner->transpose(a); }
  void scale_from_amax(const ScaleFromAmaxArgs& a) override { inner->scale_from_amax(a); }
  void copy_to_device(TensorView d, const void* s) override { inner->copy_to_device(d, s); }
  void copy_to_host(void* d, TensorView s) override { inner->copy_to_host(d, s); }
  void fill(TensorView d, float v) override { inner->fill(d, v); }
  void synchronize() override { inner->synchronize(); }
  void reserve_timing_marks(size_t c) override { inner->reserve_timing_marks(c); }
  void timing_mark(size_t i) override { inner->timing_mark(i); }
  double timing_elapsed_ms(size_t a, size_t b) override { return inner->timing_elapsed_ms(a, b); }
};

// A row-major (rows, cols) matrix transposed: the K-major copy a float8 GEMM operand is cast into.
inline std::vector<float> transposed(const std::vector<float>& m, int64_t rows, int64_t cols) {
  std::vector<float> t(m.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = m[size_t(r * cols + c)];
  return t;
}

}  // namespace smelt::testing
