// device_array<T>: a row-major array in device memory, the shard type of cuda_device
// tensors. Owns its block (from the caching allocator); copies are deep (device to
// device, on tessera's stream); moving hands the block over. Host transfers wait for
// the stream. Plain C++ over the CUDA runtime API.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/cuda/allocator.hpp>
#include <tessera/cuda/runtime.hpp>

namespace tessera::cuda {

template <class T>
class device_array {
  static_assert(std::is_trivially_copyable_v<T>, "device_array: the element type must be trivially copyable");

 public:
  using value_type = T;
  using shape_type = std::vector<std::size_t>;

  device_array() = default;
  /// An uninitialised array of `shape` (row-major).
  explicit device_array(shape_type shape) : shape_(std::move(shape)) {
    size_ = std::accumulate(shape_.begin(), shape_.end(), std::size_t(1), std::multiplies<>());
    if (size_ > 0) data_ = static_cast<T*>(allocator().allocate(size_ * sizeof(T)));
  }
  /// A copy of `n` elements at host address `host`, of shape `shape` (n must match).
  static device_array from_host(const T* host, std::size_t n, shape_type shape) {
    device_array a(std::move(shape));
    if (a.size_ != n)
      throw error("device_array::from_host: " + std::to_string(n) + " elements for a shape of " +
                  std::to_string(a.size_));
    if (n > 0)
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(a.data_, host, n * sizeof(T), cudaMemcpyHostToDevice, stream()));
    // The source may be freed as soon as we return: wait for the copy.
    synchronize();
    return a;
  }

  /// A copy of o's elements and shape; an empty array (default-constructed, or of a
  /// shape with a zero extent) copies as empty, with no allocation.
  device_array(const device_array& o) : size_(o.size_), shape_(o.shape_) {
    if (size_ == 0) return;
    data_ = static_cast<T*>(allocator().allocate(size_ * sizeof(T)));
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(data_, o.data_, size_ * sizeof(T), cudaMemcpyDeviceToDevice, stream()));
  }
  device_array& operator=(const device_array& o) {
    if (this != &o) *this = device_array(o);
    return *this;
  }
  device_array(device_array&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), shape_(std::move(o.shape_)) {
    o.shape_.clear();
  }
  device_array& operator=(device_array&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      shape_ = std::move(o.shape_);
      o.shape_.clear();
    }
    return *this;
  }
  ~device_array() { release(); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t dimension() const noexcept { return shape_.size(); }
  const shape_type& shape() const noexcept { return shape_; }

  /// The same elements seen with another shape of the same size.
  void reshape(const shape_type& shape) {
    const std::size_t n = std::accumulate(shape.begin(), shape.end(), std::size_t(1), std::multiplies<>());
    if (n != size_)
      throw error("device_array::reshape: a shape of " + std::to_string(n) + " elements for an array of " +
                  std::to_string(size_));
    shape_ = shape;
  }

  /// Copies every element to `host` (size() elements) and waits for the copy.
  void copy_to_host(T* host) const {
    if (size_ > 0)
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(host, data_, size_ * sizeof(T), cudaMemcpyDeviceToHost, stream()));
    synchronize();
  }
  /// The elements in a host vector (waits for the stream).
  std::vector<T> to_vector() const {
    std::vector<T> v(size_);
    copy_to_host(v.data());
    return v;
  }

 private:
  void release() noexcept {
    if (data_) allocator().deallocate(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  shape_type shape_;
};

}  // namespace tessera::cuda
