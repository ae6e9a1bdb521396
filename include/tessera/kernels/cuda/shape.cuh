// Data-movement kernels on device arrays, the GPU twins of kernels/cpu/shape.hpp:
// transpose and strided_slice as strided gathers, strided_slice_grad as a strided
// scatter into zeros, concat and split as copies of row blocks. The same shape rules
// and error texts as the CPU kernels (their planning functions are shared). nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/launch.cuh>
#include <tessera/kernels/cpu/shape.hpp>
#include <tessera/kernels/cuda/common.cuh>
#include <tessera/tensor/cuda_storage.cuh>

namespace tessera::kernels::cuda {

namespace detail {

struct copy_f {
  template <class T> __device__ T operator()(T v) const { return v; }
};

// out[m(i)] = in[i] for the n elements of a box (m's offsets distinct: no races).
template <class T>
__global__ void scatter_strided_kernel(T* out, const T* in, std::int64_t n, tessera::cuda::strided_map<1> m) {
  TESSERA_GRID_STRIDE(i, n) {
    std::int64_t off[1];
    m.offsets(i, off);
    out[off[0]] = in[i];
  }
}

// For o < outer and c < chunk: dst[o * dst_row + dst_at + c] = src[o * src_row + src_at + c].
template <class T>
__global__ void copy_rows_kernel(T* dst, std::int64_t dst_row, std::int64_t dst_at, const T* src,
                                 std::int64_t src_row, std::int64_t src_at, std::int64_t outer, std::int64_t chunk) {
  TESSERA_GRID_STRIDE(k, outer * chunk) {
    const std::int64_t o = k / chunk, c = k % chunk;
    dst[o * dst_row + dst_at + c] = src[o * src_row + src_at + c];
  }
}

template <class T>
void copy_rows(const char* fn, T* dst, std::int64_t dst_row, std::int64_t dst_at, const T* src, std::int64_t src_row,
               std::int64_t src_at, std::int64_t outer, std::int64_t chunk) {
  if (outer <= 0 || chunk <= 0) return;
  copy_rows_kernel<<<tessera::cuda::grid_for(outer * chunk), tessera::cuda::block_threads, 0,
                     tessera::cuda::stream()>>>(dst, dst_row, dst_at, src, src_row, src_at, outer, chunk);
  tessera::cuda::check_launch(fn);
}

template <class S>
shape_vec to_vec(const S& s) {
  return shape_vec(s.begin(), s.end());
}

// The strided maps index at most max_tensor_ndim dims.
inline void require_rank(const char* fn, std::size_t ndim) {
  if (ndim > std::size_t(max_tensor_ndim))
    throw error(std::string(fn) + ": rank " + std::to_string(ndim) + " exceeds the " +
                std::to_string(max_tensor_ndim) + " dims the GPU kernels index");
}

// y (contiguous, `shape`) [i] = x[base + sum_d idx_d * st_d].
template <class T>
device_array<T> gather_strided(const char* fn, const device_array<T>& x, const shape_vec& shape, std::int64_t base,
                               const cd::stride_type& st) {
  require_rank(fn, shape.size());
  device_array<T> y(shape);
  tessera::cuda::strided_map<1> m = make_map<1>(shape, {st});
  m.base[0] = base;
  map_strided(fn, y.data(), shape, m, copy_f{}, x.data());
  return y;
}

}  // namespace detail

/// y = x permuted by perm (kernels/cpu/shape.hpp's transpose on the GPU).
template <class T>
device_array<T> transpose(const device_array<T>& x, const std::vector<int>& perm) {
  const auto p = detail::cd::check_perm("transpose", perm, x.shape());
  const detail::cd::stride_type own = detail::cd::row_major_strides(x.shape());
  detail::shape_vec shape(p.size());
  detail::cd::stride_type st(p.size());
  for (std::size_t d = 0; d < p.size(); ++d) {
    shape[d] = x.shape()[p[d]];
    st[d] = own[p[d]];
  }
  return detail::gather_strided("transpose", x, shape, 0, st);
}

/// The gradient of y = transpose(x, perm): dy transposed by the inverse permutation.
template <class T>
device_array<T> transpose_grad(const device_array<T>& dy, const std::vector<int>& perm) {
  const auto p = detail::cd::check_perm("transpose_grad", perm, dy.shape());
  std::vector<int> inverse(p.size());
  for (std::size_t d = 0; d < p.size(); ++d) inverse[p[d]] = int(d);
  return transpose(dy, inverse);
}

/// x[begin:end:strides] with Python slice semantics (kernels/cpu/shape.hpp's
/// strided_slice on the GPU).
template <class T>
device_array<T> strided_slice(const device_array<T>& x, const std::vector<index_t>& begin,
                              const std::vector<index_t>& end, const std::vector<index_t>& strides = {}) {
  const auto dims = detail::cd::plan_slice("strided_slice", x.shape(), begin, end, strides);
  const auto shape = detail::to_vec(detail::cd::slice_shape(dims));
  const auto [base, st] = detail::cd::slice_walk(x.shape(), dims);
  return detail::gather_strided("strided_slice", x, shape, base, st);
}

/// The gradient of y = strided_slice(x, ...) for x of shape `input_shape`: dy scattered
/// into zeros at the sliced positions.
template <class T>
device_array<T> strided_slice_grad(const device_array<T>& dy, const std::vector<std::size_t>& input_shape,
                                   const std::vector<index_t>& begin, const std::vector<index_t>& end,
                                   const std::vector<index_t>& strides = {}) {
  const auto dims = detail::cd::plan_slice("strided_slice_grad", input_shape, begin, end, strides);
  const auto shape = detail::to_vec(detail::cd::slice_shape(dims));
  if (!detail::cd::same_shape(dy.shape(), shape))
    throw error("strided_slice_grad: dy is " + detail::cd::shape_text(dy.shape()) + ", expected " +
                detail::cd::shape_text(shape) + ", the slice's shape for input " +
                detail::cd::shape_text(input_shape));
  detail::require_rank("strided_slice_grad", shape.size());
  const auto [base, st] = detail::cd::slice_walk(input_shape, dims);
  device_array<T> dx(input_shape);
  tessera::storage<T, cuda_device>::fill(dx, T(0));
  const std::int64_t n = detail::count_of(shape);
  if (n > 0) {
    tessera::cuda::strided_map<1> m = detail::make_map<1>(shape, {st});
    m.base[0] = base;
    detail::scatter_strided_kernel<<<tessera::cuda::grid_for(n), tessera::cuda::block_threads, 0,
                                     tessera::cuda::stream()>>>(dx.data(), dy.data(), n, m);
    tessera::cuda::check_launch("strided_slice_grad");
  }
  return dx;
}

/// The inputs joined along `axis`; every other dim must agree (kernels/cpu/shape.hpp's
/// concat on the GPU).
template <class T>
device_array<T> concat(const std::vector<const device_array<T>*>& in, int axis = 0) {
  if (in.empty()) throw error("concat: needs at least one input");
  const device_array<T>& first = *in[0];
  const std::size_t ax = detail::cd::normalize_axis(axis, first.dimension(), "concat");
  detail::shape_vec shape = first.shape();
  shape[ax] = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto& s = in[i]->shape();
    bool agree = s.size() == first.dimension();
    for (std::size_t d = 0; agree && d < s.size(); ++d) agree = d == ax || s[d] == first.shape()[d];
    if (!agree)
      throw error("concat: input " + std::to_string(i) + " is " + detail::cd::shape_text(s) + ", input 0 is " +
                  detail::cd::shape_text(first.shape()) + ": the dims other than axis " + std::to_string(ax) +
                  " must agree");
    shape[ax] += s[ax];
  }
  device_array<T> out(shape);
  const auto [outer, inner] = detail::cd::outer_inner(shape, ax);
  const std::int64_t row = std::int64_t(shape[ax] * inner);  // output elements per outer index
  std::int64_t at = 0;                                        // offset of input i's block in a row
  for (const device_array<T>* x : in) {
    const std::int64_t chunk = std::int64_t(x->shape()[ax] * inner);
    detail::copy_rows("concat", out.data(), row, at, x->data(), chunk, 0, std::int64_t(outer), chunk);
    at += chunk;
  }
  return out;
}

