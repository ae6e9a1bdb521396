// 2-D max, average and global average pooling on NCHW float device arrays, the GPU
// twin of kernels/cpu/pool.hpp: the same windows (padding per side, ceil_mode,
// count_include_pad with PyTorch's divisors), shapes and error texts. Direct kernels,
// one thread per output: cuDNN's pooling descriptors pad both sides alike and have no
// ceil_mode. Max pooling keeps the index of each window's first maximum (row-major
// window order, as oneDNN and PyTorch) in the workspace; the backward kernels add into
// dx atomically where windows overlap. nvcc only.
#pragma once

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
#include <tessera/kernels/cuda/cudnn.cuh>

namespace tessera::kernels::cuda {

namespace detail {

/// The window of output (i, j): input rows [h0, h1) and columns [w0, w1) clipped to the
/// image, and the average's divisor (PyTorch's: the window clipped to the explicit
/// padding when count_include_pad, else to the image).
struct pool_window {
  std::int64_t h0, h1, w0, w1;
  float divisor;
};

struct pool_geometry {
  std::int64_t planes = 0, h = 0, w = 0, oh = 0, ow = 0;
  std::int64_t kh = 1, kw = 1, sh = 1, sw = 1, top = 0, bottom = 0, left = 0, right = 0;
  bool include_pad = true;

