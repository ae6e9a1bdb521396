// Softmax along one axis (numerically stable), log-softmax, their gradients, one_hot,
// and the softmax cross-entropy losses with their gradient wrt the logits.
//
// Stability: every exponent is taken of x - max(x) over the axis, so no exp
// overflows; log_softmax is x - max - log(sum exp(x - max)), never log(softmax).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/kernels/cpu/common.hpp>

namespace tessera::kernels::cpu {

namespace detail {

/// A tensor seen as (outer, n, inner) around one axis: the axis' vectors start at
/// o * n * inner + i (o < outer, i < inner) and step by `inner`.
struct axis_view {
  std::size_t outer = 1, n = 1, inner = 1;
};

inline axis_view view_around(std::string_view fn, shape_arg shape, int axis) {
  const std::size_t ax = normalize_axis(axis, shape.size(), fn);
  axis_view v;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (d < ax) v.outer *= shape[d];
    else if (d == ax) v.n = shape[d];
    else v.inner *= shape[d];
  }
  return v;
}

/// Calls f(base) for the first element of every vector along the axis.
template <class F>
void for_each_vector(const axis_view& v, F&& f) {
  for (std::size_t o = 0; o < v.outer; ++o)
    for (std::size_t i = 0; i < v.inner; ++i) f(o * v.n * v.inner + i);
}

/// max over the vector at p with the given stride (n > 0).
template <class T>
T vector_max(const T* p, std::size_t n, std::size_t stride) {
  T m = p[0];
  for (std::size_t j = 1; j < n; ++j) m = std::max(m, p[j * stride]);
  return m;
}

/// Writes the softmax of the vector at x to y; returns log(sum exp(x - max)) + max,
/// the vector's log-sum-exp.
template <class T>
T softmax_vector(const T* x, T* y, std::size_t n, std::size_t stride) {
  const T m = vector_max(x, n, stride);
  T sum = T(0);
  for (std::size_t j = 0; j < n; ++j) {
    const T e = std::exp(x[j * stride] - m);
    y[j * stride] = e;
    sum += e;
  }
  const T inv = T(1) / sum;
  for (std::size_t j = 0; j < n; ++j) y[j * stride] *= inv;
  return m + std::log(sum);
}

/// The rows of a (..., classes) tensor: count and length (classes on the last axis).
template <class T>
axis_view class_rows(std::string_view fn, const xt::xarray<T>& logits) {
  if (logits.dimension() == 0)
    throw error(std::string(fn) + ": logits must have a class dim, logits is ()");
  return view_around(fn, logits.shape(), -1);
}

template <class T, class U>
void require_same(std::string_view fn, const char* na, const xt::xarray<T>& a, const char* nb,
                  const xt::xarray<U>& b) {
  if (!same_shape(a, b))
    throw error(std::string(fn) + ": shapes differ: " + na + " is " + shape_text(a) + ", " + nb +
                " is " + shape_text(b));
}

/// The shape of a (..., classes) tensor without its class dim.
template <class T>
shape_type row_shape(const xt::xarray<T>& logits) {
  return shape_type(logits.shape().begin(), logits.shape().end() - 1);
}

}  // namespace detail

/// exp(x) / sum(exp(x)) along `axis` (negative counts from the end), computed as
/// exp(x - max) / sum(exp(x - max)): no overflow for any finite input. Throws on an
/// axis out of range: "softmax: axis 2 is out of range for a tensor of rank 2".
template <std::floating_point T>
xt::xarray<T> softmax(const xt::xarray<T>& x, int axis = -1) {
  const auto v = detail::view_around("softmax", x.shape(), axis);
  auto y = detail::empty_array<T>(x.shape());
  if (v.n == 0) return y;
  detail::for_each_vector(
      v, [&](std::size_t b) { detail::softmax_vector(x.data() + b, y.data() + b, v.n, v.inner); });
  return y;
}

/// log(softmax(x)) along `axis`, computed as x - logsumexp(x) (accurate where softmax
/// underflows to 0).
template <std::floating_point T>
xt::xarray<T> log_softmax(const xt::xarray<T>& x, int axis = -1) {
  const auto v = detail::view_around("log_softmax", x.shape(), axis);
  auto y = detail::empty_array<T>(x.shape());
  if (v.n == 0) return y;
  detail::for_each_vector(v, [&](std::size_t b) {
    const T* px = x.data() + b;
    T* py = y.data() + b;
    const T m = detail::vector_max(px, v.n, v.inner);
    T sum = T(0);
    for (std::size_t j = 0; j < v.n; ++j) sum += std::exp(px[j * v.inner] - m);
    const T lse = m + std::log(sum);
    for (std::size_t j = 0; j < v.n; ++j) py[j * v.inner] = px[j * v.inner] - lse;
  });
  return y;
}

