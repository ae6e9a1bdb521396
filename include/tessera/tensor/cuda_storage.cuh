// The GPU's storage: shards are cuda::device_array<T> in device memory (the storage
// trait of tensor/device.hpp for cuda_device), with the fill and box-copy kernels the
// redistribution executor packs and unpacks with. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <xtensor/xarray.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/launch.cuh>
#include <tessera/cuda/runtime.hpp>
#include <tessera/tensor/device.hpp>
#include <tessera/tensor/dist_tensor.hpp>
#include <tessera/tensor/host_storage.hpp>

namespace tessera {

namespace detail {

template <class T>
__global__ void fill_kernel(T* p, std::int64_t n, T value) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    p[i] = value;
}

template <class T>
__global__ void copy_box_kernel(const T* src, T* dst, cuda::strided_map<2> m, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t off[2];
    m.offsets(i, off);
    dst[off[1]] = src[off[0]];
  }
}

}  // namespace detail

template <class T>
struct storage<T, cuda_device> {
  using array = cuda::device_array<T>;

  static array empty(const extents& shape) { return array(detail::shape_vector(shape)); }

  static void fill(array& a, T value) {
    if (a.size() == 0) return;
    detail::fill_kernel<<<cuda::grid_for(std::int64_t(a.size())), cuda::block_threads, 0, cuda::stream()>>>(
        a.data(), std::int64_t(a.size()), value);
    cuda::check_launch("fill");
  }

  /// The box `box` at src_off in src (shape src_shape) to dst_off in dst (shape
  /// dst_shape); both pointers in device memory. A contiguous box is one copy, rows of
  /// a box one cudaMemcpy2DAsync, anything else a strided kernel.
  static void copy_box(const T* src, const extents& src_shape, const extents& src_off, T* dst,
                       const extents& dst_shape, const extents& dst_off, const extents& box) {
    const index_t n = box.size();
    if (n == 0) return;
    const auto ss = cuda::row_major(src_shape), ds = cuda::row_major(dst_shape);
    cuda::strided_map<2> m;
    m.ndim = box.ndim;
    for (int d = 0; d < box.ndim; ++d) {
      m.shape[d] = box.v[d];
      m.stride[0][d] = ss[d];
      m.stride[1][d] = ds[d];
      m.base[0] += src_off.v[d] * ss[d];
      m.base[1] += dst_off.v[d] * ds[d];
    }
    // Trailing dims whole in the box and both arrays make contiguous runs of `run`
    // elements: one run is one copy, runs along one dim one 2-D copy.
    int inner = box.ndim - 1;
    index_t run = box.ndim > 0 ? box.v[box.ndim - 1] : 1;
    while (inner > 0 && box.v[inner] == src_shape.v[inner] && box.v[inner] == dst_shape.v[inner] &&
           src_off.v[inner] == 0 && dst_off.v[inner] == 0) {
      --inner;
      run *= box.v[inner];
    }
    if (inner <= 0) {
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst + m.base[1], src + m.base[0], std::size_t(run) * sizeof(T),
                                         cudaMemcpyDeviceToDevice, cuda::stream()));
      return;
    }
    if (inner == 1) {
      TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(dst + m.base[1], std::size_t(ds[0]) * sizeof(T), src + m.base[0],
                                           std::size_t(ss[0]) * sizeof(T), std::size_t(run) * sizeof(T),
                                           std::size_t(box.v[0]), cudaMemcpyDeviceToDevice, cuda::stream()));
      return;
    }
    detail::copy_box_kernel<<<cuda::grid_for(n), cuda::block_threads, 0, cuda::stream()>>>(src, dst, m, n);
    cuda::check_launch("copy_box");
  }

  /// The shard in host memory (waits for the stream).
  static xt::xarray<T> to_host(const array& a) {
    xt::xarray<T> h = xt::xarray<T>::from_shape(a.shape());
    a.copy_to_host(h.data());
    return h;
  }
  static array from_host(const xt::xarray<T>& h) {
    return array::from_host(h.data(), h.size(), std::vector<std::size_t>(h.shape().begin(), h.shape().end()));
  }

  /// n elements from src to dst, both in device memory: one cudaMemcpyAsync on
  /// tessera's stream (after the kernels that wrote src, before those that read dst).
  static void copy_n(const T* src, T* dst, std::size_t n) {
    if (n == 0) return;
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, cuda::stream()));
  }
  /// n elements at p (device memory) set to value, on tessera's stream.
  static void fill_n(T* p, std::size_t n, T value) {
    if (n == 0) return;
    detail::fill_kernel<<<cuda::grid_for(std::int64_t(n)), cuda::block_threads, 0, cuda::stream()>>>(
        p, std::int64_t(n), value);
    cuda::check_launch("fill_n");
  }
};

template <class T>
struct device_of<cuda::device_array<T>> {
  using type = cuda_device;
};

/// The same tensor (layout, shape, rank) with its shard copied to the GPU.
template <class T>
tensor_on<T, cuda_device> to_device(const tensor_on<T, cpu_device>& x) {
  return tensor_on<T, cuda_device>(x.layout(), x.global_shape(), x.rank(),
                                   storage<T, cuda_device>::from_host(x.local()));
}

/// The same tensor with its shard copied to the host (waits for tessera's stream).
template <class T>
tensor_on<T, cpu_device> to_host(const tensor_on<T, cuda_device>& x) {
  return tensor_on<T, cpu_device>(x.layout(), x.global_shape(), x.rank(), storage<T, cuda_device>::to_host(x.local()));
}

}  // namespace tessera
