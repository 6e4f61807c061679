// CPU reference of the float8 ops (amax, quantize, dequantize): plain loops over rows, each
// element rounded by the scalar functions of core/numerics.h that the CUDA kernels also use.
#include "cpu/fp8.h"

#include <cmath>
#include <string>

#include "core/numerics.h"

namespace smelt::cpu {
namespace {

void require(bool condition, const std::string& op, const std::string& message) {
  if (!condition) fail(ErrorKind::internal, "cpu::" + op + ": " + message);
}

void require_cpu(const TensorView& view, const std::string& op, const char* name) {
  require(!view.empty(), op, std::string(name) + " has no data; pass a view onto CPU memory");
  require(view.device == Device::cpu, op,
          std::string(name) + " must live on the CPU, found " + view.str() + "; run this op on the CUDA backend instead");
}

bool is_high_precision(DType dtype) { return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f64; }

bool is_statistic(DType dtype) { return dtype == DType::f32 || dtype == DType::f64; }

Float8Format float8_format(DType dtype) { return dtype == DType::e4m3 ? Float8Format::e4m3 : Float8Format::e5m2; }

// Element i of an f32 / bf16 / f64 view, as float (f64 rounds to nearest).
float load_float(const TensorView& view, int64_t i) {
  switch (view.dtype) {
    case DType::f32: return view.as<const float>()[i];
    case DType::bf16: return bf16_to_float(view.as<const uint16_t>()[i]);
    case DType::f64: return static_cast<float>(view.as<const double>()[i]);
    default: break;
  }
  fail(ErrorKind::internal, "cpu fp8: cannot read " + view.str() + " as float; expected f32, bf16 or f64");
}

void store_float(const TensorView& view, int64_t i, float value) {
  switch (view.dtype) {
    case DType::f32: view.as<float>()[i] = value; return;
    case DType::bf16: view.as<uint16_t>()[i] = float_to_bf16(value); return;
    case DType::f64: view.as<double>()[i] = value; return;
    default: break;
  }
  fail(ErrorKind::internal, "cpu fp8: cannot write float into " + view.str() + "; expected f32, bf16 or f64");
}

// Checks a scale or amax vector: one value (tensorwise) or one per row (rowwise).
void require_statistic(const TensorView& view, int64_t rows, bool rowwise, const std::string& op, const char* name) {
  require_cpu(view, op, name);
  require(is_statistic(view.dtype), op, std::string(name) + " must be f32 (or f64 in tests), found " + view.str());
  const int64_t expected = rowwise ? rows : 1;
  require(view.numel() == expected, op,
          std::string(name) + " must hold " + std::to_string(expected) + (rowwise ? " values (one per row)" : " value") +
              ", found " + view.str() + "; check the rowwise flag and the shape");
}

// Checks the high-precision and float8 sides of quantize / dequantize.
void require_pair(const TensorView& high, const TensorView& low, const std::string& op, const char* high_name,
                  const char* low_name) {
  require_cpu(high, op, high_name);
  require_cpu(low, op, low_name);
  require(is_high_precision(high.dtype), op,
          std::string(high_name) + " must be f32, bf16 or f64, found " + high.str());
  require(is_float8(low.dtype), op, std::string(low_name) + " must be e4m3 or e5m2, found " + low.str());
  require(high.shape == low.shape, op,
          std::string(high_name) + " and " + low_name + " must have the same shape, found " + high.str() + " and " +
              low.str());
}

}  // namespace

void amax(const AmaxArgs& args) {
  const std::string op = "amax";
  require_cpu(args.x, op, "x");
  require(is_high_precision(args.x.dtype), op, "x must be f32, bf16 or f64, found " + args.x.str());
  const int64_t rows = args.x.rows(), cols = args.x.cols();
  require_statistic(args.amax, rows, args.rowwise, op, "amax");

  // NaN sticks: once the running maximum is NaN, `magnitude > maximum` is false forever.
  float maximum = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    if (args.rowwise) maximum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      const float magnitude = std::fabs(load_float(args.x, r * cols + c));
      if (std::isnan(magnitude) || magnitude > maximum) maximum = magnitude;
    }
    if (args.rowwise) store_float(args.amax, r, maximum);
  }
  if (!args.rowwise) store_float(args.amax, 0, maximum);
}

void quantize(const QuantizeArgs& args) {
  const std::string op = "quantize";
  require_pair(args.src, args.dst, op, "src", "dst");
  const int64_t rows = args.src.rows(), cols = args.src.cols();
  require_statistic(args.scale, rows, args.rowwise, op, "scale");

  const Float8Format format = float8_format(args.dst.dtype);
  auto* out = args.dst.as<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = load_float(args.scale, args.rowwise ? r : 0);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      out[i] = float_to_float8(load_float(args.src, i) * scale, format);
    }
  }
}

void dequantize(const DequantizeArgs& args) {
  const std::string op = "dequantize";
  require_pair(args.dst, args.src, op, "dst", "src");
  const int64_t rows = args.src.rows(), cols = args.src.cols();
  require_statistic(args.scale, rows, args.rowwise, op, "scale");

  const Float8Format format = float8_format(args.src.dtype);
  const auto* in = args.src.as<const uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = load_float(args.scale, args.rowwise ? r : 0);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      store_float(args.dst, i, float8_to_float(in[i], format) / scale);
    }
  }
}

}  // namespace smelt::cpu
