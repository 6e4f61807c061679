// Tests of core/numerics.h: float8 e4m3/e5m2 and bfloat16 encode/decode against independent
// formulas and brute-force references, ties, saturation, special values, and amax -> scale.
#include "core/numerics.h"
#include "support/fresh_random.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace smelt {
namespace {

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float float_of(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

struct FormatLayout {
  Float8Format format;
  int mantissa_bits;
  int bias;
  bool has_infinity;
  uint8_t max_code;
};

constexpr FormatLayout kE4m3{Float8Format::e4m3, 3, 7, false, 0x7E};
constexpr FormatLayout kE5m2{Float8Format::e5m2, 2, 15, true, 0x7B};
constexpr FormatLayout kLayouts[] = {kE4m3, kE5m2};

const char* name(const FormatLayout& layout) { return layout.format == Float8Format::e4m3 ? "e4m3" : "e5m2"; }

// Decodes a code from its fields with ldexp, independent of the header's bit manipulation.
double reference_decode(uint8_t code, const FormatLayout& layout) {
  const int exponent_bits = 7 - layout.mantissa_bits;
  const int sign = code >> 7;
  const int exponent = (code >> layout.mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = code & ((1 << layout.mantissa_bits) - 1);
  const int top_exponent = (1 << exponent_bits) - 1;
  double magnitude;
  if (layout.has_infinity && exponent == top_exponent) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else if (!layout.has_infinity && exponent == top_exponent && mantissa == (1 << layout.mantissa_bits) - 1) {
    magnitude = NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(double(mantissa), 1 - layout.bias - layout.mantissa_bits);
  } else {
    magnitude = std::ldexp(double((1 << layout.mantissa_bits) + mantissa), exponent - layout.bias - layout.mantissa_bits);
  }
  return sign ? -magnitude : magnitude;
}

// Nearest finite code by scanning all of them, ties to the even code (even mantissa): the
// saturating encode. Double differences are exact wherever two candidates are close to a tie.
uint8_t reference_encode(float value, const FormatLayout& layout) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  if (std::isnan(value)) return sign | 0x7F;
  const double magnitude = std::fabs(double(value));
  if (magnitude >= reference_decode(layout.max_code, layout)) return sign | layout.max_code;
  uint8_t best = 0;
  double best_error = magnitude;
  for (int code = 1; code <= layout.max_code; ++code) {
    const double error = std::fabs(reference_decode(uint8_t(code), layout) - magnitude);
    if (error < best_error || (error == best_error && code % 2 == 0)) {
      best = uint8_t(code);
      best_error = error;
    }
  }
  return sign | best;
}

uint8_t encode(float value, const FormatLayout& layout, bool saturate) {
  if (layout.format == Float8Format::e4m3) return saturate ? float_to_e4m3(value) : float_to_e4m3_unsaturated(value);
  return saturate ? float_to_e5m2(value) : float_to_e5m2_unsaturated(value);
}

bool is_nan_code(uint8_t code, const FormatLayout& layout) {
  return layout.has_infinity ? (code & 0x7F) > 0x7C : (code & 0x7F) == 0x7F;
}

TEST(Float8Decode, EveryCodeMatchesFieldFormula) {
  for (const FormatLayout& layout : kLayouts) {
    for (int code = 0; code < 256; ++code) {
      const double expected = reference_decode(uint8_t(code), layout);
      const float decoded = float8_to_float(uint8_t(code), layout.format);
      SCOPED_TRACE(std::string(name(layout)) + " code " + std::to_string(code));
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(decoded));
      } else {
        EXPECT_EQ(double(decoded), expected);
        EXPECT_EQ(std::signbit(decoded), code >= 0x80);  // includes -0 for 0x80
      }
    }
  }
}

TEST(Float8Decode, SpecialCodes) {
  int e4m3_nans = 0, e5m2_nans = 0;
  for (int code = 0; code < 256; ++code) {
    e4m3_nans += std::isnan(e4m3_to_float(uint8_t(code)));
    e5m2_nans += std::isnan(e5m2_to_float(uint8_t(code)));
  }
  EXPECT_EQ(e4m3_nans, 2);  // 0x7F, 0xFF
  EXPECT_EQ(e5m2_nans, 6);  // 0x7D..0x7F, 0xFD..0xFF
  EXPECT_EQ(e5m2_to_float(0x7C), INFINITY);
  EXPECT_EQ(e5m2_to_float(0xFC), -INFINITY);
  for (int code = 0; code < 256; ++code) EXPECT_FALSE(std::isinf(e4m3_to_float(uint8_t(code)))) << code;
}

