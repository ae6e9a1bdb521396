// Elementwise kernels: binary arithmetic with NumPy broadcasting, unary maps, their
// gradients, add_to and scale in place, reduce_to_shape (the backward of a broadcast),
// bias_add, and the fused maps (fused_map, fused_bias_map) that run a chain of
// element-wise steps in one pass.
//
// Broadcasting (NumPy): shapes align on the right; a missing dim or a dim of 1
// stretches to the other operand's extent. (3, 1) and (1, 4) give (3, 4); a 0-D
// array (a scalar) broadcasts to anything. The backward of a broadcasting op sums
// the output gradient back to each operand's shape: reduce_to_shape.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <xtensor/xarray.hpp>
#include <tessera/core/error.hpp>
#include <tessera/kernels/cpu/common.hpp>
#include <tessera/kernels/cpu/parallel.hpp>

namespace tessera::kernels::cpu {

namespace detail {

/// The broadcast shape of a and b, or a tessera::error naming both:
/// "add: shapes do not broadcast: a is (3, 2), b is (4,)".
inline shape_type broadcast_shape(std::string_view fn, shape_arg a, shape_arg b) {
  const std::size_t r = std::max(a.size(), b.size());
  shape_type out(r, 1);
  for (std::size_t i = 0; i < r; ++i) {  // i counts from the right
    const std::size_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const std::size_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1)
      throw error(std::string(fn) + ": shapes do not broadcast: a is " + shape_text(a) +
                  ", b is " + shape_text(b));
    out[r - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

/// out = op(a, b) elementwise with broadcasting.
template <class T, class Op>
xt::xarray<T> broadcast_binary(std::string_view fn, const xt::xarray<T>& a, const xt::xarray<T>& b,
                               Op op) {
  const shape_type shape = broadcast_shape(fn, a.shape(), b.shape());
  auto out = empty_array<T>(shape);
  T* o = out.data();
  const T* pa = a.data();
  const T* pb = b.data();
  const std::size_t n = out.size();
  if (same_shape(a.shape(), shape) && same_shape(b.shape(), shape)) {
    parallel_ranges(n, parallel_grain, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) o[i] = op(pa[i], pb[i]);
    });
  } else if (b.size() == 1 && same_shape(a.shape(), shape)) {
    const T vb = pb[0];
    parallel_ranges(n, parallel_grain, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) o[i] = op(pa[i], vb);
    });
  } else if (a.size() == 1 && same_shape(b.shape(), shape)) {
    const T va = pa[0];
    parallel_ranges(n, parallel_grain, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) o[i] = op(va, pb[i]);
    });
  } else {
    const stride_type sa = broadcast_strides(a.shape(), shape);
    const stride_type sb = broadcast_strides(b.shape(), shape);
    strided_loop<2>(shape, {&sa, &sb}, {0, 0},
                    [&](std::size_t i, const auto& off) { o[i] = op(pa[off[0]], pb[off[1]]); });
  }
  return out;
}

template <class T, class F>
xt::xarray<T> map(const xt::xarray<T>& x, F f) {
  auto out = empty_array<T>(x.shape());
  const T* px = x.data();
  T* o = out.data();
  parallel_ranges(x.size(), parallel_grain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) o[i] = f(px[i]);
  });
  return out;
}

template <class T, class U>
void require_same_shape(std::string_view fn, const char* na, const xt::xarray<T>& a,
                        const char* nb, const xt::xarray<U>& b) {
  if (!same_shape(a, b))
    throw error(std::string(fn) + ": shapes differ: " + na + " is " + shape_text(a) + ", " + nb +
                " is " + shape_text(b));
}

}  // namespace detail

/// a + b with broadcasting. Throws tessera::error when the shapes do not broadcast.
template <class T>
xt::xarray<T> add(const xt::xarray<T>& a, const xt::xarray<T>& b) {
  return detail::broadcast_binary("add", a, b, [](T x, T y) { return x + y; });
}

/// a - b with broadcasting.
template <class T>
xt::xarray<T> sub(const xt::xarray<T>& a, const xt::xarray<T>& b) {
  return detail::broadcast_binary("sub", a, b, [](T x, T y) { return x - y; });
}

/// a * b with broadcasting.
template <class T>
xt::xarray<T> mul(const xt::xarray<T>& a, const xt::xarray<T>& b) {
  return detail::broadcast_binary("mul", a, b, [](T x, T y) { return x * y; });
}

/// a / b with broadcasting (IEEE division for floating point: x / 0 is inf or NaN).
template <class T>
xt::xarray<T> div(const xt::xarray<T>& a, const xt::xarray<T>& b) {
  return detail::broadcast_binary("div", a, b, [](T x, T y) { return x / y; });
}

