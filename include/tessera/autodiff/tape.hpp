// Reverse-mode automatic differentiation over sharded operators. A tape records each
// operator's output and a function that turns the output's gradient into its inputs'
// gradients. Gradients carry layouts like values do: a gradient may hold partial sums
// (dA of a MatMul whose columns are split is partial over that axis), gradients of one
// value that arrive in different layouts are redistributed into one before they are
// added, and asking for a parameter's gradient redistributes it to the parameter's
// layout, which resolves what is still partial: for a data-parallel parameter, that
// is the all-reduce over the data-parallel ranks.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
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

template <class T, class D = cpu_device>
class tape;

/// A value recorded on a tape: the handle operators take and return.
template <class T, class D = cpu_device>
struct var {
  tape<T, D>* t = nullptr;
  int id = -1;
  const tensor_on<T, D>& value() const { return t->value(id); }
};

/// The record of one computation on tensors of device D. Not thread-safe; one per
/// forward pass.
template <class T, class D>
class tape {
 public:
  using tensor = tensor_on<T, D>;
  /// Gets the gradient of the node's output and adds its inputs' gradients (add_grad).
  /// The gradient is the function's to keep: one that hands an input dy as it is (Add)
  /// moves it rather than copying it (a function taking `const tensor&` also fits).
  using backward_fn = std::function<void(tape&, tensor&& grad)>;

  /// Called during backward() once for each leaf that requires a gradient, with its id,
  /// when the pass reaches it: every node that could still add to its gradient has run.
  using leaf_hook = std::function<void(int id)>;

  explicit tape(context& ctx) : ctx_(&ctx), serial_(next_serial()) {}
  tape(const tape&) = delete;
  tape& operator=(const tape&) = delete;

  context& ctx() { return *ctx_; }
  /// A number no other tape of this process has had: tells tapes apart even when one
  /// is made where another was destroyed.
  std::uint64_t serial() const { return serial_; }
  /// The number of values recorded so far.
  int size() const { return int(nodes_.size()); }

  /// A value with no inputs: a parameter (requires_grad) or data.
  var<T, D> leaf(tensor value, bool requires_grad = true) {
    nodes_.push_back(node{std::move(value), {}, {}, requires_grad});
    return {this, int(nodes_.size()) - 1};
  }
  /// A leaf that refers to `value` instead of copying it (a parameter): `value` must
  /// outlive the tape and stay unchanged while the tape is used.
  var<T, D> leaf_view(const tensor& value, bool requires_grad = true) {
    nodes_.push_back(node{std::nullopt, {}, {}, requires_grad, &value});
    return {this, int(nodes_.size()) - 1};
  }
  /// A value outside the tape (as leaf_view) with a backward function: a parameter read
  /// where it is under another label, whose gradient the function hands on.
  var<T, D> record_view(const tensor& value, backward_fn backward) {
    nodes_.push_back(node{std::nullopt, std::move(backward), {}, true, &value});
    return {this, int(nodes_.size()) - 1};
  }
  /// An operator's output and its backward function.
  var<T, D> record(tensor value, backward_fn backward) {
    nodes_.push_back(node{std::move(value), std::move(backward), {}, true});
    return {this, int(nodes_.size()) - 1};
  }
  /// As above; with requires_grad false (no input needs a gradient) the backward
  /// function never runs.
  var<T, D> record(tensor value, backward_fn backward, bool requires_grad) {
    nodes_.push_back(node{std::move(value), std::move(backward), {}, requires_grad});
    return {this, int(nodes_.size()) - 1};
  }

  const tensor& value(int id) const {
    const node& n = at(id);
    if (n.released)
      throw error("autodiff: value " + std::to_string(id) + " was released (by a consuming backward pass or release())");
    return n.val();
  }
  /// Whether gradients flow to node `id`: a leaf made with requires_grad, or an
  /// operator's output recorded as needing one.
  bool requires_grad(int id) const { return at(id).requires_grad; }

  /// Sets the function backward() calls as each leaf's gradient becomes final.
  void set_leaf_hook(leaf_hook hook) { leaf_hook_ = std::move(hook); }

