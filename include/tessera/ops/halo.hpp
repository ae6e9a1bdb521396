// The halo exchanges of a window operator over a split height or width
// (ops/window_rule.hpp), on any device: halo_extend gives a rank's input with the rows
// its windows overlap fetched from its neighbours, halo_fold adds the gradients of those
// rows back into their owners. Each is one all_to_all_v over the ranks along the split
// axis (non-zero only between neighbours), whose received elements the operator's
// definition lists and the graph prices.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/window_rule.hpp>
#include <tessera/tensor/device.hpp>

namespace tessera::ops {

namespace detail {

// `s` with dim `dim` set to `n`.
inline extents with_dim(extents s, int dim, index_t n) {
  s.v[dim] = n;
  return s;
}

// An offset of `n` along dim `dim` of a rank-`ndim` array.
inline extents offset_along(int ndim, int dim, index_t n) {
  extents o;
  o.ndim = ndim;
  o.v[dim] = n;
  return o;
}

// One all_to_all_v with the neighbours along a split axis: `to_prev` elements to the
// previous member and `to_next` to the next, from `send` (in that order); receives
// `from_prev` then `from_next` into a new buffer. Checks the elements received against
// the definition's count for this rank.
template <class T, class D, class G>
typename storage<T, D>::array neighbour_exchange(G& group, const typename storage<T, D>::array& send, index_t to_prev,
                                                 index_t to_next, index_t from_prev, index_t from_next,
                                                 const internal_collective& ic, int rank, std::string_view op) {
  const int g = group.size(), c = group.rank();
  std::vector<int> sc(std::size_t(g), 0), sd(std::size_t(g), 0), rc(std::size_t(g), 0), rd(std::size_t(g), 0);
  if (c > 0) {
    sc[std::size_t(c - 1)] = int(to_prev);
    rc[std::size_t(c - 1)] = int(from_prev);
  }
  if (c + 1 < g) {
    sc[std::size_t(c + 1)] = int(to_next);
    sd[std::size_t(c + 1)] = int(c > 0 ? to_prev : 0);
    rc[std::size_t(c + 1)] = int(from_next);
    rd[std::size_t(c + 1)] = int(c > 0 ? from_prev : 0);
  }
  const index_t total = (c > 0 ? from_prev : 0) + (c + 1 < g ? from_next : 0);
  const index_t want = std::size_t(rank) < ic.rank_elements.size() ? ic.rank_elements[std::size_t(rank)] : -1;
  if (total != want)
    throw error(std::string(op) + ": the " + ic.purpose + " exchange receives " + std::to_string(total) +
                " elements on rank " + std::to_string(rank) + ", the definition's collective " + std::to_string(want));
  typename storage<T, D>::array recv = storage<T, D>::empty(extents{std::max<index_t>(total, 1)});
  group.all_to_all_v(std::span<const T>(send.data(), send.size()), std::span<const int>(sc), std::span<const int>(sd),
                     std::span<T>(recv.data(), std::size_t(total)), std::span<const int>(rc), std::span<const int>(rd));
  return recv;
}

// The box of `rows` rows of `x` (shape xs) starting at `first` along `dim`, copied into
// `dst` (shape ds) at `at` along `dim`.
template <class T, class D>
void copy_rows(const T* x, const extents& xs, index_t first, T* dst, const extents& ds, index_t at, int dim,
               index_t rows) {
  if (rows <= 0) return;
  storage<T, D>::copy_box(x, xs, offset_along(xs.ndim, dim, first), dst, ds, offset_along(ds.ndim, dim, at),
                          with_dim(xs, dim, rows));
}

}  // namespace detail

/// Rank `rank`'s shard `x` extended along `dim` (2: H, 3: W) by the halo of axis `a`:
/// recv_before(c) rows from the previous rank along the split, then x, then
/// recv_after(c) from the next, c being this rank's place in `group` (the ranks along
/// the split axis). Each rank sends its first halo_after() rows back and its last
/// halo_before() rows forward. `ic` is the definition's exchange (its counts are checked).
template <class T, class D, class G>
typename storage<T, D>::array halo_extend(const typename storage<T, D>::array& x, int dim, const window_axis& a,
                                          G& group, const internal_collective& ic, int rank, std::string_view op) {
  using S = storage<T, D>;
  const int c = group.rank();
  const extents xs = extents_of(x.shape());
  index_t row = 1;
  for (int d = 0; d < xs.ndim; ++d)
    if (d != dim) row *= xs[d];
  const index_t local = xs[dim];
  const index_t to_prev = c > 0 ? a.halo_after() : 0, to_next = c + 1 < a.parts ? a.halo_before() : 0;
  // Two blocks, each contiguous: the rows for the previous rank, then those for the next.
  typename S::array send = S::empty(extents{std::max<index_t>((to_prev + to_next) * row, 1)});
  detail::copy_rows<T, D>(x.data(), xs, 0, send.data(), detail::with_dim(xs, dim, to_prev), 0, dim, to_prev);
  detail::copy_rows<T, D>(x.data(), xs, local - to_next, send.data() + to_prev * row,
                          detail::with_dim(xs, dim, to_next), 0, dim, to_next);
  const index_t rb = a.recv_before(c), ra = a.recv_after(c);
  const typename S::array recv =
      detail::neighbour_exchange<T, D>(group, send, to_prev * row, to_next * row, rb * row, ra * row, ic, rank, op);
  const extents es = detail::with_dim(xs, dim, rb + local + ra);
  typename S::array ext = S::empty(es);
  detail::copy_rows<T, D>(recv.data(), detail::with_dim(xs, dim, rb), 0, ext.data(), es, 0, dim, rb);
  detail::copy_rows<T, D>(x.data(), xs, 0, ext.data(), es, rb, dim, local);
  detail::copy_rows<T, D>(recv.data() + rb * row, detail::with_dim(xs, dim, ra), 0, ext.data(), es, rb + local, dim,
                          ra);
  return ext;
}

/// The gradient of rank `rank`'s own rows from `dx_ext`, the gradient of its extended
/// input (halo_extend's): its middle rows, plus the gradients its neighbours computed for
/// the rows they fetched from it (the first halo_after() rows from the previous rank, the
/// last halo_before() from the next).
template <class T, class D, class G>
typename storage<T, D>::array halo_fold(const typename storage<T, D>::array& dx_ext, int dim, const window_axis& a,
                                        G& group, const internal_collective& ic, int rank, std::string_view op) {
  using S = storage<T, D>;
  using K = kernels::backend<D>;
  const int c = group.rank();
  const extents es = extents_of(dx_ext.shape());
  index_t row = 1;
  for (int d = 0; d < es.ndim; ++d)
    if (d != dim) row *= es[d];
  const index_t rb = a.recv_before(c), ra = a.recv_after(c);
  const index_t local = es[dim] - rb - ra;
  const index_t from_prev = c > 0 ? a.halo_after() : 0, from_next = c + 1 < a.parts ? a.halo_before() : 0;
  // The halo rows' gradients go back: the first rb rows to the previous rank, the last ra to the next.
  typename S::array send = S::empty(extents{std::max<index_t>((rb + ra) * row, 1)});
  detail::copy_rows<T, D>(dx_ext.data(), es, 0, send.data(), detail::with_dim(es, dim, rb), 0, dim, rb);
  detail::copy_rows<T, D>(dx_ext.data(), es, rb + local, send.data() + rb * row, detail::with_dim(es, dim, ra), 0,
                          dim, ra);
  const typename S::array recv = detail::neighbour_exchange<T, D>(group, send, rb * row, ra * row, from_prev * row,
                                                                   from_next * row, ic, rank, op);
  const extents xs = detail::with_dim(es, dim, local);
  typename S::array dx = S::empty(xs);
  detail::copy_rows<T, D>(dx_ext.data(), es, rb, dx.data(), xs, 0, dim, local);
  auto add_rows = [&](const T* from, index_t rows, index_t at) {
    if (rows <= 0) return;
    const extents bs = detail::with_dim(xs, dim, rows);
    typename S::array mine = S::empty(bs), theirs = S::empty(bs);
    detail::copy_rows<T, D>(dx.data(), xs, at, mine.data(), bs, 0, dim, rows);
    S::copy_n(from, theirs.data(), std::size_t(rows * row));
    K::add_to(mine, theirs);
    detail::copy_rows<T, D>(mine.data(), bs, 0, dx.data(), xs, at, dim, rows);
  };
  add_rows(recv.data(), from_prev, 0);
  add_rows(recv.data() + from_prev * row, from_next, local - from_next);
  return dx;
}

}  // namespace tessera::ops