/// max(x, 0).
template <class T>
xt::xarray<T> relu(const xt::xarray<T>& x) {
  return detail::map(x, [](T v) { return v > T(0) ? v : T(0); });
}

/// e^x.
template <class T>
xt::xarray<T> exp(const xt::xarray<T>& x) {
  return detail::map(x, [](T v) { return T(std::exp(v)); });
}

/// The natural log (log 0 = -inf, log of a negative number = NaN).
template <class T>
xt::xarray<T> log(const xt::xarray<T>& x) {
  return detail::map(x, [](T v) { return T(std::log(v)); });
}

/// -x.
template <class T>
xt::xarray<T> neg(const xt::xarray<T>& x) {
  return detail::map(x, [](T v) { return -v; });
}

/// The gradient of relu: dy where x > 0, else 0 (the subgradient at x = 0 is 0).
/// dy and x must have the same shape.
template <class T>
xt::xarray<T> relu_grad(const xt::xarray<T>& dy, const xt::xarray<T>& x) {
  detail::require_same_shape("relu_grad", "dy", dy, "x", x);
  auto dx = detail::empty_array<T>(x.shape());
  const T* g = dy.data();
  const T* v = x.data();
  T* o = dx.data();
  detail::parallel_ranges(dx.size(), detail::parallel_grain, [g, v, o](std::size_t i0, std::size_t i1) {
    // dy loaded whatever the mask: a select, which vectorises, where a load under the
    // condition stays a branch.
    for (std::size_t i = i0; i < i1; ++i) {
      const T d = g[i];
      o[i] = v[i] > T(0) ? d : T(0);
    }
  });
  return dx;
}

/// dst += src in place, element by element (a gradient accumulated): the two must have
/// the same number of elements.
template <class T>
void add_to(xt::xarray<T>& dst, const xt::xarray<T>& src) {
  if (dst.size() != src.size())
    throw error("add_to: dst has " + std::to_string(dst.size()) + " elements, src " + std::to_string(src.size()));
  T* d = dst.data();
  const T* v = src.data();
  detail::parallel_ranges(dst.size(), detail::parallel_grain, [d, v](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) d[i] += v[i];
  });
}

/// x *= s in place.
template <class T>
void scale(xt::xarray<T>& x, T s) {
  T* d = x.data();
  detail::parallel_ranges(x.size(), detail::parallel_grain, [d, s](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) d[i] *= s;
  });
}

/// Sums `grad` (the gradient of a broadcast result) back to `shape`, the shape of the
/// operand that was broadcast: over the leading dims `shape` lacks and over the dims
/// where `shape` has 1 and grad does not. `shape` must broadcast to grad's shape.
/// Example: y = add(a (3, 1), b (1, 4)) is (3, 4); dL/da = reduce_to_shape(dy, {3, 1})
/// (the row sums), dL/db = reduce_to_shape(dy, {1, 4}); for b 0-D, reduce_to_shape(dy, {})
/// is the sum of every element.
/// Throws: "reduce_to_shape: shape (3, 2) does not broadcast to the gradient's shape (3, 4)".
template <class T>
xt::xarray<T> reduce_to_shape(const xt::xarray<T>& grad, shape_arg shape) {
  if (!detail::broadcasts_to(shape, grad.shape()))
    throw error("reduce_to_shape: shape " + detail::shape_text(shape) +
                " does not broadcast to the gradient's shape " + detail::shape_text(grad));
  const detail::shape_type out_shape = detail::to_shape(shape);
  if (detail::same_shape(shape, grad.shape())) {
    auto out = detail::empty_array<T>(out_shape);
    std::copy(grad.data(), grad.data() + grad.size(), out.data());
    return out;
  }
  auto out = detail::filled_array<T>(out_shape, T(0));
  const detail::stride_type so = detail::broadcast_strides(shape, grad.shape());
  const T* g = grad.data();
  T* o = out.data();
  detail::strided_loop<1>(grad.shape(), {&so}, {0},
                          [&](std::size_t i, const auto& off) { o[off[0]] += g[i]; });
  return out;
}
/// The same, taking the gradient over: returned as it is when it already has `shape`.
template <class T>
xt::xarray<T> reduce_to_shape(xt::xarray<T>&& grad, shape_arg shape) {
  if (detail::broadcasts_to(shape, grad.shape()) && detail::same_shape(shape, grad.shape())) return std::move(grad);
  return reduce_to_shape(std::as_const(grad), shape);
}


