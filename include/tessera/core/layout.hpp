// A tensor's distribution over a mesh: which mesh axes split each tensor dim
// (major to minor), which hold partial values still to be reduced, and the
// rest replicas.
#pragma once

#include <array>
#include <initializer_list>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/reduce_op.hpp>

namespace tessera {

/// The layout of a tensor on a mesh. For every tensor dim `d`, `split[d]` lists the
/// mesh axes that cut it, major to minor: the dim is cut into the product of their
/// sizes, and the piece a rank holds is the mixed-radix number of its coordinates
/// on those axes. `partial` is the set of mesh axes over which the local values are
/// partial results, combined with `op`. Every other mesh axis holds replicas.
///
/// Example, mesh{2, 4}: layout(m, {{0}, {1}}) cuts a 16 x 32 matrix into 2 x 4 blocks
/// of 8 x 8; rank 5 (coordinates (1, 1)) holds rows 8..16, columns 8..16.
/// layout(m, {{1, 0}, {}}) cuts rows into 8 pieces, axis 1 major: rank 5 holds
/// piece 1 * 2 + 1 = 3. layout(m, {{0}, {}}).with_partial(1) holds partial sums over
/// the 4 ranks of each row of the mesh, the seed's MatMul output before AllReduce.
///
/// A structural type, usable as a template argument.
struct layout {
  mesh dev;
  int ndim = 0;
  std::array<axis_list, max_tensor_ndim> split{};
  axis_mask partial = 0;
  reduce_op op = reduce_op::sum;

  constexpr layout() = default;
  /// `dims` gives, per tensor dim, the mesh axes that split it ({} = not split).
  constexpr layout(const mesh& m, std::initializer_list<axis_list> dims) : dev(m) {
    for (const axis_list& a : dims) {
      if (ndim < max_tensor_ndim) split[ndim] = a;
      ++ndim;
    }
  }
  /// The fully replicated layout of a rank-`n` tensor.
  static constexpr layout replicated(const mesh& m, int n) {
    layout l;
    l.dev = m;
    l.ndim = n;
    return l;
  }

  /// This layout with the listed mesh axes also partial, combined with `how`.
  constexpr layout with_partial(const axis_list& axes, reduce_op how = reduce_op::sum) const {
    layout l = *this;
    l.partial |= axes.mask();
    l.op = how;
    return l;
  }
  constexpr layout with_partial(int axis, reduce_op how = reduce_op::sum) const {
    return with_partial(axis_list{axis}, how);
  }
  /// This layout with dim `d` split by `axes` (replacing what split it).
  constexpr layout with_split(int d, const axis_list& axes) const {
    layout l = *this;
    l.split[d] = axes;
    return l;
  }

  /// Into how many pieces dim `d` is cut.
  constexpr int pieces(int d) const { return group_size(dev, split[d]); }
  /// The dim that mesh axis `a` splits, or -1.
  constexpr int dim_of(int a) const {
    for (int d = 0; d < ndim; ++d)
      if (split[d].contains(a)) return d;
    return -1;
  }
  constexpr bool is_partial(int a) const { return (partial >> a & 1u) != 0; }
  /// Mesh axes that split some dim.
  constexpr axis_mask split_axes() const {
    axis_mask m = 0;
    for (int d = 0; d < ndim; ++d) m |= split[d].mask();
    return m;
  }
  /// Mesh axes that hold replicas (neither split nor partial).
  constexpr axis_mask replica_axes() const {
    const axis_mask all = dev.ndim >= 32 ? ~0u : (1u << dev.ndim) - 1u;
    return all & ~split_axes() & ~partial;
  }
  constexpr bool has_partial() const { return partial != 0; }
  /// The same placement with partial axes treated as replicas.
  constexpr layout without_partial() const {
    layout l = *this;
    l.partial = 0;
    l.op = reduce_op::sum;
    return l;
  }

  friend constexpr bool operator==(const layout&, const layout&) = default;
};

/// Checks a layout on its own: a valid mesh, a rank in range, every named mesh axis
/// in range and used at most once, no partial axis that also splits, a partial
/// reduction of sum, max or min.
constexpr status check(const layout& l) {
  if (status s = check(l.dev); !s.ok()) return s;
  if (l.ndim < 0 || l.ndim > max_tensor_ndim)
    return fail(errc::layout_ndim, -1, -1, l.ndim, max_tensor_ndim);
  axis_mask seen = 0;
  for (int d = 0; d < l.ndim; ++d) {
    const axis_list& s = l.split[d];
    if (s.n > max_mesh_ndim) return fail(errc::axis_used_twice, d, -1);
    for (int i = 0; i < s.n; ++i) {
      const int a = s.v[i];
      if (a < 0 || a >= l.dev.ndim) return fail(errc::axis_out_of_range, d, a, l.dev.ndim);
      if (seen >> a & 1u) return fail(errc::axis_used_twice, d, a);
      if (l.is_partial(a)) return fail(errc::partial_axis_splits, d, a);
      seen |= 1u << a;
    }
  }
  if (l.dev.ndim < 32 && (l.partial >> l.dev.ndim) != 0) {
    int a = l.dev.ndim;
    while (!(l.partial >> a & 1u)) ++a;
    return fail(errc::partial_axis_out_of_range, -1, a, l.dev.ndim);
  }
  if (l.op == reduce_op::mean) return fail(errc::partial_op);
  return {};
}

/// Checks a layout for a tensor of shape `global`: the layout itself, matching ranks,
/// and each static extent divisible by its number of pieces. Dynamic extents are
/// checked when their values are known.
constexpr status check(const layout& l, const extents& global) {
  if (status s = check(l); !s.ok()) return s;
  if (global.ndim != l.ndim) return fail(errc::shape_ndim, -1, -1, global.ndim, l.ndim);
  for (int d = 0; d < l.ndim; ++d) {
    const index_t e = global.v[d];
    if (e == dynamic_extent) continue;
    if (e < 0) return fail(errc::negative_extent, d, -1, e);
    if (e % l.pieces(d) != 0) {
      const int axis = l.split[d].n > 0 ? l.split[d].back() : -1;
      return fail(errc::dim_not_divisible, d, axis, e, l.pieces(d));
    }
  }
  return {};
}

}  // namespace tessera
