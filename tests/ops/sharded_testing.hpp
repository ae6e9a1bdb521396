// What the sharded-operator tests share: global test tensors, a rank's shard of one,
// the whole tensor back from a sharded one (the oracle's view), float comparison and
// the enumeration of every split tuple that fits a number of ranks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <type_traits>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/tensor/dist_tensor.hpp>
#include "device_under_test.hpp"

namespace tessera::testing {

inline std::vector<std::size_t> dims_of(const extents& e) {
  return std::vector<std::size_t>(e.v.begin(), e.v.begin() + e.ndim);
}

inline extents extents_of(const std::vector<std::size_t>& s) {
  extents e;
  e.ndim = int(s.size());
  for (std::size_t d = 0; d < s.size(); ++d) e.v[d] = index_t(s[d]);
  return e;
}

/// A global tensor of small integers in [-5, 5] (exact sums and products), different
/// for every seed and without a repeating pattern along any one dim.
template <class T = float>
xt::xarray<T> integer_tensor(const extents& shape, int seed) {
  xt::xarray<T> x = xt::xarray<T>::from_shape(dims_of(shape));
  const std::vector<std::size_t> dims = dims_of(shape);
  for (std::size_t lin = 0; lin < x.size(); ++lin) {
    std::size_t rest = lin;
    long h = seed;
    for (int d = shape.ndim - 1; d >= 0; --d) {
      h += long(rest % dims[d]) * (3 + 4 * d);
      rest /= dims[d];
    }
    x.data()[lin] = T(h % 11 - 5);
  }
  return x;
}

/// A global tensor of values in [-2, 2] with no ties along any dim (for softmax and
/// argmax-like operators).
template <class T = float>
xt::xarray<T> smooth_tensor(const extents& shape, int seed) {
  xt::xarray<T> x = xt::xarray<T>::from_shape(dims_of(shape));
  for (std::size_t lin = 0; lin < x.size(); ++lin)
    x.data()[lin] = T(2.0 * std::sin(0.7 * double(lin) + 1.3 * double(seed) + 0.1));
  return x;
}

/// A tensor on the test device (the host, or the GPU when the file is compiled with
/// TESSERA_TEST_CUDA, as tests/cuda/ops.cu does).
template <class T>
using dev_tensor = tensor_on<T, test_device>;

/// This rank's shard of a global tensor under a non-partial layout, on the host.
template <class T>
dist_tensor<T> host_shard_of(const xt::xarray<T>& g, const layout& l, int rank) {
  const extents shape = extents_of(std::vector<std::size_t>(g.shape().begin(), g.shape().end()));
  dist_tensor<T> t(l, shape, rank);
  t.fill_global([&](const auto& i) {
    std::size_t lin = 0;
    for (int d = 0; d < shape.ndim; ++d) lin = lin * g.shape()[d] + std::size_t(i[d]);
    return g.data()[lin];
  });
  return t;
}

/// This rank's shard of a global tensor under a non-partial layout, on the test device.
template <class T>
dev_tensor<T> shard_of(const xt::xarray<T>& g, const layout& l, int rank) {
  return to_test_device(host_shard_of(g, l, rank));
}

/// This rank's shard on device D: the host (a one-rank reference run) or the test
/// device.
template <class D, class T>
tensor_on<T, D> shard_on(const xt::xarray<T>& g, const layout& l, int rank) {
  if constexpr (std::is_same_v<D, cpu_device>) {
    return host_shard_of(g, l, rank);
  } else {
    static_assert(std::is_same_v<D, test_device>, "shard_on: the device must be the host or the test device");
    return shard_of(g, l, rank);
  }
}

/// The whole tensor on every rank, on the host: redistributed to the replicated layout
/// of the world's mesh (which also resolves partial values).
template <class T, class D, class C>
xt::xarray<T> gather(const tensor_on<T, D>& x, device_context<C>& ctx) {
  return storage<T, D>::to_host(redistribute(x, layout::replicated(mesh{ctx.size()}, x.ndim()), ctx).local());
}

/// Equal shapes and elements equal to `rel` relative (absolute near 0); NaN equals NaN.
template <class T>
bool close(const xt::xarray<T>& a, const xt::xarray<T>& b, double rel = 1e-5) {
  if (!std::ranges::equal(a.shape(), b.shape())) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = double(a.data()[i]), y = double(b.data()[i]);
    if (std::isnan(x) && std::isnan(y)) continue;
    if (std::fabs(x - y) > rel * std::max(1.0, std::max(std::fabs(x), std::fabs(y)))) return false;
  }
  return true;
}

/// Every split tuple for `shape` whose product divides p, each split dividing its
/// extent, and, where `fixed[d]` > 0, dim d split exactly fixed[d] ways.
inline std::vector<split_tuple> split_tuples(const extents& shape, int p, const std::vector<int>& fixed = {}) {
  std::vector<split_tuple> out;
  split_tuple cur;
  cur.n = shape.ndim;
  std::function<void(int, int)> rec = [&](int d, int prod) {
    if (d == shape.ndim) {
      out.push_back(cur);
      return;
    }
    for (int s = 1; s <= p; ++s) {
      if (std::size_t(d) < fixed.size() && fixed[std::size_t(d)] > 0 && s != fixed[std::size_t(d)]) continue;
      if (p % (prod * s) == 0 && shape.v[d] % s == 0) {
        cur.v[d] = s;
        rec(d + 1, prod * s);
      }
    }
  };
  rec(0, 1);
  return out;
}

/// The replicated layout of a rank-n tensor on the world's flat mesh (p): the layout the
/// tests give inputs in when they make an operator redistribute them.
inline layout flat(int p, int n) { return layout::replicated(mesh{p}, n); }

/// Every strategy of MatMul on p devices: (m, k, n) with m k n dividing p, as split
/// tuples for the transpose flags (k = 1 only, SUMMA's, with k_split_only_one).
inline std::vector<strategy> matmul_strategies(int p, bool ta, bool tb, bool k_split_only_one = false) {
  std::vector<strategy> out;
  for (int m = 1; m <= p; ++m)
    for (int k = 1; k <= p; ++k)
      for (int n = 1; n <= p; ++n) {
        if (p % (m * k * n) != 0 || (k_split_only_one && k != 1)) continue;
        out.push_back(strategy{ta ? split_tuple{k, m} : split_tuple{m, k}, tb ? split_tuple{n, k} : split_tuple{k, n}});
      }
  return out;
}

}  // namespace tessera::testing
