// What every tessera kernel shares: launch geometry (grid-stride loops over 256-thread
// blocks) and the strided index map that turns a linear index over a box into element
// offsets in up to K operands (the device twin of kernels/cpu/common.hpp's
// strided_loop). nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <tessera/core/config.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/cuda/runtime.hpp>

namespace tessera::cuda {

/// Threads per block of the element-wise and copy kernels.
inline constexpr int block_threads = 256;

/// Blocks for a grid-stride loop over n items: enough to fill the device several times
/// over, never more than the items need.
inline unsigned grid_for(std::int64_t n) {
  static const int sms = [] {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, current_device()) != cudaSuccess) v = 80;
    return v;
  }();
  const std::int64_t want = (n + block_threads - 1) / block_threads;
  const std::int64_t cap = std::int64_t(sms) * 32;
  return unsigned(want < 1 ? 1 : (want < cap ? want : cap));
}

/// Offsets of K operands along a row-major box: element `lin` of the box has
/// coordinates idx (row-major over `shape`), and operand k's element is
/// base[k] + sum_d idx[d] * stride[k][d]. Strides may be 0 (broadcast).
template <int K>
struct strided_map {
  int ndim = 0;
  std::int64_t shape[max_tensor_ndim] = {};
  std::int64_t stride[K][max_tensor_ndim] = {};
  std::int64_t base[K] = {};

  __device__ void offsets(std::int64_t lin, std::int64_t (&off)[K]) const {
    for (int k = 0; k < K; ++k) off[k] = base[k];
    for (int d = ndim - 1; d >= 0; --d) {
      const std::int64_t i = lin % shape[d];
      lin /= shape[d];
      for (int k = 0; k < K; ++k) off[k] += i * stride[k][d];
    }
  }
};

/// Row-major element strides of a shape.
inline std::array<std::int64_t, max_tensor_ndim> row_major(const extents& s) {
  std::array<std::int64_t, max_tensor_ndim> st{};
  std::int64_t acc = 1;
  for (int d = s.ndim - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= s.v[d];
  }
  return st;
}

}  // namespace tessera::cuda
