// Global tensor shapes: a rank and up to max_tensor_ndim extents, some of which
// may be dynamic (known only at run time).
#pragma once

#include <array>
#include <initializer_list>
#include <tessera/core/config.hpp>

namespace tessera {

/// An extent whose value is known only at run time.
inline constexpr index_t dynamic_extent = -1;

/// A tensor shape. A structural type: `extents{128, 64}` can be a template
/// argument. Unused entries stay 0 so that equal shapes compare equal.
struct extents {
  int ndim = 0;
  std::array<index_t, max_tensor_ndim> v{};

  constexpr extents() = default;
  constexpr extents(std::initializer_list<index_t> e) {
    for (index_t x : e) {
      if (ndim < max_tensor_ndim) v[ndim] = x;
      ++ndim;
    }
  }
  /// A shape of rank `n` whose extents are all dynamic.
  static constexpr extents dynamic(int n) {
    extents e;
    e.ndim = n;
    for (int d = 0; d < n; ++d) e.v[d] = dynamic_extent;
    return e;
  }

  constexpr index_t operator[](int d) const { return v[d]; }
  constexpr index_t& operator[](int d) { return v[d]; }
  constexpr int rank() const { return ndim; }
  /// Number of elements (1 for rank 0).
  constexpr index_t size() const {
    index_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= v[d];
    return n;
  }
  constexpr bool is_static() const {
    for (int d = 0; d < ndim; ++d)
      if (v[d] == dynamic_extent) return false;
    return true;
  }
  friend constexpr bool operator==(const extents&, const extents&) = default;
};

/// The extents of an array's shape (any sequence of sizes: an xarray's, a device
/// array's); dims past max_tensor_ndim count in ndim only, as in the list constructor.
template <class Shape>
constexpr extents extents_of(const Shape& s) {
  extents e;
  e.ndim = int(s.size());
  for (int d = 0; d < e.ndim && d < max_tensor_ndim; ++d) e.v[d] = index_t(s[std::size_t(d)]);
  return e;
}

}  // namespace tessera