// Published bit patterns (OCP FP8 specification tables), as an anchor independent of both codecs.
TEST(Float8Decode, KnownBitPatterns) {
  struct Known {
    Float8Format format;
    uint8_t code;
    float value;
  };
  const Known known[] = {
      {Float8Format::e4m3, 0x00, 0.0f},         {Float8Format::e4m3, 0x01, 0.001953125f},  // 2^-9
      {Float8Format::e4m3, 0x07, 0.013671875f}, {Float8Format::e4m3, 0x08, 0.015625f},     // 2^-6
      {Float8Format::e4m3, 0x38, 1.0f},         {Float8Format::e4m3, 0x3C, 1.5f},
      {Float8Format::e4m3, 0x40, 2.0f},         {Float8Format::e4m3, 0x70, 128.0f},
      {Float8Format::e4m3, 0x77, 240.0f},       {Float8Format::e4m3, 0x7E, 448.0f},
      {Float8Format::e4m3, 0xFE, -448.0f},      {Float8Format::e4m3, 0xB8, -1.0f},
      {Float8Format::e5m2, 0x01, 1.52587890625e-05f},  // 2^-16
      {Float8Format::e5m2, 0x04, 6.103515625e-05f},    // 2^-14
      {Float8Format::e5m2, 0x3C, 1.0f},         {Float8Format::e5m2, 0x3E, 1.5f},
      {Float8Format::e5m2, 0x40, 2.0f},         {Float8Format::e5m2, 0xC0, -2.0f},
      {Float8Format::e5m2, 0x7B, 57344.0f},     {Float8Format::e5m2, 0x7C, INFINITY},
      {Float8Format::e5m2, 0xFC, -INFINITY},
  };
  for (const Known& k : known) {
    EXPECT_EQ(float8_to_float(k.code, k.format), k.value) << int(k.code);
    EXPECT_EQ(float_to_float8(k.value, k.format), std::isinf(k.value) ? (k.code & 0x80) | 0x7B : k.code)
        << int(k.code);
  }
  EXPECT_EQ(float_to_e5m2_unsaturated(INFINITY), 0x7C);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)) && std::isnan(e4m3_to_float(0xFF)));
  EXPECT_TRUE(std::isnan(e5m2_to_float(0x7D)) && std::isnan(e5m2_to_float(0x7F)));
  EXPECT_EQ(float8_max(Float8Format::e4m3), 448.0f);
  EXPECT_EQ(float8_max(Float8Format::e5m2), 57344.0f);
}

TEST(Float8Encode, RoundTripsEveryCode) {
  for (const FormatLayout& layout : kLayouts) {
    for (int code = 0; code < 256; ++code) {
      const uint8_t c = uint8_t(code);
      const float value = float8_to_float(c, layout.format);
      if (is_nan_code(c, layout)) {
        EXPECT_TRUE(is_nan_code(encode(value, layout, true), layout));
        EXPECT_TRUE(is_nan_code(encode(value, layout, false), layout));
      } else if (std::isinf(value)) {
        EXPECT_EQ(encode(value, layout, false), c);
        EXPECT_EQ(encode(value, layout, true), (c & 0x80) | layout.max_code);
      } else {
        EXPECT_EQ(encode(value, layout, true), c) << name(layout) << " code " << code;
        EXPECT_EQ(encode(value, layout, false), c) << name(layout) << " code " << code;
      }
    }
  }
}

// Midpoints between every pair of neighbouring codes (subnormal, the subnormal/normal boundary,
// every binade) go to the even code; one float ulp either side goes to the nearer code.
TEST(Float8Encode, TiesToEvenAndNeighboursOfEveryMidpoint) {
  for (const FormatLayout& layout : kLayouts) {
    for (float sign : {1.0f, -1.0f}) {
      const uint8_t sign_bit = sign < 0 ? 0x80 : 0x00;
      for (int code = 0; code < layout.max_code; ++code) {
        const float low = float8_to_float(uint8_t(code), layout.format);
        const float high = float8_to_float(uint8_t(code + 1), layout.format);
        const float middle = (low + high) * 0.5f;  // exact: few significant bits
        ASSERT_EQ(double(middle), (double(low) + double(high)) / 2);
        const int even = code % 2 == 0 ? code : code + 1;
        for (bool saturate : {true, false}) {
          SCOPED_TRACE(std::string(name(layout)) + " between codes " + std::to_string(code) + " and " +
                       std::to_string(code + 1) + (saturate ? " saturating" : " unsaturated"));
          EXPECT_EQ(encode(sign * middle, layout, saturate), sign_bit | even);
          EXPECT_EQ(encode(sign * std::nextafter(middle, INFINITY), layout, saturate), sign_bit | (code + 1));
          EXPECT_EQ(encode(sign * std::nextafter(middle, 0.0f), layout, saturate), sign_bit | code);
        }
      }
    }
  }
}

