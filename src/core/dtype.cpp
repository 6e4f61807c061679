// Parsing dtype names as they appear in configs (torchtitan spells them "bfloat16", "float32").
#include "core/dtype.h"

#include <stdexcept>

namespace smelt {

DType parse_dtype(std::string_view name) {
  if (name == "f64" || name == "float64") return DType::f64;
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "e4m3" || name == "float8_e4m3fn") return DType::e4m3;
  if (name == "e5m2" || name == "float8_e5m2") return DType::e5m2;
  if (name == "i32" || name == "int32") return DType::i32;
  throw std::invalid_argument("unknown dtype '" + std::string(name) +
                              "' (expected float32, bfloat16, float8_e4m3fn or float8_e5m2)");
}

}  // namespace smelt
