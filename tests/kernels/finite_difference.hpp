// Test helpers for the CPU kernels: seeded random arrays, naive multi-index loops,
// and one generic check of a backward kernel against central finite differences.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/error.hpp>

namespace kernel_test {

using shape_t = std::vector<std::size_t>;

/// Uniform values in [lo, hi), the same for the same seed.
template <class T = double>
xt::xarray<T> random_array(const shape_t& shape, std::uint64_t seed, double lo = -1.0,
                           double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  xt::xarray<T> x = xt::xarray<T>::from_shape(shape);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = T(dist(gen));
  return x;
}

/// Values at least `gap` away from 0 (for kinks at 0, such as relu's).
inline xt::xarray<double> random_away_from_zero(const shape_t& shape, std::uint64_t seed,
                                                double gap = 0.1) {
  auto x = random_array(shape, seed);
  for (std::size_t i = 0; i < x.size(); ++i) {
    double& v = x.data()[i];
    v = v < 0 ? v - gap : v + gap;
  }
  return x;
}

inline shape_t shape_of(const xt::xarray<double>& x) {
  return shape_t(x.shape().begin(), x.shape().end());
}

/// The row-major multi-index of element `lin` of an array of shape `shape`.
inline std::vector<std::size_t> unravel(std::size_t lin, const shape_t& shape) {
  std::vector<std::size_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = lin % shape[d];
    lin /= shape[d];
  }
  return idx;
}

/// The row-major linear index of a multi-index.
inline std::size_t ravel(const std::vector<std::size_t>& idx, const shape_t& shape) {
  std::size_t lin = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) lin = lin * shape[d] + idx[d];
  return lin;
}

inline std::size_t count_of(const shape_t& shape) {
  std::size_t n = 1;
  for (std::size_t e : shape) n *= e;
  return n;
}

/// max |a - b| / max(max |a|, max |b|, 1e-300); shapes must agree (else 1e300).
template <class T>
double relative_error(const xt::xarray<T>& a, const xt::xarray<T>& b) {
  if (!std::ranges::equal(a.shape(), b.shape())) return 1e300;
  double diff = 0, scale = 1e-300;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a.data()[i]) - double(b.data()[i])));
    scale = std::max({scale, std::abs(double(a.data()[i])), std::abs(double(b.data()[i]))});
  }
  return diff / scale;
}

/// dL/dx by central differences, L(x) a scalar function: (L(x + h e_i) - L(x - h e_i)) / 2h.
inline xt::xarray<double> numeric_gradient(
    const std::function<double(const xt::xarray<double>&)>& loss, const xt::xarray<double>& x,
    double h = 1e-5) {
  xt::xarray<double> g = xt::xarray<double>::from_shape(x.shape());
  xt::xarray<double> probe = x;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x.data()[i];
    probe.data()[i] = v + h;
    const double up = loss(probe);
    probe.data()[i] = v - h;
    const double down = loss(probe);
    probe.data()[i] = v;
    g.data()[i] = (up - down) / (2 * h);
  }
  return g;
}

/// The defining check of a backward kernel. For y = forward(x) and a fixed random
/// weight w of y's shape, L(x) = sum(w * forward(x)) has dL/dx = backward(w, x); returns
/// the relative error between backward(w, x) and L's central-difference gradient.
inline double gradient_error(
    const std::function<xt::xarray<double>(const xt::xarray<double>&)>& forward,
    const std::function<xt::xarray<double>(const xt::xarray<double>&, const xt::xarray<double>&)>&
        backward,
    const xt::xarray<double>& x, std::uint64_t seed = 7) {
  const xt::xarray<double> y = forward(x);
  const xt::xarray<double> w = random_array(shape_of(y), seed);
  auto loss = [&](const xt::xarray<double>& p) {
    const xt::xarray<double> v = forward(p);
    double s = 0;
    for (std::size_t i = 0; i < v.size(); ++i) s += v.data()[i] * w.data()[i];
    return s;
  };
  return relative_error(backward(w, x), numeric_gradient(loss, x));
}

/// The tessera::error text f throws ("" if it throws none).
template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const tessera::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace kernel_test
