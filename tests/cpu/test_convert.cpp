// Tests of the CPU dtype conversion op: every pair of f64, f32 and bf16 against scalar casts.
#include "cpu/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/numerics.h"
#include "support/fresh_random.h"

namespace smelt {
namespace {

std::vector<double> random_doubles(size_t count, uint32_t seed) {
  std::mt19937 random(uint32_t(testing_support::fresh(seed)));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> log_magnitude(-30.0, 30.0);
  std::vector<double> values(count);
  for (double& v : values) v = normal(random) * std::pow(10.0, log_magnitude(random));
  return values;
}

TEST(CpuConvert, EveryPairMatchesScalarCasts) {
  const size_t count = 4096;
  std::vector<double> f64 = random_doubles(count, 3);
  f64[0] = std::numeric_limits<double>::infinity();
  f64[1] = -0.0;
  f64[2] = std::numeric_limits<double>::quiet_NaN();
  f64[3] = 1e300;  // overflows f32 and bf16

  std::vector<float> f32(count, std::numeric_limits<float>::quiet_NaN());
  cpu::convert({TensorView(f64.data(), DType::f64, Shape{64, 64}), TensorView(f32.data(), DType::f32, Shape{4096})});
  for (size_t i = 0; i < count; ++i) {
    if (std::isnan(f64[i])) {
      EXPECT_TRUE(std::isnan(f32[i]));
    } else {
      ASSERT_EQ(f32[i], static_cast<float>(f64[i])) << i;
    }
  }
  EXPECT_TRUE(std::signbit(f32[1]));
  EXPECT_EQ(f32[3], std::numeric_limits<float>::infinity());

  std::vector<uint16_t> bf16_from_f32(count, 0x7FC0), bf16_from_f64(count, 0x7FC0);
  cpu::convert({TensorView(f32.data(), DType::f32, Shape{4096}), TensorView(bf16_from_f32.data(), DType::bf16, Shape{4096})});
  cpu::convert({TensorView(f64.data(), DType::f64, Shape{4096}), TensorView(bf16_from_f64.data(), DType::bf16, Shape{4096})});
  int inexact = 0;
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(bf16_from_f32[i], float_to_bf16(f32[i])) << i;
    ASSERT_EQ(bf16_from_f64[i], float_to_bf16(static_cast<float>(f64[i]))) << i;
    inexact += bf16_to_float(bf16_from_f32[i]) != f32[i];
  }
  EXPECT_GT(inexact, int(count) / 2);  // the data really needed rounding

  std::vector<float> f32_from_bf16(count, std::numeric_limits<float>::quiet_NaN());
  std::vector<double> f64_from_bf16(count, std::numeric_limits<double>::quiet_NaN());
  std::vector<double> f64_from_f32(count, std::numeric_limits<double>::quiet_NaN());
  cpu::convert({TensorView(bf16_from_f32.data(), DType::bf16, Shape{4096}), TensorView(f32_from_bf16.data(), DType::f32, Shape{4096})});
  cpu::convert({TensorView(bf16_from_f32.data(), DType::bf16, Shape{4096}), TensorView(f64_from_bf16.data(), DType::f64, Shape{4096})});
  cpu::convert({TensorView(f32.data(), DType::f32, Shape{4096}), TensorView(f64_from_f32.data(), DType::f64, Shape{4096})});
  for (size_t i = 3; i < count; ++i) {
    ASSERT_EQ(f32_from_bf16[i], bf16_to_float(bf16_from_f32[i])) << i;
    ASSERT_EQ(f64_from_bf16[i], double(bf16_to_float(bf16_from_f32[i]))) << i;
    ASSERT_EQ(f64_from_f32[i], double(f32[i])) << i;
  }
  EXPECT_TRUE(std::isnan(f32_from_bf16[2]) && std::isnan(f64_from_bf16[2]) && std::isnan(f64_from_f32[2]));

  std::vector<float> copy(count, std::numeric_limits<float>::quiet_NaN());
  cpu::convert({TensorView(f32.data(), DType::f32, Shape{4096}), TensorView(copy.data(), DType::f32, Shape{4096})});
  for (size_t i = 3; i < count; ++i) ASSERT_EQ(copy[i], f32[i]) << i;
}

// Accumulate adds src (widened) to dst: a received gradient shard added to the shard.
TEST(CpuConvert, AccumulateAddsTheWidenedSourceToTheDestination) {
  const size_t count = 1000;
  const std::vector<double> base = random_doubles(count, 5), more = random_doubles(count, 6);
  std::vector<float> shard(count), from_f32(count);
  std::vector<uint16_t> from_bf16(count);
  std::vector<double> wide(base), from_f64(more);
  for (size_t i = 0; i < count; ++i) {
    shard[i] = static_cast<float>(base[i] * 1e-20);  // magnitudes that stay finite in f32
    from_f32[i] = static_cast<float>(more[i] * 1e-20);
    from_bf16[i] = float_to_bf16(from_f32[i]);
  }
  std::vector<float> sum_f32(shard), sum_bf16(shard);
  cpu::convert({TensorView(from_f32.data(), DType::f32, Shape{int64_t(count)}),
                TensorView(sum_f32.data(), DType::f32, Shape{int64_t(count)}), true});
  cpu::convert({TensorView(from_bf16.data(), DType::bf16, Shape{int64_t(count)}),
                TensorView(sum_bf16.data(), DType::f32, Shape{int64_t(count)}), true});
  cpu::convert({TensorView(from_f64.data(), DType::f64, Shape{int64_t(count)}),
                TensorView(wide.data(), DType::f64, Shape{int64_t(count)}), true});
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(sum_f32[i], shard[i] + from_f32[i]) << i;
    ASSERT_EQ(sum_bf16[i], shard[i] + bf16_to_float(from_bf16[i])) << i;
    ASSERT_EQ(wide[i], base[i] + more[i]) << i;
  }
  // Into bf16, or onto itself: refused.
  EXPECT_THROW(cpu::convert({TensorView(from_f32.data(), DType::f32, Shape{int64_t(count)}),
                             TensorView(from_bf16.data(), DType::bf16, Shape{int64_t(count)}), true}),
               Error);
  EXPECT_THROW(cpu::convert({TensorView(shard.data(), DType::f32, Shape{int64_t(count)}),
                             TensorView(shard.data(), DType::f32, Shape{int64_t(count)}), true}),
               Error);
}

TEST(CpuConvert, RejectsBadArguments) {
  std::vector<float> a(8, 1.0f), b(9, 0.0f);
  std::vector<uint8_t> float8(8);
  EXPECT_THROW(cpu::convert({TensorView(a.data(), DType::f32, Shape{8}), TensorView(b.data(), DType::f32, Shape{9})}), Error);
  EXPECT_THROW(cpu::convert({TensorView(a.data(), DType::f32, Shape{8}), TensorView(float8.data(), DType::e4m3, Shape{8})}), Error);
  EXPECT_THROW(cpu::convert({TensorView(a.data(), DType::f32, Shape{8}, Device::cuda), TensorView(b.data(), DType::f32, Shape{8})}), Error);
}

}  // namespace
}  // namespace smelt
