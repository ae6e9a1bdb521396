// The local pieces of the operators that combine values across ranks between kernels:
// softmax and log-softmax along an axis (row max, row sum, output; the backward's row
// sum and gradient), sparse softmax cross entropy (label columns, row terms, loss,
// gradient), argmax (local best and index; the tie resolution), one-hot on a piece of
// the depth, and a type conversion. The ops (ops/softmax_axis.hpp,
// ops/sparse_cross_entropy.hpp, ops/argmax.hpp, ops/one_hot.hpp) all-reduce the row
// arrays in between. A "row" is one vector along the axis: row = o * inner + i for a
// tensor seen as (outer, n, inner); row arrays are 1-D of outer * inner elements.
// kernels/cuda/sharded.cuh mirrors every function.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/kernels/cpu/common.hpp>
#include <tessera/kernels/cpu/softmax.hpp>

namespace tessera::kernels::cpu {

namespace detail {

// Calls f(row, base) for every vector along the axis (base: its first element).
template <class F>
void for_each_row(const axis_view& v, F&& f) {
  for (std::size_t o = 0; o < v.outer; ++o)
    for (std::size_t i = 0; i < v.inner; ++i) f(o * v.inner + i, o * v.n * v.inner + i);
}

template <class T, class A>
void require_rows(std::string_view fn, const char* name, const A& a, std::size_t rows) {
  if (a.size() != rows)
    throw error(std::string(fn) + ": " + name + " has " + std::to_string(a.size()) + " elements, expected " +
                std::to_string(rows) + " (one per vector along the axis)");
}

/// Throws unless every index is an integer (floating-point indices only):
/// "one_hot: index 2.5 at local position 3 is not an integer".
template <class I>
void require_integer_indices(const I* p, std::size_t n) {
  if constexpr (std::floating_point<I>) {
    for (std::size_t i = 0; i < n; ++i)
      if (!(std::floor(p[i]) == p[i])) {
        std::ostringstream text;
        text << "one_hot: index " << p[i] << " at local position " << i << " is not an integer";
        throw error(text.str());
      }
  }
}

/// The local column of each row's label (-1 where another rank of the class group holds
/// it), for labels of rows first_row... of a (rows, classes) problem whose local columns
/// are [first_col, first_col + cols). Throws on a label outside [0, classes) or one that
/// is not an integer: "sparse_softmax_cross_entropy: label 9 at row 3 is out of range
/// [0, 8)".
template <class L>
void sparse_ce_column_of(const L* labels, std::size_t rows, index_t classes, index_t first_row, index_t first_col,
                         std::size_t cols, std::int64_t* column) {
  for (std::size_t i = 0; i < rows; ++i) {
    const L v = labels[i];
    auto where = [&] { return " at row " + std::to_string(first_row + index_t(i)); };
    if constexpr (std::floating_point<L>) {
      if (!(std::floor(v) == v)) {
        std::ostringstream text;
        text << "sparse_softmax_cross_entropy: label " << v << where() << " is not an integer";
        throw error(text.str());
      }
    }
    const auto k = std::int64_t(v);
    if (k < 0 || k >= classes)
      throw error("sparse_softmax_cross_entropy: label " + std::to_string(k) + where() + " is out of range [0, " +
                  std::to_string(classes) + ")");
    column[i] = k >= first_col && k < first_col + index_t(cols) ? k - first_col : -1;
  }
}

}  // namespace detail

// ---- softmax along an axis ----------------------------------------------------------

/// The max of every vector along `axis` (-inf for an empty one; a NaN is skipped unless
/// it comes first, as std::max does): (rows,).
template <class T>
xt::xarray<T> softmax_axis_max(const xt::xarray<T>& x, int axis) {
  const detail::axis_view v = detail::view_around("softmax", x.shape(), axis);
  auto max = detail::filled_array<T>(std::vector<std::size_t>{v.outer * v.inner}, -std::numeric_limits<T>::infinity());
  const T* p = x.data();
  T* m = max.data();
  detail::for_each_row(v, [&](std::size_t row, std::size_t b) {
    for (std::size_t j = 0; j < v.n; ++j) m[row] = std::max(m[row], p[b + j * v.inner]);
  });
  return max;
}

/// sum exp(x - max[row]) of every vector along `axis`: (rows,).
template <class T>
xt::xarray<T> softmax_axis_sum(const xt::xarray<T>& x, int axis, const xt::xarray<T>& max) {
  const detail::axis_view v = detail::view_around("softmax", x.shape(), axis);
  detail::require_rows<T>("softmax_axis_sum", "max", max, v.outer * v.inner);
  auto sum = detail::filled_array<T>(std::vector<std::size_t>{v.outer * v.inner}, T(0));
  const T* p = x.data();
  const T* m = max.data();
  T* s = sum.data();
  detail::for_each_row(v, [&](std::size_t row, std::size_t b) {
    for (std::size_t j = 0; j < v.n; ++j) s[row] += std::exp(p[b + j * v.inner] - m[row]);
  });
  return sum;
}

/// softmax (exp(x - max) / sum) or, with `log`, log-softmax (x - max - log(sum)) from
/// the (global) row max and sum: x's shape.
template <class T>
xt::xarray<T> softmax_axis_out(const xt::xarray<T>& x, int axis, const xt::xarray<T>& max,
                               const xt::xarray<T>& sum, bool log) {
  const detail::axis_view v = detail::view_around("softmax", x.shape(), axis);
  detail::require_rows<T>("softmax_axis_out", "max", max, v.outer * v.inner);
  detail::require_rows<T>("softmax_axis_out", "sum", sum, v.outer * v.inner);
  auto y = detail::empty_array<T>(x.shape());
  const T* p = x.data();
  const T* m = max.data();
  const T* s = sum.data();
  T* o = y.data();
  detail::for_each_row(v, [&](std::size_t row, std::size_t b) {
    if (log) {
      const T lse = m[row] + std::log(s[row]);
      for (std::size_t j = 0; j < v.n; ++j) o[b + j * v.inner] = p[b + j * v.inner] - lse;
    } else {
      const T inv = T(1) / s[row];
      for (std::size_t j = 0; j < v.n; ++j) o[b + j * v.inner] = std::exp(p[b + j * v.inner] - m[row]) * inv;
    }
  });
  return y;
}

/// The backward's row sum: sum(dy * y) (softmax) or sum(dy) (log-softmax): (rows,).
template <class T>
xt::xarray<T> softmax_axis_grad_sum(const xt::xarray<T>& dy, const xt::xarray<T>& y, int axis, bool log) {
  const detail::axis_view v = detail::view_around("softmax_backward", y.shape(), axis);
  if (!detail::same_shape(dy, y))
    throw error("softmax_axis_grad_sum: dy is " + detail::shape_text(dy) + ", y is " + detail::shape_text(y));
  auto acc = detail::filled_array<T>(std::vector<std::size_t>{v.outer * v.inner}, T(0));
  const T* g = dy.data();
  const T* py = y.data();
  T* a = acc.data();
  detail::for_each_row(v, [&](std::size_t row, std::size_t b) {
    for (std::size_t j = 0; j < v.n; ++j) {
      const std::size_t at = b + j * v.inner;
      a[row] += log ? g[at] : g[at] * py[at];
    }
  });
  return acc;
}

/// dx from the (global) row sum `acc`: y (dy - acc) (softmax) or dy - exp(y) acc
/// (log-softmax): y's shape.
template <class T>
xt::xarray<T> softmax_axis_grad(const xt::xarray<T>& dy, const xt::xarray<T>& y, int axis,
                                const xt::xarray<T>& acc, bool log) {
  const detail::axis_view v = detail::view_around("softmax_backward", y.shape(), axis);
  if (!detail::same_shape(dy, y))
    throw error("softmax_axis_grad: dy is " + detail::shape_text(dy) + ", y is " + detail::shape_text(y));
  detail::require_rows<T>("softmax_axis_grad", "acc", acc, v.outer * v.inner);
  auto dx = detail::empty_array<T>(y.shape());
  const T* g = dy.data();
  const T* py = y.data();
  const T* a = acc.data();
  T* o = dx.data();
  detail::for_each_row(v, [&](std::size_t row, std::size_t b) {
    for (std::size_t j = 0; j < v.n; ++j) {
      const std::size_t at = b + j * v.inner;
      o[at] = log ? g[at] - std::exp(py[at]) * a[row] : py[at] * (g[at] - a[row]);
    }
  });
  return dx;
}

// ---- sparse softmax cross entropy ---------------------------------------------------

/// Each row's label as a local column (-1 where another rank holds it), checked (see
/// detail::sparse_ce_column_of): (rows,) int64.
template <class L>
xt::xarray<std::int64_t> sparse_ce_columns(const xt::xarray<L>& labels, index_t classes, index_t first_row,
                                           index_t first_col, std::size_t cols) {
  auto column = detail::empty_array<std::int64_t>(std::vector<std::size_t>{labels.size()});
  detail::sparse_ce_column_of(labels.data(), labels.size(), classes, first_row, first_col, cols, column.data());
  return column;
}

/// (2, rows) for logits x (rows, cols): sum exp(x - max) per row, then the label's logit
/// (0 where column is -1).
template <class T>
xt::xarray<T> sparse_ce_terms(const xt::xarray<T>& x, const xt::xarray<std::int64_t>& column,
                              const xt::xarray<T>& max) {
  if (x.dimension() != 2) throw error("sparse_ce_terms: x must be 2-D, x is " + detail::shape_text(x));
  const std::size_t rows = x.shape()[0], cols = x.shape()[1];
  detail::require_rows<T>("sparse_ce_terms", "column", column, rows);
  detail::require_rows<T>("sparse_ce_terms", "max", max, rows);
  auto acc = detail::filled_array<T>(std::vector<std::size_t>{2, rows}, T(0));
  const T* px = x.data();
  T* a = acc.data();
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) a[i] += std::exp(px[i * cols + j] - max.data()[i]);
    if (column.data()[i] >= 0) a[rows + i] = px[i * cols + std::size_t(column.data()[i])];
  }
  return acc;
}

