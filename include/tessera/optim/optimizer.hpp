// What every optimizer shares: its parameters, a learning rate that may change with
// the step (constant, step decay, cosine), weight decay, the step count, and the
// checks on the gradients it is given. Each rank updates its own shards: gradients
// arrive in the parameters' layouts (a gradient reducer has resolved partial sums), so
// a step needs no communication.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numbers>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::optim {

/// A learning rate as a function of the step (0 for the first step). Converts from a
/// number (a constant rate).
template <class T>
class learning_rate {
 public:
  learning_rate(T constant) : f_([constant](std::int64_t) { return constant; }) {}  // NOLINT: implicit
  explicit learning_rate(std::function<T(std::int64_t)> f) : f_(std::move(f)) {}
  T operator()(std::int64_t step) const { return f_(step); }

 private:
  std::function<T(std::int64_t)> f_;
};

/// Step decay (PyTorch's StepLR, MindSpore's piecewise exponential decay with
/// is_stair): base * gamma^floor(step / step_size).
/// step_lr(0.1f, 30, 0.1f)(29) == 0.1f, (30) == 0.01f.
template <class T>
learning_rate<T> step_lr(T base, std::int64_t step_size, T gamma) {
  if (step_size < 1) throw error("step_lr: step_size must be at least 1, got " + std::to_string(step_size));
  return learning_rate<T>([=](std::int64_t s) {
    return T(double(base) * std::pow(double(gamma), double(s / step_size)));
  });
}

/// Cosine annealing (PyTorch's CosineAnnealingLR in closed form, MindSpore's
/// cosine_decay_lr per step): min + (base - min) (1 + cos(pi min(step, total) / total)) / 2.
/// cosine_lr(1.0, 10, 0.0)(5) == 0.5; from step `total` on, `min`.
template <class T>
learning_rate<T> cosine_lr(T base, std::int64_t total_steps, T min_lr = T(0)) {
  if (total_steps < 1) throw error("cosine_lr: total_steps must be at least 1, got " + std::to_string(total_steps));
  return learning_rate<T>([=](std::int64_t s) {
    const double t = double(s < total_steps ? s : total_steps) / double(total_steps);
    return T(double(min_lr) + (double(base) - double(min_lr)) * 0.5 * (1.0 + std::cos(std::numbers::pi * t)));
  });
}

namespace detail {

/// The checks of a step over bare tensors: one gradient per parameter, each in its
/// parameter's layout and shape.
/// "sgd: the gradient of parameter 0 is (3,) [-], the parameter (2,) [-]".
template <class Tensor>
void check_tensor_step(const std::string& name, const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  if (grads.size() != params.size())
    throw error(name + ": " + std::to_string(grads.size()) + " gradients for " + std::to_string(params.size()) +
                " parameters");
  for (std::size_t i = 0; i < params.size(); ++i)
    if (!(grads[i].layout() == params[i].layout()) || !(grads[i].global_shape() == params[i].global_shape()))
      throw error(name + ": the gradient of parameter " + std::to_string(i) + " is " +
                  to_string(grads[i].global_shape()) + " " + to_string(grads[i].layout()) + ", the parameter " +
                  to_string(params[i].global_shape()) + " " + to_string(params[i].layout()));
}

/// A zeroed state shard per parameter of a step over bare tensors (made at first use).
template <class Tensor>
void ensure_tensor_state(std::vector<typename Tensor::array_type>& state, const std::vector<Tensor>& params) {
  if (!state.empty()) return;
  for (const Tensor& p : params) {
    state.push_back(Tensor::storage_type::empty(p.local_shape()));
    Tensor::storage_type::fill(state.back(), typename Tensor::value_type(0));
  }
}

}  // namespace detail

/// The base of the optimizers (MindSpore's nn.Optimizer): call it with the gradients,
/// in the order of parameters(), to update the parameters. D is the device of the
/// parameters and gradients (the host by default; on a GPU each update is the
/// backend's fused kernel over the shard).
template <class T, class D = cpu_device>
class optimizer {
 public:
  using tensor = tensor_on<T, D>;
  using array = typename storage<T, D>::array;

  virtual ~optimizer() = default;
  optimizer(const optimizer&) = delete;
  optimizer& operator=(const optimizer&) = delete;

