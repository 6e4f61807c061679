// Scalar numerics shared by the CPU and CUDA backends: bfloat16 and float8 (e4m3fn, e5m2)
// encode/decode with round-to-nearest-even and saturation, and the amax -> scale rule of
// float8 training. One header for host C++ and CUDA device code, so both backends round alike.
#pragma once
#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <cstring>
#endif
#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

#ifndef SMELT_HOST_DEVICE
#if defined(__CUDACC__)
#define SMELT_HOST_DEVICE __host__ __device__
#else
#define SMELT_HOST_DEVICE
#endif
#endif
#ifndef SMELT_FORCE_INLINE
#if defined(__CUDACC__)
#define SMELT_FORCE_INLINE __forceinline__
#else
#define SMELT_FORCE_INLINE inline
#endif
#endif

namespace smelt {

enum class Float8Format : uint8_t {
  e4m3,  // OCP E4M3 "fn": bias 7, no infinities, NaN = S.1111.111, max 448, min subnormal 2^-9
  e5m2,  // OCP E5M2: bias 15, IEEE-like with infinities, max 57344, min subnormal 2^-16
};

// The smallest amax the scale computation divides by (as torchao's float8 training does).
constexpr double kAmaxFloor = 1e-12;

namespace numerics_detail {

constexpr uint32_t kFloatSignMask = 0x80000000u;
constexpr uint32_t kFloatMagnitudeMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInfinityBits = 0x7F800000u;
constexpr uint32_t kFloatQuietNanBits = 0x7FC00000u;
constexpr int kFloatMantissaBits = 23;
constexpr int kFloatBias = 127;

SMELT_HOST_DEVICE SMELT_FORCE_INLINE uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

SMELT_HOST_DEVICE SMELT_FORCE_INLINE float bits_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// Rounds a finite, non-negative float (given by its bits) to a float8 grid with MantissaBits
// mantissa bits and exponent bias Bias, ties to even, as if the exponent range had no top.
// Returns the magnitude code (exponent field << MantissaBits | mantissa); a value that
// rounds past the format's largest finite number gives a code above it (codes are monotonic).
template <int MantissaBits, int Bias>
SMELT_HOST_DEVICE SMELT_FORCE_INLINE uint32_t round_magnitude_to_code(uint32_t magnitude) {
  constexpr uint32_t min_normal_exponent_field = kFloatBias + 1 - Bias;  // float exponent of 2^(1-Bias)
  const uint32_t exponent_field = magnitude >> kFloatMantissaBits;
  if (exponent_field >= min_normal_exponent_field) {
    // Normal float8: re-bias the exponent, then drop the low mantissa bits with RNE.
    constexpr int dropped = kFloatMantissaBits - MantissaBits;
    const uint32_t rebased = magnitude - (uint32_t(kFloatBias - Bias) << kFloatMantissaBits);
    const uint32_t kept_lowest_bit = (rebased >> dropped) & 1u;
    return (rebased + ((1u << (dropped - 1)) - 1u) + kept_lowest_bit) >> dropped;
  }
  // Subnormal float8 (or zero): the code is the number of smallest subnormals 2^(1-Bias-MantissaBits).
  // value = significand * 2^(exponent - 150), so code = RNE(significand >> shift) with:
  const uint32_t mantissa = magnitude & ((1u << kFloatMantissaBits) - 1u);
  const uint32_t significand = exponent_field == 0 ? mantissa : (mantissa | (1u << kFloatMantissaBits));
  const int exponent = exponent_field == 0 ? 1 : int(exponent_field);
  const int shift = (1 - Bias - MantissaBits) - (exponent - kFloatBias - kFloatMantissaBits);
  if (shift > kFloatMantissaBits + 1) return 0;  // significand < 2^24 <= half a subnormal
  const uint32_t quotient = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const bool round_up = remainder > half || (remainder == half && (quotient & 1u));
  return quotient + (round_up ? 1u : 0u);
}

// Decodes a finite float8 magnitude code (sign bit cleared) to float, exactly.
template <int MantissaBits, int Bias>
SMELT_HOST_DEVICE SMELT_FORCE_INLINE float decode_finite_magnitude(uint32_t code) {
  const uint32_t exponent_field = code >> MantissaBits;
  const uint32_t mantissa = code & ((1u << MantissaBits) - 1u);
  if (exponent_field == 0) {
    // mantissa * 2^(1 - Bias - MantissaBits): a small integer times a power of two, exact in float.
    constexpr uint32_t smallest_subnormal_bits = uint32_t(kFloatBias + 1 - Bias - MantissaBits) << kFloatMantissaBits;
    return float(mantissa) * bits_float(smallest_subnormal_bits);
  }
  return bits_float(((exponent_field + kFloatBias - Bias) << kFloatMantissaBits) |
                    (mantissa << (kFloatMantissaBits - MantissaBits)));
}

SMELT_HOST_DEVICE SMELT_FORCE_INLINE bool is_nan_bits(uint32_t bits) {
  return (bits & kFloatMagnitudeMask) > kFloatInfinityBits;
}

}  // namespace numerics_detail

// ---- bfloat16 -------------------------------------------------------------------------------

SMELT_HOST_DEVICE SMELT_FORCE_INLINE float bf16_to_float(uint16_t value) {
  return numerics_detail::bits_float(uint32_t(value) << 16);
}

// Round to nearest, ties to even; overflow goes to infinity; every NaN becomes 0x7FC0
// (PyTorch's float -> bfloat16 conversion does the same).
SMELT_HOST_DEVICE SMELT_FORCE_INLINE uint16_t float_to_bf16(float value) {
  const uint32_t bits = numerics_detail::float_bits(value);
  if (numerics_detail::is_nan_bits(bits)) return 0x7FC0;
  const uint32_t kept_lowest_bit = (bits >> 16) & 1u;
  return uint16_t((bits + 0x7FFFu + kept_lowest_bit) >> 16);
}

// ---- float8 e4m3fn --------------------------------------------------------------------------

constexpr float kE4m3Max = 448.0f;
constexpr uint8_t kE4m3MaxCode = 0x7E;
constexpr uint8_t kE4m3NanCode = 0x7F;

SMELT_HOST_DEVICE SMELT_FORCE_INLINE float e4m3_to_float(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t magnitude = code & 0x7Fu;
  if (magnitude == kE4m3NanCode) return numerics_detail::bits_float(sign | numerics_detail::kFloatQuietNanBits);
  const float value = numerics_detail::decode_finite_magnitude<3, 7>(magnitude);
  return numerics_detail::bits_float(sign | numerics_detail::float_bits(value));
}

// Saturating: finite values beyond 448 (after rounding) and infinities clamp to +-448; NaN -> NaN.
SMELT_HOST_DEVICE SMELT_FORCE_INLINE uint8_t float_to_e4m3(float value) {
  const uint32_t bits = numerics_detail::float_bits(value);
  const uint8_t sign = uint8_t((bits & numerics_detail::kFloatSignMask) >> 24);
  const uint32_t magnitude = bits & numerics_detail::kFloatMagnitudeMask;
  if (magnitude > numerics_detail::kFloatInfinityBits) return sign | kE4m3NanCode;
  if (magnitude == numerics_detail::kFloatInfinityBits) return sign | kE4m3MaxCode;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // Finite values: the hardware conversion (cvt.rn.satfinite) rounds and saturates exactly as
  // below, in one instruction; the `gpu` tests compare every cast kernel with the CPU bit for bit.
  return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3);
#endif
  const uint32_t code = numerics_detail::round_magnitude_to_code<3, 7>(magnitude);
  return sign | uint8_t(code > kE4m3MaxCode ? kE4m3MaxCode : code);
}

