// Reverse-mode automatic differentiation over sharded operators. A tape records each
// operator's output and a function that turns the output's gradient into its inputs'
// gradients. Gradients carry layouts like values do: a gradient may hold partial sums
// (dA of a MatMul whose columns are split is partial over that axis), gradients of one
// value that arrive in different layouts are redistributed into one before they are
// added, and asking for a parameter's gradient redistributes it to the parameter's
// layout, which resolves what is still partial: for a data-parallel parameter, that
// is the all-reduce over the data-parallel ranks.
#pragma once

#include <functional>
#include <optional>
#include <utility>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::autodiff {

template <class T, class C, class D = cpu_device>
class tape;

/// A value recorded on a tape: the handle operators take and return.
template <class T, class C, class D = cpu_device>
struct var {
  tape<T, C, D>* t = nullptr;
  int id = -1;
  const tensor_on<T, D>& value() const { return t->value(id); }
};

/// The record of one computation on tensors of device D. Not thread-safe; one per
/// forward pass.
template <class T, class C, class D>
class tape {
 public:
  using tensor = tensor_on<T, D>;
  /// Gets the gradient of the node's output and adds its inputs' gradients (add_grad).
  using backward_fn = std::function<void(tape&, const tensor& grad)>;

  explicit tape(device_context<C>& ctx) : ctx_(&ctx) {}
  tape(const tape&) = delete;
  tape& operator=(const tape&) = delete;

  device_context<C>& ctx() { return *ctx_; }

  /// A value with no inputs: a parameter (requires_grad) or data.
  var<T, C, D> leaf(tensor value, bool requires_grad = true) {
    nodes_.push_back(node{std::move(value), {}, {}, requires_grad});
    return {this, int(nodes_.size()) - 1};
  }
  /// An operator's output and its backward function.
  var<T, C, D> record(tensor value, backward_fn backward) {
    nodes_.push_back(node{std::move(value), std::move(backward), {}, true});
    return {this, int(nodes_.size()) - 1};
  }

  const tensor& value(int id) const { return at(id).value; }

  /// Adds `g` to the gradient of node `id`. The first gradient's layout is kept; later
  /// ones are redistributed to it (partial layouts included) and added shard by shard.
  void add_grad(int id, tensor g) {
    node& n = at(id);
    if (!n.requires_grad) return;
    if (!(g.global_shape() == n.value.global_shape()))
      throw error("autodiff: a gradient of shape " + to_string(g.global_shape()) +
                  " for a value of shape " + to_string(n.value.global_shape()));
    if (!n.grad) {
      n.grad = std::move(g);
      return;
    }
    if (!(g.layout() == n.grad->layout())) g = redistribute(g, n.grad->layout(), *ctx_);
    kernels::backend<D>::add_to(n.grad->local(), g.local());
  }

  /// Runs the backward pass from `loss`, a scalar (rank-0) value: its gradient is 1.
  void backward(var<T, C, D> loss) {
    const tensor& l = value(loss.id);
    if (l.ndim() != 0)
      throw error("autodiff: backward starts from a scalar loss, got shape " + to_string(l.global_shape()));
    tensor seed(l.layout().without_partial(), l.global_shape(), l.rank());
    tensor::storage_type::fill(seed.local(), T(1));
    add_grad(loss.id, std::move(seed));
    for (int id = loss.id; id >= 0; --id) {
      node& n = nodes_[std::size_t(id)];
      if (n.grad && n.backward) {
        const tensor g = *n.grad;  // the backward may add to earlier nodes only
        n.backward(*this, g);
      }
    }
  }

  /// The gradient of `v` in v's own layout (partial sums resolved); zeros if nothing
  /// reached it.
  tensor grad(var<T, C, D> v) {
    node& n = at(v.id);
    if (!n.grad) {
      tensor z(n.value.layout(), n.value.global_shape(), n.value.rank());
      return z;
    }
    if (n.grad->layout() == n.value.layout()) return *n.grad;
    return redistribute(*n.grad, n.value.layout(), *ctx_);
  }

 private:
  struct node {
    tensor value;
    backward_fn backward;
    std::optional<tensor> grad;
    bool requires_grad = true;
  };
  node& at(int id) {
    if (id < 0 || id >= int(nodes_.size()))
      throw error("autodiff: no value " + std::to_string(id) + " on this tape");
    return nodes_[std::size_t(id)];
  }
  const node& at(int id) const { return const_cast<tape*>(this)->at(id); }

  device_context<C>* ctx_;
  std::vector<node> nodes_;
};

/// Runs f on the tape with `params` as leaves, then the backward pass from the scalar
/// it returns: the loss value and the gradient of each parameter, in its layout.
template <class T, class D, class C, class F>
std::pair<tensor_on<T, D>, std::vector<tensor_on<T, D>>> value_and_grad(
    F&& f, const std::vector<tensor_on<T, D>>& params, device_context<C>& ctx) {
  tape<T, C, D> t(ctx);
  std::vector<var<T, C, D>> vars;
  vars.reserve(params.size());
  for (const tensor_on<T, D>& p : params) vars.push_back(t.leaf(p));
  const var<T, C, D> loss = f(t, vars);
  t.backward(loss);
  std::vector<tensor_on<T, D>> grads;
  grads.reserve(vars.size());
  for (const var<T, C, D>& v : vars) grads.push_back(t.grad(v));
  return {loss.value(), std::move(grads)};
}

}  // namespace tessera::autodiff
