// Test helpers for the CPU kernels: seeded random data, typed host buffers
// (f64 / f32 / bf16) poisoned with NaN, central finite differences, and
// element-wise comparison with a stated tolerance.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/numerics.h"
#include "core/tensor.h"
#include "cpu/cpu_backend.h"
#include "support/fresh_random.h"
#include "support/normwise.h"

namespace smelt::test {

inline std::vector<double> random_values(size_t count, uint64_t seed, double low = -1.0, double high = 1.0) {
  std::mt19937_64 generator(testing_support::fresh(seed));
  std::uniform_real_distribution<double> distribution(low, high);
  std::vector<double> values(count);
  for (double& v : values) v = distribution(generator);
  return values;
}

inline std::vector<int32_t> random_ids(size_t count, uint64_t seed, int32_t low, int32_t high) {
  std::mt19937_64 generator(testing_support::fresh(seed));
  std::uniform_int_distribution<int32_t> distribution(low, high);
  std::vector<int32_t> ids(count);
  for (int32_t& id : ids) id = distribution(generator);
  return ids;
}

// A host tensor of any float dtype, filled from doubles (rounded to the dtype) or NaN.
struct Buffer {
  std::vector<double> storage;  // 8-byte aligned backing bytes
  DType dtype = DType::f64;
  Shape shape;

  Buffer() = default;
  Buffer(DType type, Shape s) : storage((s.numel() * dtype_size(type) + 7) / 8 + 1), dtype(type), shape(s) { poison(); }
  Buffer(const std::vector<double>& values, DType type, Shape s) : Buffer(type, s) { assign(values); }

  TensorView view() { return TensorView(storage.data(), dtype, shape); }
  int64_t numel() const { return shape.numel(); }

  void poison() {
    for (int64_t i = 0; i < numel(); ++i) set(i, std::numeric_limits<double>::quiet_NaN());
  }
  void assign(const std::vector<double>& values) {
    EXPECT_EQ(int64_t(values.size()), numel());
    for (int64_t i = 0; i < numel(); ++i) set(i, values[i]);
  }
  void set(int64_t i, double v) {
    auto* bytes = reinterpret_cast<unsigned char*>(storage.data());
    switch (dtype) {
      case DType::f64: reinterpret_cast<double*>(bytes)[i] = v; break;
      case DType::f32: reinterpret_cast<float*>(bytes)[i] = float(v); break;
      case DType::bf16: reinterpret_cast<uint16_t*>(bytes)[i] = float_to_bf16(float(v)); break;
      default: FAIL() << "Buffer: unsupported dtype " << dtype_name(dtype);
    }
  }
  double get(int64_t i) const {
    const auto* bytes = reinterpret_cast<const unsigned char*>(storage.data());
    switch (dtype) {
      case DType::f64: return reinterpret_cast<const double*>(bytes)[i];
      case DType::f32: return reinterpret_cast<const float*>(bytes)[i];
      case DType::bf16: return bf16_to_float(reinterpret_cast<const uint16_t*>(bytes)[i]);
      default: return std::numeric_limits<double>::quiet_NaN();
    }
  }
  std::vector<double> values() const {
    std::vector<double> out(numel());
    for (int64_t i = 0; i < numel(); ++i) out[i] = get(i);
    return out;
  }
  // Raw bytes, for bitwise comparisons.
  std::vector<unsigned char> bits() const {
    const auto* bytes = reinterpret_cast<const unsigned char*>(storage.data());
    return std::vector<unsigned char>(bytes, bytes + numel() * dtype_size(dtype));
  }
};

// The values as they are after rounding to `dtype` (what a lower-precision run actually sees).
inline std::vector<double> rounded(const std::vector<double>& values, DType dtype) {
  Buffer b(values, dtype, Shape{int64_t(values.size())});
  return b.values();
}

inline double weighted_sum(const std::vector<double>& weights, const std::vector<double>& values) {
  double sum = 0;
  for (size_t i = 0; i < values.size(); ++i) sum += weights[i] * values[i];
  return sum;
}

// Central differences of loss() with respect to every entry of `x` (perturbed in place, restored).
inline std::vector<double> numeric_gradient(std::vector<double>& x, const std::function<double()>& loss,
                                            double step = 1e-6) {
  std::vector<double> gradient(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + step;
    const double plus = loss();
    x[i] = saved - step;
    const double minus = loss();
    x[i] = saved;
    gradient[i] = (plus - minus) / (2 * step);
  }
  return gradient;
}

// |actual - expected| <= relative * (|expected| + floor * max|expected|), element-wise; NaN fails.
inline void expect_close(const std::vector<double>& actual, const std::vector<double>& expected, double relative,
                         const std::string& what, double floor = 1e-2) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double largest = 0;
  for (double e : expected) largest = std::max(largest, std::abs(e));
  ASSERT_GT(largest, 0.0) << what << ": the expected values are all zero, the test would prove nothing";
  int reported = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tolerance = relative * (std::abs(expected[i]) + floor * largest);
    if (!(std::abs(actual[i] - expected[i]) <= tolerance) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << actual[i] << ", expected " << expected[i] << " (tolerance "
                    << tolerance << ")";
  }
}

// Norm-wise: ||actual - expected|| <= relative * ||expected||, NaN fails (support/normwise.h).
inline void expect_close_normwise(const std::vector<double>& actual, const std::vector<double>& expected,
                                  double relative, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  testing_support::expect_normwise_close(
      int64_t(actual.size()), [&](int64_t i) { return expected[size_t(i)]; }, [&](int64_t i) { return actual[size_t(i)]; },
      relative, what);
}

// A CPU backend with a bound workspace of the size it asks for.
struct BackendFixture {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::vector<double> workspace;

  explicit BackendFixture(const WorkspaceShape& shape = WorkspaceShape{}) {
    workspace.assign(backend->workspace_bytes(shape) / sizeof(double) + 1, std::numeric_limits<double>::quiet_NaN());
    backend->set_workspace(TensorView(workspace.data(), DType::f64, Shape{int64_t(workspace.size())}));
  }
  Backend& operator*() { return *backend; }
  Backend* operator->() { return backend.get(); }
};

}  // namespace smelt::test