/// The per-row loss max + log(sum) - picked from the (global) max and terms: (rows,).
template <class T>
xt::xarray<T> sparse_ce_loss(const xt::xarray<T>& max, const xt::xarray<T>& terms) {
  const std::size_t rows = max.size();
  detail::require_rows<T>("sparse_ce_loss", "terms", terms, 2 * rows);
  auto loss = detail::empty_array<T>(std::vector<std::size_t>{rows});
  for (std::size_t i = 0; i < rows; ++i)
    loss.data()[i] = max.data()[i] + std::log(terms.data()[i]) - terms.data()[rows + i];
  return loss;
}

/// dx = dloss (softmax(x) - [j == column]) on this rank's columns: x's shape.
template <class T>
xt::xarray<T> sparse_ce_grad(const xt::xarray<T>& dloss, const xt::xarray<T>& x,
                             const xt::xarray<std::int64_t>& column, const xt::xarray<T>& max,
                             const xt::xarray<T>& terms) {
  if (x.dimension() != 2) throw error("sparse_ce_grad: x must be 2-D, x is " + detail::shape_text(x));
  const std::size_t rows = x.shape()[0], cols = x.shape()[1];
  detail::require_rows<T>("sparse_ce_grad", "dloss", dloss, rows);
  detail::require_rows<T>("sparse_ce_grad", "column", column, rows);
  detail::require_rows<T>("sparse_ce_grad", "max", max, rows);
  detail::require_rows<T>("sparse_ce_grad", "terms", terms, 2 * rows);
  auto dx = detail::empty_array<T>(x.shape());
  const T* px = x.data();
  const T* g = dloss.data();
  T* o = dx.data();
  for (std::size_t i = 0; i < rows; ++i) {
    const T inv = T(1) / terms.data()[i];
    for (std::size_t j = 0; j < cols; ++j) {
      const std::size_t k = i * cols + j;
      const T hot = std::int64_t(j) == column.data()[i] ? T(1) : T(0);
      o[k] = g[i] * (std::exp(px[k] - max.data()[i]) * inv - hot);
    }
  }
  return dx;
}