// Non-saturating, as PyTorch's plain cast: values that round past 448 (|x| > 464), infinities
// and NaN all become NaN (0x7F with the input's sign).
SMELT_HOST_DEVICE SMELT_FORCE_INLINE uint8_t float_to_e4m3_unsaturated(float value) {
  const uint32_t bits = numerics_detail::float_bits(value);
  const uint8_t sign = uint8_t((bits & numerics_detail::kFloatSignMask) >> 24);
  const uint32_t magnitude = bits & numerics_detail::kFloatMagnitudeMask;
  if (magnitude >= numerics_detail::kFloatInfinityBits) return sign | kE4m3NanCode;
  const uint32_t code = numerics_detail::round_magnitude_to_code<3, 7>(magnitude);
  return sign | uint8_t(code > kE4m3MaxCode ? kE4m3NanCode : code);
}

// ---- float8 e5m2 ----------------------------------------------------------------------------

constexpr float kE5m2Max = 57344.0f;
constexpr uint8_t kE5m2MaxCode = 0x7B;
constexpr uint8_t kE5m2InfinityCode = 0x7C;
constexpr uint8_t kE5m2NanCode = 0x7F;

SMELT_HOST_DEVICE SMELT_FORCE_INLINE float e5m2_to_float(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t magnitude = code & 0x7Fu;
  if (magnitude > kE5m2InfinityCode) return numerics_detail::bits_float(sign | numerics_detail::kFloatQuietNanBits);
  if (magnitude == kE5m2InfinityCode) return numerics_detail::bits_float(sign | numerics_detail::kFloatInfinityBits);
  const float value = numerics_detail::decode_finite_magnitude<2, 15>(magnitude);
  return numerics_detail::bits_float(sign | numerics_detail::float_bits(value));
}

