// The device matrix: a row-major grid of ranks, and process groups over its axes.
#pragma once

#include <array>
#include <initializer_list>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>

namespace tessera {

/// Mesh coordinates of one rank, one entry per mesh axis.
using mesh_coords = std::array<int, max_mesh_ndim>;

/// A set of mesh axes as a bit mask (bit a = mesh axis a).
using axis_mask = unsigned;

/// The device matrix: `ndim` axes of sizes `dims[0..ndim)`, row-major, last axis
/// fastest: rank = ((i0 * d1) + i1) * d2 + ...  With mesh{2, 4}, ranks 0-3 have
/// i0 = 0 and ranks 4-7 have i0 = 1.
///
/// A structural type: `mesh{2, 4}` can be a template argument. Unused entries of
/// `dims` stay 0 so that equal meshes compare equal.
struct mesh {
  int ndim = 0;
  std::array<int, max_mesh_ndim> dims{};

  constexpr mesh() = default;
  constexpr mesh(std::initializer_list<int> sizes) {
    for (int s : sizes) {
      if (ndim < max_mesh_ndim) dims[ndim] = s;
      ++ndim;
    }
  }

  /// Number of ranks: the product of the axis sizes.
  constexpr int size() const {
    int n = 1;
    for (int a = 0; a < ndim; ++a) n *= dims[a];
    return n;
  }
  constexpr int extent(int axis) const { return dims[axis]; }

  /// Row-major coordinates of `rank`.
  constexpr mesh_coords coords(int rank) const {
    mesh_coords c{};
    for (int a = ndim - 1; a >= 0; --a) {
      c[a] = rank % dims[a];
      rank /= dims[a];
    }
    return c;
  }
  /// The rank at coordinates `c`. @post coords(rank_of(c)) == c
  constexpr int rank_of(const mesh_coords& c) const {
    int r = 0;
    for (int a = 0; a < ndim; ++a) r = r * dims[a] + c[a];
    return r;
  }

  friend constexpr bool operator==(const mesh&, const mesh&) = default;
};

/// Checks a mesh: 1..max_mesh_ndim axes, each of positive size.
constexpr status check(const mesh& m) {
  if (m.ndim < 1 || m.ndim > max_mesh_ndim) return fail(errc::mesh_ndim, -1, -1, m.ndim, max_mesh_ndim);
  for (int a = 0; a < m.ndim; ++a)
    if (m.dims[a] < 1) return fail(errc::mesh_axis_size, -1, a, m.dims[a]);
  return {};
}

/// Checks that a mesh spans exactly `nranks` ranks.
constexpr status check_mesh_size(const mesh& m, int nranks) {
  if (status s = check(m); !s.ok()) return s;
  if (m.size() != nranks) return fail(errc::mesh_size_mismatch, -1, -1, m.size(), nranks);
  return {};
}

// ---- process groups -------------------------------------------------------------
//
// The group of `rank` over an ordered list of mesh axes is the set of ranks that
// share rank's coordinates on every other axis. Its members are ordered by the
// mixed-radix number of their coordinates on the listed axes, the first listed
// axis most significant. Example, mesh{2, 4}: the group of rank 5 over axis 1 is
// {4, 5, 6, 7} (rank 5 is member 1); over axis 0 it is {1, 5} (member 1); over
// axes (1, 0) it is {0, 4, 1, 5, 2, 6, 3, 7}.

/// An ordered list of mesh axes, major to minor.
struct axis_list {
  int n = 0;
  std::array<int, max_mesh_ndim> v{};

  constexpr axis_list() = default;
  constexpr axis_list(std::initializer_list<int> axes) {
    for (int a : axes) {
      if (n < max_mesh_ndim) v[n] = a;
      ++n;
    }
  }
  constexpr int size() const { return n; }
  constexpr bool empty() const { return n == 0; }
  constexpr int operator[](int i) const { return v[i]; }
  constexpr int back() const { return v[n - 1]; }
  constexpr void push_back(int a) { v[n++] = a; }
  constexpr void pop_back() { v[--n] = 0; }
  constexpr bool contains(int a) const {
    for (int i = 0; i < n; ++i)
      if (v[i] == a) return true;
    return false;
  }
  constexpr axis_mask mask() const {
    axis_mask m = 0;
    for (int i = 0; i < n; ++i) m |= 1u << v[i];
    return m;
  }
  friend constexpr bool operator==(const axis_list&, const axis_list&) = default;
};

/// Number of ranks in each group over `axes`.
constexpr int group_size(const mesh& m, const axis_list& axes) {
  int g = 1;
  for (int i = 0; i < axes.n; ++i) g *= m.dims[axes.v[i]];
  return g;
}

/// Position of `rank` inside its group over `axes`.
constexpr int group_index(const mesh& m, const axis_list& axes, int rank) {
  const mesh_coords c = m.coords(rank);
  int idx = 0;
  for (int i = 0; i < axes.n; ++i) idx = idx * m.dims[axes.v[i]] + c[axes.v[i]];
  return idx;
}

/// Which group `rank` belongs to: the mixed-radix number of its coordinates on the
/// axes not in `axes` (0 .. size / group_size - 1). Ranks with equal colors form a group.
constexpr int group_color(const mesh& m, const axis_list& axes, int rank) {
  const mesh_coords c = m.coords(rank);
  const axis_mask in = axes.mask();
  int color = 0;
  for (int a = 0; a < m.ndim; ++a)
    if (!(in >> a & 1u)) color = color * m.dims[a] + c[a];
  return color;
}

/// The `index`-th member of `rank`'s group over `axes`.
/// @post group_index(m, axes, group_member(m, axes, r, i)) == i
constexpr int group_member(const mesh& m, const axis_list& axes, int rank, int index) {
  mesh_coords c = m.coords(rank);
  for (int i = axes.n - 1; i >= 0; --i) {
    const int a = axes.v[i];
    c[a] = index % m.dims[a];
    index /= m.dims[a];
  }
  return m.rank_of(c);
}

}  // namespace tessera
