// The scalars of one optimizer step, computed on the host once per step and shared by
// every device's update kernel (kernels/cpu/optim.hpp, kernels/cuda/optim.cuh), so the
// host and the GPU apply the same coefficients, and the check of an update over many
// parameters. Standard library only.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <tessera/core/error.hpp>

namespace tessera::kernels {

/// SGD with momentum: buf = keep * buf + take * d, i.e. buf = d on the first step and
/// momentum * buf + (1 - dampening) * d after it.
template <class T>
struct sgd_momentum_step {
  T keep, take;
};

template <class T>
constexpr sgd_momentum_step<T> sgd_momentum_step_for(T momentum, T dampening, bool first_step) {
  return first_step ? sgd_momentum_step<T>{T(0), T(1)} : sgd_momentum_step<T>{momentum, T(1) - dampening};
}

/// Adam (AdamW with `decoupled`) at step t: x = p * shrink; d = g + l2 * x;
/// p = x - step * m / (sqrt(v) * inv_bc2 + eps), with the bias corrections 1 - beta1^t
/// and sqrt(1 - beta2^t) computed in double.
template <class T>
struct adam_step {
  T step, inv_bc2, shrink, l2;
};

/// Throws tessera::error when t < 1 ("adam_update: the step t counts from 1, got 0").
template <class T>
adam_step<T> adam_step_for(T lr, T beta1, T beta2, T weight_decay, bool decoupled, std::int64_t t) {
  if (t < 1) throw error("adam_update: the step t counts from 1, got " + std::to_string(t));
  const T bc1 = T(1) - T(std::pow(double(beta1), double(t)));
  const T bc2_sqrt = T(std::sqrt(1.0 - std::pow(double(beta2), double(t))));
  return {lr / bc1, T(1) / bc2_sqrt, decoupled ? T(1) - lr * weight_decay : T(1), decoupled ? T(0) : weight_decay};
}

/// The check of an update over many parameters (the backends' *_update_many): one array
/// of each operand per parameter.
/// "momentum_update: 3 gradient arrays for 4 parameters".
inline void check_update_lists(const char* fn, std::size_t params,
                               std::initializer_list<std::pair<const char*, std::size_t>> operands) {
  for (const auto& [name, n] : operands)
    if (n != params)
      throw error(std::string(fn) + ": " + std::to_string(n) + " " + name + " arrays for " + std::to_string(params) +
                  " parameters");
}

}  // namespace tessera::kernels
