// Shared by the nn tests under mpiexec: global arrays cut into any layout's shard,
// shards gathered back, and comparisons.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace nn_test {

using namespace tessera;

inline extents shape_of(const auto& g) {
  extents s;
  s.ndim = int(g.dimension());
  for (int d = 0; d < s.ndim; ++d) s.v[d] = index_t(g.shape()[d]);
  return s;
}

/// This rank's shard of the global array `g` in layout `l`.
template <class T>
dist_tensor<T> shard_of(const xt::xarray<T>& g, const layout& l, int rank) {
  const extents shape = shape_of(g);
  dist_tensor<T> t(l, shape, rank);
  t.fill_global([&](const auto& i) {
    std::size_t lin = 0;
    for (int d = 0; d < shape.ndim; ++d) lin = lin * g.shape()[d] + std::size_t(i[d]);
    return g.data()[lin];
  });
  return t;
}

/// The global array of `x` (partial sums resolved), on every rank.
template <class T>
xt::xarray<T> gather(const dist_tensor<T>& x, context& ctx) {
  return redistribute(x, layout::replicated(x.layout().dev, x.ndim()), ctx).local();
}

/// Element-wise |a - b| <= tol (1 + |b|), shapes equal.
template <class T>
bool close(const xt::xarray<T>& a, const xt::xarray<T>& b, double tol) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(double(a.data()[i]) - double(b.data()[i])) <= tol * (1 + std::abs(double(b.data()[i])))))
      return false;
  return true;
}

/// A global array of the given shape with values from a fixed pattern in [-1, 1].
template <class T>
xt::xarray<T> pattern(std::vector<std::size_t> shape, int seed) {
  xt::xarray<T> x = xt::xarray<T>::from_shape(shape);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = T(double((i * 37 + std::size_t(seed) * 11) % 23) / 11.0 - 1.0);
  return x;
}

}  // namespace nn_test
