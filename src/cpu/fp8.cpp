// CPU reference of the float8 ops (amax, quantize, dequantize): plain loops over rows, each
// element rounded by the scalar functions of core/numerics.h that the CUDA kernels also use.
#include "cpu/fp8.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/numerics.h"
#include "cpu/fp8_elements.h"

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
  require(!args.amax.empty() || !args.column_amax.empty(), op, "expected amax or column_amax to write, found neither");
  if (!args.amax.empty()) require_statistic(args.amax, by_column ? cols : rows, args.rowwise, op, "amax");
  if (!args.column_amax.empty()) require_statistic(args.column_amax, cols, true, op, "column_amax");

  // NaN sticks: once the running maximum is NaN, `magnitude > maximum` is false forever.
  auto fold = [](float maximum, float value) {
    const float magnitude = std::fabs(value);
    return (std::isnan(magnitude) || magnitude > maximum) ? magnitude : maximum;
  };
  auto column_maxima = [&](const TensorView& out) {
    for (int64_t c = 0; c < cols; ++c) {
      float maximum = 0.0f;
      for (int64_t r = 0; r < rows; ++r) maximum = fold(maximum, load_float(args.x, r * cols + c));
      store_float(out, c, maximum);
    }
  };
  if (!args.column_amax.empty()) column_maxima(args.column_amax);
  if (args.amax.empty()) return;
  if (by_column) return column_maxima(args.amax);
  float maximum = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    if (args.rowwise) maximum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) maximum = fold(maximum, load_float(args.x, r * cols + c));
    if (args.rowwise) store_float(args.amax, r, maximum);
  }
  if (!args.rowwise) store_float(args.amax, 0, maximum);
}

void amax_of(const TensorView& x, const TensorView& result) {
  AmaxArgs a;
  a.x = x.reshaped(Shape{x.rows(), x.cols()});
  a.amax = result;
  amax(a);
}

namespace {

// The scales of one output: read from `scale`, or computed from `amax` and written to `scale`.
std::vector<float> output_scales(const TensorView& amax, const TensorView& scale, int64_t count, bool rowwise,
                                 DType format, bool power_of_two, const std::string& op, const char* name) {
  require_statistic(scale, count, rowwise, op, name);
  std::vector<float> scales(static_cast<size_t>(scale.numel()));
  if (amax.empty()) {
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = load_float(scale, int64_t(i));
    return scales;
  }
  require_statistic(amax, count, rowwise, op, (std::string(name) + "'s amax").c_str());
  for (size_t i = 0; i < scales.size(); ++i) {
    scales[i] = amax_to_scale(load_float(amax, int64_t(i)), float8_format(format), power_of_two);
    store_float(scale, int64_t(i), scales[i]);
  }
  return scales;
}

}  // namespace

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
    require(args.dst_transposed.empty(), op, "dst_transposed needs transpose = false (dst is already transposed)");
  } else {
    require_pair(args.src, args.dst, op, "src", "dst");
  }
  const std::vector<float> scales = output_scales(args.amax, args.scale, args.dst.rows(), args.rowwise, args.dst.dtype,
                                                  args.round_scale_to_power_of_two, op, "scale");
  std::vector<float> transposed_scales;
  if (!args.dst_transposed.empty()) {
    require_cpu(args.dst_transposed, op, "dst_transposed");
    require(is_float8(args.dst_transposed.dtype) && args.dst_transposed.rows() == cols &&
                args.dst_transposed.cols() == rows,
            op, "dst_transposed must be e4m3 or e5m2 of src transposed, (" + std::to_string(cols) + ", " +
                    std::to_string(rows) + "), found " + args.dst_transposed.str());
    transposed_scales = output_scales(args.amax_transposed, args.scale_transposed, cols, args.rowwise,
                                      args.dst_transposed.dtype, args.round_scale_to_power_of_two, op,
                                      "scale_transposed");
  }

  const Float8Format format = float8_format(args.dst.dtype);
  auto* out = args.dst.as<uint8_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float value = load_float(args.src, r * cols + c);
      const int64_t destination = args.transpose ? c * rows + r : r * cols + c;
      const int64_t scale_index = !args.rowwise ? 0 : (args.transpose ? c : r);
      out[destination] = float_to_float8(value * scales[size_t(scale_index)], format);
    }
  }
  if (args.dst_transposed.empty()) return;
  const Float8Format transposed_format = float8_format(args.dst_transposed.dtype);
  auto* out_transposed = args.dst_transposed.as<uint8_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out_transposed[c * rows + r] = float_to_float8(
          load_float(args.src, r * cols + c) * transposed_scales[size_t(args.rowwise ? c : 0)], transposed_format);
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

void transpose(const TransposeArgs& args) {
  const std::string op = "transpose";
  require_cpu(args.src, op, "src");
  require_cpu(args.dst, op, "dst");
  require(is_float8(args.src.dtype) && args.dst.dtype == args.src.dtype, op,
          "expected float8 src and dst of the same dtype, found " + args.src.str() + " and " + args.dst.str());
  const int64_t rows = args.src.rows(), cols = args.src.cols();
  require(args.dst.rows() == cols && args.dst.cols() == rows, op,
          "expected dst of src transposed, (" + std::to_string(cols) + ", " + std::to_string(rows) + "), found " +
              args.dst.str());
  const auto* in = args.src.as<const uint8_t>();
  auto* out = args.dst.as<uint8_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

}  // namespace smelt::cpu
