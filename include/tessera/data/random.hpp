// The dataset layer's random numbers: a small generator whose sequence is fixed by
// its seed on every platform, and the keys that seed it per pass and per sample.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace tessera::data {

/// What a transform knows about the row it transforms: the sample's index in its
/// source (row::index) and the pass (the epoch, times the repeat count, plus the
/// repetition). Random transforms seed their generator from these and their own seed,
/// so a sample's augmentation does not depend on sharding, shuffling or prefetching,
/// and differs from pass to pass.
struct sample_info {
  std::int64_t index = 0;
  std::int64_t pass = 0;
};

/// splitmix64's finaliser: a bijection of 64-bit words that scatters nearby inputs.
constexpr std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// A key from a list of numbers (order matters): mix(... mix(mix(k0) ^ k1) ...).
constexpr std::uint64_t make_key(std::initializer_list<std::uint64_t> parts) {
  std::uint64_t k = 0x243f6a8885a308d3ull;
  for (std::uint64_t p : parts) k = mix(k ^ p);
  return k;
}

/// splitmix64: a 64-bit generator with one word of state. Its outputs, and so every
/// shuffle and augmentation derived from them, are the same with every compiler and
/// standard library (unlike std::uniform_int_distribution's).
class rng {
 public:
  constexpr explicit rng(std::uint64_t seed) : state_(seed) {}
  /// The generator of a random transform with seed `seed` for one sample and pass.
  /// `salt` tells kinds of transform apart, so that a crop and a flip given the same
  /// seed draw unrelated numbers.
  static constexpr rng for_sample(std::uint64_t seed, const sample_info& s, std::uint64_t salt = 0) {
    return rng(make_key({seed, salt, static_cast<std::uint64_t>(s.pass), static_cast<std::uint64_t>(s.index)}));
  }

  constexpr std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n) (n > 0), without modulo bias.
  constexpr std::uint64_t below(std::uint64_t n) {
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
    std::uint64_t x = next();
    while (x >= limit) x = next();
    return x % n;
  }
  /// Uniform in [0, 1), 24 random bits.
  constexpr float uniform() { return static_cast<float>(next() >> 40) * 0x1p-24f; }

 private:
  std::uint64_t state_;
};

}  // namespace tessera::data
