// Tests of the CPU float8 ops (amax, quantize, dequantize): against direct loops and the scalar
// functions of core/numerics.h, round-trip error bounds, per-row scales, and argument checks.
#include "cpu/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/numerics.h"
#include "support/fresh_random.h"

namespace smelt {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// (rows, cols) f32 values, each row with its own magnitude (10^-decades .. 10^decades) so
// per-row scales matter.
std::vector<float> random_rows(int64_t rows, int64_t cols, uint32_t seed, float decades = 3.0f) {
  std::mt19937 random(uint32_t(testing_support::fresh(seed)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_magnitude(-decades, decades);
  std::vector<float> values(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::pow(10.0f, log_magnitude(random));
    for (int64_t c = 0; c < cols; ++c) values[size_t(r * cols + c)] = normal(random) * magnitude;
  }
  return values;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = float_to_bf16(values[i]);
  return out;
}

float row_amax(const std::vector<float>& values, int64_t row, int64_t cols) {
  float maximum = 0.0f;
  for (int64_t c = 0; c < cols; ++c) maximum = std::max(maximum, std::fabs(values[size_t(row * cols + c)]));
  return maximum;
}

TEST(CpuAmax, TensorwiseAndRowwise) {
  const int64_t rows = 37, cols = 53;
  std::vector<float> x = random_rows(rows, cols, 1);
  std::vector<uint16_t> x_bf16 = to_bf16(x);
  std::vector<float> x_bf16_as_float(x.size());
  for (size_t i = 0; i < x.size(); ++i) x_bf16_as_float[i] = bf16_to_float(x_bf16[i]);

  for (DType dtype : {DType::f32, DType::bf16}) {
    void* data = dtype == DType::f32 ? static_cast<void*>(x.data()) : static_cast<void*>(x_bf16.data());
    const std::vector<float>& seen = dtype == DType::f32 ? x : x_bf16_as_float;
    TensorView view(data, dtype, Shape{rows, cols});

    float total = kNan;
    cpu::amax({view, TensorView(&total, DType::f32, Shape{1}), false});
    float expected_total = 0.0f;
    for (int64_t r = 0; r < rows; ++r) expected_total = std::max(expected_total, row_amax(seen, r, cols));
    EXPECT_EQ(total, expected_total);
    EXPECT_GT(total, 0.0f);

    std::vector<float> per_row(size_t(rows), kNan);
    cpu::amax({view, TensorView(per_row.data(), DType::f32, Shape{rows}), true});
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(per_row[size_t(r)], row_amax(seen, r, cols)) << "row " << r;
  }
}

TEST(CpuAmax, NanPropagates) {
  std::vector<float> x = random_rows(4, 8, 2);
  x[9] = kNan;  // row 1
  float total = 0.0f;
  cpu::amax({TensorView(x.data(), DType::f32, Shape{4, 8}), TensorView(&total, DType::f32, Shape{1}), false});
  EXPECT_TRUE(std::isnan(total));
  std::vector<float> per_row(4, 0.0f);
  cpu::amax({TensorView(x.data(), DType::f32, Shape{4, 8}), TensorView(per_row.data(), DType::f32, Shape{4}), true});
  EXPECT_FALSE(std::isnan(per_row[0]));
  EXPECT_TRUE(std::isnan(per_row[1]));
  EXPECT_FALSE(std::isnan(per_row[2]));
}

struct Case {
  DType source_dtype;
  DType float8_dtype;
  bool rowwise;
};

// Quantize with torchao-style scales, compare bit for bit with the scalar encode, then
// dequantize and bound the relative error by half an ulp of the float8 format.
void check_round_trip(const Case& test_case, uint32_t seed) {
  const int64_t rows = 29, cols = 67;
  const Float8Format format = test_case.float8_dtype == DType::e4m3 ? Float8Format::e4m3 : Float8Format::e5m2;
  // One tensorwise scale cannot keep six decades inside e4m3's range, so spread less there.
  std::vector<float> x = random_rows(rows, cols, seed, test_case.rowwise ? 3.0f : 1.0f);
  std::vector<uint16_t> x_bf16 = to_bf16(x);
  if (test_case.source_dtype == DType::bf16)
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(x_bf16[i]);
  void* source_data =
      test_case.source_dtype == DType::f32 ? static_cast<void*>(x.data()) : static_cast<void*>(x_bf16.data());
  TensorView source(source_data, test_case.source_dtype, Shape{rows, cols});

  const int64_t scale_count = test_case.rowwise ? rows : 1;
  std::vector<float> amax(static_cast<size_t>(scale_count), kNan);
  std::vector<float> scale(static_cast<size_t>(scale_count), kNan);
  cpu::amax({source, TensorView(amax.data(), DType::f32, Shape{scale_count}), test_case.rowwise});
  for (int64_t s = 0; s < scale_count; ++s) scale[size_t(s)] = amax_to_scale(amax[size_t(s)], format, false);
  TensorView scale_view(scale.data(), DType::f32, Shape{scale_count});

  std::vector<uint8_t> quantized(x.size(), 0x7F);  // poison: NaN in both formats
  cpu::quantize({source, TensorView(quantized.data(), test_case.float8_dtype, Shape{rows, cols}), scale_view,
                 test_case.rowwise});
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = scale[size_t(test_case.rowwise ? r : 0)];
    bool reaches_max = false;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      ASSERT_EQ(quantized[i], float_to_float8(x[i] * row_scale, format)) << "row " << r << " col " << c;
      reaches_max |= std::fabs(float8_to_float(quantized[i], format)) == float8_max(format);
    }
    // Each row's largest element lands on the format's max when that row has its own scale.
    if (test_case.rowwise) {
      EXPECT_TRUE(reaches_max) << "row " << r;
    }
  }

  const float min_normal = format == Float8Format::e4m3 ? std::ldexp(1.0f, -6) : std::ldexp(1.0f, -14);
  const float smallest_step = format == Float8Format::e4m3 ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, -16);
  const double relative_bound = (format == Float8Format::e4m3 ? 1.0 / 16 : 1.0 / 8) * (1 + 1e-6);
  for (DType destination_dtype : {DType::f32, DType::bf16}) {
    std::vector<float> restored(x.size(), kNan);
    std::vector<uint16_t> restored_bf16(x.size(), 0x7FC0);
    void* destination_data = destination_dtype == DType::f32 ? static_cast<void*>(restored.data())
                                                             : static_cast<void*>(restored_bf16.data());
    cpu::dequantize({TensorView(quantized.data(), test_case.float8_dtype, Shape{rows, cols}),
                     TensorView(destination_data, destination_dtype, Shape{rows, cols}), scale_view,
                     test_case.rowwise});
    // bf16 output adds its own rounding, half an ulp of 2^-8.
    const double bound = destination_dtype == DType::f32 ? relative_bound : relative_bound + 1.0 / 256 + 1e-6;
    int normal_count = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float row_scale = scale[size_t(test_case.rowwise ? r : 0)];
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = size_t(r * cols + c);
        const float value = destination_dtype == DType::f32 ? restored[i] : bf16_to_float(restored_bf16[i]);
        const float exact = float8_to_float(quantized[i], format) / row_scale;
        const float expected = destination_dtype == DType::f32 ? exact : bf16_to_float(float_to_bf16(exact));
        ASSERT_EQ(value, expected) << "row " << r << " col " << c;
        const double error = std::fabs(double(value) - double(x[i]));
        if (std::fabs(x[i] * row_scale) >= min_normal) {
          ++normal_count;
          EXPECT_LE(error, bound * std::fabs(double(x[i]))) << "row " << r << " col " << c << " x " << x[i];
        } else {
          EXPECT_LE(error, (0.5 * smallest_step / row_scale) * (1 + 1e-6) + std::fabs(x[i]) / 256) << "row " << r;
        }
      }
    }
    EXPECT_GT(normal_count, rows * cols * 9 / 10);
  }
}

