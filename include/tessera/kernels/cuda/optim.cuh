// Fused optimizer updates on device arrays: one pass over a parameter shard, its
// gradient and its state, the GPU twins of kernels/cpu/optim.hpp's (Momentum, SGD with
// or without momentum, Adam and AdamW), with the same per-element arithmetic; the
// step's scalars (Adam's bias corrections) are computed on the host as there. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tessera/core/error.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/launch.cuh>
#include <tessera/kernels/cuda/common.cuh>
#include <tessera/kernels/optim_step.hpp>

namespace tessera::kernels::cuda {

namespace detail {

// One element of MindSpore's Momentum (kernels/cpu/optim.hpp's momentum_update).
template <class T>
__device__ __forceinline__ void momentum_step(T& p, T& a, T g, T lr, T mu, T wd, bool nesterov) {
  const T d = g + wd * p;
  const T v = mu * a + d;
  a = v;
  p -= lr * (nesterov ? d + mu * v : v);
}

template <class T>
__global__ void momentum_kernel(T* p, T* a, const T* g, std::int64_t n, T lr, T mu, T wd, bool nesterov) {
  TESSERA_GRID_STRIDE(i, n) momentum_step(p[i], a[i], g[i], lr, mu, wd, nesterov);
}

// The same over 16-byte vectors (n counts vectors): five streams of one element size,
// one load or store instruction each.
template <class T>
__global__ void momentum_vec_kernel(vec16<T>* p, vec16<T>* a, const vec16<T>* g, std::int64_t n, T lr, T mu, T wd,
                                    bool nesterov) {
  TESSERA_GRID_STRIDE(i, n) {
    vec16<T> pv = p[i], av = a[i];
    const vec16<T> gv = g[i];
#pragma unroll
    for (int k = 0; k < vec16<T>::n; ++k) momentum_step(pv.v[k], av.v[k], gv.v[k], lr, mu, wd, nesterov);
    p[i] = pv;
    a[i] = av;
  }
}

__device__ inline float sqrt_of(float v) { return sqrtf(v); }
__device__ inline double sqrt_of(double v) { return ::sqrt(v); }

template <class T>
__global__ void sgd_kernel(T* p, const T* g, std::int64_t n, T lr, T wd, bool decay) {
  TESSERA_GRID_STRIDE(i, n) {
    if (decay) p[i] -= lr * (g[i] + wd * p[i]);
    else p[i] -= lr * g[i];
  }
}

template <class T>
__global__ void sgd_momentum_kernel(T* p, const T* g, T* buf, std::int64_t n, T lr, T mu, T keep, T take, T wd,
                                    bool nesterov) {
  TESSERA_GRID_STRIDE(i, n) {
    const T d = g[i] + wd * p[i];
    const T b = keep * buf[i] + take * d;
    buf[i] = b;
    p[i] -= lr * (nesterov ? d + mu * b : b);
  }
}

template <class T>
__global__ void adam_kernel(T* p, const T* g, T* m, T* v, std::int64_t n, T beta1, T beta2, T eps, T step, T inv_bc2,
                            T shrink, T l2) {
  TESSERA_GRID_STRIDE(i, n) {
    const T x = p[i] * shrink;
    const T d = g[i] + l2 * x;
    const T mi = beta1 * m[i] + (T(1) - beta1) * d;
    const T vi = beta2 * v[i] + (T(1) - beta2) * d * d;
    m[i] = mi;
    v[i] = vi;
    p[i] = x - step * mi / (sqrt_of(vi) * inv_bc2 + eps);
  }
}

template <class T>
void require_size(const char* fn, const char* name, const device_array<T>& a, std::size_t want) {
  if (a.size() != want)
    throw error(std::string(fn) + ": " + name + " has " + std::to_string(a.size()) + " elements, the parameter " +
                std::to_string(want));
}

}  // namespace detail

/// MindSpore's Momentum in place (kernels/cpu/optim.hpp's momentum_update):
///   d = g + weight_decay * p;  accum = momentum * accum + d
///   p -= lr * (nesterov ? d + momentum * accum : accum)
/// 16-byte vector loads for the bulk when the three arrays are aligned.
template <class T>
void momentum_update(device_array<T>& param, device_array<T>& accum, const device_array<T>& grad, T lr,
                     T momentum, T weight_decay = T(0), bool nesterov = false) {
  detail::require_size("momentum_update", "the gradient", grad, param.size());
  detail::require_size("momentum_update", "the accumulator", accum, param.size());
  const std::int64_t n = std::int64_t(param.size());
  if (n == 0) return;
  using vec = detail::vec16<T>;
  constexpr int V = vec::n;
  std::int64_t done = 0;
  T* p = param.data();
  T* a = accum.data();
  const T* g = grad.data();
  if (V > 1 && n >= V && detail::aligned16(p) && detail::aligned16(a) && detail::aligned16(g)) {
    const std::int64_t nv = n / V;
    detail::momentum_vec_kernel<<<tessera::cuda::grid_for(nv), tessera::cuda::block_threads, 0,
                                  tessera::cuda::stream()>>>(reinterpret_cast<vec*>(p), reinterpret_cast<vec*>(a),
                                                             reinterpret_cast<const vec*>(g), nv, lr, momentum,
                                                             weight_decay, nesterov);
    tessera::cuda::check_launch("momentum_update");
    done = nv * V;
  }
  if (done < n) {
    detail::momentum_kernel<<<tessera::cuda::grid_for(n - done), tessera::cuda::block_threads, 0,
                              tessera::cuda::stream()>>>(p + done, a + done, g + done, n - done, lr, momentum,
                                                         weight_decay, nesterov);
    tessera::cuda::check_launch("momentum_update");
  }
}

/// p -= lr * (g + weight_decay * p), in place (kernels/cpu/optim.hpp's sgd_update).
template <class T>
void sgd_update(device_array<T>& param, const device_array<T>& grad, T lr, T weight_decay = T(0)) {
  detail::require_size("sgd_update", "the gradient", grad, param.size());
  const std::int64_t n = std::int64_t(param.size());
  if (n == 0) return;
  detail::sgd_kernel<<<tessera::cuda::grid_for(n), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(
      param.data(), grad.data(), n, lr, weight_decay, weight_decay != T(0));
  tessera::cuda::check_launch("sgd_update");
}

/// SGD with momentum, in place (kernels/cpu/optim.hpp's sgd_momentum_update):
///   d = g + weight_decay * p;  buf = first_step ? d : momentum * buf + (1 - dampening) * d
///   p -= lr * (nesterov ? d + momentum * buf : buf)
template <class T>
void sgd_momentum_update(device_array<T>& param, const device_array<T>& grad, device_array<T>& buf, T lr, T momentum,
                         T dampening, T weight_decay, bool nesterov, bool first_step) {
  detail::require_size("sgd_momentum_update", "the gradient", grad, param.size());
  detail::require_size("sgd_momentum_update", "the momentum buffer", buf, param.size());
  const std::int64_t n = std::int64_t(param.size());
  if (n == 0) return;
  const auto [keep, take] = sgd_momentum_step_for(momentum, dampening, first_step);
  detail::sgd_momentum_kernel<<<tessera::cuda::grid_for(n), tessera::cuda::block_threads, 0,
                                tessera::cuda::stream()>>>(param.data(), grad.data(), buf.data(), n, lr, momentum,
                                                           keep, take, weight_decay, nesterov);
  tessera::cuda::check_launch("sgd_momentum_update");
}

/// Adam, or AdamW with `decoupled`, at step t >= 1, in place (kernels/cpu/optim.hpp's
/// adam_update; the bias corrections computed on the host in double, as there).
template <class T>
void adam_update(device_array<T>& param, const device_array<T>& grad, device_array<T>& m, device_array<T>& v, T lr,
                 T beta1, T beta2, T eps, T weight_decay, bool decoupled, std::int64_t t) {
  detail::require_size("adam_update", "the gradient", grad, param.size());
  detail::require_size("adam_update", "the first moment", m, param.size());
  detail::require_size("adam_update", "the second moment", v, param.size());
  const auto [step, inv_bc2, shrink, l2] = adam_step_for(lr, beta1, beta2, weight_decay, decoupled, t);
  const std::int64_t n = std::int64_t(param.size());
  if (n == 0) return;
  detail::adam_kernel<<<tessera::cuda::grid_for(n), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(
      param.data(), grad.data(), m.data(), v.data(), n, beta1, beta2, eps, step, inv_bc2, shrink, l2);
  tessera::cuda::check_launch("adam_update");
}

}  // namespace tessera::kernels::cuda