  const std::vector<nn::parameter<T, D>*>& parameters() const { return params_; }
  /// Steps taken so far.
  std::int64_t global_step() const { return step_; }
  /// The learning rate of the next step.
  T current_learning_rate() const { return lr_(step_); }
  T weight_decay() const { return weight_decay_; }

  /// One step: parameter i moves by its gradient grads[i], which must have the
  /// parameter's shape and layout. A gradient still partial is refused:
  /// "sgd: the gradient of parameter 'fc.weight' is (10, 512) [0, -] partial sum {0}, the
  /// parameter (10, 512) [-, -]: reduce gradients over the data-parallel ranks first
  /// (train::distributed_grad_reducer)".
  void operator()(const std::vector<tensor>& grads) { step(grads); }
  /// The same step, then each gradient's storage goes back to its parameter, where the
  /// next step's gradient is written (no fresh memory each step): `grads` is left empty.
  void operator()(std::vector<tensor>& grads) {
    step(grads);
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i]->recycle_grad_storage(std::move(grads[i].local()));
    grads.clear();
  }
  void operator()(std::vector<tensor>&& grads) { (*this)(grads); }
  void step(const std::vector<tensor>& grads) {
    if (grads.size() != params_.size())
      throw error(name_ + ": " + std::to_string(grads.size()) + " gradients for " +
                  std::to_string(params_.size()) + " parameters");
    for (std::size_t i = 0; i < params_.size(); ++i) check(i, params_[i]->data(), grads[i]);
    const T lr = lr_(step_);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if constexpr (std::is_same_v<D, cpu_device>) update(i, params_[i]->data().data(), grads[i].data(), lr);
      else update_on_device(i, params_[i]->data().local(), grads[i].local(), lr);
    }
    ++step_;
  }

 protected:
  optimizer(std::string name, std::vector<nn::parameter<T, D>*> params, learning_rate<T> lr, T weight_decay)
      : name_(std::move(name)), params_(std::move(params)), lr_(std::move(lr)), weight_decay_(weight_decay) {
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!params_[i]) throw error(name_ + ": parameter " + std::to_string(i) + " is null");
  }

  /// Updates parameter i's shard `p` with its gradient `g` at learning rate `lr`.
  virtual void update(std::size_t i, std::span<T> p, std::span<const T> g, T lr) = 0;
  /// The same on a device other than the host: `p` and `g` are the shards' arrays.
  virtual void update_on_device(std::size_t i, array& p, const array& g, T lr) {
    (void)i;
    (void)p;
    (void)g;
    (void)lr;
    throw error(name_ + ": no update of parameters on device " + std::string(D::name));
  }

  /// A zeroed state array per parameter of device D, the shape of its shard (made at
  /// first use).
  void ensure_device_state(std::vector<array>& state) const {
    if (!state.empty()) return;
    for (const nn::parameter<T, D>* p : params_) {
      state.push_back(storage<T, D>::empty(p->data().local_shape()));
      storage<T, D>::fill(state.back(), T(0));
    }
  }

  /// A zeroed state buffer per parameter, the size of its shard (made at first use).
  void ensure_state(std::vector<std::vector<T>>& state) const {
    if (!state.empty()) return;
    state.resize(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) state[i].assign(params_[i]->data().data().size(), T(0));
  }

  void check(std::size_t i, const tensor& p, const tensor& g) const {
    if (g.layout() == p.layout() && g.global_shape() == p.global_shape()) return;
    const std::string who = params_.empty() || !params_[i] ? "parameter " + std::to_string(i)
                                                            : "parameter '" + params_[i]->name() + "'";
    std::string msg = name_ + ": the gradient of " + who + " is " + to_string(g.global_shape()) + " " +
                      to_string(g.layout()) + ", the parameter " + to_string(p.global_shape()) + " " +
                      to_string(p.layout());
    if (g.layout().has_partial() && g.layout().without_partial() == p.layout())
      msg += ": reduce gradients over the data-parallel ranks first (train::distributed_grad_reducer)";
    throw error(msg);
  }

  std::string name_;
  std::vector<nn::parameter<T, D>*> params_;
  learning_rate<T> lr_;
  T weight_decay_;
  std::int64_t step_ = 0;
};

}  // namespace tessera::optim