  __host__ __device__ pool_window window(std::int64_t i, std::int64_t j) const {
    const std::int64_t hs = i * sh - top, ws = j * sw - left;
    const std::int64_t he = hs + kh < h + bottom ? hs + kh : h + bottom;
    const std::int64_t we = ws + kw < w + right ? ws + kw : w + right;
    pool_window win;
    win.h0 = hs > 0 ? hs : 0;
    win.w0 = ws > 0 ? ws : 0;
    win.h1 = he < h ? he : h;
    win.w1 = we < w ? we : w;
    win.divisor = include_pad ? float((he - hs) * (we - ws)) : float((win.h1 - win.h0) * (win.w1 - win.w0));
    return win;
  }
};

inline pool_geometry pool_geom(const char* fn, std::span<const std::size_t> x, const pool2d_params& p,
                               std::array<std::size_t, 4>& y) {
  y = pool2d_output_shape(fn, x, p);
  pool_geometry g;
  g.planes = std::int64_t(x[0] * x[1]);
  g.h = std::int64_t(x[2]);
  g.w = std::int64_t(x[3]);
  g.oh = std::int64_t(y[2]);
  g.ow = std::int64_t(y[3]);
  g.kh = p.kernel_h;
  g.kw = p.kernel_w;
  g.sh = p.stride_h;
  g.sw = p.stride_w;
  g.top = p.pad.top;
  g.bottom = p.pad.bottom;
  g.left = p.pad.left;
  g.right = p.pad.right;
  g.include_pad = p.count_include_pad;
  return g;
}

template <class T>
__global__ void max_pool_kernel(const T* x, T* y, std::int32_t* index, pool_geometry g) {
  const std::int64_t n = g.planes * g.oh * g.ow;
  TESSERA_GRID_STRIDE(o, n) {
    const std::int64_t j = o % g.ow, i = (o / g.ow) % g.oh, p = o / (g.ow * g.oh);
    const pool_window win = g.window(i, j);
    const T* plane = x + p * g.h * g.w;
    T best = T(0);
    std::int64_t at = -1;
    for (std::int64_t r = win.h0; r < win.h1; ++r)
      for (std::int64_t c = win.w0; c < win.w1; ++c) {
        const T v = plane[r * g.w + c];
        if (at < 0 || v > best) {
          best = v;
          at = r * g.w + c;
        }
      }
    y[o] = best;
    index[o] = std::int32_t(at);
  }
}

template <class T>
__global__ void max_pool_backward_kernel(const T* dy, const std::int32_t* index, T* dx, pool_geometry g) {
  const std::int64_t n = g.planes * g.oh * g.ow;
  TESSERA_GRID_STRIDE(o, n) {
    const std::int64_t p = o / (g.ow * g.oh);
    if (index[o] >= 0) atomicAdd(dx + p * g.h * g.w + index[o], dy[o]);
  }
}

template <class T>
__global__ void avg_pool_kernel(const T* x, T* y, pool_geometry g) {
  const std::int64_t n = g.planes * g.oh * g.ow;
  TESSERA_GRID_STRIDE(o, n) {
    const std::int64_t j = o % g.ow, i = (o / g.ow) % g.oh, p = o / (g.ow * g.oh);
    const pool_window win = g.window(i, j);
    const T* plane = x + p * g.h * g.w;
    T s = T(0);
    for (std::int64_t r = win.h0; r < win.h1; ++r)
      for (std::int64_t c = win.w0; c < win.w1; ++c) s += plane[r * g.w + c];
    y[o] = s / T(win.divisor);
  }
}

template <class T>
__global__ void avg_pool_backward_kernel(const T* dy, T* dx, pool_geometry g) {
  const std::int64_t n = g.planes * g.oh * g.ow;
  TESSERA_GRID_STRIDE(o, n) {
    const std::int64_t j = o % g.ow, i = (o / g.ow) % g.oh, p = o / (g.ow * g.oh);
    const pool_window win = g.window(i, j);
    const T v = dy[o] / T(win.divisor);
    T* plane = dx + p * g.h * g.w;
    for (std::int64_t r = win.h0; r < win.h1; ++r)
      for (std::int64_t c = win.w0; c < win.w1; ++c) atomicAdd(plane + r * g.w + c, v);
  }
}

inline device_array<float> zeros_like_shape(std::span<const std::size_t> s) {
  device_array<float> a(std::vector<std::size_t>(s.begin(), s.end()));
  if (a.size())
    TESSERA_CUDA_CHECK(cudaMemsetAsync(a.data(), 0, a.size() * sizeof(float), tessera::cuda::stream()));
  return a;
}

inline device_array<float> avg_forward(const char* fn, const device_array<float>& x, const pool2d_params& p) {
  std::array<std::size_t, 4> ys{};
  const auto g = pool_geom(fn, dims(x), p, ys);
  device_array<float> y(std::vector<std::size_t>(ys.begin(), ys.end()));
  if (y.size() == 0) return y;
  avg_pool_kernel<<<tessera::cuda::grid_for(std::int64_t(y.size())), tessera::cuda::block_threads, 0,
                    tessera::cuda::stream()>>>(x.data(), y.data(), g);
  tessera::cuda::check_launch(fn);
  return y;
}

inline device_array<float> avg_backward(const char* fn, const device_array<float>& dy,
                                        std::span<const std::size_t> x_shape, const pool2d_params& p) {
  std::array<std::size_t, 4> ys{};
  const auto g = pool_geom(fn, x_shape, p, ys);
  require_dims(fn, "dy", dims(dy), ys);
  device_array<float> dx = zeros_like_shape(x_shape);
  if (dy.size() == 0) return dx;
  avg_pool_backward_kernel<<<tessera::cuda::grid_for(std::int64_t(dy.size())), tessera::cuda::block_threads, 0,
                             tessera::cuda::stream()>>>(dy.data(), dx.data(), g);
  tessera::cuda::check_launch(fn);
  return dx;
}

inline pool2d_params global_window(const char* fn, std::span<const std::size_t> x) {
  tessera::detail::require_nchw(fn, "x", x);
  return pool2d_params{index_t(x[2]), index_t(x[3]), 1, 1};
}

}  // namespace detail

/// Max pooling: y and the index of each window's maximum within its plane (the
/// workspace). As kernels/cpu/pool.hpp's.
inline max_pool2d_result<device_array<float>, device_workspace> max_pool2d_forward(const device_array<float>& x,
                                                                                   const pool2d_params& p) {
  constexpr const char* fn = "max_pool2d_forward";
  std::array<std::size_t, 4> ys{};
  const auto g = detail::pool_geom(fn, detail::dims(x), p, ys);
  max_pool2d_result<device_array<float>, device_workspace> out;
  out.y = device_array<float>(std::vector<std::size_t>(ys.begin(), ys.end()));
  out.workspace.indices = device_array<std::int32_t>(std::vector<std::size_t>(ys.begin(), ys.end()));
  if (out.y.size() == 0) return out;
  detail::max_pool_kernel<<<tessera::cuda::grid_for(std::int64_t(out.y.size())), tessera::cuda::block_threads, 0,
                            tessera::cuda::stream()>>>(x.data(), out.y.data(), out.workspace.indices.data(), g);
  tessera::cuda::check_launch(fn);
  return out;
}

/// dx: dy added at each window's maximum. x and y are the forward's (only x's shape is
/// read); the workspace holds the maxima's positions.
inline device_array<float> max_pool2d_backward(const device_array<float>& dy, const device_array<float>& x,
                                               const device_array<float>& y, const device_workspace& workspace,
                                               const pool2d_params& p) {
  (void)y;
  constexpr const char* fn = "max_pool2d_backward";
  if (workspace.indices.size() == 0 && dy.size() != 0)
    throw error(std::string(fn) + ": the workspace is empty (max_pool2d_forward's)");
  std::array<std::size_t, 4> ys{};
  const auto g = detail::pool_geom(fn, detail::dims(x), p, ys);
  detail::require_dims(fn, "dy", detail::dims(dy), ys);
  device_array<float> dx = detail::zeros_like_shape(detail::dims(x));
  if (dy.size() == 0) return dx;
  detail::max_pool_backward_kernel<<<tessera::cuda::grid_for(std::int64_t(dy.size())), tessera::cuda::block_threads,
                                     0, tessera::cuda::stream()>>>(dy.data(), workspace.indices.data(), dx.data(), g);
  tessera::cuda::check_launch(fn);
  return dx;
}

/// Average pooling (PyTorch's divisors).
inline device_array<float> avg_pool2d_forward(const device_array<float>& x, const pool2d_params& p) {
  return detail::avg_forward("avg_pool2d_forward", x, p);
}

/// dx of shape x_shape: each dy spread over its window by the forward's divisor.
inline device_array<float> avg_pool2d_backward(const device_array<float>& dy, std::span<const std::size_t> x_shape,
                                               const pool2d_params& p) {
  return detail::avg_backward("avg_pool2d_backward", dy, x_shape, p);
}
inline device_array<float> avg_pool2d_backward(const device_array<float>& dy, const std::vector<std::size_t>& x_shape,
                                               const pool2d_params& p) {
  return avg_pool2d_backward(dy, std::span<const std::size_t>(x_shape), p);
}

/// y (N, C, 1, 1) = the mean of x over (H, W).
inline device_array<float> global_avg_pool2d_forward(const device_array<float>& x) {
  constexpr const char* fn = "global_avg_pool2d_forward";
  return detail::avg_forward(fn, x, detail::global_window(fn, detail::dims(x)));
}

/// dx (x_shape) = dy / (H * W) at every position.
inline device_array<float> global_avg_pool2d_backward(const device_array<float>& dy,
                                                      std::span<const std::size_t> x_shape) {
  constexpr const char* fn = "global_avg_pool2d_backward";
  return detail::avg_backward(fn, dy, x_shape, detail::global_window(fn, x_shape));
}
inline device_array<float> global_avg_pool2d_backward(const device_array<float>& dy,
                                                      const std::vector<std::size_t>& x_shape) {
  return global_avg_pool2d_backward(dy, std::span<const std::size_t>(x_shape));
}

}  // namespace tessera::kernels::cuda