TEST(Float8Encode, SaturatesBeyondMax) {
  for (float sign : {1.0f, -1.0f}) {
    const uint8_t s = sign < 0 ? 0x80 : 0x00;
    for (float value : {448.0f, 449.0f, 463.99f, 464.0f, 465.0f, 480.0f, 1e4f, 1e30f, 3.4e38f, INFINITY})
      EXPECT_EQ(float_to_e4m3(sign * value), s | 0x7E) << value;
    for (float value : {57344.0f, 57345.0f, 61439.0f, 61440.0f, 61441.0f, 65536.0f, 1e30f, INFINITY})
      EXPECT_EQ(float_to_e5m2(sign * value), s | 0x7B) << value;
    EXPECT_EQ(float_to_e4m3(sign * 432.0f), s | 0x7E);  // tie 416|448 -> 448 (even mantissa 110)
    EXPECT_EQ(float_to_e4m3(sign * 431.0f), s | 0x7D);
  }
}

// The plain (PyTorch .to(float8)) casts: e4m3 overflow is NaN, e5m2 overflow is infinity.
TEST(Float8Encode, UnsaturatedOutOfRange) {
  for (float sign : {1.0f, -1.0f}) {
    const uint8_t s = sign < 0 ? 0x80 : 0x00;
    EXPECT_EQ(float_to_e4m3_unsaturated(sign * 448.0f), s | 0x7E);
    EXPECT_EQ(float_to_e4m3_unsaturated(sign * 464.0f), s | 0x7E);  // tie, even mantissa
    EXPECT_EQ(float_to_e4m3_unsaturated(sign * std::nextafter(464.0f, 0.0f)), s | 0x7E);
    for (float value : {std::nextafter(464.0f, INFINITY), 470.0f, 480.0f, 1e6f, INFINITY})
      EXPECT_EQ(float_to_e4m3_unsaturated(sign * value), s | 0x7F) << value;
    EXPECT_EQ(float_to_e5m2_unsaturated(sign * 57344.0f), s | 0x7B);
    EXPECT_EQ(float_to_e5m2_unsaturated(sign * std::nextafter(61440.0f, 0.0f)), s | 0x7B);
    for (float value : {61440.0f, 65536.0f, 1e30f, INFINITY})
      EXPECT_EQ(float_to_e5m2_unsaturated(sign * value), s | 0x7C) << value;
  }
}

TEST(Float8Encode, ZerosSubnormalFloatsAndNan) {
  for (const FormatLayout& layout : kLayouts) {
    for (bool saturate : {true, false}) {
      EXPECT_EQ(encode(0.0f, layout, saturate), 0x00);
      EXPECT_EQ(encode(-0.0f, layout, saturate), 0x80);
      for (float tiny : {std::numeric_limits<float>::denorm_min(), 1e-40f, std::numeric_limits<float>::min(), 1e-30f}) {
        EXPECT_EQ(encode(tiny, layout, saturate), 0x00) << tiny;
        EXPECT_EQ(encode(-tiny, layout, saturate), 0x80) << tiny;
      }
      EXPECT_EQ(encode(std::numeric_limits<float>::quiet_NaN(), layout, saturate), 0x7F);
      EXPECT_EQ(encode(-std::numeric_limits<float>::quiet_NaN(), layout, saturate), 0xFF);
      EXPECT_EQ(encode(float_of(0x7F800001u), layout, saturate), 0x7F);  // signalling NaN
    }
  }
  // Half of the smallest subnormal is a tie to zero; just above it rounds up.
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(float_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -17)), 0x00);
  EXPECT_EQ(float_to_e5m2(std::nextafter(std::ldexp(1.0f, -17), 1.0f)), 0x01);
}

