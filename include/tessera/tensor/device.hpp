// Where a tensor's shard lives: the device tags, and the storage trait that names
// each device's array type and its memory operations (allocate, fill, copy a box,
// move to and from the host). Standard library only; each device specialises the
// trait in its own header (tensor/host_storage.hpp, tensor/cuda_storage.cuh).
#pragma once

#include <concepts>
#include <string_view>

namespace tessera {

/// The host: shards are `xt::xarray<T>` in CPU memory (tensor/host_storage.hpp).
struct cpu_device {
  static constexpr std::string_view name = "cpu";
};

/// An NVIDIA GPU: shards are `cuda::device_array<T>` in device memory on the current
/// device's stream (tensor/cuda_storage.cuh, compiled by nvcc).
struct cuda_device {
  static constexpr std::string_view name = "cuda";
};

/// The memory model of device D for elements of type T. Every specialisation provides
///
///     using array = ...;                      // the shard type: row-major, owns its memory
///     static array empty(const extents&);     // uninitialised
///     static void fill(array&, T value);
///     // the box of shape `box` at src_off in the row-major src (shape src_shape) to
///     // dst_off in dst (shape dst_shape); pointers into this device's memory
///     static void copy_box(const T* src, const extents& src_shape, const extents& src_off,
///                          T* dst, const extents& dst_shape, const extents& dst_off,
///                          const extents& box);
///     static xt::xarray<T> to_host(const array&);
///     static array from_host(const xt::xarray<T>&);
///     // n elements from src to dst, and n elements at p set to value; pointers into
///     // this device's memory (on a GPU: queued on tessera's stream, in order with
///     // the kernels before and after)
///     static void copy_n(const T* src, T* dst, std::size_t n);
///     static void fill_n(T* p, std::size_t n, T value);
///
/// The primary template is never defined: a device whose header is missing is an error
/// naming the trait and the device.
template <class T, class D>
struct storage;

/// The device an array type belongs to (`xt::xarray<T>` -> cpu_device,
/// `cuda::device_array<T>` -> cuda_device); specialised beside each storage.
template <class A>
struct device_of;
template <class A>
using device_of_t = typename device_of<A>::type;

/// The storage trait of an array type.
template <class A>
using storage_of = storage<typename A::value_type, device_of_t<A>>;

/// A device tag: one of cpu_device, cuda_device.
template <class D>
concept device = std::same_as<D, cpu_device> || std::same_as<D, cuda_device>;

}  // namespace tessera
