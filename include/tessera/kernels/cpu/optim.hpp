// The optimizers' updates as fused per-element kernels: one pass over a parameter's
// shard, its gradient and its state (spans of equal length), no temporaries, in pieces
// on OpenMP's threads where the program has them (kernels/cpu/parallel.hpp). Each
// states its formula; the CUDA kernels mirror these signatures.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tessera/core/error.hpp>
#include <tessera/kernels/cpu/parallel.hpp>
#include <tessera/kernels/optim_step.hpp>

namespace tessera::kernels::cpu {

namespace detail {
[[noreturn, gnu::cold]] inline void optim_size_fail(const char* fn, const char* name, std::size_t n,
                                                    std::size_t want) {
  throw error(std::string(fn) + ": " + name + " has " + std::to_string(n) + " elements, the parameter " +
              std::to_string(want));
}
template <class S>
inline void optim_check(const char* fn, const char* name, const S& s, std::size_t want) {
  if (s.size() != want) [[unlikely]]
    optim_size_fail(fn, name, s.size(), want);
}
}  // namespace detail

/// Plain gradient descent with L2 weight decay:
///   p -= lr * (g + weight_decay * p)
template <class T>
void sgd_update(std::span<T> p, std::span<const T> g, T lr, T weight_decay = T(0)) {
  detail::optim_check("sgd_update", "the gradient", g, p.size());
  const std::size_t n = p.size();
  T* __restrict pp = p.data();
  const T* __restrict pg = g.data();
  detail::parallel_ranges(n, detail::parallel_grain, [&](std::size_t i0, std::size_t i1) {
    if (weight_decay == T(0))
      for (std::size_t i = i0; i < i1; ++i) pp[i] -= lr * pg[i];
    else
      for (std::size_t i = i0; i < i1; ++i) pp[i] -= lr * (pg[i] + weight_decay * pp[i]);
  });
}

/// SGD with momentum, PyTorch's torch.optim.SGD (and MindSpore's nn.SGD):
///   d = g + weight_decay * p
///   buf = first_step ? d : momentum * buf + (1 - dampening) * d
///   p -= lr * (nesterov ? d + momentum * buf : buf)
template <class T>
void sgd_momentum_update(std::span<T> p, std::span<const T> g, std::span<T> buf, T lr, T momentum,
                         T dampening, T weight_decay, bool nesterov, bool first_step) {
  detail::optim_check("sgd_momentum_update", "the gradient", g, p.size());
  detail::optim_check("sgd_momentum_update", "the momentum buffer", buf, p.size());
  const std::size_t n = p.size();
  T* __restrict pp = p.data();
  const T* __restrict pg = g.data();
  T* __restrict pb = buf.data();
  const auto [keep, take] = sgd_momentum_step_for(momentum, dampening, first_step);
  detail::parallel_ranges(n, detail::parallel_grain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      const T d = pg[i] + weight_decay * pp[i];
      const T b = keep * pb[i] + take * d;
      pb[i] = b;
      pp[i] -= lr * (nesterov ? d + momentum * b : b);
    }
  });
}

/// MindSpore's nn.Momentum (ApplyMomentum):
///   d = g + weight_decay * p
///   accum = momentum * accum + d
///   p -= lr * (nesterov ? d + momentum * accum : accum)
/// (accum starts at zero, so the first step moves by lr * d, as PyTorch's SGD does.)
template <class T>
void momentum_update(std::span<T> p, std::span<const T> g, std::span<T> accum, T lr, T momentum,
                     T weight_decay = T(0), bool nesterov = false) {
  detail::optim_check("momentum_update", "the gradient", g, p.size());
  detail::optim_check("momentum_update", "the accumulator", accum, p.size());
  const std::size_t n = p.size();
  T* __restrict pp = p.data();
  const T* __restrict pg = g.data();
  T* __restrict pa = accum.data();
  detail::parallel_ranges(n, detail::parallel_grain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      const T d = pg[i] + weight_decay * pp[i];
      const T a = momentum * pa[i] + d;
      pa[i] = a;
      pp[i] -= lr * (nesterov ? d + momentum * a : a);
    }
  });
}

/// Adam (PyTorch's torch.optim.Adam) and, with `decoupled`, AdamW (torch.optim.AdamW),
/// at step t = 1, 2, ...:
///   Adam:  d = g + weight_decay * p          AdamW: p *= 1 - lr * weight_decay; d = g
///   m = beta1 * m + (1 - beta1) * d
///   v = beta2 * v + (1 - beta2) * d^2
///   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
template <class T>
void adam_update(std::span<T> p, std::span<const T> g, std::span<T> m, std::span<T> v, T lr, T beta1, T beta2,
                 T eps, T weight_decay, bool decoupled, std::int64_t t) {
  detail::optim_check("adam_update", "the gradient", g, p.size());
  detail::optim_check("adam_update", "the first moment", m, p.size());
  detail::optim_check("adam_update", "the second moment", v, p.size());
  const auto [step, inv_bc2, shrink, l2] = adam_step_for(lr, beta1, beta2, weight_decay, decoupled, t);
  const std::size_t n = p.size();
  T* __restrict pp = p.data();
  const T* __restrict pg = g.data();
  T* __restrict pm = m.data();
  T* __restrict pv = v.data();
  detail::parallel_ranges(n, detail::parallel_grain, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      const T x = pp[i] * shrink;
      const T d = pg[i] + l2 * x;
      const T mi = beta1 * pm[i] + (T(1) - beta1) * d;
      const T vi = beta2 * pv[i] + (T(1) - beta2) * d * d;
      pm[i] = mi;
      pv[i] = vi;
      pp[i] = x - step * mi / (std::sqrt(vi) * inv_bc2 + eps);
    }
  });
}

/// x *= a.
template <class T>
void scale(std::span<T> x, T a) {
  for (T& v : x) v *= a;
}

}  // namespace tessera::kernels::cpu
