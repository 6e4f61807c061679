// Test support for the CUDA backend: a fixture holding the CPU reference and the CUDA
// backend side by side, seeded random host tensors, NaN-poisoned device outputs, and a
// norm-wise relative comparison that never lets NaN pass. Skips when there is no GPU.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/numerics.h"
#include "core/random.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "support/fresh_random.h"
#include "support/normwise.h"

namespace smelt::test {

// A host tensor with its own bytes.
struct HostTensor {
  std::vector<uint64_t> storage;
  TensorView view;

  HostTensor() = default;
  HostTensor(DType dtype, Shape shape) : storage((shape.numel() * dtype_size(dtype) + 7) / 8 + 1) {
    view = TensorView(storage.data(), dtype, shape, Device::cpu);
  }
  HostTensor(const HostTensor& other) : storage(other.storage) {
    view = TensorView(storage.data(), other.view.dtype, other.view.shape, Device::cpu);
  }
  HostTensor& operator=(const HostTensor& other) {
    storage = other.storage;
    view = TensorView(storage.data(), other.view.dtype, other.view.shape, Device::cpu);
    return *this;
  }
  int64_t numel() const { return view.numel(); }
  double get(int64_t i) const {
    switch (view.dtype) {
      case DType::f32: return view.as<const float>()[i];
      case DType::bf16: return bf16_to_float(view.as<const uint16_t>()[i]);
      case DType::f64: return view.as<const double>()[i];
      case DType::i32: return view.as<const int32_t>()[i];
      default: return std::numeric_limits<double>::quiet_NaN();
    }
  }
  void set(int64_t i, double value) {
    switch (view.dtype) {
      case DType::f32: view.as<float>()[i] = float(value); break;
      case DType::bf16: view.as<uint16_t>()[i] = float_to_bf16(float(value)); break;
      case DType::f64: view.as<double>()[i] = value; break;
      case DType::i32: view.as<int32_t>()[i] = int32_t(value); break;
      default: break;
    }
  }
};

inline HostTensor random_tensor(DType dtype, Shape shape, uint64_t seed, double scale = 1.0) {
  HostTensor tensor(dtype, shape);
  Random random(testing_support::fresh(seed));
  for (int64_t i = 0; i < tensor.numel(); ++i) tensor.set(i, scale * random.normal());
  return tensor;
}

inline HostTensor random_ids(Shape shape, uint64_t seed, int32_t bound) {
  HostTensor tensor(DType::i32, shape);
  Random random(testing_support::fresh(seed));
  for (int64_t i = 0; i < tensor.numel(); ++i) tensor.view.as<int32_t>()[i] = int32_t(random.below(uint64_t(bound)));
  return tensor;
}

// AdamW's second moment: the squares of a random tensor (non-negative, never all zero).
inline HostTensor random_second_moment(int64_t count, uint64_t seed, double scale = 0.1) {
  HostTensor root = random_tensor(DType::f32, Shape{count}, seed, scale), squares(DType::f32, Shape{count});
  for (int64_t i = 0; i < count; ++i) squares.set(i, root.get(i) * root.get(i));
  return squares;
}

// The one-element f32 sum of squares of `values` (summed in double), as the gradient norm step
// leaves it for AdamW's clipping.
inline HostTensor sum_of_squares(const HostTensor& values) {
  double total = 0;
  for (int64_t i = 0; i < values.numel(); ++i) total += values.get(i) * values.get(i);
  HostTensor sum(DType::f32, Shape{1});
  sum.set(0, total);
  return sum;
}

inline HostTensor nan_tensor(DType dtype, Shape shape) {
  HostTensor tensor(dtype, shape);
  for (int64_t i = 0; i < tensor.numel(); ++i) tensor.set(i, std::numeric_limits<double>::quiet_NaN());
  return tensor;
}

// Norm-wise relative error |got - want| / |want|; NaN anywhere in `got` fails.
inline void expect_close(const HostTensor& want, const HostTensor& got, double tolerance, const std::string& what) {
  ASSERT_EQ(want.numel(), got.numel()) << what;
  testing_support::expect_normwise_close(
      want.numel(), [&](int64_t i) { return want.get(i); }, [&](int64_t i) { return got.get(i); }, tolerance, what);
}

inline void expect_bits_equal(const HostTensor& want, const HostTensor& got, const std::string& what) {
  ASSERT_EQ(want.view.bytes(), got.view.bytes()) << what;
  int64_t mismatches = 0, first = -1;
  const auto* a = static_cast<const unsigned char*>(want.view.data);
  const auto* b = static_cast<const unsigned char*>(got.view.data);
  const size_t element = dtype_size(want.view.dtype);
  for (int64_t i = 0; i < want.numel(); ++i)
    if (std::memcmp(a + i * element, b + i * element, element) != 0 && mismatches++ == 0) first = i;
  // The first difference's bytes, in hex, lowest address first.
  auto bytes_at = [&](const unsigned char* p) {
    std::string text;
    char digits[4];
    for (size_t k = 0; k < element; ++k) {
      std::snprintf(digits, sizeof(digits), "%02x", p[first * int64_t(element) + int64_t(k)]);
      text += digits;
    }
    return text;
  };
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " of " << want.numel() << " elements differ in bits"
                           << (first < 0 ? std::string()
                                         : ", the first at element " + std::to_string(first) + ": want 0x" +
                                               bytes_at(a) + ", got 0x" + bytes_at(b));
}

inline GemmArgs gemm_args(TensorView a, bool transpose_a, TensorView b, bool transpose_b, TensorView out) {
  GemmArgs args;
  args.a = a;
  args.transpose_a = transpose_a;
  args.b = b;
  args.transpose_b = transpose_b;
  args.out = out;
  return args;
}

// Tolerances per dtype (norm-wise relative): GEMM-based and reduction ops, element-wise ops.
inline double tolerance_for(DType dtype) { return dtype == DType::bf16 ? 1e-2 : 1e-4; }
inline double elementwise_tolerance(DType dtype) { return dtype == DType::bf16 ? 1e-2 : 1e-5; }

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    cuda_ = make_cuda_backend();
    cpu_ = make_cpu_backend();
    WorkspaceShape shape;
    shape.tokens = 1024;
    shape.seq_len = 256;
    shape.batch = 4;
    shape.max_rows = shape.max_inner = shape.max_cols = 1024;
    shape.heads = 16;
    shape.kv_heads = 16;
    shape.head_dim = 128;
    shape.compute_dtype = DType::bf16;
    const size_t cuda_workspace = cuda_->workspace_bytes(shape);
    arena_ = std::make_unique<Arena>(cuda_->memory(), kArenaBytes + cuda_workspace);
    cuda_->set_workspace(arena_->view(kArenaBytes, DType::f32, Shape{int64_t(cuda_workspace / 4)}));
    shape.compute_dtype = DType::f32;
    const size_t cpu_workspace = cpu_->workspace_bytes(shape);
    cpu_workspace_.resize(cpu_workspace / 8 + 1);
    cpu_->set_workspace(TensorView(cpu_workspace_.data(), DType::f32, Shape{int64_t(cpu_workspace / 4)}));
  }

  // A device copy of a host tensor.
  TensorView upload(const HostTensor& host) {
    TensorView device = allocate(host.view.dtype, host.view.shape);
    cuda_->copy_to_device(device, host.view.data);
    return device;
  }
  // A device tensor filled with NaN (outputs are poisoned before kernels write them).
  TensorView poisoned(DType dtype, Shape shape) {
    TensorView device = allocate(dtype, shape);
    if (dtype == DType::e4m3 || dtype == DType::e5m2 || dtype == DType::i32) {
      HostTensor junk(dtype, shape);
      std::memset(junk.view.data, 0x7F, junk.view.bytes());
      cuda_->copy_to_device(device, junk.view.data);
    } else {
      cuda_->fill(device, std::numeric_limits<float>::quiet_NaN());
    }
    return device;
  }
  HostTensor download(TensorView device) {
    HostTensor host(device.dtype, device.shape);
    cuda_->copy_to_host(host.view.data, device);
    return host;
  }
  // Gives the whole test arena back: every view handed out so far must be dead (a loop over cases
  // calls it first thing in each case).
  void rewind_arena() { used_ = 0; }
  TensorView allocate(DType dtype, Shape shape) {
    const size_t bytes = (size_t(shape.numel()) * dtype_size(dtype) + 255) / 256 * 256;
    if (used_ + bytes > kArenaBytes) ADD_FAILURE() << "test arena too small";
    TensorView view = arena_->view(used_, dtype, shape);
    used_ += bytes;
    return view;
  }

  static constexpr size_t kArenaBytes = size_t(512) << 20;
  std::unique_ptr<Backend> cuda_, cpu_;
  std::unique_ptr<Arena> arena_;
  std::vector<uint64_t> cpu_workspace_;
  size_t used_ = 0;
};

}  // namespace smelt::test