TEST(CpuQuantize, RoundTripE4m3Tensorwise) { check_round_trip({DType::f32, DType::e4m3, false}, 11); }
TEST(CpuQuantize, RoundTripE4m3Rowwise) { check_round_trip({DType::f32, DType::e4m3, true}, 12); }
TEST(CpuQuantize, RoundTripE5m2Tensorwise) { check_round_trip({DType::f32, DType::e5m2, false}, 13); }
TEST(CpuQuantize, RoundTripE5m2Rowwise) { check_round_trip({DType::f32, DType::e5m2, true}, 14); }
TEST(CpuQuantize, RoundTripBf16SourceE4m3Rowwise) { check_round_trip({DType::bf16, DType::e4m3, true}, 15); }
TEST(CpuQuantize, RoundTripBf16SourceE5m2Tensorwise) { check_round_trip({DType::bf16, DType::e5m2, false}, 16); }

// Out-of-range values saturate (a stale, too-large scale), and rowwise scales really are per row.
TEST(CpuQuantize, SaturatesAndUsesEachRowsScale) {
  std::vector<float> x = {1.0f, -1000.0f, 2.0f, 0.5f, -5.0f, 1e9f};  // (2, 3)
  std::vector<float> scale = {1.0f, 100.0f};
  std::vector<uint8_t> out(6, 0x7F);
  cpu::quantize({TensorView(x.data(), DType::f32, Shape{2, 3}), TensorView(out.data(), DType::e4m3, Shape{2, 3}),
                 TensorView(scale.data(), DType::f32, Shape{2}), true});
  EXPECT_EQ(out[0], float_to_e4m3(1.0f));
  EXPECT_EQ(out[1], 0xFE);  // -1000 -> -448
  EXPECT_EQ(out[2], float_to_e4m3(2.0f));
  EXPECT_EQ(out[3], float_to_e4m3(50.0f));
  EXPECT_EQ(out[4], 0xFE);  // -5 * 100 = -500 -> -448
  EXPECT_EQ(out[5], 0x7E);
}

