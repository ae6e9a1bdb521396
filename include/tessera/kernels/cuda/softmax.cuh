// The pieces of a sharded softmax cross entropy on device arrays, the GPU twins of
// kernels/cpu/softmax.hpp's ce_* functions (that header explains how the op combines
// them across the class group): the row max, the three row terms (one warp per row),
// the per-row loss and the gradient. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/launch.cuh>
#include <tessera/kernels/cuda/common.cuh>
#include <tessera/kernels/cuda/reduce.cuh>

namespace tessera::kernels::cuda {

namespace detail {

__device__ inline float exp_of(float v) { return expf(v); }
__device__ inline double exp_of(double v) { return ::exp(v); }
__device__ inline float log_of(float v) { return logf(v); }
__device__ inline double log_of(double v) { return ::log(v); }

// One warp per row: s[row] = sum exp(x - m), s[rows + row] = sum t, s[2 rows + row] = sum t (m - x).
template <class T>
__global__ void ce_terms_kernel(const T* x, const T* t, const T* m, T* s, std::int64_t rows, std::int64_t cols) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t row = blockIdx.x * std::int64_t(blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
    const T mi = m[row];
    T sum = 0, mass = 0, term = 0;
    for (std::int64_t j = lane; j < cols; j += 32) {
      const T xv = x[row * cols + j], tv = t[row * cols + j];
      sum += exp_of(xv - mi);
      mass += tv;
      term += tv * (mi - xv);
    }
    for (int o = 16; o > 0; o /= 2) {
      sum += __shfl_down_sync(0xffffffffu, sum, o);
      mass += __shfl_down_sync(0xffffffffu, mass, o);
      term += __shfl_down_sync(0xffffffffu, term, o);
    }
    if (lane == 0) {
      s[row] = sum;
      s[rows + row] = mass;
      s[2 * rows + row] = term;
    }
  }
}

template <class T>
__global__ void ce_loss_kernel(const T* s, T* loss, std::int64_t rows) {
  TESSERA_GRID_STRIDE(i, rows) {
    loss[i] = s[i] > T(0) ? s[2 * rows + i] + s[rows + i] * log_of(s[i]) : T(0);
  }
}

template <class T>
__global__ void ce_grad_kernel(const T* g, const T* x, const T* t, const T* m, const T* s, T* dx, std::int64_t rows,
                               std::int64_t cols) {
  TESSERA_GRID_STRIDE(k, rows * cols) {
    const std::int64_t i = k / cols;
    const T inv = s[i] > T(0) ? T(1) / s[i] : T(0);
    dx[k] = g[i] * (exp_of(x[k] - m[i]) * inv * s[rows + i] - t[k]);
  }
}

}  // namespace detail

/// The row max of x (rows, cols): (rows,).
template <class T>
device_array<T> ce_row_max(const device_array<T>& x) {
  return reduce_max(x, std::vector<int>{1}, false);
}

/// (3, rows): per row sum exp(x - m), the label mass, and sum t (m - x).
template <class T>
device_array<T> ce_row_terms(const device_array<T>& x, const device_array<T>& t, const device_array<T>& m) {
  const std::int64_t rows = std::int64_t(x.shape()[0]), cols = std::int64_t(x.shape()[1]);
  device_array<T> s(std::vector<std::size_t>{3, std::size_t(rows)});
  if (rows == 0) return s;
  constexpr int warps_per_block = tessera::cuda::block_threads / 32;
  const std::int64_t blocks = (rows + warps_per_block - 1) / warps_per_block;
  detail::ce_terms_kernel<<<unsigned(blocks < 65535 ? blocks : 65535), tessera::cuda::block_threads, 0,
                            tessera::cuda::stream()>>>(x.data(), t.data(), m.data(), s.data(), rows, cols);
  tessera::cuda::check_launch("ce_row_terms");
  return s;
}

/// The per-row loss from the global terms.
template <class T>
device_array<T> ce_loss(const device_array<T>& s) {
  const std::int64_t rows = std::int64_t(s.shape()[1]);
  device_array<T> loss(std::vector<std::size_t>{std::size_t(rows)});
  if (rows == 0) return loss;
  detail::ce_loss_kernel<<<tessera::cuda::grid_for(rows), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(
      s.data(), loss.data(), rows);
  tessera::cuda::check_launch("ce_loss");
  return loss;
}

/// dx = dloss (softmax(x) mass - t) on this rank's columns.
template <class T>
device_array<T> ce_grad(const device_array<T>& dloss, const device_array<T>& x, const device_array<T>& t,
                        const device_array<T>& m, const device_array<T>& s) {
  const std::int64_t rows = std::int64_t(x.shape()[0]), cols = std::int64_t(x.shape()[1]);
  device_array<T> dx(x.shape());
  if (rows * cols == 0) return dx;
  detail::ce_grad_kernel<<<tessera::cuda::grid_for(rows * cols), tessera::cuda::block_threads, 0,
                           tessera::cuda::stream()>>>(dloss.data(), x.data(), t.data(), m.data(), s.data(), dx.data(),
                                                      rows, cols);
  tessera::cuda::check_launch("ce_grad");
  return dx;
}

}  // namespace tessera::kernels::cuda
