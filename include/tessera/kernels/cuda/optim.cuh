// Fused optimizer updates on device arrays: one pass over a parameter shard, its
// gradient and its state, the GPU twins of kernels/cpu/optim.hpp's (Momentum, SGD with
// or without momentum, Adam and AdamW), with the same per-element arithmetic; the
// step's scalars (Adam's bias corrections) are computed on the host as there. Each
// also runs over many parameters in a few launches (*_update_many: an optimizer's step
// over a network). nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>
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

// The optimizers' element updates, as functors over the elements' references for
// multi_map (kernels/cuda/common.cuh), which runs one over an array or over many.
template <class T>
struct momentum_f {
  T lr, mu, wd;
  bool nesterov;
  __device__ void operator()(T& p, T& a, const T& g) const { momentum_step(p, a, g, lr, mu, wd, nesterov); }
};

template <class T>
struct sgd_f {
  T lr, wd;
  bool decay;
  __device__ void operator()(T& p, const T& g) const {
    if (decay) p -= lr * (g + wd * p);
    else p -= lr * g;
  }
};

template <class T>
struct sgd_momentum_f {
  T lr, mu, keep, take, wd;
  bool nesterov;
  __device__ void operator()(T& p, const T& g, T& buf) const {
    const T d = g + wd * p;
    const T b = keep * buf + take * d;
    buf = b;
    p -= lr * (nesterov ? d + mu * b : b);
  }
};

template <class T>
struct adam_f {
  T beta1, beta2, eps, step, inv_bc2, shrink, l2;
  __device__ void operator()(T& p, const T& g, T& m, T& v) const {
    const T x = p * shrink;
    const T d = g + l2 * x;
    const T mi = beta1 * m + (T(1) - beta1) * d;
    const T vi = beta2 * v + (T(1) - beta2) * d * d;
    m = mi;
    v = vi;
    p = x - step * mi / (sqrt_of(vi) * inv_bc2 + eps);
  }
};

template <class T>
void require_size(const char* fn, const char* name, const device_array<T>& a, std::size_t want) {
  if (a.size() != want)
    throw error(std::string(fn) + ": " + name + " has " + std::to_string(a.size()) + " elements, the parameter " +
                std::to_string(want));
}

/// The operands of an update over many parameters: group j holds the j-th entry of
/// each list, every array of parameter j's size ("momentum_update: the gradient of
/// parameter 3 has 10 elements, the parameter 12").
template <class T, int K>
struct update_groups {
  std::vector<std::array<T*, K>> arrays;
  std::vector<std::int64_t> sizes;
};

template <class T, int K>
update_groups<T, K> group_arrays(const char* fn, std::span<device_array<T>* const> params,
                                 const std::array<std::pair<const char*, std::span<const device_array<T>* const>>,
                                                  std::size_t(K - 1)>& others) {
  update_groups<T, K> out;
  for (const auto& [name, list] : others) check_update_lists(fn, params.size(), {{name, list.size()}});
  out.arrays.reserve(params.size());
  out.sizes.reserve(params.size());
  for (std::size_t j = 0; j < params.size(); ++j) {
    std::array<T*, K> a{};
    a[0] = params[j]->data();
    for (std::size_t k = 0; k + 1 < std::size_t(K); ++k) {
      const device_array<T>& o = *others[k].second[j];
      if (o.size() != params[j]->size())
        throw error(std::string(fn) + ": the " + others[k].first + " of parameter " + std::to_string(j) + " has " +
                    std::to_string(o.size()) + " elements, the parameter " + std::to_string(params[j]->size()));
      a[k + 1] = const_cast<T*>(o.data());  // read-only operands: the update's functor takes them by const&
    }
    out.arrays.push_back(a);
    out.sizes.push_back(std::int64_t(params[j]->size()));
  }
  return out;
}

template <class T, int K, class F>
void update_all(const char* fn, const update_groups<T, K>& g, F f) {
  multi_map<T, K>(fn, std::span<const std::array<T*, K>>(g.arrays), std::span<const std::int64_t>(g.sizes), f);
}

template <class T>
std::span<const device_array<T>* const> read_only(std::span<device_array<T>* const> s) {
  return {const_cast<const device_array<T>* const*>(s.data()), s.size()};
}

}  // namespace detail

/// Momentum over many parameters at once: params[j] with accums[j] and grads[j], as
/// momentum_update does each, in a few kernel launches (detail::multi_map) rather than
/// one or two per parameter: a network's step on a GPU launches few kernels for its
/// update. Throws, naming the parameter, for arrays of unequal sizes.
template <class T>
void momentum_update_many(std::span<device_array<T>* const> params, std::span<device_array<T>* const> accums,
                          std::span<const device_array<T>* const> grads, T lr, T momentum, T weight_decay = T(0),
                          bool nesterov = false) {
  constexpr const char* fn = "momentum_update";
  const auto g = detail::group_arrays<T, 3>(fn, params, {{{"accumulator", detail::read_only(accums)}, {"gradient", grads}}});
  detail::update_all(fn, g, detail::momentum_f<T>{lr, momentum, weight_decay, nesterov});
}