// Column amax beside the row amax, from one call, against direct loops (NaN-free random data).
TEST(CpuAmax, RowsAndColumnsInOnePass) {
  const int64_t rows = 7, cols = 5;
  const std::vector<float> x = random_rows(rows, cols, 31);
  std::vector<float> per_row(rows, kNan), per_column(cols, kNan);
  AmaxArgs args;
  args.x = TensorView(const_cast<float*>(x.data()), DType::f32, Shape{rows, cols});
  args.amax = TensorView(per_row.data(), DType::f32, Shape{rows});
  args.rowwise = true;
  args.column_amax = TensorView(per_column.data(), DType::f32, Shape{cols});
  cpu::amax(args);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(per_row[size_t(r)], row_amax(x, r, cols)) << "row " << r;
  for (int64_t c = 0; c < cols; ++c) {
    float expected = 0;
    for (int64_t r = 0; r < rows; ++r) expected = std::max(expected, std::fabs(x[size_t(r * cols + c)]));
    EXPECT_EQ(per_column[size_t(c)], expected) << "column " << c;
  }
}

// Hand-computed: both layouts from one call, scales computed from amax and written out.
// x = {1, -2}, {0.5, 3}; rowwise e4m3 with power-of-two scales: row amax {2, 3} -> scales
// {128, 128} -> {128, -256}, {64, 384} = 0x70 0xF8 0x68 0x7C; column amax {1, 3} -> {256, 128},
// x^T = {1, 0.5}, {-2, 3} -> {256, 128}, {-256, 384} = 0x78 0x70 0xF8 0x7C. Tensorwise e5m2
// (amax 3, scale 57344/3) on x^T: 1 -> 19114.7 -> 20480 (0x75), 0.5 -> 9557.3 -> 10240 (0x71),
// -2 -> -38229.3 -> -40960 (0xF9), 3 -> 57344 (0x7B).
TEST(CpuQuantize, HandComputedBothLayoutsWithScalesFromAmax) {
  std::vector<float> x = {1.0f, -2.0f, 0.5f, 3.0f};
  std::vector<float> row_amax_values = {2.0f, 3.0f}, column_amax_values = {1.0f, 3.0f};
  std::vector<float> scale(2, kNan), scale_transposed(2, kNan);
  std::vector<uint8_t> rows_out(4, 0x7F), columns_out(4, 0x7F);
  QuantizeArgs q;
  q.src = TensorView(x.data(), DType::f32, Shape{2, 2});
  q.dst = TensorView(rows_out.data(), DType::e4m3, Shape{2, 2});
  q.scale = TensorView(scale.data(), DType::f32, Shape{2});
  q.amax = TensorView(row_amax_values.data(), DType::f32, Shape{2});
  q.rowwise = true;
  q.round_scale_to_power_of_two = true;
  q.dst_transposed = TensorView(columns_out.data(), DType::e4m3, Shape{2, 2});
  q.amax_transposed = TensorView(column_amax_values.data(), DType::f32, Shape{2});
  q.scale_transposed = TensorView(scale_transposed.data(), DType::f32, Shape{2});
  cpu::quantize(q);
  EXPECT_EQ(scale, (std::vector<float>{128.0f, 128.0f}));
  EXPECT_EQ(scale_transposed, (std::vector<float>{256.0f, 128.0f}));
  EXPECT_EQ(rows_out, (std::vector<uint8_t>{0x70, 0xF8, 0x68, 0x7C}));
  EXPECT_EQ(columns_out, (std::vector<uint8_t>{0x78, 0x70, 0xF8, 0x7C}));

  float amax = 3.0f, tensor_scale = kNan;
  std::vector<uint8_t> e5m2(4, 0x7F);
  QuantizeArgs t;
  t.src = q.src;
  t.dst = TensorView(e5m2.data(), DType::e5m2, Shape{2, 2});
  t.scale = TensorView(&tensor_scale, DType::f32, Shape{1});
  t.amax = TensorView(&amax, DType::f32, Shape{1});
  t.transpose = true;
  cpu::quantize(t);
  EXPECT_EQ(tensor_scale, 57344.0f / 3.0f);
  EXPECT_EQ(e5m2, (std::vector<uint8_t>{0x75, 0x71, 0xF9, 0x7B}));
}