// Saturating: finite values beyond 57344 (after rounding) and infinities clamp to +-57344; NaN -> NaN.
SMELT_HOST_DEVICE SMELT_FORCE_INLINE uint8_t float_to_e5m2(float value) {
  const uint32_t bits = numerics_detail::float_bits(value);
  const uint8_t sign = uint8_t((bits & numerics_detail::kFloatSignMask) >> 24);
  const uint32_t magnitude = bits & numerics_detail::kFloatMagnitudeMask;
  if (magnitude > numerics_detail::kFloatInfinityBits) return sign | kE5m2NanCode;
  if (magnitude == numerics_detail::kFloatInfinityBits) return sign | kE5m2MaxCode;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E5M2);  // as float_to_e4m3
#endif
  const uint32_t code = numerics_detail::round_magnitude_to_code<2, 15>(magnitude);
  return sign | uint8_t(code > kE5m2MaxCode ? kE5m2MaxCode : code);
}

// Non-saturating, as PyTorch's plain cast: values that round past 57344 (|x| >= 61440) and
// infinities become infinity; NaN -> NaN (0x7F with the input's sign).
SMELT_HOST_DEVICE SMELT_FORCE_INLINE uint8_t float_to_e5m2_unsaturated(float value) {
  const uint32_t bits = numerics_detail::float_bits(value);
  const uint8_t sign = uint8_t((bits & numerics_detail::kFloatSignMask) >> 24);
  const uint32_t magnitude = bits & numerics_detail::kFloatMagnitudeMask;
  if (magnitude > numerics_detail::kFloatInfinityBits) return sign | kE5m2NanCode;
  if (magnitude == numerics_detail::kFloatInfinityBits) return sign | kE5m2InfinityCode;
  const uint32_t code = numerics_detail::round_magnitude_to_code<2, 15>(magnitude);
  return sign | uint8_t(code > kE5m2InfinityCode ? kE5m2InfinityCode : code);
}

// ---- by format ------------------------------------------------------------------------------

SMELT_HOST_DEVICE SMELT_FORCE_INLINE float float8_max(Float8Format format) {
  return format == Float8Format::e4m3 ? kE4m3Max : kE5m2Max;
}

// Saturating encode (what float8 training uses).
SMELT_HOST_DEVICE SMELT_FORCE_INLINE uint8_t float_to_float8(float value, Float8Format format) {
  return format == Float8Format::e4m3 ? float_to_e4m3(value) : float_to_e5m2(value);
}

SMELT_HOST_DEVICE SMELT_FORCE_INLINE float float8_to_float(uint8_t code, Float8Format format) {
  return format == Float8Format::e4m3 ? e4m3_to_float(code) : e5m2_to_float(code);
}

// ---- scales ---------------------------------------------------------------------------------

// The largest power of two not above |value|, with value's sign; 0, infinities and NaN pass
// through. Exact: keeps the top set bit of the float (the exponent for normals).
SMELT_HOST_DEVICE SMELT_FORCE_INLINE float round_down_to_power_of_two(float value) {
  const uint32_t bits = numerics_detail::float_bits(value);
  const uint32_t magnitude = bits & numerics_detail::kFloatMagnitudeMask;
  if (magnitude >= numerics_detail::kFloatInfinityBits || magnitude == 0) return value;
  uint32_t kept = magnitude & 0x7F800000u;  // normal: clear the mantissa
  if (kept == 0) {                          // subnormal: keep the highest mantissa bit
    kept = magnitude;
    while (kept & (kept - 1u)) kept &= kept - 1u;
  }
  return numerics_detail::bits_float((bits & numerics_detail::kFloatSignMask) | kept);
}

// Scale that maps amax onto the format's largest value: float8_max / max(amax, 1e-12), rounded
// once to float32 (bit-identical to dividing in float32 whenever amax >= 1e-12, and to torchao,
// which divides in float64 and casts). NaN amax gives NaN; infinite amax gives 0. With
// round_to_power_of_two the scale is rounded down to a power of two, exactly.
SMELT_HOST_DEVICE SMELT_FORCE_INLINE float amax_to_scale(float amax, Float8Format format, bool round_to_power_of_two) {
  if (amax != amax) return amax;
  const double floored = double(amax) > kAmaxFloor ? double(amax) : kAmaxFloor;
  const float scale = float(double(float8_max(format)) / floored);
  return round_to_power_of_two ? round_down_to_power_of_two(scale) : scale;
}

}  // namespace smelt