/// x cut along `axis` into pieces of the given extents (kernels/cpu/shape.hpp's split on
/// the GPU).
template <class T>
std::vector<device_array<T>> split(const device_array<T>& x, const std::vector<std::size_t>& sizes, int axis = 0) {
  const std::size_t ax = detail::cd::normalize_axis(axis, x.dimension(), "split");
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  if (total != x.shape()[ax])
    throw error("split: sizes " + detail::cd::list_text(sizes) + " add up to " + std::to_string(total) + ", x " +
                detail::cd::shape_text(x.shape()) + " has extent " + std::to_string(x.shape()[ax]) + " at axis " +
                std::to_string(ax));
  const auto [outer, inner] = detail::cd::outer_inner(x.shape(), ax);
  const std::int64_t row = std::int64_t(x.shape()[ax] * inner);
  std::vector<device_array<T>> out;
  out.reserve(sizes.size());
  std::int64_t at = 0;
  for (std::size_t s : sizes) {
    detail::shape_vec shape = x.shape();
    shape[ax] = s;
    device_array<T> piece(shape);
    const std::int64_t chunk = std::int64_t(s * inner);
    detail::copy_rows("split", piece.data(), chunk, 0, x.data(), row, at, std::int64_t(outer), chunk);
    at += chunk;
    out.push_back(std::move(piece));
  }
  return out;
}

}  // namespace tessera::kernels::cuda
