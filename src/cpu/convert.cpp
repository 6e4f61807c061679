// CPU reference of element-wise dtype conversion (f64, f32, bf16), with bfloat16 rounding
// from core/numerics.h so that both backends round identically.
#include "cpu/convert.h"

#include <cstring>
#include <string>

#include "core/numerics.h"

namespace smelt::cpu {
namespace {

bool is_convertible(DType dtype) { return dtype == DType::f64 || dtype == DType::f32 || dtype == DType::bf16; }

template <typename Source, typename Destination, typename Function>
void map(const TensorView& src, const TensorView& dst, Function function) {
  const auto* in = src.as<const Source>();
  auto* out = dst.as<Destination>();
  const int64_t count = src.numel();
  for (int64_t i = 0; i < count; ++i) out[i] = function(in[i]);
}

// dst += src, src widened to dst's dtype first (f32 or f64).
template <typename Destination>
void add_into(const TensorView& src, const TensorView& dst) {
  auto* out = dst.as<Destination>();
  const int64_t count = src.numel();
  switch (src.dtype) {
    case DType::f64: for (int64_t i = 0; i < count; ++i) out[i] += static_cast<Destination>(src.as<double>()[i]); return;
    case DType::f32: for (int64_t i = 0; i < count; ++i) out[i] += static_cast<Destination>(src.as<float>()[i]); return;
    case DType::bf16:
      for (int64_t i = 0; i < count; ++i) out[i] += static_cast<Destination>(bf16_to_float(src.as<uint16_t>()[i]));
      return;
    default: break;
  }
  fail(ErrorKind::internal, "cpu::convert: accumulates from f64, f32 or bf16, found " + src.str());
}

}  // namespace

void convert(const ConvertArgs& args) {
  const TensorView& src = args.src;
  const TensorView& dst = args.dst;
  for (const TensorView* view : {&src, &dst}) {
    const char* name = view == &src ? "src" : "dst";
    if (view->empty())
      fail(ErrorKind::internal, std::string("cpu::convert: ") + name + " has no data; pass a view onto CPU memory");
    if (view->device != Device::cpu)
      fail(ErrorKind::internal, std::string("cpu::convert: ") + name + " must live on the CPU, found " + view->str() +
                                    "; run this op on the CUDA backend instead");
  }
  if (src.numel() != dst.numel())
    fail(ErrorKind::internal, "cpu::convert: src and dst must hold the same number of elements, found " + src.str() +
                                  " and " + dst.str() + "; reshape one of them or fix the caller");
  if (args.accumulate) {
    if (src.data == dst.data)
      fail(ErrorKind::internal, "cpu::convert: accumulate adds src to a different dst, found both at " + src.str());
    if (dst.dtype == DType::f32) return add_into<float>(src, dst);
    if (dst.dtype == DType::f64) return add_into<double>(src, dst);
    fail(ErrorKind::internal, "cpu::convert: accumulates into f32 or f64, found dst " + dst.str() +
                                  "; gradients are accumulated in the master dtype");
  }
  if (src.dtype == dst.dtype) {
    if (src.data != dst.data) std::memmove(dst.data, src.data, src.bytes());
    return;
  }
  if (!is_convertible(src.dtype) || !is_convertible(dst.dtype))
    fail(ErrorKind::internal, "cpu::convert: converts between f64, f32 and bf16 only, found " + src.str() + " -> " +
                                  dst.str() + "; use quantize / dequantize for float8 (they take a scale)");

  const auto bf16_from_double = [](double x) { return float_to_bf16(static_cast<float>(x)); };
  const auto bf16_from_float = [](float x) { return float_to_bf16(x); };
  const auto float_from_bf16 = [](uint16_t x) { return bf16_to_float(x); };
  const auto double_from_bf16 = [](uint16_t x) { return static_cast<double>(bf16_to_float(x)); };
  const auto float_from_double = [](double x) { return static_cast<float>(x); };
  const auto double_from_float = [](float x) { return static_cast<double>(x); };

  switch (src.dtype) {
    case DType::f32:
      if (dst.dtype == DType::bf16) return map<float, uint16_t>(src, dst, bf16_from_float);
      return map<float, double>(src, dst, double_from_float);
    case DType::bf16:
      if (dst.dtype == DType::f32) return map<uint16_t, float>(src, dst, float_from_bf16);
      return map<uint16_t, double>(src, dst, double_from_bf16);
    case DType::f64:
      if (dst.dtype == DType::f32) return map<double, float>(src, dst, float_from_double);
      return map<double, uint16_t>(src, dst, bf16_from_double);
    default: break;
  }
  fail(ErrorKind::internal, "cpu::convert: unreachable dtype pair " + src.str() + " -> " + dst.str());
}

}  // namespace smelt::cpu
