// Device matrices of one rank list, and layouts moved between them. Each operator
// has its own device matrix (MatMul ((2, 4), (4, 1)) uses (2, 4, 1); a data-parallel
// op uses (8,)); all factor the same ranks row-major, so two of them usually share
// a common refinement on which both layouts can be written and a plan computed.
#pragma once

#include <array>
#include <tessera/core/error.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>

namespace tessera {

namespace detail {
// The strides of a mesh's axes, plus the total: for (2, 4) -> {8, 4, 1}.
constexpr std::array<int, max_mesh_ndim + 1> suffix_products(const mesh& m) {
  std::array<int, max_mesh_ndim + 1> s{};
  s[m.ndim] = 1;
  for (int a = m.ndim - 1; a >= 0; --a) s[a] = s[a + 1] * m.dims[a];
  return s;
}
}  // namespace detail

/// Checks that `a` and `b` (of equal size) have a common refinement: every stride
/// of one divides or is divided by every stride of the other. (2, 3) and (3, 2) do
/// not: their axes cut the 6 ranks in incompatible ways. The refinement must also fit
/// in max_mesh_ndim axes: (2, 4, 2, 4, 2, 4) and (4, 2, 4, 2, 4, 2) would need 9.
constexpr status check_refinement(const mesh& a, const mesh& b) {
  if (status s = check(a); !s.ok()) return s;
  if (status s = check(b); !s.ok()) return s;
  if (a.size() != b.size()) return fail(errc::mesh_size_mismatch, -1, -1, a.size(), b.size());
  const auto sa = detail::suffix_products(a), sb = detail::suffix_products(b);
  for (int i = 0; i <= a.ndim; ++i)
    for (int j = 0; j <= b.ndim; ++j)
      if (sa[i] % sb[j] != 0 && sb[j] % sa[i] != 0)
        return fail(errc::mesh_no_refinement, -1, -1, sa[i], sb[j]);
  // The refinement's axes: the distinct strides of both, less the total.
  int axes = 0;
  for (int i = 0, j = 0; i <= a.ndim || j <= b.ndim; ++axes) {
    const int next = j > b.ndim || (i <= a.ndim && sa[i] >= sb[j]) ? sa[i] : sb[j];
    while (i <= a.ndim && sa[i] == next) ++i;
    while (j <= b.ndim && sb[j] == next) ++j;
  }
  if (axes - 1 > max_mesh_ndim) return fail(errc::mesh_refinement_ndim, -1, -1, axes - 1, max_mesh_ndim);
  return {};
}

/// The coarsest mesh that refines both `a` and `b`: its strides are the union of
/// theirs. (2, 4) and (4, 2) -> (2, 2, 2); (2, 4, 1) and (8,) -> (2, 4). Axes of size
/// 1 disappear unless the mesh is (1,).
/// @pre check_refinement(a, b).ok()
constexpr mesh common_refinement(const mesh& a, const mesh& b) {
  const auto sa = detail::suffix_products(a), sb = detail::suffix_products(b);
  // Merge the two descending stride lists, dropping repeats.
  std::array<int, 2 * max_mesh_ndim + 2> s{};
  int n = 0, i = 0, j = 0;
  while (i <= a.ndim || j <= b.ndim) {
    int next;
    if (j > b.ndim || (i <= a.ndim && sa[i] >= sb[j])) next = sa[i++];
    else next = sb[j++];
    if (n == 0 || s[n - 1] != next) s[n++] = next;
  }
  mesh m;
  for (int k = 0; k + 1 < n; ++k) m.dims[m.ndim++] = s[k] / s[k + 1];
  if (m.ndim == 0) m = mesh{1};
  return m;
}

/// The axes of `fine` that mesh axis `axis` of `coarse` spans (major to minor).
/// @pre fine refines coarse
constexpr axis_list refined_axes(const mesh& coarse, int axis, const mesh& fine) {
  const auto sc = detail::suffix_products(coarse), sf = detail::suffix_products(fine);
  axis_list out;
  for (int f = 0; f < fine.ndim; ++f)
    if (sf[f] <= sc[axis] && sf[f + 1] >= sc[axis + 1] && fine.dims[f] > 1) out.push_back(f);
  return out;
}

/// The same distribution written on a finer mesh: each mesh axis becomes the fine axes
/// it spans, in order, wherever it split a dim or held partial values. The slice
/// geometry is unchanged: every rank holds the same shard.
/// @pre fine refines l.dev
constexpr layout refine(const layout& l, const mesh& fine) {
  layout out = layout::replicated(fine, l.ndim);
  out.op = l.op;
  for (int d = 0; d < l.ndim; ++d)
    for (int i = 0; i < l.split[d].n; ++i) {
      const axis_list f = refined_axes(l.dev, l.split[d].v[i], fine);
      for (int k = 0; k < f.n; ++k) out.split[d].push_back(f.v[k]);
    }
  for (int a = 0; a < l.dev.ndim; ++a)
    if (l.is_partial(a)) out.partial |= refined_axes(l.dev, a, fine).mask();
  if (!out.partial) out.op = reduce_op::sum;
  return out;
}

namespace detail {
// The mesh axes of `l` that hold partial values, in axis order.
constexpr axis_list partial_axes(const layout& l) {
  axis_list out;
  for (int a = 0; a < l.dev.ndim; ++a)
    if (l.is_partial(a)) out.push_back(a);
  return out;
}
}  // namespace detail

/// Whether layouts `a` and `b` of one tensor, possibly on different device matrices of
/// the same ranks, put the same shard on every rank and agree on what is partial: the
/// same ranks reduce together, with the same operation. Matrices with a common
/// refinement place alike exactly the layouts that are equal written on it; for
/// others ((2, 3) and (3, 2)) every rank's piece of every dim and its partial group
/// are compared. Examples: [0, -] on (2, 1, 1) and [0, -] on (2, 1): true (MatMul
/// ((2, 1), (1, 1)) and ReLU ((2, 1)) place a batch-split tensor alike); [0, -] on
/// (8,) and [0 1, -] on (2, 4): true; [0, -] on (8,) and [1 0, -] on (2, 4): false
/// (another piece order); replicated on (4,) and on (8,): false (other ranks).
/// @post for valid layouts of a tensor whose extents are positive and divisible by
///       both: the result is true iff every rank's shard_box and partial group are
///       equal under a and b (tests/core/test_refine.cpp checks every pair)
constexpr bool same_placement(const layout& a, const layout& b) {
  if (a == b) return true;
  if (a.ndim != b.ndim || a.dev.size() != b.dev.size()) return false;
  if (check_refinement(a.dev, b.dev).ok()) {
    const mesh fine = common_refinement(a.dev, b.dev);
    return refine(a, fine) == refine(b, fine);
  }
  // Partial over axes of size 1 only is not partial (refine drops such axes too).
  const axis_list pa = detail::partial_axes(a), pb = detail::partial_axes(b);
  const bool a_partial = group_size(a.dev, pa) > 1, b_partial = group_size(b.dev, pb) > 1;
  if (a_partial != b_partial || (a_partial && a.op != b.op)) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.pieces(d) != b.pieces(d)) return false;
  for (int r = 0; r < a.dev.size(); ++r) {
    for (int d = 0; d < a.ndim; ++d)
      if (group_index(a.dev, a.split[d], r) != group_index(b.dev, b.split[d], r)) return false;
    // The same partial groups: each rank's group starts at the same (lowest) rank.
    if (group_member(a.dev, pa, r, 0) != group_member(b.dev, pb, r, 0)) return false;
  }
  return true;
}

}  // namespace tessera
