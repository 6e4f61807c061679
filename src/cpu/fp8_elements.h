// Element helpers shared by the CPU float8 ops (cpu/fp8.cpp, cpu/fp8_blocks.cpp): an f32 / bf16
// / f64 element as float, and the numerics format of a float8 dtype.
#pragma once
#include <string>

#include "core/error.h"
#include "core/numerics.h"
#include "core/tensor.h"

namespace smelt::cpu {

inline Float8Format float8_format(DType dtype) {
  return dtype == DType::e4m3 ? Float8Format::e4m3 : Float8Format::e5m2;
}

// Element i of an f32 / bf16 / f64 view, as float (f64 rounds to nearest).
inline float load_float(const TensorView& view, int64_t i) {
  switch (view.dtype) {
    case DType::f32: return view.as<const float>()[i];
    case DType::bf16: return bf16_to_float(view.as<const uint16_t>()[i]);
    case DType::f64: return static_cast<float>(view.as<const double>()[i]);
    default: break;
  }
  fail(ErrorKind::internal, "cpu fp8: cannot read " + view.str() + " as float; expected f32, bf16 or f64");
}

}  // namespace smelt::cpu
