// A counter-based random generator: the number at a position depends only on the
// stream's key and the position, so every rank draws any element of a global tensor
// without state (parameter initializers, dropout masks). Standard library only.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>

namespace tessera::kernels {

/// SplitMix64's output function: a bijection of 64-bit words that mixes every input
/// bit into every output bit.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// A random stream addressed by position: bits(i) is the i-th output of SplitMix64
/// seeded with mix64(key), computed directly from i. Streams of different keys are
/// unrelated; draws need no state, so any rank draws any element.
///
///     random_stream s(stream_key(1, "fc.weight"));
///     s.uniform<float>(7);   // the same number on every rank and in every run
class random_stream {
 public:
  constexpr explicit random_stream(std::uint64_t key) : key_(mix64(key)) {}

  /// 64 random bits for position i.
  constexpr std::uint64_t bits(std::uint64_t i) const {
    return mix64(key_ + (i + 1) * 0x9e3779b97f4a7c15ULL);
  }
  /// Uniform in [0, 1) with the precision of double (53 bits).
  constexpr double uniform01(std::uint64_t i) const { return double(bits(i) >> 11) * 0x1.0p-53; }
  /// Uniform in [lo, hi).
  constexpr double uniform(std::uint64_t i, double lo, double hi) const {
    return lo + (hi - lo) * uniform01(i);
  }
  /// Standard normal for position i (Box-Muller on positions 2i and 2i + 1).
  double normal(std::uint64_t i) const {
    const double u1 = double((bits(2 * i) >> 11) + 1) * 0x1.0p-53;  // (0, 1]: log is finite
    const double u2 = uniform01(2 * i + 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  std::uint64_t key_;
};

/// The key of a named stream under a seed: FNV-1a over the name, mixed with the seed.
/// `stream_key(1, "fc.weight") != stream_key(1, "fc.bias")`.
constexpr std::uint64_t stream_key(std::uint64_t seed, std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : name) {
    h ^= std::uint8_t(c);
    h *= 0x100000001b3ULL;
  }
  return mix64(h ^ mix64(seed));
}

}  // namespace tessera::kernels
