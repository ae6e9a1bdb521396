// Momentum SGD over sharded parameters, MindSpore's update: accum = momentum * accum +
// grad; param -= learning_rate * accum. Each rank updates its own shard: gradients
// arrive in the parameters' layouts (autodiff resolves partial sums), so the update
// needs no communication. The update is one fused kernel of the shards' device.
#pragma once

#include <cstddef>
#include <string>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::optim {

template <class T, class D = cpu_device>
class momentum {
 public:
  using tensor = tensor_on<T, D>;

  momentum(T learning_rate, T momentum_factor) : lr_(learning_rate), mu_(momentum_factor) {}

  /// One step: params[i] -= lr * (accum[i] = mu * accum[i] + grads[i]).
  void step(std::vector<tensor>& params, const std::vector<tensor>& grads) {
    if (grads.size() != params.size())
      throw error("momentum: " + std::to_string(grads.size()) + " gradients for " +
                  std::to_string(params.size()) + " parameters");
    if (accum_.empty())
      for (const tensor& p : params) {
        accum_.push_back(tensor::storage_type::empty(p.local_shape()));
        tensor::storage_type::fill(accum_.back(), T(0));
      }
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!(grads[i].layout() == params[i].layout()) ||
          !(grads[i].global_shape() == params[i].global_shape()))
        throw error("momentum: the gradient of parameter " + std::to_string(i) + " is " +
                    to_string(grads[i].global_shape()) + " " + to_string(grads[i].layout()) +
                    ", the parameter " + to_string(params[i].global_shape()) + " " +
                    to_string(params[i].layout()));
      kernels::backend<D>::momentum_update(params[i].local(), accum_[i], grads[i].local(), lr_, mu_);
    }
  }

 private:
  T lr_, mu_;
  std::vector<typename tensor::array_type> accum_;
};

}  // namespace tessera::optim
