// Momentum SGD over sharded parameters, MindSpore's update: accum = momentum * accum +
// grad; param -= learning_rate * accum. Each rank updates its own shard: gradients
// arrive in the parameters' layouts (autodiff resolves partial sums), so the update
// needs no communication.
#pragma once

#include <cstddef>
#include <string>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::optim {

template <class T>
class momentum {
 public:
  momentum(T learning_rate, T momentum_factor) : lr_(learning_rate), mu_(momentum_factor) {}

  /// One step: params[i] -= lr * (accum[i] = mu * accum[i] + grads[i]).
  void step(std::vector<dist_tensor<T>>& params, const std::vector<dist_tensor<T>>& grads) {
    if (grads.size() != params.size())
      throw error("momentum: " + std::to_string(grads.size()) + " gradients for " +
                  std::to_string(params.size()) + " parameters");
    if (accum_.empty())
      for (const dist_tensor<T>& p : params) accum_.push_back(xt::zeros_like(p.local()));
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!(grads[i].layout() == params[i].layout()) ||
          !(grads[i].global_shape() == params[i].global_shape()))
        throw error("momentum: the gradient of parameter " + std::to_string(i) + " is " +
                    to_string(grads[i].global_shape()) + " " + to_string(grads[i].layout()) +
                    ", the parameter " + to_string(params[i].global_shape()) + " " +
                    to_string(params[i].layout()));
      xt::xarray<T>& a = accum_[i];
      a = mu_ * a + grads[i].local();
      params[i].local() -= lr_ * a;
    }
  }

 private:
  T lr_, mu_;
  std::vector<xt::xarray<T>> accum_;
};

}  // namespace tessera::optim