/// Plain SGD over many parameters (sgd_update's, in a few launches).
template <class T>
void sgd_update_many(std::span<device_array<T>* const> params, std::span<const device_array<T>* const> grads, T lr,
                     T weight_decay = T(0)) {
  constexpr const char* fn = "sgd_update";
  const auto g = detail::group_arrays<T, 2>(fn, params, {{{"gradient", grads}}});
  detail::update_all(fn, g, detail::sgd_f<T>{lr, weight_decay, weight_decay != T(0)});
}

/// SGD with momentum over many parameters (sgd_momentum_update's, in a few launches).
template <class T>
void sgd_momentum_update_many(std::span<device_array<T>* const> params, std::span<const device_array<T>* const> grads,
                              std::span<device_array<T>* const> bufs, T lr, T momentum, T dampening, T weight_decay,
                              bool nesterov, bool first_step) {
  constexpr const char* fn = "sgd_momentum_update";
  const auto g =
      detail::group_arrays<T, 3>(fn, params, {{{"gradient", grads}, {"momentum buffer", detail::read_only(bufs)}}});
  const auto [keep, take] = sgd_momentum_step_for(momentum, dampening, first_step);
  detail::update_all(fn, g, detail::sgd_momentum_f<T>{lr, momentum, keep, take, weight_decay, nesterov});
}

/// Adam or AdamW at step t >= 1 over many parameters (adam_update's, in a few launches).
template <class T>
void adam_update_many(std::span<device_array<T>* const> params, std::span<const device_array<T>* const> grads,
                      std::span<device_array<T>* const> ms, std::span<device_array<T>* const> vs, T lr, T beta1,
                      T beta2, T eps, T weight_decay, bool decoupled, std::int64_t t) {
  constexpr const char* fn = "adam_update";
  const auto [step, inv_bc2, shrink, l2] = adam_step_for(lr, beta1, beta2, weight_decay, decoupled, t);
  const auto g = detail::group_arrays<T, 4>(
      fn, params,
      {{{"gradient", grads}, {"first moment", detail::read_only(ms)}, {"second moment", detail::read_only(vs)}}});
  detail::update_all(fn, g, detail::adam_f<T>{beta1, beta2, eps, step, inv_bc2, shrink, l2});
}

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
  device_array<T>* p = &param;
  const device_array<T>* g = &grad;
  sgd_update_many<T>({&p, 1}, {&g, 1}, lr, weight_decay);
}

/// SGD with momentum, in place (kernels/cpu/optim.hpp's sgd_momentum_update):
///   d = g + weight_decay * p;  buf = first_step ? d : momentum * buf + (1 - dampening) * d
///   p -= lr * (nesterov ? d + momentum * buf : buf)
template <class T>
void sgd_momentum_update(device_array<T>& param, const device_array<T>& grad, device_array<T>& buf, T lr, T momentum,
                         T dampening, T weight_decay, bool nesterov, bool first_step) {
  detail::require_size("sgd_momentum_update", "the gradient", grad, param.size());
  detail::require_size("sgd_momentum_update", "the momentum buffer", buf, param.size());
  device_array<T>* p = &param;
  device_array<T>* b = &buf;
  const device_array<T>* g = &grad;
  sgd_momentum_update_many<T>({&p, 1}, {&g, 1}, {&b, 1}, lr, momentum, dampening, weight_decay, nesterov, first_step);
}

/// Adam, or AdamW with `decoupled`, at step t >= 1, in place (kernels/cpu/optim.hpp's
/// adam_update; the bias corrections computed on the host in double, as there).
template <class T>
void adam_update(device_array<T>& param, const device_array<T>& grad, device_array<T>& m, device_array<T>& v, T lr,
                 T beta1, T beta2, T eps, T weight_decay, bool decoupled, std::int64_t t) {
  detail::require_size("adam_update", "the gradient", grad, param.size());
  detail::require_size("adam_update", "the first moment", m, param.size());
  detail::require_size("adam_update", "the second moment", v, param.size());
  device_array<T>* p = &param;
  device_array<T>* mp = &m;
  device_array<T>* vp = &v;
  const device_array<T>* g = &grad;
  adam_update_many<T>({&p, 1}, {&g, 1}, {&mp, 1}, {&vp, 1}, lr, beta1, beta2, eps, weight_decay, decoupled, t);
}

}  // namespace tessera::kernels::cuda
