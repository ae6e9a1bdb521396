// value_and_grad over a network's parameters (MindSpore's mindspore.value_and_grad):
// a function that runs a forward function on a fresh tape, then the backward pass,
// and returns the loss and each parameter's gradient. Gradients come back as the
// backward pass made them: for a data-parallel network, partial sums over the ranks
// that split the batch, which a gradient reducer resolves. A parameter with a
// gradient listener (train::distributed_grad_reducer) hands it its gradient as soon
// as the backward pass has finished with it, so its reduction overlaps the rest of
// the pass.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/autodiff/tape.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/tensor/dist_tensor.hpp>
#include <tessera/train/memory.hpp>

namespace tessera::train {

namespace detail {

template <class X>
struct is_var : std::false_type {};
template <class T, class D>
struct is_var<autodiff::var<T, D>> : std::true_type {};

template <class X>
struct is_var_pair : std::false_type {};
template <class T, class D>
struct is_var_pair<std::pair<autodiff::var<T, D>, autodiff::var<T, D>>> : std::true_type {};

// A tensor_on<T, D> argument enters the tape as a data leaf (no copy); others pass as
// they are (labels of an integer type, options, ...).
template <class T, class D, class A>
decltype(auto) wrap_argument(autodiff::tape<T, D>& t, const A& a) {
  if constexpr (std::is_same_v<A, tensor_on<T, D>>) return t.leaf_view(a, false);
  else return (a);
}

}  // namespace detail

/// The callable value_and_grad returns. Call it with the forward function's
/// arguments; every tensor_on<T, D> argument (a tensor of the parameters' device)
/// reaches the forward function as a tape value (autodiff::var), the others unchanged.
template <class T, class F, class D = cpu_device>
class grad_function {
 public:
  using tensor = tensor_on<T, D>;

  grad_function(F f, std::vector<nn::parameter<T, D>*> params, context& ctx)
      : f_(std::move(f)), params_(std::move(params)), ctx_(&ctx) {
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!params_[i]) throw error("value_and_grad: parameter " + std::to_string(i) + " is null");
  }

  const std::vector<nn::parameter<T, D>*>& parameters() const { return params_; }

  /// Runs the forward function and the backward pass. Returns (loss, gradients), or,
  /// when the forward function returns a pair (loss, aux) (MindSpore's has_aux),
  /// ((loss, aux), gradients). The loss is the tape's scalar as computed (partial
  /// over the ranks that split the batch for a data-parallel network); gradient i is
  /// parameter i's, in the layout the backward pass produced.
  template <class... Args>
  auto operator()(const Args&... args) {
    autodiff::tape<T, D> t(*ctx_);
    const std::uint64_t serial = t.serial();
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i]->expect_grad(serial, int(i));
    struct unbind_all {
      std::vector<nn::parameter<T, D>*>& ps;
      ~unbind_all() {
        for (auto* p : ps) p->unbind();
      }
    } guard{params_};

    auto out = f_(detail::wrap_argument(t, args)...);
    using R = decltype(out);
    static_assert(detail::is_var<R>::value || detail::is_var_pair<R>::value,
                  "value_and_grad: the forward function must return a tape value (the loss) or a pair "
                  "(loss, aux) of tape values");
    autodiff::var<T, D> loss;
    if constexpr (detail::is_var<R>::value) loss = out;
    else loss = out.first;

    std::vector<std::optional<tensor>> grads(params_.size());
    run_backward(t, serial, loss, grads);
    std::vector<tensor> result;
    result.reserve(grads.size());
    for (auto& g : grads) result.push_back(std::move(*g));
    if constexpr (detail::is_var<R>::value) {
      return std::pair<tensor, std::vector<tensor>>(loss.value(), std::move(result));
    } else {
      return std::pair<std::pair<tensor, tensor>, std::vector<tensor>>(
          {loss.value(), out.second.value()}, std::move(result));
    }
  }

 private:
  void run_backward(autodiff::tape<T, D>& t, std::uint64_t serial, autodiff::var<T, D> loss,
                    std::vector<std::optional<tensor>>& grads) {
    // slot_of[id]: which parameter the leaf with tape id `id` is.
    std::vector<int> slot_of(std::size_t(t.size()), -1);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const int id = params_[i]->leaf_id(serial);
      if (id >= 0) slot_of[std::size_t(id)] = int(i);
    }
    std::vector<nn::grad_listener<T, D>*> listeners;
    for (auto* p : params_)
      if (p->listener() && std::find(listeners.begin(), listeners.end(), p->listener()) == listeners.end())
        listeners.push_back(p->listener());
    for (auto* l : listeners) l->backward_begin();

    auto deliver = [&](std::size_t i, std::optional<tensor> g, int nodes_left) {
      nn::parameter<T, D>& p = *params_[i];
      if (!g) g.emplace(p.layout(), p.shape(), p.data().rank());  // no gradient reached it: zeros
      grads[i] = std::move(g);
      if (p.listener()) p.listener()->grad_ready(p, *grads[i], nodes_left);
    };
    t.set_leaf_hook([&](int id) {
      const int i = id < int(slot_of.size()) ? slot_of[std::size_t(id)] : -1;
      if (i >= 0) deliver(std::size_t(i), t.take_grad(id), id);
    });
    t.backward(loss);
    t.set_leaf_hook({});
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!grads[i]) deliver(i, std::nullopt, 0);  // not used by the forward pass
  }

  F f_;
  std::vector<nn::parameter<T, D>*> params_;
  context* ctx_;
};

/// MindSpore's value_and_grad(forward_fn, None, params): a function that returns the
/// loss and the gradients of `params`. (Small networks train faster after
/// retain_freed_memory().)
///
///     auto forward_fn = [&](auto x, const dist_tensor<int>& y) { return loss_fn(net(x), y); };
///     auto grad_fn = train::value_and_grad(forward_fn, net.trainable_params(), ctx);
///     auto [loss, grads] = grad_fn(images, labels);
///
/// The parameters' device D is the tapes': a network on the GPU takes its inputs as
/// tensor_on<T, cuda_device> (labels stay on the host) and gives device gradients.
template <class T, class F, class D>
grad_function<T, F, D> value_and_grad(F f, std::vector<nn::parameter<T, D>*> params, context& ctx) {
  return grad_function<T, F, D>(std::move(f), std::move(params), ctx);
}

/// The value of a scalar loss as every rank sees it: its partial sums resolved (one
/// small all-reduce when the loss is partial). Collective: every rank must call it.
/// A loss on a device is read back to the host.
template <class T, class D>
T scalar(const tensor_on<T, D>& loss, context& ctx) {
  if (loss.ndim() != 0) throw error("scalar: the loss must be a scalar, got shape " + to_string(loss.global_shape()));
  if constexpr (std::is_same_v<D, cpu_device>) {
    if (!loss.layout().has_partial()) return loss.local()();
    return redistribute(loss, loss.layout().without_partial(), ctx).local()();
  } else {
    if (!loss.layout().has_partial()) return storage<T, D>::to_host(loss.local())();
    return storage<T, D>::to_host(redistribute(loss, loss.layout().without_partial(), ctx).local())();
  }
}

}  // namespace tessera::train
