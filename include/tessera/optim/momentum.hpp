// Momentum over sharded parameters, MindSpore's nn.Momentum (ApplyMomentum):
// accum = momentum * accum + grad; param -= learning_rate * accum (or, with Nesterov,
// param -= learning_rate * (grad + momentum * accum)), grad including L2 weight decay.
// Each rank updates its own shard: gradients arrive in the parameters' layouts, so the
// update needs no communication. The update is kernels::cpu::momentum_update on the
// host; on a GPU, a few fused kernels over all the shards of a step (momentum_update_many).
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/kernels/cpu/optim.hpp>
#include <tessera/optim/optimizer.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::optim {

/// MindSpore's nn.Momentum(params, learning_rate, momentum, weight_decay, use_nesterov):
///   d = g + weight_decay * p;  accum = momentum * accum + d
///   p -= lr * (nesterov ? d + momentum * accum : accum)
///
///     optim::momentum<float> opt(net.trainable_params(), 0.01f, 0.9f);
///     opt(grads);
///
/// It also runs over bare tensors of device D: `momentum<float> opt(lr, mu);
/// opt.step(params, grads)`. On a device (D = cuda_device) a step is a few fused
/// kernels over all the shards, with the same arithmetic, weight decay and Nesterov
/// included.
template <class T, class D = cpu_device>
class momentum : public optimizer<T, D> {
 public:
  using tensor = tensor_on<T, D>;
  using array = typename tensor::array_type;

  momentum(std::vector<nn::parameter<T, D>*> params, learning_rate<T> lr, T momentum_factor, T weight_decay = T(0),
           bool nesterov = false)
      : optimizer<T, D>("momentum", std::move(params), std::move(lr), weight_decay),
        mu_(momentum_factor),
        nesterov_(nesterov) {
    if (momentum_factor < T(0))
      throw error("momentum: momentum must not be negative, got " + std::to_string(momentum_factor));
  }
  /// Over bare tensors (no parameter objects): see step(params, grads).
  momentum(T learning_rate, T momentum_factor)
      : momentum(std::vector<nn::parameter<T, D>*>{}, learning_rate, momentum_factor) {}

  using optimizer<T, D>::step;

  /// One step over bare tensors: params[i] moves by grads[i] (same layout and shape).
  void step(std::vector<tensor>& params, const std::vector<tensor>& grads) {
    if (grads.size() != params.size())
      throw error("momentum: " + std::to_string(grads.size()) + " gradients for " + std::to_string(params.size()) +
                  " parameters");
    if (tensor_accum_.empty())
      for (const tensor& p : params) {
        tensor_accum_.push_back(tensor::storage_type::empty(p.local_shape()));
        tensor::storage_type::fill(tensor_accum_.back(), T(0));
      }
    for (std::size_t i = 0; i < params.size(); ++i)
      if (!(grads[i].layout() == params[i].layout()) || !(grads[i].global_shape() == params[i].global_shape()))
        throw error("momentum: the gradient of parameter " + std::to_string(i) + " is " +
                    to_string(grads[i].global_shape()) + " " + to_string(grads[i].layout()) + ", the parameter " +
                    to_string(params[i].global_shape()) + " " + to_string(params[i].layout()));
    const T lr = this->lr_(this->step_);
    if constexpr (std::same_as<D, cpu_device>) {
      for (std::size_t i = 0; i < params.size(); ++i)
        kernels::cpu::momentum_update(params[i].data(), grads[i].data(),
                                      std::span<T>(tensor_accum_[i].data(), tensor_accum_[i].size()), lr, mu_,
                                      this->weight_decay_, nesterov_);
    } else {
      const auto [p, g] = detail::tensor_arrays(params, grads);
      std::vector<array*> a;
      for (array& s : tensor_accum_) a.push_back(&s);
      kernels::backend<D>::template momentum_update_many<T>(p, a, g, lr, mu_, this->weight_decay_, nesterov_);
    }
    ++this->step_;
  }

 protected:
  void update(std::size_t i, std::span<T> p, std::span<const T> g, T lr) override {
    this->ensure_state(accum_);
    kernels::cpu::momentum_update(p, g, this->span_of(accum_[i]), lr, mu_, this->weight_decay_, nesterov_);
  }
  void update_on_device(std::span<const std::size_t> which, std::span<array* const> p,
                        std::span<const array* const> g, T lr) override {
    this->ensure_state(accum_);
    kernels::backend<D>::template momentum_update_many<T>(p, detail::state_of(accum_, which), g, lr, mu_,
                                                          this->weight_decay_, nesterov_);
  }
  std::vector<std::pair<std::string, std::vector<typename tensor::array_type>*>> state_slots() override {
    return {{"moments", &accum_}};
  }

 private:
  T mu_;
  bool nesterov_;
  std::vector<typename tensor::array_type> accum_;  // per parameter (the steps of parameter objects)
  std::vector<typename tensor::array_type> tensor_accum_;
};

}  // namespace tessera::optim
