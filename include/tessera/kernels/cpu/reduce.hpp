// Reductions over a list of axes (sum, mean, max, min) and their gradients.
//
// Axes: negative values count from the end; an empty list reduces every dim (as
// MindSpore's ReduceSum with axis=()); naming a dim twice is an error. keep_dims
// keeps each reduced dim as extent 1: (2, 3, 4) over axes [1] is (2, 4), or (2, 1, 4)
// with keep_dims. Each gradient takes dy in the shape of the forward result (the same
// keep_dims) and returns the input's shape.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/error.hpp>
#include <tessera/kernels/cpu/common.hpp>

namespace tessera::kernels::cpu {

namespace detail {

/// Where each input element lands in the result: `strides` (over the input's dims)
/// are the kept-dims result's row-major strides with 0 on the reduced dims.
struct reduction {
  shape_type out_shape;   // the result's shape (keep_dims or not)
  stride_type strides;    // input dim -> result offset step
  std::size_t count = 1;  // input elements per result element
};

inline reduction plan_reduction(std::string_view fn, shape_arg in, const std::vector<int>& axes,
                                bool keep_dims) {
  const std::vector<bool> mask = axes_mask(axes, in.size(), fn);
  reduction r;
  shape_type kept(in.begin(), in.end());
  for (std::size_t d = 0; d < in.size(); ++d)
    if (mask[d]) {
      r.count *= in[d];
      kept[d] = 1;
      if (keep_dims) r.out_shape.push_back(1);
    } else {
      r.out_shape.push_back(in[d]);
    }
  r.strides = row_major_strides(kept);
  for (std::size_t d = 0; d < in.size(); ++d)
    if (mask[d]) r.strides[d] = 0;
  return r;
}

template <class T>
void require_dy_shape(std::string_view fn, const xt::xarray<T>& dy, const reduction& r,
                      shape_arg in, const std::vector<int>& axes, bool keep_dims) {
  if (!same_shape(dy.shape(), r.out_shape))
    throw error(std::string(fn) + ": dy is " + shape_text(dy) + ", expected " +
                shape_text(r.out_shape) + " (the reduction of " + shape_text(in) + " over axes " +
                list_text(axes) + " with keep_dims " + bool_text(keep_dims) + ")");
}

/// out[r(i)] = combine(out[r(i)], x[i]) over every input element i, out starting at init.
template <class T, class Combine>
xt::xarray<T> reduce_with(const xt::xarray<T>& x, const reduction& r, T init, Combine combine) {
  auto out = filled_array<T>(r.out_shape, init);
  const T* px = x.data();
  T* o = out.data();
  strided_loop<1>(x.shape(), {&r.strides}, {0},
                  [&](std::size_t i, const auto& off) { o[off[0]] = combine(o[off[0]], px[i]); });
  return out;
}

/// dx[i] = scale * dy[r(i)]: the gradient of a sum, broadcast back.
template <class T>
xt::xarray<T> spread(const xt::xarray<T>& dy, shape_arg in, const reduction& r, T scale) {
  auto dx = empty_array<T>(to_shape(in));
  const T* g = dy.data();
  T* o = dx.data();
  strided_loop<1>(in, {&r.strides}, {0},
                  [&](std::size_t i, const auto& off) { o[i] = scale * g[off[0]]; });
  return dx;
}

template <class T>
constexpr T lowest_value() {
  if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::lowest();
}
template <class T>
constexpr T highest_value() {
  if constexpr (std::numeric_limits<T>::has_infinity) return std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::max();
}

// A NaN wins a max or min (v != v only for NaN), as in NumPy.
template <class T>
T max_of(T acc, T v) {
  return (v > acc || v != v) ? v : acc;
}
template <class T>
T min_of(T acc, T v) {
  return (v < acc || v != v) ? v : acc;
}

template <class T>
void require_nonempty(std::string_view fn, const xt::xarray<T>& x, const std::vector<int>& axes) {
  const std::vector<bool> mask = axes_mask(axes, x.dimension(), fn);
  for (std::size_t d = 0; d < x.dimension(); ++d)
    if (mask[d] && x.shape()[d] == 0)
      throw error(std::string(fn) + ": cannot reduce over an empty dim: dim " + std::to_string(d) +
                  " of x " + shape_text(x) + " has extent 0");
}

/// Gradient of a max or min: dy goes to the positions where x equals the result,
/// split equally among ties.
template <class T>
xt::xarray<T> extremum_grad(std::string_view fn, const xt::xarray<T>& dy, const xt::xarray<T>& x,
                            const xt::xarray<T>& y, const std::vector<int>& axes, bool keep_dims) {
  const reduction r = plan_reduction(fn, x.shape(), axes, keep_dims);
  require_dy_shape(fn, dy, r, x.shape(), axes, keep_dims);
  if (!same_shape(y.shape(), r.out_shape))
    throw error(std::string(fn) + ": y is " + shape_text(y) + ", expected " +
                shape_text(r.out_shape) + ", the shape of dy");
  return spread_to_ties(dy, x, y, count_ties(x, y, r), r);
}

/// How many elements of each reduced slice of x equal the slice's result y.
template <class T>
xt::xarray<T> count_ties(const xt::xarray<T>& x, const xt::xarray<T>& y, const reduction& r) {
  const T* px = x.data();
  const T* py = y.data();
  auto ties = filled_array<T>(r.out_shape, T(0));
  T* nt = ties.data();
  strided_loop<1>(x.shape(), {&r.strides}, {0}, [&](std::size_t i, const auto& off) {
    if (px[i] == py[off[0]]) nt[off[0]] += T(1);
  });
  return ties;
}

/// dx[i] = dy[r(i)] / ties[r(i)] where x[i] equals y[r(i)], else 0.
template <class T>
xt::xarray<T> spread_to_ties(const xt::xarray<T>& dy, const xt::xarray<T>& x, const xt::xarray<T>& y,
                             const xt::xarray<T>& ties, const reduction& r) {
  const T* px = x.data();
  const T* py = y.data();
  const T* g = dy.data();
  const T* nt = ties.data();
  auto dx = empty_array<T>(x.shape());
  T* o = dx.data();
  strided_loop<1>(x.shape(), {&r.strides}, {0}, [&](std::size_t i, const auto& off) {
    o[i] = px[i] == py[off[0]] ? g[off[0]] / nt[off[0]] : T(0);
  });
  return dx;
}

}  // namespace detail

/// The sum over `axes` (empty: every dim). Example: x (2, 3, 4), axes [0, -1] gives
/// (3,), or (1, 3, 1) with keep_dims. Throws on an axis out of range or named twice:
/// "reduce_sum: axis 3 is out of range for a tensor of rank 3".
template <class T>
xt::xarray<T> reduce_sum(const xt::xarray<T>& x, const std::vector<int>& axes = {},
                         bool keep_dims = false) {
  const auto r = detail::plan_reduction("reduce_sum", x.shape(), axes, keep_dims);
  return detail::reduce_with(x, r, T(0), [](T acc, T v) { return acc + v; });
}

/// The mean over `axes`: the sum divided by the number of reduced elements (an empty
/// reduction gives 0 / 0, NaN for floating point).
template <class T>
xt::xarray<T> reduce_mean(const xt::xarray<T>& x, const std::vector<int>& axes = {},
                          bool keep_dims = false) {
  const auto r = detail::plan_reduction("reduce_mean", x.shape(), axes, keep_dims);
  auto out = detail::reduce_with(x, r, T(0), [](T acc, T v) { return acc + v; });
  const T n = T(r.count);
  for (std::size_t i = 0; i < out.size(); ++i) out.data()[i] /= n;
  return out;
}

/// The maximum over `axes` (a NaN in a reduced slice gives NaN). Throws when a
/// reduced dim is empty: "reduce_max: cannot reduce over an empty dim: dim 1 of x
/// (2, 0) has extent 0".
template <class T>
xt::xarray<T> reduce_max(const xt::xarray<T>& x, const std::vector<int>& axes = {},
                         bool keep_dims = false) {
  const auto r = detail::plan_reduction("reduce_max", x.shape(), axes, keep_dims);
  detail::require_nonempty("reduce_max", x, axes);
  return detail::reduce_with(x, r, detail::lowest_value<T>(), detail::max_of<T>);
}

/// The minimum over `axes`; see reduce_max.
template <class T>
xt::xarray<T> reduce_min(const xt::xarray<T>& x, const std::vector<int>& axes = {},
                         bool keep_dims = false) {
  const auto r = detail::plan_reduction("reduce_min", x.shape(), axes, keep_dims);
  detail::require_nonempty("reduce_min", x, axes);
  return detail::reduce_with(x, r, detail::highest_value<T>(), detail::min_of<T>);
}

/// The gradient of reduce_sum: dy (the result's shape, same axes and keep_dims)
/// broadcast back to `input_shape`. Throws when dy's shape is not the result's:
/// "reduce_sum_grad: dy is (4,), expected (3,) (the reduction of (3, 4) over axes [1]
/// with keep_dims false)".
template <class T>
xt::xarray<T> reduce_sum_grad(const xt::xarray<T>& dy, shape_arg input_shape,
                              const std::vector<int>& axes = {}, bool keep_dims = false) {
  const auto r = detail::plan_reduction("reduce_sum_grad", input_shape, axes, keep_dims);
  detail::require_dy_shape("reduce_sum_grad", dy, r, input_shape, axes, keep_dims);
  return detail::spread(dy, input_shape, r, T(1));
}

/// The gradient of reduce_mean: dy broadcast back to `input_shape`, divided by the
/// number of reduced elements.
template <class T>
xt::xarray<T> reduce_mean_grad(const xt::xarray<T>& dy, shape_arg input_shape,
                               const std::vector<int>& axes = {}, bool keep_dims = false) {
  const auto r = detail::plan_reduction("reduce_mean_grad", input_shape, axes, keep_dims);
  detail::require_dy_shape("reduce_mean_grad", dy, r, input_shape, axes, keep_dims);
  return detail::spread(dy, input_shape, r, T(1) / T(r.count));
}

/// The gradient of y = reduce_max(x, axes, keep_dims): each dy element goes to the
/// positions of its slice where x equals the maximum y. Ties split it equally (k
/// positions at the maximum get dy / k each), as MindSpore's and TensorFlow's
/// ReduceMax gradients do; the result sums back to dy, and is the true gradient
/// wherever the maximum is unique.
template <class T>
xt::xarray<T> reduce_max_grad(const xt::xarray<T>& dy, const xt::xarray<T>& x,
                              const xt::xarray<T>& y, const std::vector<int>& axes = {},
                              bool keep_dims = false) {
  return detail::extremum_grad("reduce_max_grad", dy, x, y, axes, keep_dims);
}

/// The gradient of y = reduce_min(x, axes, keep_dims); ties split as in reduce_max_grad.
template <class T>
xt::xarray<T> reduce_min_grad(const xt::xarray<T>& dy, const xt::xarray<T>& x,
                              const xt::xarray<T>& y, const std::vector<int>& axes = {},
                              bool keep_dims = false) {
  return detail::extremum_grad("reduce_min_grad", dy, x, y, axes, keep_dims);
}

// ---- the pieces of a sharded ReduceMax's gradient ------------------------------
// When the reduced dims are split, a slice's ties lie on several ranks: each rank
// counts its own (reduce_max_tie_counts), the counts are summed across the ranks
// (ops/reduce.hpp), and each rank spreads dy over its ties with the global count.

/// Per element of y (the GLOBAL maximum of each slice, keep_dims as in the forward),
/// how many elements of this shard x equal it.
template <class T>
xt::xarray<T> reduce_max_tie_counts(const xt::xarray<T>& x, const xt::xarray<T>& y,
                                    const std::vector<int>& axes, bool keep_dims) {
  const auto r = detail::plan_reduction("reduce_max_backward", x.shape(), axes, keep_dims);
  return detail::count_ties(x, y, r);
}

/// dx[i] = dy / ties of x[i]'s slice where x[i] equals the slice's maximum y, else 0;
/// `ties` holds the global tie counts.
template <class T>
xt::xarray<T> reduce_max_spread(const xt::xarray<T>& dy, const xt::xarray<T>& x, const xt::xarray<T>& y,
                                const xt::xarray<T>& ties, const std::vector<int>& axes,
                                bool keep_dims) {
  const auto r = detail::plan_reduction("reduce_max_backward", x.shape(), axes, keep_dims);
  return detail::spread_to_ties(dy, x, y, ties, r);
}

}  // namespace tessera::kernels::cpu
