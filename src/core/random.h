// Random: a small, portable, seedable generator (SplitMix64 + xoshiro256**) with
// uniform and normal draws, identical on every platform and compiler.
#pragma once
#include <cmath>
#include <cstdint>
#include <numbers>

namespace smelt {

class Random {
 public:
  explicit Random(uint64_t seed, uint64_t stream = 0) {
    uint64_t x = seed ^ (0x9E3779B97F4A7C15ull * (stream + 1));
    for (auto& s : state_) s = split_mix(x);
  }
  uint64_t next() {
    const uint64_t result = rotate(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotate(state_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [low, high).
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  // Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2 * std::numbers::pi * u2);
    has_spare_ = true;
    return radius * std::cos(2 * std::numbers::pi * u2);
  }
  uint64_t below(uint64_t bound) { return bound == 0 ? 0 : next() % bound; }

 private:
  static uint64_t split_mix(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  static uint64_t rotate(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace smelt