// ---- argmax ---------------------------------------------------------------------------

/// The local maximum of every vector along `axis` and the index of its first occurrence,
/// counted from `first` (the shard's offset along the axis): ((rows,) values, (rows,)
/// int64 indices; index -1 for an empty axis).
template <class T>
std::pair<xt::xarray<T>, xt::xarray<std::int64_t>> argmax_local(const xt::xarray<T>& x, int axis,
                                                                std::int64_t first) {
  const detail::axis_view v = detail::view_around("argmax", x.shape(), axis);
  const std::size_t rows = v.outer * v.inner;
  auto best = detail::filled_array<T>(std::vector<std::size_t>{rows}, std::numeric_limits<T>::lowest());
  auto index = detail::filled_array<std::int64_t>(std::vector<std::size_t>{rows}, std::int64_t(-1));
  const T* p = x.data();
  detail::for_each_row(v, [&](std::size_t row, std::size_t b) {
    for (std::size_t j = 0; j < v.n; ++j) {
      const T e = p[b + j * v.inner];
      if (index.data()[row] < 0 || e > best.data()[row]) {
        best.data()[row] = e;
        index.data()[row] = first + std::int64_t(j);
      }
    }
  });
  return {std::move(best), std::move(index)};
}

/// In place: index = INT64_MAX where this rank's best is not the group's top (so that
/// an all-reduce (min) of the indices gives the first global maximum).
template <class T>
void argmax_resolve(xt::xarray<std::int64_t>& index, const xt::xarray<T>& best, const xt::xarray<T>& top) {
  detail::require_rows<T>("argmax_resolve", "best", best, index.size());
  detail::require_rows<T>("argmax_resolve", "top", top, index.size());
  for (std::size_t o = 0; o < index.size(); ++o)
    if (!(best.data()[o] == top.data()[o])) index.data()[o] = std::numeric_limits<std::int64_t>::max();
}

