// Copying a box between row-major arrays in host memory: every pack and unpack of the
// redistribution executor on the host is one call. tensor/cuda_storage.cuh is its
// device twin.
#pragma once

#include <algorithm>
#include <array>
#include <tessera/core/config.hpp>
#include <tessera/core/extents.hpp>

namespace tessera::detail {

/// Copies the box of shape `box` at `src_off` in the row-major array `src` (shape
/// `src_shape`) to `dst_off` in `dst` (shape `dst_shape`). The innermost dim is
/// copied as contiguous runs.
template <class T>
void copy_box(const T* src, const extents& src_shape, const extents& src_off, T* dst,
              const extents& dst_shape, const extents& dst_off, const extents& box) {
  const int n = box.ndim;
  if (box.size() == 0) return;
  if (n == 0) {
    *dst = *src;
    return;
  }
  std::array<index_t, max_tensor_ndim> src_stride{}, dst_stride{};
  src_stride[n - 1] = dst_stride[n - 1] = 1;
  for (int d = n - 2; d >= 0; --d) {
    src_stride[d] = src_stride[d + 1] * src_shape.v[d + 1];
    dst_stride[d] = dst_stride[d + 1] * dst_shape.v[d + 1];
  }
  // Merge trailing dims that are whole in source, destination and box into one run.
  int inner = n - 1;
  index_t run = box.v[n - 1];
  while (inner > 0 && box.v[inner] == src_shape.v[inner] && box.v[inner] == dst_shape.v[inner] &&
         src_off.v[inner] == 0 && dst_off.v[inner] == 0) {
    --inner;
    run *= box.v[inner];
  }
  index_t src_base = 0, dst_base = 0;
  for (int d = 0; d < n; ++d) {
    src_base += src_off.v[d] * src_stride[d];
    dst_base += dst_off.v[d] * dst_stride[d];
  }
  std::array<index_t, max_tensor_ndim> idx{};
  while (true) {
    index_t s = src_base, t = dst_base;
    for (int d = 0; d < inner; ++d) {
      s += idx[d] * src_stride[d];
      t += idx[d] * dst_stride[d];
    }
    std::copy_n(src + s, run, dst + t);
    int d = inner - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < box.v[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

/// A shape of rank n with all extents zero except as set: the origin of a box.
constexpr extents origin(int n) {
  extents e;
  e.ndim = n;
  return e;
}

}  // namespace tessera::detail