namespace detail {

/// The size of x's last dim, checked against the bias's: "bias_add: bias is (5,),
/// expected (4,) for x (2, 4)" (fn names the caller).
template <class T>
std::size_t bias_width(std::string_view fn, const xt::xarray<T>& x, const xt::xarray<T>& bias) {
  if (x.dimension() == 0) throw error(std::string(fn) + ": x must have at least one dim, x is ()");
  const std::size_t c = x.shape()[x.dimension() - 1];
  if (bias.dimension() != 1 || bias.shape()[0] != c)
    throw error(std::string(fn) + ": bias is " + shape_text(bias) + ", expected (" + std::to_string(c) +
                ",) for x " + shape_text(x));
  return c;
}

}  // namespace detail

namespace detail {

// out[i] = f(x0[i], xs[i]...) after the shape checks; out may be x0's own storage.
template <class T, class F, class... X>
void fused_map_to(std::string_view fn, F f, T* out, const xt::xarray<T>& x0, const X&... xs) {
  [[maybe_unused]] int k = 0;
  (require_same_shape(fn, "operand 0", x0, ("operand " + std::to_string(++k)).c_str(), xs), ...);
  (void)fn;  // named only by the checks, which a map of x0 alone has none of
  const T* p0 = x0.data();
  const std::size_t n = x0.size();
  [&](const auto*... p) {
    parallel_ranges(n, parallel_grain, [&](std::size_t i0, std::size_t i1) {
      for (std::size_t i = i0; i < i1; ++i) out[i] = f(p0[i], p[i]...);
    });
  }(xs.data()...);
}

}  // namespace detail

/// out[i] = f(x0[i], xs[i]...) over arrays of one shape, in one pass: a fused chain of
/// element-wise steps (kernels/fused.hpp's functors, or any callable). `fn` names the
/// caller in the error: "div_backward: shapes differ: operand 0 is (2, 3), operand 1
/// is (3,)".
template <class T, class F, class... X>
xt::xarray<T> fused_map(std::string_view fn, F f, const xt::xarray<T>& x0, const X&... xs) {
  auto out = detail::empty_array<T>(x0.shape());
  detail::fused_map_to(fn, f, out.data(), x0, xs...);
  return out;
}
/// The same written over x0's own storage, given away (an rvalue): no new array. Each
/// element is read before it is written, so an xs may be x0 itself.
template <class T, class F, class... X>
xt::xarray<T> fused_map(std::string_view fn, F f, xt::xarray<T>&& x0, const X&... xs) {
  detail::fused_map_to(fn, f, x0.data(), x0, xs...);
  return std::move(x0);
}

namespace detail {

// out = f(x, bias) with the bias repeated along the rows; out may be x.
template <class T, class F>
void bias_map_to(std::string_view fn, const xt::xarray<T>& x, const xt::xarray<T>& bias, T* out, F f) {
  const std::size_t c = bias_width(fn, x, bias);
  const T* px = x.data();
  const T* pb = bias.data();
  const std::size_t rows = c == 0 ? 0 : x.size() / c;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < c; ++j) out[r * c + j] = f(px[r * c + j], pb[j]);
}

}  // namespace detail

/// f(x, bias) with the bias (c,) repeated along x's (..., c) leading dims, in one pass
/// over x's own storage (pass an rvalue to reuse it): nn::dense fuses its bias and
/// activation as f(x, b) = act(x + b). The bias is checked as bias_add's.
template <class T, class F>
xt::xarray<T> fused_bias_map(std::string_view fn, xt::xarray<T> x, const xt::xarray<T>& bias, F f) {
  detail::bias_map_to(fn, x, bias, x.data(), f);
  return x;
}

/// x + bias along x's last dim: x (..., c), bias (c,). Throws when bias is not 1-D or
/// its size differs from x's last dim:
/// "bias_add: bias is (5,), expected (4,) for x (2, 4)".
template <class T>
xt::xarray<T> bias_add(const xt::xarray<T>& x, const xt::xarray<T>& bias) {
  auto out = detail::empty_array<T>(x.shape());
  detail::bias_map_to("bias_add", x, bias, out.data(), [](T v, T b) { return v + b; });
  return out;
}

/// The gradient of bias_add wrt bias: dy (..., c) summed over every dim but the last,
/// shape (c,). (The gradient wrt x is dy itself.)
template <class T>
xt::xarray<T> bias_add_grad_bias(const xt::xarray<T>& dy) {
  if (dy.dimension() == 0)
    throw error("bias_add_grad_bias: dy must have at least one dim, dy is ()");
  const std::size_t c = dy.shape()[dy.dimension() - 1];
  auto db = detail::filled_array<T>(detail::shape_type{c}, T(0));
  const T* g = dy.data();
  T* o = db.data();
  const std::size_t rows = c == 0 ? 0 : dy.size() / c;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < c; ++j) o[j] += g[r * c + j];
  return db;
}

}  // namespace tessera::kernels::cpu
