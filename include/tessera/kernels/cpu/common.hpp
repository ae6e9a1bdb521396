// What the CPU kernels share: the shape argument type, shape text for errors, axis
// normalisation, the one strided loop that every broadcasting, reducing, transposing and
// slicing kernel runs on, and the branch-free mask of the ReLU gradients.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/kernels/cpu/isa.hpp>

namespace tessera::kernels::cpu {

/// The element types BLAS multiplies: matmul and its gradients take these.
template <class T>
concept blas_scalar = std::same_as<T, float> || std::same_as<T, double>;

/// A tensor shape passed to a kernel (not owned): `x.shape()`, a
/// `std::vector<std::size_t>`, or a braced list `{3, 4}` (`{}` is the 0-D shape).
/// Use it only as a parameter: it refers to the caller's storage.
class shape_arg {
 public:
  shape_arg(std::initializer_list<std::size_t> dims) : dims_(dims.begin(), dims.size()) {}
  template <std::ranges::contiguous_range R>
    requires std::same_as<std::ranges::range_value_t<R>, std::size_t>
  shape_arg(const R& dims) : dims_(std::ranges::data(dims), std::ranges::size(dims)) {}

  std::size_t size() const { return dims_.size(); }
  std::size_t operator[](std::size_t i) const { return dims_[i]; }
  const std::size_t* begin() const { return dims_.data(); }
  const std::size_t* end() const { return dims_.data() + dims_.size(); }
  std::span<const std::size_t> span() const { return dims_; }

