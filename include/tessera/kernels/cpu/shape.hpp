// Data-movement kernels, materialised row-major: transpose, strided_slice, concat,
// split, reshape, and the backward of each (transpose_grad, strided_slice_grad;
// split is concat's backward and concat is split's).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/kernels/cpu/common.hpp>

namespace tessera::kernels::cpu {

namespace detail {

/// perm normalised (negative entries count from the end); throws unless it is a
/// permutation of the rank's dims.
inline std::vector<std::size_t> check_perm(std::string_view fn, const std::vector<int>& perm,
                                           shape_arg shape) {
  auto bad = [&] {
    return error(std::string(fn) + ": perm " + list_text(perm) + " is not a permutation of the " +
                 std::to_string(shape.size()) + " dims of " + shape_text(shape));
  };
  if (perm.size() != shape.size()) throw bad();
  std::vector<std::size_t> p(perm.size());
  std::vector<bool> seen(perm.size(), false);
  const int r = int(perm.size());
  for (std::size_t d = 0; d < perm.size(); ++d) {
    if (perm[d] < -r || perm[d] >= r) throw bad();
    p[d] = std::size_t(perm[d] < 0 ? perm[d] + r : perm[d]);
    if (seen[p[d]]) throw bad();
    seen[p[d]] = true;
  }
  return p;
}

/// One sliced dim: `count` elements from `start`, `step` apart (step may be negative).
struct slice_dim {
  std::int64_t start = 0, step = 1;
  std::size_t count = 0;
};

/// Python slice semantics per dim, for begin/end/strides covering the leading dims
/// (the rest are taken whole). A negative begin or end counts from the end; both are
/// then clamped to the dim, so end = INT64_MAX (INT64_MIN with a negative stride)
/// means "to the end". Example: extent 6, begin 4, end -7, stride -2 gives 4, 2, 0.
inline std::vector<slice_dim> plan_slice(std::string_view fn, shape_arg shape,
                                         const std::vector<index_t>& begin,
                                         const std::vector<index_t>& end,
                                         const std::vector<index_t>& strides) {
  if (begin.size() != end.size() || (!strides.empty() && strides.size() != begin.size()))
    throw error(std::string(fn) + ": begin, end and strides must have the same length: begin " +
                list_text(begin) + ", end " + list_text(end) + ", strides " + list_text(strides));
  if (begin.size() > shape.size())
    throw error(std::string(fn) + ": begin " + list_text(begin) + " slices " +
                std::to_string(begin.size()) + " dims, x " + shape_text(shape) + " has rank " +
                std::to_string(shape.size()));
  std::vector<slice_dim> dims(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const std::int64_t n = std::int64_t(shape[d]);
    if (d >= begin.size()) {
      dims[d] = {0, 1, shape[d]};
      continue;
    }
    const std::int64_t s = strides.empty() ? 1 : strides[d];
    if (s == 0)
      throw error(std::string(fn) + ": strides " + list_text(strides) + " has 0 at dim " +
                  std::to_string(d));
    const std::int64_t lo = s > 0 ? 0 : -1, hi = s > 0 ? n : n - 1;
    auto place = [&](std::int64_t i) { return std::clamp(i < 0 ? i + n : i, lo, hi); };
    const std::int64_t b = place(begin[d]), e = place(end[d]);
    const std::int64_t span = s > 0 ? e - b : b - e, step = s > 0 ? s : -s;
    dims[d] = {b, s, span > 0 ? std::size_t((span + step - 1) / step) : 0};
  }
  return dims;
}

inline shape_type slice_shape(const std::vector<slice_dim>& dims) {
  shape_type out(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) out[d] = dims[d].count;
  return out;
}

/// The slice's walk through the sliced array: its base offset and per-dim strides.
inline std::pair<std::int64_t, stride_type> slice_walk(shape_arg shape,
                                                       const std::vector<slice_dim>& dims) {
  const stride_type own = row_major_strides(shape);
  stride_type st(dims.size());
  std::int64_t base = 0;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    base += dims[d].start * own[d];
    st[d] = dims[d].step * own[d];
  }
  return {base, st};
}

/// (outer, inner) around an axis: elements before it and after it, row-major.
inline std::pair<std::size_t, std::size_t> outer_inner(shape_arg shape, std::size_t axis) {
  std::size_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (std::size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  return {outer, inner};
}

template <class T>
xt::xarray<T> concat_impl(const std::vector<const xt::xarray<T>*>& in, int axis) {
  if (in.empty()) throw error("concat: needs at least one input");
  const xt::xarray<T>& first = *in[0];
  const std::size_t ax = normalize_axis(axis, first.dimension(), "concat");
  shape_type shape = first.shape();
  shape[ax] = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto& s = in[i]->shape();
    bool agree = s.size() == first.dimension();
    for (std::size_t d = 0; agree && d < s.size(); ++d)
      agree = d == ax || s[d] == first.shape()[d];
    if (!agree)
      throw error("concat: input " + std::to_string(i) + " is " + shape_text(*in[i]) +
                  ", input 0 is " + shape_text(first) + ": the dims other than axis " +
                  std::to_string(ax) + " must agree");
    shape[ax] += s[ax];
  }
  auto out = empty_array<T>(shape);
  const auto [outer, inner] = outer_inner(shape, ax);
  const std::size_t row = shape[ax] * inner;  // output elements per outer index
  std::size_t at = 0;                         // offset of input i's block in a row
  for (const xt::xarray<T>* x : in) {
    const std::size_t chunk = x->shape()[ax] * inner;
    for (std::size_t o = 0; o < outer; ++o)
      std::copy_n(x->data() + o * chunk, chunk, out.data() + o * row + at);
    at += chunk;
  }
  return out;
}

}  // namespace detail

