// Element access and argument checks shared by the CPU kernels: how each storage
// dtype (f64, f32, bf16) is loaded into its accumulator type and stored back,
// the once-per-op dtype dispatch, and the shape/dtype checks with clear messages.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/numerics.h"
#include "core/tensor.h"

namespace smelt::cpu {

// Storage types: double (f64), float (f32), uint16_t (bf16 bits).
// Accumulator: double for f64 storage, float otherwise. Statistics and weight
// gradients are stored in the accumulator type too (f64 tests, f32 otherwise).
template <typename Storage>
using Accumulator = std::conditional_t<std::is_same_v<Storage, double>, double, float>;

inline double load(const double* p, int64_t i) { return p[i]; }
inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) { return bf16_to_float(p[i]); }

inline void store(double* p, int64_t i, double v) { p[i] = v; }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(uint16_t* p, int64_t i, float v) { p[i] = float_to_bf16(v); }

template <typename Storage>
constexpr DType storage_dtype() {
  if constexpr (std::is_same_v<Storage, double>) return DType::f64;
  else if constexpr (std::is_same_v<Storage, float>) return DType::f32;
  else return DType::bf16;
}

// Calls body(Storage{}) with the storage type of an activation dtype; one switch per op.
template <typename Body>
void dispatch_activation(DType dtype, const char* op, Body&& body) {
  switch (dtype) {
    case DType::f64: body(double{}); return;
    case DType::f32: body(float{}); return;
    case DType::bf16: body(uint16_t{}); return;
    default:
      fail(ErrorKind::internal, std::string(op) + ": expected activations in f64, f32 or bf16, found " +
                                    std::string(dtype_name(dtype)) + "; convert them before calling the op");
  }
}

inline void expect_dtype(const TensorView& t, DType dtype, const char* op, const char* name) {
  if (t.dtype != dtype)
    fail(ErrorKind::internal, std::string(op) + ": expected `" + name + "` in " + std::string(dtype_name(dtype)) +
                                  ", found " + t.str() + "; pass it in the dtype the op documents (ops/op_args.h)");
}

inline void expect_numel(const TensorView& t, int64_t numel, const char* op, const char* name) {
  if (t.empty() || t.numel() != numel)
    fail(ErrorKind::internal, std::string(op) + ": expected `" + name + "` with " + std::to_string(numel) +
                                  " elements, found " + (t.empty() ? std::string("an empty view") : t.str()) +
                                  "; check the shapes the caller passes (ops/op_args.h)");
}

inline void expect_same_shape(const TensorView& t, const TensorView& like, const char* op, const char* name,
                              const char* like_name) {
  if (t.empty() || !(t.shape == like.shape))
    fail(ErrorKind::internal, std::string(op) + ": expected `" + name + "` shaped like `" + like_name + "` " +
                                  like.str() + ", found " + (t.empty() ? std::string("an empty view") : t.str()) +
                                  "; check the shapes the caller passes (ops/op_args.h)");
}

inline void expect_host(const TensorView& t, const char* op, const char* name) {
  if (!t.empty() && t.device != Device::cpu)
    fail(ErrorKind::internal, std::string(op) + ": expected `" + name + "` in host memory, found " + t.str() +
                                  "; the CPU backend only reads views of host memory");
}

}  // namespace smelt::cpu
