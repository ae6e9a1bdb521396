// SGD over sharded parameters, MindSpore's nn.SGD and PyTorch's torch.optim.SGD:
// plain gradient descent, or with momentum (optionally Nesterov), dampening and L2
// weight decay. The update is kernels::cpu::sgd_update / sgd_momentum_update.
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

/// MindSpore's nn.SGD(params, learning_rate, momentum, dampening, weight_decay,
/// nesterov):
///   d = g + weight_decay * p
///   momentum 0:  p -= lr * d
///   otherwise:   buf = momentum * buf + (1 - dampening) * d  (buf = d at the first step)
///                p -= lr * (nesterov ? d + momentum * buf : buf)
///
///     optim::sgd<float> opt(net.trainable_params(), 1e-2f);   // the seed's SGD(params, 1e-2)
///     opt(grads);
template <class T>
class sgd : public optimizer<T> {
 public:
  sgd(std::vector<nn::parameter<T>*> params, learning_rate<T> lr = T(0.1), T momentum = T(0),
      T dampening = T(0), T weight_decay = T(0), bool nesterov = false)
      : optimizer<T>("sgd", std::move(params), std::move(lr), weight_decay),
        momentum_(momentum),
        dampening_(dampening),
        nesterov_(nesterov) {
    if (momentum < T(0)) throw error("sgd: momentum must not be negative, got " + std::to_string(momentum));
    if (nesterov && (momentum <= T(0) || dampening != T(0)))
      throw error("sgd: nesterov needs a positive momentum and zero dampening, got momentum " +
                  std::to_string(momentum) + " and dampening " + std::to_string(dampening));
  }

  T momentum() const { return momentum_; }

 protected:
  void update(std::size_t i, std::span<T> p, std::span<const T> g, T lr) override {
    if (momentum_ == T(0)) return kernels::cpu::sgd_update(p, g, lr, this->weight_decay_);
    this->ensure_state(buf_);
    kernels::cpu::sgd_momentum_update(p, g, std::span<T>(buf_[i]), lr, momentum_, dampening_,
                                      this->weight_decay_, nesterov_, this->step_ == 0);
  }

 private:
  T momentum_, dampening_;
  bool nesterov_;
  std::vector<std::vector<T>> buf_;
};

}  // namespace tessera::optim