  /// Moves out the gradient accumulated for node `id`, in the layout it was accumulated
  /// in (possibly partial); nullopt if nothing reached it.
  std::optional<tensor> take_grad(int id) {
    node& n = at(id);
    std::optional<tensor> g = std::move(n.grad);
    n.grad.reset();
    return g;
  }

  /// Adds `g` to the gradient of node `id`. The first gradient's layout is kept; later
  /// ones are redistributed to it (partial layouts included) and added shard by shard.
  void add_grad(int id, tensor g) {
    node& n = at(id);
    if (!n.requires_grad) return;
    if (n.released)
      throw error("autodiff: a gradient for value " + std::to_string(id) +
                  ", released by an earlier consuming backward pass: the outputs of such passes must share "
                  "no operator output, only leaves");
    if (!(g.global_shape() == n.val().global_shape()))
      throw error("autodiff: a gradient of shape " + to_string(g.global_shape()) +
                  " for a value of shape " + to_string(n.val().global_shape()));
    if (!n.grad) {
      n.grad = std::move(g);
      return;
    }
    // A layout that places the same shards (another operator's device matrix) adds as it
    // is: redistributing would copy it for an empty plan.
    if (!same_placement(g.layout(), n.grad->layout())) g = redistribute(g, n.grad->layout(), *ctx_);
    kernels::backend<D>::add_to(n.grad->local(), g.local());
  }

  /// Runs the backward pass from `loss`, a scalar (rank-0) value: its gradient is 1.
  void backward(var<T, D> loss) {
    const tensor& l = value(loss.id);
    if (l.ndim() != 0)
      throw error("autodiff: backward starts from a scalar loss, got shape " + to_string(l.global_shape()));
    tensor seed(l.layout().without_partial(), l.global_shape(), l.rank());
    tensor::storage_type::fill(seed.local(), T(1));
    add_grad(loss.id, std::move(seed));
    run_backward(loss.id, false);
  }

  /// Runs a backward pass from `y` with `dy` as its gradient (y's shape, any layout).
  /// The operator outputs it passes are used up: each one's backward runs once, and
  /// then its value, gradient and backward function (with what it saved) are released.
  /// So passes from several outputs of one tape add up at the leaves, whose gradients
  /// accumulate, and each pass frees what it went through: a pipeline's micro-batches,
  /// one pass each from its output, keep only the activations of those in flight. The
  /// outputs must share no operator output, only leaves (a later pass reaching a
  /// released value is an error).
  void backward(var<T, D> y, tensor dy) {
    add_grad(y.id, std::move(dy));
    run_backward(y.id, true);
  }

  /// One consuming pass (as above) from several outputs at once, each with its
  /// gradient: what a pipeline stage's part of a micro-batch runs when its values went
  /// to several later stages. Without seeds it does nothing.
  void backward(std::vector<std::pair<var<T, D>, tensor>> seeds) {
    int from = -1;
    for (auto& [y, dy] : seeds) {
      add_grad(y.id, std::move(dy));
      from = std::max(from, y.id);
    }
    if (from >= 0) run_backward(from, true);
  }

  /// Releases the values, gradients and backward functions of nodes [first, last],
  /// which nothing on the tape may use again, except the leaves that refer to a value
  /// outside the tape (leaf_view: parameters). A pipeline stage releases so what one
  /// micro-batch recorded (its input, and the values no gradient reached) once that
  /// micro-batch's backward pass is done.
  void release_range(int first, int last) {
    for (int id = first; id <= last; ++id) {
      node& n = at(id);
      if (n.view) continue;
      n.value.reset();
      n.grad.reset();
      n.backward = nullptr;
      n.released = true;
    }
  }

  /// Frees the elements of node `id`'s value and keeps its layout and shape: for a
  /// value that nothing reads again, forward or backward, but whose node stays on the
  /// tape (its gradient and backward still run). The graph executor frees so what no
  /// operator's backward reads (ops::backward_reads_input). A leaf that refers to a
  /// value outside the tape is left alone.
  void drop_elements(int id) {
    node& n = at(id);
    if (n.view || !n.value || n.dropped) return;
    n.value->local() = typename tensor::array_type();
    n.dropped = true;
  }

