// SGD over sharded parameters, MindSpore's nn.SGD and PyTorch's torch.optim.SGD:
// plain gradient descent, or with momentum (optionally Nesterov), dampening and L2
// weight decay. The update is kernels::cpu::sgd_update / sgd_momentum_update on the
// host; on a device, the backend's *_update_many (on a GPU, a few fused kernels over all
// the shards of a step).
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

/// MindSpore's nn.SGD(params, learning_rate, momentum, dampening, weight_decay,
/// nesterov):
///   d = g + weight_decay * p
///   momentum 0:  p -= lr * d
///   otherwise:   buf = momentum * buf + (1 - dampening) * d  (buf = d at the first step)
///                p -= lr * (nesterov ? d + momentum * buf : buf)
///
///     optim::sgd<float> opt(net.trainable_params(), 1e-2f);   // the seed's SGD(params, 1e-2)
///     opt(grads);
///
/// It also runs over bare tensors of device D: `sgd<float, cuda_device> opt(lr, mu);
/// opt.step(params, grads)`.
template <class T, class D = cpu_device>
class sgd : public optimizer<T, D> {
 public:
  using tensor = tensor_on<T, D>;
  using array = typename tensor::array_type;

  sgd(std::vector<nn::parameter<T, D>*> params, learning_rate<T> lr = T(0.1), T momentum = T(0),
      T dampening = T(0), T weight_decay = T(0), bool nesterov = false)
      : optimizer<T, D>("sgd", std::move(params), std::move(lr), weight_decay),
        momentum_(momentum),
        dampening_(dampening),
        nesterov_(nesterov) {
    if (momentum < T(0)) throw error("sgd: momentum must not be negative, got " + std::to_string(momentum));
    if (nesterov && (momentum <= T(0) || dampening != T(0)))
      throw error("sgd: nesterov needs a positive momentum and zero dampening, got momentum " +
                  std::to_string(momentum) + " and dampening " + std::to_string(dampening));
  }

  /// Over bare tensors (no parameter objects): see step(params, grads).
  explicit sgd(T learning_rate, T momentum = T(0), T dampening = T(0), T weight_decay = T(0), bool nesterov = false)
      : sgd(std::vector<nn::parameter<T, D>*>{}, learning_rate, momentum, dampening, weight_decay, nesterov) {}

  T momentum() const { return momentum_; }

  using optimizer<T, D>::step;
  /// One step over bare tensors: params[i] moves by grads[i] (same layout and shape),
  /// with the update of the parameter objects' steps.
  void step(std::vector<tensor>& params, const std::vector<tensor>& grads) {
    detail::check_tensor_step(this->name_, params, grads);
    const T lr = this->lr_(this->step_);
    if (momentum_ != T(0)) detail::ensure_tensor_state(tensor_buf_, params);
    const auto [p, g] = detail::tensor_arrays(params, grads);
    std::vector<array*> b;
    for (array& s : tensor_buf_) b.push_back(&s);
    update_many(p, g, b, lr);
    ++this->step_;
  }

 protected:
  void update(std::size_t i, std::span<T> p, std::span<const T> g, T lr) override {
    if (momentum_ == T(0)) return kernels::cpu::sgd_update(p, g, lr, this->weight_decay_);
    this->ensure_state(buf_);
    kernels::cpu::sgd_momentum_update(p, g, this->span_of(buf_[i]), lr, momentum_, dampening_,
                                      this->weight_decay_, nesterov_, this->step_ == 0);
  }
  void update_on_device(std::span<const std::size_t> which, std::span<array* const> p,
                        std::span<const array* const> g, T lr) override {
    if (momentum_ != T(0)) this->ensure_state(buf_);
    update_many(p, g, momentum_ != T(0) ? detail::state_of(buf_, which) : std::vector<array*>{}, lr);
  }

  std::vector<std::pair<std::string, std::vector<typename tensor::array_type>*>> state_slots() override {
    if (momentum_ == T(0)) return {};
    return {{"accum", &buf_}};
  }

 private:
  // The backend's batched update of parameters p with gradients g (and momentum buffers
  // bufs, with momentum).
  void update_many(std::span<array* const> p, std::span<const array* const> g, std::span<array* const> bufs, T lr) {
    using K = kernels::backend<D>;
    if (momentum_ == T(0)) return K::template sgd_update_many<T>(p, g, lr, this->weight_decay_);
    K::template sgd_momentum_update_many<T>(p, g, bufs, lr, momentum_, dampening_, this->weight_decay_, nesterov_,
                                            this->step_ == 0);
  }

  T momentum_, dampening_;
  bool nesterov_;
  std::vector<typename tensor::array_type> buf_;  // per parameter (the steps of parameter objects)
  std::vector<typename tensor::array_type> tensor_buf_;
};

}  // namespace tessera::optim