/// y with y.shape[d] = x.shape[perm[d]] and y[i_0, ..., i_n] = x at index j with
/// j[perm[d]] = i_d, materialised row-major (NumPy's transpose(x, perm)). Throws
/// unless perm is a permutation of x's dims:
/// "transpose: perm [0, 0] is not a permutation of the 2 dims of (3, 4)".
template <class T>
xt::xarray<T> transpose(const xt::xarray<T>& x, const std::vector<int>& perm) {
  const auto p = detail::check_perm("transpose", perm, x.shape());
  const detail::stride_type own = detail::row_major_strides(x.shape());
  detail::shape_type shape(p.size());
  detail::stride_type st(p.size());
  for (std::size_t d = 0; d < p.size(); ++d) {
    shape[d] = x.shape()[p[d]];
    st[d] = own[p[d]];
  }
  auto y = detail::empty_array<T>(shape);
  const T* px = x.data();
  T* o = y.data();
  detail::strided_loop<1>(shape, {&st}, {0},
                          [&](std::size_t i, const auto& off) { o[i] = px[off[0]]; });
  return y;
}

/// The gradient of y = transpose(x, perm): dy transposed by the inverse permutation.
template <class T>
xt::xarray<T> transpose_grad(const xt::xarray<T>& dy, const std::vector<int>& perm) {
  const auto p = detail::check_perm("transpose_grad", perm, dy.shape());
  std::vector<int> inverse(p.size());
  for (std::size_t d = 0; d < p.size(); ++d) inverse[p[d]] = int(d);
  return transpose(dy, inverse);
}

/// x[begin_0:end_0:strides_0, begin_1:end_1:strides_1, ...] with Python slice
/// semantics: begin, end and strides name the leading dims (later dims are taken
/// whole; empty strides mean all 1); negative begin or end count from the end and
/// both are clamped, so INT64_MAX (INT64_MIN for a negative stride) means "to the
/// end"; a negative stride walks backwards. Example: x (6,) = 0..5, begin [4], end
/// [-7], strides [-2] gives (4, 2, 0). Throws on a 0 stride, differing lengths, or more
/// dims than x has.
template <class T>
xt::xarray<T> strided_slice(const xt::xarray<T>& x, const std::vector<index_t>& begin,
                            const std::vector<index_t>& end,
                            const std::vector<index_t>& strides = {}) {
  const auto dims = detail::plan_slice("strided_slice", x.shape(), begin, end, strides);
  const auto shape = detail::slice_shape(dims);
  const auto [base, st] = detail::slice_walk(x.shape(), dims);
  auto y = detail::empty_array<T>(shape);
  const T* px = x.data();
  T* o = y.data();
  detail::strided_loop<1>(shape, {&st}, {base},
                          [&](std::size_t i, const auto& off) { o[i] = px[off[0]]; });
  return y;
}

/// The gradient of y = strided_slice(x, begin, end, strides) for x of shape
/// `input_shape`: dy scattered into zeros at the sliced positions. Throws when dy's
/// shape is not the slice's.
template <class T>
xt::xarray<T> strided_slice_grad(const xt::xarray<T>& dy, shape_arg input_shape,
                                 const std::vector<index_t>& begin,
                                 const std::vector<index_t>& end,
                                 const std::vector<index_t>& strides = {}) {
  const auto dims = detail::plan_slice("strided_slice_grad", input_shape, begin, end, strides);
  const auto shape = detail::slice_shape(dims);
  if (!detail::same_shape(dy.shape(), shape))
    throw error("strided_slice_grad: dy is " + detail::shape_text(dy) + ", expected " +
                detail::shape_text(shape) + ", the slice's shape for input " +
                detail::shape_text(input_shape));
  const auto [base, st] = detail::slice_walk(input_shape, dims);
  auto dx = detail::filled_array<T>(detail::to_shape(input_shape), T(0));
  const T* g = dy.data();
  T* o = dx.data();
  detail::strided_loop<1>(shape, {&st}, {base},
                          [&](std::size_t i, const auto& off) { o[off[0]] = g[i]; });
  return dx;
}

/// The inputs joined along `axis`; every other dim must agree. Throws on no input,
/// an axis out of range, or disagreeing dims: "concat: input 1 is (2, 5), input 0 is
/// (3, 4): the dims other than axis 0 must agree". The backward is split(dy, sizes,
/// axis) with sizes the inputs' extents along the axis.
template <class T>
xt::xarray<T> concat(const std::vector<xt::xarray<T>>& inputs, int axis = 0) {
  std::vector<const xt::xarray<T>*> in;
  for (const auto& x : inputs) in.push_back(&x);
  return detail::concat_impl(in, axis);
}