// Random floats across (and beyond) each format's exponent range, plus random bit patterns
// and points at and around midpoints, against the brute-force nearest-code reference.
TEST(Float8Encode, RandomFloatsMatchBruteForce) {
  std::mt19937 random(uint32_t(testing_support::fresh(20240611)));
  for (const FormatLayout& layout : kLayouts) {
    const int lowest = 1 - layout.bias - layout.mantissa_bits - 4;
    const int highest = (layout.format == Float8Format::e4m3 ? 8 : 15) + 3;
    std::uniform_int_distribution<int> exponent(lowest, highest);
    std::uniform_int_distribution<uint32_t> mantissa(0, (1u << 23) - 1), any_bits;
    std::uniform_int_distribution<int> kind(0, 15), code(0, layout.max_code - 1);
    int mismatches = 0;
    for (int i = 0; i < 500000; ++i) {
      float value;
      const int k = kind(random);
      if (k == 0) {
        value = float_of(any_bits(random));
      } else if (k == 1) {  // a midpoint or one ulp from it
        const int c = code(random);
        const float middle = (float8_to_float(uint8_t(c), layout.format) + float8_to_float(uint8_t(c + 1), layout.format)) / 2;
        const uint32_t choice = any_bits(random) % 3;
        value = choice == 0 ? middle : std::nextafter(middle, choice == 1 ? INFINITY : 0.0f);
      } else {
        value = float_of((uint32_t(exponent(random) + 127) << 23) | mantissa(random));
      }
      if (any_bits(random) & 1) value = -value;
      const uint8_t expected = reference_encode(value, layout);
      const uint8_t saturated = encode(value, layout, true);
      if (saturated != expected && !(std::isnan(value) && is_nan_code(saturated, layout))) {
        if (++mismatches <= 10)
          ADD_FAILURE() << name(layout) << " value " << value << " (bits 0x" << std::hex << bits_of(value) << ") gave 0x"
                        << int(saturated) << ", reference 0x" << int(expected);
      }
      // Unsaturated differs only past the top midpoint.
      const double magnitude = std::fabs(double(value));
      uint8_t unsaturated_expected = expected;
      const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
      if (layout.format == Float8Format::e4m3 && magnitude > 464.0) unsaturated_expected = sign | 0x7F;
      if (layout.format == Float8Format::e5m2 && magnitude >= 61440.0) unsaturated_expected = sign | 0x7C;
      const uint8_t unsaturated = encode(value, layout, false);
      if (unsaturated != unsaturated_expected && !(std::isnan(value) && is_nan_code(unsaturated, layout))) {
        if (++mismatches <= 10)
          ADD_FAILURE() << name(layout) << " unsaturated value " << value << " gave 0x" << std::hex << int(unsaturated)
                        << ", expected 0x" << int(unsaturated_expected);
      }
    }
    EXPECT_EQ(mismatches, 0) << name(layout);
  }
}

// bfloat16 reference: the nearer of the two truncation neighbours, ties to the even one,
// with infinity standing at 2^128 for rounding purposes (IEEE overflow rule).
uint16_t reference_bf16(float value) {
  if (std::isnan(value)) return 0x7FC0;
  const uint32_t bits = bits_of(value);
  const uint16_t down = uint16_t(bits >> 16);
  const uint16_t up = uint16_t(down + 1);
  const auto as_double = [](uint16_t b) {
    if ((b & 0x7FFF) == 0x7F80) return std::copysign(std::ldexp(1.0, 128), (b & 0x8000) ? -1.0 : 1.0);
    return double(float_of(uint32_t(b) << 16));
  };
  if ((bits & 0xFFFF) == 0 || std::isinf(value)) return down;
  const double error_down = std::fabs(double(value) - as_double(down));
  const double error_up = std::fabs(as_double(up) - double(value));
  if (error_down != error_up) return error_down < error_up ? down : up;
  return (down & 1) == 0 ? down : up;
}