// ---- one-hot, conversion --------------------------------------------------------------

/// indices.shape + (local_depth,) for this rank's piece [first, first + local_depth) of
/// a depth of `depth`: `on` where the index (in [0, depth)) falls on the piece, `off`
/// elsewhere. Throws on a non-integer floating-point index.
template <class T, class I>
xt::xarray<T> one_hot_piece(const xt::xarray<I>& indices, index_t depth, index_t first, index_t local_depth, T on,
                            T off) {
  detail::require_integer_indices(indices.data(), indices.size());
  xt::xarray<std::int64_t> shifted = xt::xarray<std::int64_t>::from_shape(indices.shape());
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const auto k = std::int64_t(indices.data()[i]);
    // Outside [0, depth) stays outside after the shift, so it gives a row of `off`.
    shifted.data()[i] = k >= 0 && k < depth ? k - first : std::int64_t(-1);
  }
  return one_hot<T>(shifted, local_depth, on, off);
}

/// x's elements converted to To (static_cast), same shape.
template <class To, class From>
xt::xarray<To> convert(const xt::xarray<From>& x) {
  auto y = detail::empty_array<To>(x.shape());
  for (std::size_t i = 0; i < x.size(); ++i) y.data()[i] = To(x.data()[i]);
  return y;
}

}  // namespace tessera::kernels::cpu
