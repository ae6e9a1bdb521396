// Slice geometry: for any layout and rank, the local shape and the offset of the
// local shard in the global tensor. Everything that needs to know where a shard
// lies (redistribution, oracles, checkpoints, dataset slicing) asks here.
#pragma once

#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>

namespace tessera {

/// The piece of dim `d` that `rank` holds: the mixed-radix number of its coordinates
/// on the axes splitting `d`, major first. 0 for an unsplit dim.
constexpr index_t piece_index(const layout& l, int d, int rank) {
  return group_index(l.dev, l.split[d], rank);
}

/// The shape of every rank's shard (the same on all ranks: dims divide evenly).
/// @pre check(l, global).ok()
constexpr extents local_shape(const layout& l, const extents& global) {
  extents e = global;
  for (int d = 0; d < l.ndim; ++d) e.v[d] = global.v[d] / l.pieces(d);
  return e;
}

/// Number of elements in each rank's shard.
constexpr index_t local_size(const layout& l, const extents& global) {
  return local_shape(l, global).size();
}

/// Where `rank`'s shard starts in the global tensor.
/// Example: mesh{2, 4}, layout(m, {{0}, {1}}), global (16, 32), rank 5 -> (8, 8).
constexpr extents local_offset(const layout& l, const extents& global, int rank) {
  extents o = global;
  for (int d = 0; d < l.ndim; ++d) o.v[d] = piece_index(l, d, rank) * (global.v[d] / l.pieces(d));
  return o;
}

/// A box of the global index space: [offset, offset + shape) in every dim.
struct box {
  extents offset;
  extents shape;
  friend constexpr bool operator==(const box&, const box&) = default;
};

/// `rank`'s shard as a box of the global tensor.
constexpr box shard_box(const layout& l, const extents& global, int rank) {
  return box{local_offset(l, global, rank), local_shape(l, global)};
}

/// The intersection of two boxes of the same rank (shape 0 in some dim if empty).
constexpr box intersect(const box& x, const box& y) {
  box r = x;
  for (int d = 0; d < x.shape.ndim; ++d) {
    const index_t lo = x.offset.v[d] > y.offset.v[d] ? x.offset.v[d] : y.offset.v[d];
    const index_t hx = x.offset.v[d] + x.shape.v[d], hy = y.offset.v[d] + y.shape.v[d];
    const index_t hi = hx < hy ? hx : hy;
    r.offset.v[d] = lo;
    r.shape.v[d] = hi > lo ? hi - lo : 0;
  }
  return r;
}

}  // namespace tessera