TEST(Bfloat16, SpecialValuesAndTies) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to infinity
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(float_to_bf16(float_of(0x7F800001u)), 0x7FC0);  // NaN with a low payload stays NaN
  EXPECT_EQ(float_to_bf16(float_of(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(float_of(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(float_of(0x3F808001u)), 0x3F81);
  EXPECT_EQ(float_to_bf16(float_of(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(float_to_bf16(float_of(0x00008000u)), 0x0000);  // subnormal tie
  EXPECT_EQ(float_to_bf16(float_of(0x00018000u)), 0x0002);
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7FC0)));
  EXPECT_EQ(bf16_to_float(0xFF80), -INFINITY);
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every bf16 round-trips exactly
    const float value = bf16_to_float(uint16_t(b));
    EXPECT_EQ(bits_of(value), b << 16);
    if (!std::isnan(value)) {
      EXPECT_EQ(float_to_bf16(value), b);
    }
  }
}

TEST(Bfloat16, RandomFloatsMatchReference) {
  std::mt19937 random(uint32_t(testing_support::fresh(7)));
  std::uniform_int_distribution<uint32_t> any_bits;
  int mismatches = 0;
  for (int i = 0; i < 1000000; ++i) {
    uint32_t bits = any_bits(random);
    if (i % 4 == 0) bits = (bits & 0xFFFF0000u) | 0x8000u;  // exact ties
    const float value = float_of(bits);
    if (float_to_bf16(value) != reference_bf16(value) && ++mismatches <= 10)
      ADD_FAILURE() << "bits 0x" << std::hex << bits << " gave 0x" << float_to_bf16(value) << ", reference 0x"
                    << reference_bf16(value);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(AmaxToScale, Values) {
  EXPECT_EQ(amax_to_scale(448.0f, Float8Format::e4m3, false), 1.0f);
  EXPECT_EQ(amax_to_scale(1.0f, Float8Format::e4m3, false), 448.0f);
  EXPECT_EQ(amax_to_scale(3.0f, Float8Format::e4m3, false), 448.0f / 3.0f);
  EXPECT_EQ(amax_to_scale(3.0f, Float8Format::e4m3, true), 128.0f);
  EXPECT_EQ(amax_to_scale(1.0f, Float8Format::e4m3, true), 256.0f);
  EXPECT_EQ(amax_to_scale(57344.0f, Float8Format::e5m2, false), 1.0f);
  EXPECT_EQ(amax_to_scale(7.0f, Float8Format::e5m2, true), 8192.0f);  // 8192 <= 57344/7 = 8192 exactly
  EXPECT_EQ(amax_to_scale(7.5f, Float8Format::e5m2, true), 4096.0f);
  // Tiny and zero amax are floored at 1e-12 (dividing in double, as torchao does).
  const float floored = float(448.0 / 1e-12);
  EXPECT_EQ(amax_to_scale(0.0f, Float8Format::e4m3, false), floored);
  EXPECT_EQ(amax_to_scale(1e-20f, Float8Format::e4m3, false), floored);
  EXPECT_EQ(amax_to_scale(0.0f, Float8Format::e4m3, true), std::ldexp(1.0f, 48));  // 2^48 <= 4.48e14 < 2^49
  EXPECT_EQ(amax_to_scale(INFINITY, Float8Format::e4m3, false), 0.0f);
  EXPECT_TRUE(std::isnan(amax_to_scale(NAN, Float8Format::e4m3, true)));
}

TEST(AmaxToScale, RandomAmaxMatchesFloatDivisionAndPowerOfTwoBounds) {
  std::mt19937 random(uint32_t(testing_support::fresh(99)));
  std::uniform_real_distribution<float> log_amax(-11.0f, 30.0f);
  for (int i = 0; i < 100000; ++i) {
    const float amax = std::pow(10.0f, log_amax(random));
    for (Float8Format format : {Float8Format::e4m3, Float8Format::e5m2}) {
      const float scale = amax_to_scale(amax, format, false);
      ASSERT_EQ(scale, float8_max(format) / amax) << amax;  // one rounding: same as float32 division
      const float rounded = amax_to_scale(amax, format, true);
      int exponent;
      ASSERT_EQ(std::frexp(rounded, &exponent), 0.5f) << rounded;  // a power of two
      ASSERT_LE(rounded, scale);
      ASSERT_GT(2.0f * rounded, scale);
    }
  }
  EXPECT_EQ(round_down_to_power_of_two(std::numeric_limits<float>::denorm_min() * 3), std::numeric_limits<float>::denorm_min() * 2);
  EXPECT_EQ(round_down_to_power_of_two(0.75f), 0.5f);
  EXPECT_EQ(round_down_to_power_of_two(0.0f), 0.0f);
  EXPECT_EQ(round_down_to_power_of_two(INFINITY), INFINITY);
}

}  // namespace
}  // namespace smelt