/// The gradient of y = softmax(x, axis) given y: dx = y * (dy - sum(dy * y, axis)).
template <std::floating_point T>
xt::xarray<T> softmax_grad(const xt::xarray<T>& dy, const xt::xarray<T>& y, int axis = -1) {
  detail::require_same("softmax_grad", "dy", dy, "y", y);
  const auto v = detail::view_around("softmax_grad", y.shape(), axis);
  auto dx = detail::empty_array<T>(y.shape());
  detail::for_each_vector(v, [&](std::size_t b) {
    const T* g = dy.data() + b;
    const T* p = y.data() + b;
    T* o = dx.data() + b;
    T dot = T(0);
    for (std::size_t j = 0; j < v.n; ++j) dot += g[j * v.inner] * p[j * v.inner];
    for (std::size_t j = 0; j < v.n; ++j) o[j * v.inner] = p[j * v.inner] * (g[j * v.inner] - dot);
  });
  return dx;
}

/// The gradient of y = log_softmax(x, axis) given y: dx = dy - exp(y) * sum(dy, axis).
template <std::floating_point T>
xt::xarray<T> log_softmax_grad(const xt::xarray<T>& dy, const xt::xarray<T>& y, int axis = -1) {
  detail::require_same("log_softmax_grad", "dy", dy, "y", y);
  const auto v = detail::view_around("log_softmax_grad", y.shape(), axis);
  auto dx = detail::empty_array<T>(y.shape());
  detail::for_each_vector(v, [&](std::size_t b) {
    const T* g = dy.data() + b;
    const T* p = y.data() + b;
    T* o = dx.data() + b;
    T sum = T(0);
    for (std::size_t j = 0; j < v.n; ++j) sum += g[j * v.inner];
    for (std::size_t j = 0; j < v.n; ++j)
      o[j * v.inner] = g[j * v.inner] - std::exp(p[j * v.inner]) * sum;
  });
  return dx;
}

/// indices (any shape, int32 or int64) -> indices.shape + (depth,): `on` at each
/// index, `off` elsewhere. An index outside [0, depth) gives a row of `off` (as
/// MindSpore's and TensorFlow's OneHot do, so -1 marks padding). Throws on a negative
/// depth. Example: indices (2, -1) and depth 3 give ((0, 0, 1), (0, 0, 0)).
template <class T = float, std::integral I>
xt::xarray<T> one_hot(const xt::xarray<I>& indices, index_t depth, T on = T(1), T off = T(0)) {
  if (depth < 0) throw error("one_hot: depth must not be negative: depth " + std::to_string(depth));
  detail::shape_type shape(indices.shape().begin(), indices.shape().end());
  shape.push_back(std::size_t(depth));
  auto out = detail::filled_array<T>(shape, off);
  const I* idx = indices.data();
  T* o = out.data();
  for (std::size_t r = 0; r < indices.size(); ++r) {
    const auto k = std::int64_t(idx[r]);
    if (k >= 0 && k < depth) o[r * std::size_t(depth) + std::size_t(k)] = on;
  }
  return out;
}

/// A per-row loss and its gradient wrt the logits.
template <class T>
struct cross_entropy_result {
  xt::xarray<T> loss;  ///< logits' shape without the class dim (0-D for 1-D logits)
  xt::xarray<T> grad;  ///< d loss[row] / d logits[row, :], logits' shape
};

/// Cross-entropy of softmax(logits) against `labels`, both (..., classes), per row:
///   loss = sum_j labels_j * (logsumexp(logits) - logits_j)
///   grad = softmax(logits) * sum_j labels_j - labels
/// which is softmax - labels when each label row sums to 1 (one-hot or a
/// distribution); a row of zeros (an ignored sample) gets loss 0 and gradient 0.
/// `grad` is the gradient of each row's own loss: scale row r by dL/dloss[r] for a
/// weighted or mean loss. Throws when the shapes differ.
template <std::floating_point T>
cross_entropy_result<T> softmax_cross_entropy(const xt::xarray<T>& logits,
                                              const xt::xarray<T>& labels) {
  const auto v = detail::class_rows("softmax_cross_entropy", logits);
  detail::require_same("softmax_cross_entropy", "logits", logits, "labels", labels);
  cross_entropy_result<T> r{detail::empty_array<T>(detail::row_shape(logits)),
                            detail::empty_array<T>(logits.shape())};
  for (std::size_t row = 0; row < v.outer; ++row) {
    const T* x = logits.data() + row * v.n;
    const T* t = labels.data() + row * v.n;
    T* g = r.grad.data() + row * v.n;
    if (v.n == 0) {
      r.loss.data()[row] = T(0);
      continue;
    }
    const T lse = detail::softmax_vector(x, g, v.n, 1);  // g = softmax
    T loss = T(0), mass = T(0);
    for (std::size_t j = 0; j < v.n; ++j) {
      loss += t[j] * (lse - x[j]);
      mass += t[j];
    }
    for (std::size_t j = 0; j < v.n; ++j) g[j] = g[j] * mass - t[j];
    r.loss.data()[row] = loss;
  }
  return r;
}

