// What the GPU's convolutional network kernels share: the cuDNN handle of each device
// (bound to tessera's stream), cuDNN's errors as tessera::error, owned descriptors, the
// workspace handle, and NCHW helpers (zero or -inf padding, cropping) for the cases
// cuDNN's descriptors cannot express (padding that differs before and after). nvcc
// only; link tessera::cudnn.
#pragma once

#include <cudnn.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/launch.cuh>
#include <tessera/cuda/runtime.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/kernels/cuda/common.cuh>

namespace tessera::kernels::cuda {

/// What a GPU kernel's backward needs from its forward besides the arrays: the index
/// of each window's maximum (max pooling), the ReLU mask (a batch norm with ReLU fused).
/// Empty where the forward keeps nothing.
struct device_workspace {
  device_array<std::int32_t> indices;
  device_array<std::uint8_t> mask;
  bool empty() const { return indices.size() == 0 && mask.size() == 0; }
};

namespace detail {

/// "cudnnConvolutionForward failed: CUDNN_STATUS_BAD_PARAM (2000)"
[[noreturn, gnu::cold, gnu::noinline]] inline void cudnn_fail(cudnnStatus_t s, const char* call) {
  throw error(std::string(call) + " failed: " + cudnnGetErrorString(s) + " (" + std::to_string(int(s)) + ")");
}
inline void cudnn_check(cudnnStatus_t s, const char* call) {
  if (s != CUDNN_STATUS_SUCCESS) [[unlikely]]
    cudnn_fail(s, call);
}
#define TESSERA_CUDNN_CHECK(call) ::tessera::kernels::cuda::detail::cudnn_check((call), #call)

/// The cuDNN handle of the current device, bound to tessera's stream; created on first
/// use, kept for the life of the process.
inline cudnnHandle_t cudnn() {
  constexpr int max_devices = 64;
  static cudnnHandle_t handles[max_devices] = {};
  const int d = tessera::cuda::current_device();
  if (!handles[d]) {
    TESSERA_CUDNN_CHECK(cudnnCreate(&handles[d]));
    TESSERA_CUDNN_CHECK(cudnnSetStream(handles[d], tessera::cuda::stream()));
  }
  return handles[d];
}

/// An owned cuDNN descriptor: move-only RAII over create/destroy.
template <class H, cudnnStatus_t (*Create)(H*), cudnnStatus_t (*Destroy)(H)>
class cudnn_descriptor {
 public:
  cudnn_descriptor() { TESSERA_CUDNN_CHECK(Create(&h_)); }
  cudnn_descriptor(const cudnn_descriptor&) = delete;
  cudnn_descriptor& operator=(const cudnn_descriptor&) = delete;
  cudnn_descriptor(cudnn_descriptor&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  cudnn_descriptor& operator=(cudnn_descriptor&& o) noexcept {
    if (this != &o) {
      if (h_) Destroy(h_);
      h_ = o.h_;
      o.h_ = nullptr;
    }
    return *this;
  }
  ~cudnn_descriptor() {
    if (h_) Destroy(h_);
  }
  H get() const { return h_; }
  operator H() const { return h_; }

 private:
  H h_ = nullptr;
};

using tensor_desc =
    cudnn_descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using filter_desc =
    cudnn_descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using conv_desc = cudnn_descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                                   cudnnDestroyConvolutionDescriptor>;

/// An NCHW float tensor descriptor.
inline tensor_desc nchw_desc(std::span<const std::size_t> s) {
  tensor_desc d;
  TESSERA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(s[0]), int(s[1]),
                                                 int(s[2]), int(s[3])));
  return d;
}

inline std::span<const std::size_t> dims(const device_array<float>& x) {
  return std::span<const std::size_t>(x.shape().data(), x.shape().size());
}

/// Throws unless `got` equals `want` (the host kernels' text).
inline void require_dims(const char* fn, const char* name, std::span<const std::size_t> got,
                         std::span<const std::size_t> want) {
  if (!std::ranges::equal(got, want))
    throw error(std::string(fn) + ": " + name + " must be " + tessera::detail::dims_text(want) + ", " + name +
                " is " + tessera::detail::dims_text(got));
}
inline void require_vector(const char* fn, const char* name, const device_array<float>& v, std::size_t n) {
  if (v.dimension() != 1 || v.shape()[0] != n)
    throw error(std::string(fn) + ": " + name + " must be (" + std::to_string(n) + ",), " + name + " is " +
                tessera::detail::dims_text(dims(v)));
}

// ---- explicit padding and cropping of NCHW images -----------------------------------

/// out (N, C, H + top + bottom, W + left + right) = x surrounded by `value`.
template <class T>
__global__ void pad_nchw_kernel(T* out, const T* x, std::int64_t planes, std::int64_t h,
                                       std::int64_t w, std::int64_t top, std::int64_t left, std::int64_t oh,
                                       std::int64_t ow, T value) {
  const std::int64_t n = planes * oh * ow;
  TESSERA_GRID_STRIDE(i, n) {
    const std::int64_t j = i % ow, r = (i / ow) % oh, p = i / (ow * oh);
    const std::int64_t xi = r - top, xj = j - left;
    out[i] = xi >= 0 && xi < h && xj >= 0 && xj < w ? x[(p * h + xi) * w + xj] : value;
  }
}

/// out (N, C, H, W) = the window of xp (N, C, HP, WP) that starts at (top, left).
template <class T>
__global__ void crop_nchw_kernel(T* out, const T* xp, std::int64_t planes, std::int64_t h,
                                        std::int64_t w, std::int64_t top, std::int64_t left, std::int64_t hp,
                                        std::int64_t wp) {
  const std::int64_t n = planes * h * w;
  TESSERA_GRID_STRIDE(i, n) {
    const std::int64_t j = i % w, r = (i / w) % h, p = i / (w * h);
    out[i] = xp[(p * hp + r + top) * wp + j + left];
  }
}

inline device_array<float> pad_nchw(const device_array<float>& x, const pad2d& p, float value) {
  const auto& s = x.shape();
  const std::int64_t oh = std::int64_t(s[2]) + p.top + p.bottom, ow = std::int64_t(s[3]) + p.left + p.right;
  device_array<float> out({s[0], s[1], std::size_t(oh), std::size_t(ow)});
  const std::int64_t n = std::int64_t(out.size());
  if (n == 0) return out;
  pad_nchw_kernel<<<tessera::cuda::grid_for(n), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(
      out.data(), x.data(), std::int64_t(s[0] * s[1]), std::int64_t(s[2]), std::int64_t(s[3]), p.top, p.left, oh,
      ow, value);
  tessera::cuda::check_launch("pad_nchw");
  return out;
}

inline device_array<float> crop_nchw(const device_array<float>& xp, std::span<const std::size_t> shape,
                                     const pad2d& p) {
  device_array<float> out(std::vector<std::size_t>(shape.begin(), shape.end()));
  const std::int64_t n = std::int64_t(out.size());
  if (n == 0) return out;
  crop_nchw_kernel<<<tessera::cuda::grid_for(n), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(
      out.data(), xp.data(), std::int64_t(shape[0] * shape[1]), std::int64_t(shape[2]), std::int64_t(shape[3]),
      p.top, p.left, std::int64_t(xp.shape()[2]), std::int64_t(xp.shape()[3]));
  tessera::cuda::check_launch("crop_nchw");
  return out;
}

}  // namespace detail

}  // namespace tessera::kernels::cuda
