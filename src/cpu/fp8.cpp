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
  const bool by_column = args.rowwise && args.transpose;
  require_statistic(args.amax, by_column ? cols : rows, args.rowwise, op, "amax");

  // NaN sticks: once the running maximum is NaN, `magnitude > maximum` is false forever.
  auto fold = [](float maximum, float value) {
    const float magnitude = std::fabs(value);
    return (std::isnan(magnitude) || magnitude > maximum) ? magnitude : maximum;
  };
  if (by_column) {
    for (int64_t c = 0; c < cols; ++c) {
      float maximum = 0.0f;
      for (int64_t r = 0; r < rows; ++r) maximum = fold(maximum, load_float(args.x, r * cols + c));
      store_float(args.amax, c, maximum);
    }
    return;
  }
  float maximum = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    if (args.rowwise) maximum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) maximum = fold(maximum, load_float(args.x, r * cols + c));
    if (args.rowwise) store_float(args.amax, r, maximum);
  }
  if (!args.rowwise) store_float(args.amax, 0, maximum);
}

void quantize(const QuantizeArgs& args) {
  const std::string op = "quantize";
  const int64_t rows = args.src.rows(), cols = args.src.cols();
  if (args.transpose) {
    require_cpu(args.src, op, "src");
    require_cpu(args.dst, op, "dst");
    require(is_high_precision(args.src.dtype), op, "src must be f32, bf16 or f64, found " + args.src.str());
    require(is_float8(args.dst.dtype), op, "dst must be e4m3 or e5m2, found " + args.dst.str());
    require(args.dst.rows() == cols && args.dst.cols() == rows, op,
            "dst must be src transposed, (" + std::to_string(cols) + ", " + std::to_string(rows) + "), found " +
                args.dst.str());
  } else {
    require_pair(args.src, args.dst, op, "src", "dst");
  }
  require_statistic(args.scale, args.dst.rows(), args.rowwise, op, "scale");

  const Float8Format format = float8_format(args.dst.dtype);
  auto* out = args.dst.as<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t destination = args.transpose ? c * rows + r : r * cols + c;
      const int64_t scale_index = !args.rowwise ? 0 : (args.transpose ? c : r);
      out[destination] = float_to_float8(load_float(args.src, r * cols + c) * load_float(args.scale, scale_index), format);
    }
  }
}

void scale_from_amax(const ScaleFromAmaxArgs& args) {
  const std::string op = "scale_from_amax";
  require_cpu(args.amax, op, "amax");
  require_cpu(args.scale, op, "scale");
  require(args.amax.dtype == DType::f32 && args.scale.dtype == DType::f32, op,
          "amax and scale must be f32, found " + args.amax.str() + " and " + args.scale.str());
  require(args.amax.numel() == args.scale.numel(), op,
          "amax and scale must hold as many values, found " + args.amax.str() + " and " + args.scale.str());
  require(is_float8(args.format), op, "format must be e4m3 or e5m2, found " + std::string(dtype_name(args.format)));
  const Float8Format format = float8_format(args.format);
  const float* amax = args.amax.as<const float>();
  float* scale = args.scale.as<float>();
  for (int64_t i = 0; i < args.amax.numel(); ++i) scale[i] = amax_to_scale(amax[i], format, args.round_to_power_of_two);
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