/// softmax_cross_entropy with integer class labels: labels has logits' shape without
/// the class dim; loss = logsumexp(logits) - logits[label], grad = softmax - one_hot.
/// Throws on a shape mismatch or a label outside [0, classes):
/// "sparse_softmax_cross_entropy: label 7 at row 3 is out of range [0, 5)".
template <std::floating_point T, std::integral I>
cross_entropy_result<T> sparse_softmax_cross_entropy(const xt::xarray<T>& logits,
                                                     const xt::xarray<I>& labels) {
  constexpr std::string_view fn = "sparse_softmax_cross_entropy";
  const auto v = detail::class_rows(fn, logits);
  const auto rows = detail::row_shape(logits);
  if (!detail::same_shape(labels.shape(), rows))
    throw error(std::string(fn) + ": labels is " + detail::shape_text(labels) + ", expected " +
                detail::shape_text(rows) + " for logits " + detail::shape_text(logits));
  for (std::size_t row = 0; row < v.outer; ++row) {
    const auto k = std::int64_t(labels.data()[row]);
    if (k < 0 || k >= std::int64_t(v.n))
      throw error(std::string(fn) + ": label " + std::to_string(k) + " at row " +
                  std::to_string(row) + " is out of range [0, " + std::to_string(v.n) + ")");
  }
  cross_entropy_result<T> r{detail::empty_array<T>(rows), detail::empty_array<T>(logits.shape())};
  for (std::size_t row = 0; row < v.outer; ++row) {
    const T* x = logits.data() + row * v.n;
    T* g = r.grad.data() + row * v.n;
    const auto k = std::size_t(labels.data()[row]);
    const T lse = detail::softmax_vector(x, g, v.n, 1);
    r.loss.data()[row] = lse - x[k];
    g[k] -= T(1);
  }
  return r;
}

// ---- the pieces of a sharded softmax cross entropy ------------------------------
// With the class dim split, each rank holds a block of columns of every row. The
// loss needs the GLOBAL row max and sums, so the op (ops/softmax.hpp) computes the
// local pieces here and combines them across the class group between the calls:
//   m   = ce_row_max(x)                   then all_reduce max
//   s   = ce_row_terms(x, t, m)           then all_reduce sum: rows of
//         [sum_j exp(x_j - m), sum_j t_j, sum_j t_j (m - x_j)]
//   loss = ce_loss(s),  dx = ce_grad(dloss, x, t, m, s)

/// The row max of x (rows, cols): (rows,).
template <class T>
xt::xarray<T> ce_row_max(const xt::xarray<T>& x) {
  const std::size_t rows = x.shape()[0], cols = x.shape()[1];
  auto m = detail::filled_array<T>(detail::shape_type{rows}, -std::numeric_limits<T>::infinity());
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) m.data()[i] = std::max(m.data()[i], x.data()[i * cols + j]);
  return m;
}

/// (3, rows): per row the sum of exp(x - m), the label mass sum t, and sum t (m - x).
template <class T>
xt::xarray<T> ce_row_terms(const xt::xarray<T>& x, const xt::xarray<T>& t, const xt::xarray<T>& m) {
  const std::size_t rows = x.shape()[0], cols = x.shape()[1];
  auto s = detail::filled_array<T>(std::vector<std::size_t>{3, rows}, T(0));
  T* sum = s.data();
  T* mass = sum + rows;
  T* term = mass + rows;
  for (std::size_t i = 0; i < rows; ++i) {
    const T mi = m.data()[i];
    for (std::size_t j = 0; j < cols; ++j) {
      const T xv = x.data()[i * cols + j], tv = t.data()[i * cols + j];
      sum[i] += std::exp(xv - mi);
      mass[i] += tv;
      term[i] += tv * (mi - xv);
    }
  }
  return s;
}

/// The per-row loss from the global terms: sum t (m - x) + mass log(sum exp(x - m)).
template <class T>
xt::xarray<T> ce_loss(const xt::xarray<T>& s) {
  const std::size_t rows = s.shape()[1];
  auto loss = detail::empty_array<T>(detail::shape_type{rows});
  const T* sum = s.data();
  for (std::size_t i = 0; i < rows; ++i)
    loss.data()[i] = sum[i] > T(0) ? sum[2 * rows + i] + sum[rows + i] * std::log(sum[i]) : T(0);
  return loss;
}

/// dx = dloss (softmax(x) mass - t) on this rank's columns, from the global m and terms.
template <class T>
xt::xarray<T> ce_grad(const xt::xarray<T>& dloss, const xt::xarray<T>& x, const xt::xarray<T>& t,
                      const xt::xarray<T>& m, const xt::xarray<T>& s) {
  const std::size_t rows = x.shape()[0], cols = x.shape()[1];
  auto dx = detail::empty_array<T>(x.shape());
  const T* sum = s.data();
  for (std::size_t i = 0; i < rows; ++i) {
    const T inv = sum[i] > T(0) ? T(1) / sum[i] : T(0);
    const T g = dloss.data()[i], mi = m.data()[i], mass = sum[rows + i];
    for (std::size_t j = 0; j < cols; ++j) {
      const std::size_t k = i * cols + j;
      dx.data()[k] = g * (std::exp(x.data()[k] - mi) * inv * mass - t.data()[k]);
    }
  }
  return dx;
}

}  // namespace tessera::kernels::cpu
