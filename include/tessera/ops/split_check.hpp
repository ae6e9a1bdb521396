// A check the sharding rules share: a strategy's split tuple against an input's shape,
// every known extent divisible by its number of pieces. Standard library only and
// constexpr.
#pragma once

#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/strategy.hpp>

namespace tessera::detail {

/// Every extent of `shape` that is known divisible by its split in `s` (one entry per
/// dim): "layout: a tensor dim must be divisible by the product of its splits: dim 1 has
/// extent 6, split into 4 pieces". Dynamic extents are checked when they are known.
constexpr status check_divides(const split_tuple& s, const extents& shape) {
  for (int d = 0; d < shape.ndim && d < s.n; ++d)
    if (shape.v[d] != dynamic_extent && s.v[d] > 0 && shape.v[d] % s.v[d] != 0)
      return fail(errc::dim_not_divisible, d, -1, shape.v[d], s.v[d]);
  return {};
}

}  // namespace tessera::detail
