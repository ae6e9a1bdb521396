// The host's storage: shards are xt::xarray<T> in CPU memory (the storage trait of
// tensor/device.hpp for cpu_device).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/tensor/copy_box.hpp>
#include <tessera/tensor/device.hpp>

namespace tessera {

namespace detail {
inline std::vector<std::size_t> shape_vector(const extents& e) {
  return std::vector<std::size_t>(e.v.begin(), e.v.begin() + e.ndim);
}
}  // namespace detail

template <class T>
struct storage<T, cpu_device> {
  using array = xt::xarray<T>;

  static array empty(const extents& shape) { return array::from_shape(detail::shape_vector(shape)); }
  static void fill(array& a, T value) { std::fill(a.data(), a.data() + a.size(), value); }
  static void copy_box(const T* src, const extents& src_shape, const extents& src_off, T* dst,
                       const extents& dst_shape, const extents& dst_off, const extents& box) {
    detail::copy_box(src, src_shape, src_off, dst, dst_shape, dst_off, box);
  }
  static const xt::xarray<T>& to_host(const array& a) { return a; }
  static array from_host(const xt::xarray<T>& a) { return a; }
  static void copy_n(const T* src, T* dst, std::size_t n) { std::copy_n(src, n, dst); }
  static void fill_n(T* p, std::size_t n, T value) { std::fill_n(p, n, value); }
};

template <class T>
struct device_of<xt::xarray<T>> {
  using type = cpu_device;
};

}  // namespace tessera
