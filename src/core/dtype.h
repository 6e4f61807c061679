// Element types smelt stores tensors in, their sizes and names.
// Precision is data: every TensorView carries one of these.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace smelt {

enum class DType : uint8_t {
  f64,   // CPU only: finite-difference tests
  f32,
  bf16,
  e4m3,  // float8 e4m3fn: max 448, no infinities
  e5m2,  // float8 e5m2: max 57344
  i32,   // token ids
};

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: return 8;
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::e4m3: return 1;
    case DType::e5m2: return 1;
    case DType::i32: return 4;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
    case DType::i32: return "i32";
  }
  return "?";
}

constexpr bool is_float8(DType t) { return t == DType::e4m3 || t == DType::e5m2; }

// Parses "f32", "float32", "bf16", "bfloat16", ...; throws ConfigError-free std::invalid_argument.
DType parse_dtype(std::string_view name);

}  // namespace smelt