  /// The values the tape still holds (operator outputs and copied leaves; not the
  /// leaves that refer to values outside it, nor values whose elements were dropped).
  int live_values() const {
    int k = 0;
    for (const node& n : nodes_) k += n.value && !n.dropped ? 1 : 0;
    return k;
  }

  /// The gradient of `v` in v's own layout (partial sums resolved); zeros if nothing
  /// reached it.
  tensor grad(var<T, D> v) {
    node& n = at(v.id);
    const tensor& value = this->value(v.id);
    if (!n.grad) {
      tensor z(value.layout(), value.global_shape(), value.rank());
      return z;
    }
    if (n.grad->layout() == value.layout()) return *n.grad;
    return redistribute(*n.grad, value.layout(), *ctx_);
  }

  /// grad(v), moving the gradient out of the tape where it is laid out as v already (no
  /// copy): v has no gradient on the tape after.
  tensor release_grad(var<T, D> v) {
    node& n = at(v.id);
    const tensor& value = this->value(v.id);
    if (!n.grad || !same_placement(n.grad->layout(), value.layout())) return grad(v);
    tensor g = std::move(*n.grad).relabeled(value.layout());  // a kept form moves with it
    n.grad.reset();
    return g;
  }

 private:
  struct node {
    std::optional<tensor> value;
    backward_fn backward;
    std::optional<tensor> grad;
    bool requires_grad = true;
    const tensor* view = nullptr;  // leaf_view: the value lives there
    bool released = false;         // used up by a consuming pass, or release()
    bool dropped = false;          // drop_elements: the layout and shape only
    const tensor& val() const { return view ? *view : *value; }
  };
  node& at(int id) {
    if (id < 0 || id >= int(nodes_.size()))
      throw error("autodiff: no value " + std::to_string(id) + " on this tape");
    return nodes_[std::size_t(id)];
  }
  const node& at(int id) const { return const_cast<tape*>(this)->at(id); }

  // The nodes from `from` down to 0: each operator output with a gradient runs its
  // backward (then, when `consume`, the node is released), each leaf that needs one is
  // told to the hook.
  void run_backward(int from, bool consume) {
    for (int id = from; id >= 0; --id) {
      node& n = nodes_[std::size_t(id)];
      if (n.released) continue;
      if (n.grad && n.backward) {
        tensor g = consume ? std::move(*n.grad) : *n.grad;  // the backward may add to earlier nodes only
        if (consume) n.grad.reset();
        n.backward(*this, std::move(g));
        if (consume) {  // nodes above `id` have run: none reads it again
          n.value.reset();
          n.backward = nullptr;
          n.released = true;
        }
      } else if (!n.backward && n.requires_grad && leaf_hook_) {
        leaf_hook_(id);  // nodes below `id` were recorded before it: none uses it
      }
    }
  }

  static std::uint64_t next_serial() {
    static std::atomic<std::uint64_t> counter{0};
    return ++counter;
  }

  context* ctx_;
  std::uint64_t serial_;
  std::vector<node> nodes_;
  leaf_hook leaf_hook_;
};

/// Runs f on the tape with `params` as leaves, then the backward pass from the scalar
/// it returns: the loss value and the gradient of each parameter, in its layout.
template <class T, class D, class F>
std::pair<tensor_on<T, D>, std::vector<tensor_on<T, D>>> value_and_grad(
    F&& f, const std::vector<tensor_on<T, D>>& params, context& ctx) {
  tape<T, D> t(ctx);
  std::vector<var<T, D>> vars;
  vars.reserve(params.size());
  for (const tensor_on<T, D>& p : params) vars.push_back(t.leaf(p));
  const var<T, D> loss = f(t, vars);
  t.backward(loss);
  std::vector<tensor_on<T, D>> grads;
  grads.reserve(vars.size());
  for (const var<T, D>& v : vars) grads.push_back(t.grad(v));
  return {loss.value(), std::move(grads)};
}

}  // namespace tessera::autodiff