// The byte transpose (tensorwise W^T from W's codes): every code lands at its transposed place,
// on shapes with and without multiples of 16; a (cols, rows) dst of the wrong dtype or shape is
// refused.
TEST(CpuTranspose, MovesEveryCodeToItsTransposedPlace) {
  std::mt19937 random(uint32_t(testing_support::fresh(41)));
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{48, 80}, {7, 13}, {1, 5}}) {
    std::vector<uint8_t> codes(size_t(rows * cols)), out(size_t(rows * cols), 0x7F);
    for (auto& c : codes) c = uint8_t(random());
    cpu::transpose({TensorView(codes.data(), DType::e4m3, Shape{rows, cols}),
                    TensorView(out.data(), DType::e4m3, Shape{cols, rows})});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(out[size_t(c * rows + r)], codes[size_t(r * cols + c)]) << rows << "x" << cols << " at " << r << ", " << c;
  }
  std::vector<uint8_t> codes(12), out(12);
  const TensorView src(codes.data(), DType::e4m3, Shape{3, 4});
  EXPECT_THROW(cpu::transpose({src, TensorView(out.data(), DType::e4m3, Shape{3, 4})}), Error);
  EXPECT_THROW(cpu::transpose({src, TensorView(out.data(), DType::e5m2, Shape{4, 3})}), Error);
}

TEST(CpuFp8Ops, RejectsBadArguments) {
  std::vector<float> x(12, 1.0f), scale(4, 1.0f), out_float(12);
  std::vector<uint8_t> out(12);
  TensorView source(x.data(), DType::f32, Shape{3, 4});
  TensorView float8(out.data(), DType::e4m3, Shape{3, 4});
  // Wrong number of scales for the granularity.
  EXPECT_THROW(cpu::quantize({source, float8, TensorView(scale.data(), DType::f32, Shape{4}), true}), Error);
  EXPECT_THROW(cpu::quantize({source, float8, TensorView(scale.data(), DType::f32, Shape{3}), false}), Error);
  // Wrong dtypes.
  EXPECT_THROW(cpu::quantize({source, TensorView(out_float.data(), DType::f32, Shape{3, 4}),
                              TensorView(scale.data(), DType::f32, Shape{1}), false}),
               Error);
  EXPECT_THROW(cpu::dequantize({source, TensorView(out_float.data(), DType::f32, Shape{3, 4}),
                                TensorView(scale.data(), DType::f32, Shape{1}), false}),
               Error);
  // Shape mismatch and non-CPU memory.
  EXPECT_THROW(cpu::quantize({source, TensorView(out.data(), DType::e4m3, Shape{4, 3}),
                              TensorView(scale.data(), DType::f32, Shape{1}), false}),
               Error);
  EXPECT_THROW(cpu::amax({TensorView(x.data(), DType::f32, Shape{3, 4}, Device::cuda),
                          TensorView(scale.data(), DType::f32, Shape{1}), false}),
               Error);
  EXPECT_THROW(cpu::amax({source, TensorView(scale.data(), DType::f32, Shape{4}), true}), Error);
  try {
    cpu::quantize({source, float8, TensorView(scale.data(), DType::f32, Shape{4}), true});
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::internal);
    EXPECT_NE(std::string(error.what()).find("one per row"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace smelt