/// concat of a braced list: concat({a, b}, 1) (the list holds copies of a and b).
template <class T>
xt::xarray<T> concat(std::initializer_list<xt::xarray<T>> inputs, int axis = 0) {
  std::vector<const xt::xarray<T>*> in;
  for (const auto& x : inputs) in.push_back(&x);
  return detail::concat_impl(in, axis);
}

/// x cut along `axis` into pieces of the given extents, in order (concat's inverse).
/// Throws unless the sizes add up to x's extent:
/// "split: sizes [2, 3] add up to 5, x (4, 6) has extent 4 at axis 0".
template <class T>
std::vector<xt::xarray<T>> split(const xt::xarray<T>& x, const std::vector<std::size_t>& sizes,
                                 int axis = 0) {
  const std::size_t ax = detail::normalize_axis(axis, x.dimension(), "split");
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  if (total != x.shape()[ax])
    throw error("split: sizes " + detail::list_text(sizes) + " add up to " + std::to_string(total) +
                ", x " + detail::shape_text(x) + " has extent " + std::to_string(x.shape()[ax]) +
                " at axis " + std::to_string(ax));
  const auto [outer, inner] = detail::outer_inner(x.shape(), ax);
  const std::size_t row = x.shape()[ax] * inner;
  std::vector<xt::xarray<T>> out;
  out.reserve(sizes.size());
  std::size_t at = 0;
  for (std::size_t s : sizes) {
    detail::shape_type shape = x.shape();
    shape[ax] = s;
    auto piece = detail::empty_array<T>(shape);
    const std::size_t chunk = s * inner;
    for (std::size_t o = 0; o < outer; ++o)
      std::copy_n(x.data() + o * row + at, chunk, piece.data() + o * chunk);
    at += chunk;
    out.push_back(std::move(piece));
  }
  return out;
}

/// x cut along `axis` into `num` equal pieces (MindSpore's Split(axis, output_num)).
/// Throws unless num > 0 divides the extent:
/// "split_equal: extent 6 at axis 1 of x (4, 6) does not split into 4 equal pieces".
template <class T>
std::vector<xt::xarray<T>> split_equal(const xt::xarray<T>& x, std::size_t num, int axis = 0) {
  const std::size_t ax = detail::normalize_axis(axis, x.dimension(), "split_equal");
  const std::size_t n = x.shape()[ax];
  if (num == 0 || n % num != 0)
    throw error("split_equal: extent " + std::to_string(n) + " at axis " + std::to_string(ax) +
                " of x " + detail::shape_text(x) + " does not split into " + std::to_string(num) +
                " equal pieces");
  return split(x, std::vector<std::size_t>(num, n / num), axis);
}

namespace detail {

/// The target of a reshape of `from` to `to`, where one entry of `to` may be -1
/// (inferred). Throws unless the element counts agree:
/// "reshape: cannot reshape (2, 3) (6 elements) to [4, 2] (8 elements)".
inline shape_type reshape_target(shape_arg from, const std::vector<index_t>& to) {
  const std::size_t n = element_count(from);
  auto fail_with = [&](const std::string& why) {
    return error("reshape: cannot reshape " + shape_text(from) + " (" + std::to_string(n) +
                 " elements) to " + list_text(to) + why);
  };
  shape_type out(to.size());
  std::size_t known = 1, infer = to.size();
  for (std::size_t d = 0; d < to.size(); ++d) {
    if (to[d] == -1) {
      if (infer != to.size()) throw fail_with(": at most one dim may be -1");
      infer = d;
    } else if (to[d] < 0) {
      throw fail_with(": a dim is negative");
    } else {
      out[d] = std::size_t(to[d]);
      known *= out[d];
    }
  }
  if (infer != to.size()) {
    if (known == 0 || n % known != 0)
      throw fail_with(": no extent for the -1 dim gives " + std::to_string(n) + " elements");
    out[infer] = n / known;
    known = n;
  }
  if (known != n) throw fail_with(" (" + std::to_string(known) + " elements)");
  return out;
}

}  // namespace detail

/// x's elements, in row-major order, in a new shape; one dim may be -1 (inferred).
/// Example: reshape(x (2, 3, 4), {6, -1}) is (6, 4). Returns a copy.
template <class T>
xt::xarray<T> reshape(const xt::xarray<T>& x, const std::vector<index_t>& shape) {
  auto y = detail::empty_array<T>(detail::reshape_target(x.shape(), shape));
  std::copy(x.data(), x.data() + x.size(), y.data());
  return y;
}

/// reshape of an rvalue: reuses x's buffer (no copy).
template <class T>
xt::xarray<T> reshape(xt::xarray<T>&& x, const std::vector<index_t>& shape) {
  x.reshape(detail::reshape_target(x.shape(), shape));
  return std::move(x);
}

}  // namespace tessera::kernels::cpu
