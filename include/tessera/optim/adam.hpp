// Adam and AdamW over sharded parameters, with PyTorch's update (torch.optim.Adam and
// torch.optim.AdamW, bias-corrected). The update is kernels::cpu::adam_update.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/kernels/cpu/optim.hpp>
#include <tessera/optim/optimizer.hpp>

namespace tessera::optim {

/// Adam (MindSpore's nn.Adam, PyTorch's torch.optim.Adam) at step t = 1, 2, ...:
///   d = g + weight_decay * p            (L2 decay, added to the gradient)
///   m = beta1 m + (1 - beta1) d;  v = beta2 v + (1 - beta2) d^2
///   p -= lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)
template <class T>
class adam : public optimizer<T> {
 public:
  adam(std::vector<nn::parameter<T>*> params, learning_rate<T> lr = T(1e-3), T beta1 = T(0.9), T beta2 = T(0.999),
       T eps = T(1e-8), T weight_decay = T(0))
      : adam("adam", std::move(params), std::move(lr), beta1, beta2, eps, weight_decay, false) {}

 protected:
  adam(std::string name, std::vector<nn::parameter<T>*> params, learning_rate<T> lr, T beta1, T beta2, T eps,
       T weight_decay, bool decoupled)
      : optimizer<T>(name, std::move(params), std::move(lr), weight_decay),
        beta1_(beta1),
        beta2_(beta2),
        eps_(eps),
        decoupled_(decoupled) {
    if (!(beta1 >= T(0) && beta1 < T(1)) || !(beta2 >= T(0) && beta2 < T(1)))
      throw error(name + ": beta1 and beta2 must be in [0, 1), got " + std::to_string(beta1) + " and " +
                  std::to_string(beta2));
    if (!(eps > T(0))) throw error(name + ": eps must be positive, got " + std::to_string(eps));
  }

  void update(std::size_t i, std::span<T> p, std::span<const T> g, T lr) override {
    this->ensure_state(m_);
    this->ensure_state(v_);
    kernels::cpu::adam_update(p, g, std::span<T>(m_[i]), std::span<T>(v_[i]), lr, beta1_, beta2_, eps_,
                              this->weight_decay_, decoupled_, this->step_ + 1);
  }

 private:
  T beta1_, beta2_, eps_;
  bool decoupled_;
  std::vector<std::vector<T>> m_, v_;
};

/// AdamW (PyTorch's torch.optim.AdamW): Adam with decoupled weight decay, applied to
/// the parameter before the update, p *= 1 - lr * weight_decay, and not to the
/// gradient. (MindSpore's AdamWeightDecay decays alike but skips Adam's bias
/// correction.)
template <class T>
class adamw : public adam<T> {
 public:
  adamw(std::vector<nn::parameter<T>*> params, learning_rate<T> lr = T(1e-3), T beta1 = T(0.9), T beta2 = T(0.999),
        T eps = T(1e-8), T weight_decay = T(1e-2))
      : adam<T>("adamw", std::move(params), std::move(lr), beta1, beta2, eps, weight_decay, true) {}
};

}  // namespace tessera::optim