 private:
  std::span<const std::size_t> dims_;
};

namespace detail {

/// The shape type of every xt::xarray (a small vector of std::size_t).
using shape_type = xt::xarray<double>::shape_type;
/// Element strides, signed: a slice with a negative step walks backwards.
using stride_type = xt::svector<std::int64_t, 4>;

/// "(8, 8)", "(5,)" for one dim, "()" for a 0-D shape (the form core/format.hpp uses).
inline std::string shape_text(shape_arg s) {
  std::string out = "(";
  for (std::size_t d = 0; d < s.size(); ++d) {
    out += d ? ", " : "";
    out += std::to_string(s[d]);
  }
  return out + (s.size() == 1 ? ",)" : ")");
}
template <class T>
std::string shape_text(const xt::xarray<T>& x) {
  return shape_text(shape_arg(x.shape()));
}

/// "[0, -1]": an axis or index list as the caller wrote it.
template <class I>
std::string list_text(const std::vector<I>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    out += i ? ", " : "";
    out += std::to_string(v[i]);
  }
  return out + "]";
}

inline const char* bool_text(bool b) { return b ? "true" : "false"; }

inline bool same_shape(shape_arg a, shape_arg b) {
  return std::ranges::equal(a, b);
}
template <class T, class U>
bool same_shape(const xt::xarray<T>& a, const xt::xarray<U>& b) {
  return std::ranges::equal(a.shape(), b.shape());
}

inline std::size_t element_count(shape_arg s) {
  std::size_t n = 1;
  for (std::size_t e : s) n *= e;
  return n;
}

inline shape_type to_shape(shape_arg s) { return shape_type(s.begin(), s.end()); }

/// Row-major element strides of `shape` (the innermost dim has stride 1).
inline stride_type row_major_strides(shape_arg shape) {
  stride_type st(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;)
    st[d - 1] = st[d] * std::int64_t(shape[d]);
  return st;
}

/// `axis` in [-ndim, ndim) as an index in [0, ndim); throws otherwise:
/// "softmax: axis 2 is out of range for a tensor of rank 2".
inline std::size_t normalize_axis(int axis, std::size_t ndim, std::string_view fn) {
  const std::int64_t r = std::int64_t(ndim);
  if (axis < -r || axis >= r)
    throw error(std::string(fn) + ": axis " + std::to_string(axis) +
                " is out of range for a tensor of rank " + std::to_string(ndim));
  return std::size_t(axis < 0 ? axis + r : axis);
}

/// Which dims a reduction removes: `axes` (negative counts from the end; empty means
/// every dim, as in MindSpore's ReduceSum with axis=()). Throws on a repeated axis.
inline std::vector<bool> axes_mask(const std::vector<int>& axes, std::size_t ndim,
                                   std::string_view fn) {
  std::vector<bool> mask(ndim, axes.empty());
  for (int a : axes) {
    const std::size_t d = normalize_axis(a, ndim, fn);
    if (mask[d])
      throw error(std::string(fn) + ": axes " + list_text(axes) + " name dim " + std::to_string(d) +
                  " twice");
    mask[d] = true;
  }
  return mask;
}

/// Strides that read an array of shape `in` broadcast (NumPy rules) to the shape
/// `out`: 0 on the dims `in` lacks or has as 1. The caller has checked that `in`
/// broadcasts to `out`.
inline stride_type broadcast_strides(shape_arg in, shape_arg out) {
  stride_type st(out.size(), 0);
  const stride_type own = row_major_strides(in);
  const std::size_t lead = out.size() - in.size();
  for (std::size_t d = 0; d < in.size(); ++d)
    st[lead + d] = in[d] == 1 ? 0 : own[d];
  return st;
}

/// Whether `in` broadcasts to `out` (NumPy rules: align on the right; each dim of
/// `in` equals the one of `out` or is 1).
inline bool broadcasts_to(shape_arg in, shape_arg out) {
  if (in.size() > out.size()) return false;
  const std::size_t lead = out.size() - in.size();
  for (std::size_t d = 0; d < in.size(); ++d)
    if (in[d] != 1 && in[d] != out[lead + d]) return false;
  return true;
}

/// Visits every element of a row-major box of shape `shape`, in order, calling
/// `f(lin, off)`: `lin` is the element's row-major index in the box and `off[k]` is
/// `base[k] + sum_d idx[d] * strides[k][d]`, the element's offset in operand k.
///
/// Every index-mapping kernel is this loop with its own strides:
///   broadcast read  strides = broadcast_strides(in, out)      (0 on broadcast dims)
///   reduction       strides = kept-dims strides, 0 on reduced dims
///   transpose       strides[d] = in_strides[perm[d]]
///   strided slice   strides[d] = step[d] * in_strides[d], base = sum start[d] * in_strides[d]
/// Example: shape (2, 3), strides {(0, 1)}, base {0} visits offsets 0 1 2 0 1 2 (a
/// row of 3 broadcast over 2 rows).
template <std::size_t K, class F>
void strided_loop(shape_arg shape, const std::array<const stride_type*, K>& strides,
                  std::array<std::int64_t, K> base, F&& f) {
  const std::size_t r = shape.size();
  if (element_count(shape) == 0) return;
  if (r == 0) {
    f(std::size_t(0), base);
    return;
  }
  std::array<std::int64_t, K> inner_step{};
  for (std::size_t k = 0; k < K; ++k) inner_step[k] = (*strides[k])[r - 1];
  const std::size_t inner = shape[r - 1];
  shape_type idx(r, 0);
  std::size_t lin = 0;
  for (;;) {
    std::array<std::int64_t, K> off = base;
    for (std::size_t i = 0; i < inner; ++i) {
      f(lin++, off);
      for (std::size_t k = 0; k < K; ++k) off[k] += inner_step[k];
    }
    std::size_t d = r - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++idx[d] < shape[d]) {
        for (std::size_t k = 0; k < K; ++k) base[k] += (*strides[k])[d];
        break;
      }
      for (std::size_t k = 0; k < K; ++k) base[k] -= std::int64_t(shape[d] - 1) * (*strides[k])[d];
      idx[d] = 0;
    }
  }
}

/// An uninitialised array of the given shape (every kernel writes all of it).
template <class T, class S>
xt::xarray<T> empty_array(const S& shape) {
  return xt::xarray<T>::from_shape(shape);
}

/// An array of the given shape filled with `value`.
template <class T, class S>
xt::xarray<T> filled_array(const S& shape, T value) {
  xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
  std::fill(out.data(), out.data() + out.size(), value);
  return out;
}

/// v where keep, else +0, by a mask rather than a branch: GCC vectorises `kept(g[i], x[i]
/// > 0)` in a loop, where it leaves `x[i] > 0 ? g[i] : 0` a branch when the result is
/// multiplied or widened to double after (a ReLU's mask on a gradient).
template <class T>
  requires std::same_as<T, float> || std::same_as<T, double>
TESSERA_ALWAYS_INLINE inline T kept(T v, bool keep) {
  using bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  return std::bit_cast<T>(std::bit_cast<bits>(v) & (bits(0) - bits(keep)));
}

}  // namespace detail
}  // namespace tessera::kernels::cpu
