// Adam and AdamW over sharded parameters, with PyTorch's update (torch.optim.Adam and
// torch.optim.AdamW, bias-corrected). The update is kernels::cpu::adam_update on the
// host; on a device, the backend's adam_update_many (on a GPU, a few fused kernels over
// all the shards of a step).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/kernels/cpu/optim.hpp>
#include <tessera/optim/optimizer.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::optim {

/// Adam (MindSpore's nn.Adam, PyTorch's torch.optim.Adam) at step t = 1, 2, ...:
///   d = g + weight_decay * p            (L2 decay, added to the gradient)
///   m = beta1 m + (1 - beta1) d;  v = beta2 v + (1 - beta2) d^2
///   p -= lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)
///
/// It also runs over bare tensors of device D: `adam<float, cuda_device> opt(lr);
/// opt.step(params, grads)`.
template <class T, class D = cpu_device>
class adam : public optimizer<T, D> {
 public:
  using tensor = tensor_on<T, D>;
  using array = typename tensor::array_type;

  adam(std::vector<nn::parameter<T, D>*> params, learning_rate<T> lr = T(1e-3), T beta1 = T(0.9), T beta2 = T(0.999),
       T eps = T(1e-8), T weight_decay = T(0))
      : adam("adam", std::move(params), std::move(lr), beta1, beta2, eps, weight_decay, false) {}
  /// Over bare tensors (no parameter objects): see step(params, grads).
  explicit adam(T learning_rate, T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8), T weight_decay = T(0))
      : adam(std::vector<nn::parameter<T, D>*>{}, learning_rate, beta1, beta2, eps, weight_decay) {}

  using optimizer<T, D>::step;
  /// One step over bare tensors: params[i] moves by grads[i] (same layout and shape),
  /// with the update of the parameter objects' steps.
  void step(std::vector<tensor>& params, const std::vector<tensor>& grads) {
    detail::check_tensor_step(this->name_, params, grads);
    detail::ensure_tensor_state(tensor_m_, params);
    detail::ensure_tensor_state(tensor_v_, params);
    const T lr = this->lr_(this->step_);
    const auto [p, g] = detail::tensor_arrays(params, grads);
    std::vector<array*> m, v;
    for (std::size_t i = 0; i < params.size(); ++i) {
      m.push_back(&tensor_m_[i]);
      v.push_back(&tensor_v_[i]);
    }
    kernels::backend<D>::template adam_update_many<T>(p, g, m, v, lr, beta1_, beta2_, eps_, this->weight_decay_,
                                                      decoupled_, this->step_ + 1);
    ++this->step_;
  }

 protected:
  adam(std::string name, std::vector<nn::parameter<T, D>*> params, learning_rate<T> lr, T beta1, T beta2, T eps,
       T weight_decay, bool decoupled)
      : optimizer<T, D>(name, std::move(params), std::move(lr), weight_decay),
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
    kernels::cpu::adam_update(p, g, this->span_of(m_[i]), this->span_of(v_[i]), lr, beta1_, beta2_, eps_,
                              this->weight_decay_, decoupled_, this->step_ + 1);
  }
  void update_on_device(std::span<const std::size_t> which, std::span<array* const> p,
                        std::span<const array* const> g, T lr) override {
    this->ensure_state(m_);
    this->ensure_state(v_);
    kernels::backend<D>::template adam_update_many<T>(p, g, detail::state_of(m_, which), detail::state_of(v_, which),
                                                      lr, beta1_, beta2_, eps_, this->weight_decay_, decoupled_,
                                                      this->step_ + 1);
  }
  std::vector<std::pair<std::string, std::vector<typename tensor::array_type>*>> state_slots() override {
    return {{"moment1", &m_}, {"moment2", &v_}};
  }

 private:
  T beta1_, beta2_, eps_;
  bool decoupled_;
  std::vector<typename tensor::array_type> m_, v_;  // per parameter (the steps of parameter objects)
  std::vector<typename tensor::array_type> tensor_m_, tensor_v_;
};

/// AdamW (PyTorch's torch.optim.AdamW): Adam with decoupled weight decay, applied to
/// the parameter before the update, p *= 1 - lr * weight_decay, and not to the
/// gradient. (MindSpore's AdamWeightDecay decays alike but skips Adam's bias
/// correction.)
template <class T, class D = cpu_device>
class adamw : public adam<T, D> {
 public:
  adamw(std::vector<nn::parameter<T, D>*> params, learning_rate<T> lr = T(1e-3), T beta1 = T(0.9), T beta2 = T(0.999),
        T eps = T(1e-8), T weight_decay = T(1e-2))
      : adam<T, D>("adamw", std::move(params), std::move(lr), beta1, beta2, eps, weight_decay, true) {}
  /// Over bare tensors (no parameter objects): see adam::step(params, grads).
  explicit adamw(T learning_rate, T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8), T weight_decay = T(1e-2))
      : adamw(std::vector<nn::parameter<T, D>*>{}, learning_rate, beta1, beta2, eps, weight_decay) {}
};

}  // namespace tessera::optim
