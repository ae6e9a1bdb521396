// Fused optimizer updates on device arrays: one pass over a parameter shard, its
// gradient and its state, the GPU twins of backend<cpu_device>'s updates. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <tessera/core/error.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/launch.cuh>

namespace tessera::kernels::cuda {

namespace detail {

template <class T>
__global__ void momentum_kernel(T* p, T* a, const T* g, std::int64_t n, T lr, T mu) {
  TESSERA_GRID_STRIDE(i, n) {
    const T v = mu * a[i] + g[i];
    a[i] = v;
    p[i] -= lr * v;
  }
}

}  // namespace detail

/// accum = momentum * accum + grad; param -= lr * accum (MindSpore's Momentum), in place.
template <class T>
void momentum_update(device_array<T>& param, device_array<T>& accum, const device_array<T>& grad, T lr,
                     T momentum) {
  if (accum.size() != param.size() || grad.size() != param.size())
    throw error("momentum_update: param has " + std::to_string(param.size()) + " elements, accum " +
                std::to_string(accum.size()) + ", grad " + std::to_string(grad.size()));
  const std::int64_t n = std::int64_t(param.size());
  if (n == 0) return;
  detail::momentum_kernel<<<tessera::cuda::grid_for(n), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(
      param.data(), accum.data(), grad.data(), n, lr, momentum);
  tessera::cuda::check_launch("momentum_update");
}

}  // namespace tessera::kernels::cuda
