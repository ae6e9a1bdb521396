// Enumeration of every layout of a tensor on a mesh: for exhaustive tests and for
// strategy search.
#pragma once

#include <tessera/core/layout.hpp>

namespace tessera {

namespace detail {
template <class F>
constexpr void enumerate_orders(layout& l, int d, F& f) {
  if (d == l.ndim) {
    f(static_cast<const layout&>(l));
    return;
  }
  // Every ordering of the axes assigned to dim d (they arrive sorted).
  axis_list& s = l.split[d];
  const axis_list sorted = s;
  const int n = sorted.n;
  std::array<int, max_mesh_ndim> perm{};
  for (int i = 0; i < n; ++i) perm[i] = i;
  while (true) {
    for (int i = 0; i < n; ++i) s.v[i] = sorted.v[perm[i]];
    enumerate_orders(l, d + 1, f);
    // next permutation of perm[0..n)
    int i = n - 2;
    while (i >= 0 && perm[i] >= perm[i + 1]) --i;
    if (i < 0) break;
    int j = n - 1;
    while (perm[j] <= perm[i]) --j;
    const int t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
    for (int a = i + 1, b = n - 1; a < b; ++a, --b) {
      const int u = perm[a];
      perm[a] = perm[b];
      perm[b] = u;
    }
  }
  s = sorted;
}
}  // namespace detail

/// Calls f(layout) for every layout of a rank-`ndim` tensor on `m`: each mesh axis
/// replicates, splits one dim (in every order among the axes on that dim) or, when
/// `partial` is true, holds partial values reduced with `op`. Layouts are produced
/// in a fixed order. Mesh (2, 2) and a matrix give 2! [x^2] e^{2x} / (1 - x)^2 = 18
/// layouts with partial states (16 assignments, 2 of them with two orders), 11 without.
template <class F>
constexpr void for_each_layout(const mesh& m, int ndim, bool partial, F&& f,
                               reduce_op op = reduce_op::sum) {
  const int choices = ndim + (partial ? 2 : 1);  // dims, replica, partial
  int total = 1;
  for (int a = 0; a < m.ndim; ++a) total *= choices;
  for (int code = 0; code < total; ++code) {
    layout l = layout::replicated(m, ndim);
    int c = code;
    for (int a = 0; a < m.ndim; ++a) {
      const int what = c % choices;
      c /= choices;
      if (what < ndim) l.split[what].push_back(a);
      else if (what == ndim + 1) l.partial |= 1u << a;
    }
    if (l.partial) l.op = op;
    detail::enumerate_orders(l, 0, f);
  }
}

}  // namespace tessera
