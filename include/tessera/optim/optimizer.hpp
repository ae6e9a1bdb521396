// What every optimizer shares: its parameters, a learning rate that may change with
// the step (constant, step decay, cosine), weight decay, the step count, and the
// checks on the gradients it is given. Each rank updates its own shards: gradients
// arrive in the parameters' layouts (a gradient reducer has resolved partial sums), so
// a step needs no communication. With optimizer parallel (enable_parallel_optimizer)
// each parameter's state and update are split further over the ranks that hold its
// replicas: the step then reduce-scatters the gradients and gathers the parameters.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/tensor/dist_tensor.hpp>
#include <tessera/tensor/host_form.hpp>

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

/// The arrays of a step over bare tensors, for a device's batched update.
template <class Tensor>
std::pair<std::vector<typename Tensor::array_type*>, std::vector<const typename Tensor::array_type*>> tensor_arrays(
    std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  std::pair<std::vector<typename Tensor::array_type*>, std::vector<const typename Tensor::array_type*>> out;
  for (Tensor& p : params) out.first.push_back(&p.local());
  for (const Tensor& g : grads) out.second.push_back(&g.local());
  return out;
}

/// The state arrays of the parameters `which`, for a device's batched update.
template <class Array>
std::vector<Array*> state_of(std::vector<Array>& state, std::span<const std::size_t> which) {
  std::vector<Array*> out;
  out.reserve(which.size());
  for (std::size_t i : which) out.push_back(&state[i]);
  return out;
}

}  // namespace detail

/// Where optimizer parallel (MindSpore's enable_parallel_optimizer) puts the state and
/// the update of a parameter of `shape` laid out as `l`: `l` with its first dim that
/// can take them also split by the mesh axes holding replicas of it (after the axes
/// that split it already; axes of one rank left out), so that each replica updates its
/// own piece; `l` itself when no axis holds replicas or no dim divides.
/// Examples, mesh{8}: a (512, 784) weight replicated [-, -] -> [0, -] (64 rows a rank);
/// a (6, 16) one -> [-, 0] (6 rows do not divide into 8); (10,) -> [-] (whole).
/// mesh{2, 4}, a (16, 32) weight split [1, -] (rows by axis 1, replicas on axis 0) ->
/// [1.0, -] (rows in 8 pieces, axis 1 major).
constexpr layout state_layout(const layout& l, const extents& shape) {
  axis_mask replicas = 0;  // the axes holding replicas, of more than one rank
  index_t copies = 1;
  for (int a = 0; a < l.dev.ndim; ++a)
    if ((l.replica_axes() >> a & 1u) && l.dev.dims[a] > 1) {
      replicas |= 1u << a;
      copies *= l.dev.dims[a];
    }
  if (copies == 1 || l.ndim != shape.ndim) return l;
  for (int d = 0; d < l.ndim; ++d) {
    const index_t pieces = index_t(l.pieces(d)) * copies;
    if (shape.v[d] <= 0 || shape.v[d] % pieces != 0) continue;
    axis_list axes = l.split[d];
    for (int a = 0; a < l.dev.ndim; ++a)
      if (replicas >> a & 1u) axes.push_back(a);
    return l.with_split(d, axes);
  }
  return l;
}

/// The base of the optimizers (MindSpore's nn.Optimizer): call it with the gradients,
/// in the order of parameters(), to update the parameters. D is the device of the
/// parameters and gradients (the host by default; on a GPU a step updates every shard
/// in a few launches of the backend's fused kernels).
///
/// Optimizer parallel (MindSpore's enable_parallel_optimizer): after
/// `opt.enable_parallel_optimizer(ctx)` each parameter's state (momentum, Adam's
/// moments) and update are split over the ranks that hold replicas of the parameter,
/// in state_layout(i): a data-parallel network on 8 ranks keeps an eighth of each
/// state per rank. The step then takes the gradients as the backward pass leaves them
/// (partial sums over the replicas; no gradient reducer): each is reduce-scattered into
/// its piece, the piece of the parameter updated, and the pieces all-gathered back
/// into the parameter, as many bytes as the AllReduce they replace. The result is the
/// gradient reducer's (gradients_mean) followed by the plain step, to float rounding.
///
///     optim::adam<float> opt(net.trainable_params(), 1e-3f);
///     opt.enable_parallel_optimizer(ctx);           // before the first step
///     auto [loss, grads] = grad_fn(x, y);           // partial sums over the replicas
///     opt(grads);                                   // ReduceScatter, update, AllGather
template <class T, class D = cpu_device>
class optimizer {
 public:
  using tensor = tensor_on<T, D>;
  using array = typename storage<T, D>::array;

  /// Options of optimizer parallel.
  struct parallel_options {
    /// A parameter of fewer bytes keeps its whole state on every rank, its gradient
    /// all-reduced (MindSpore's parallel_optimizer_threshold, 64 KB): splitting it
    /// would save little memory for two collectives' latency.
    std::size_t threshold_bytes = std::size_t(64) << 10;
  };

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
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i]->recycle_grad_storage(grads[i].release_storage());
    grads.clear();
  }
  void operator()(std::vector<tensor>&& grads) { (*this)(grads); }
  void step(const std::vector<tensor>& grads) {
    if (grads.size() != params_.size())
      throw error(name_ + ": " + std::to_string(grads.size()) + " gradients for " +
                  std::to_string(params_.size()) + " parameters");
    if (parallel_) {
      parallel_step(grads);
      return;
    }
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (updates_here(i)) check(i, params_[i]->data(), grads[i]);
    const T lr = lr_(step_);
    if constexpr (std::is_same_v<D, cpu_device>) {
      for (std::size_t i = 0; i < params_.size(); ++i)
        if (updates_here(i)) apply(i, params_[i]->data(), grads[i], lr);
    } else {
      // On a device, one batched update of every parameter: a few kernel launches.
      std::vector<std::size_t> which;
      std::vector<array*> ps;
      std::vector<const array*> gs;
      for (std::size_t i = 0; i < params_.size(); ++i)
        if (updates_here(i)) {
          which.push_back(i);
          ps.push_back(&params_[i]->data().local());
          gs.push_back(&grads[i].local());
        }
      update_on_device(which, ps, gs, lr);
    }
    ++step_;
  }

  /// Turns on optimizer parallel over the ranks of `ctx` (see the class comment). Call
  /// it before the first step; the network need not be built yet (the layouts are
  /// taken at the first step). `ctx` must outlive the optimizer's steps.
  /// Throws after a step: "adam: enable_parallel_optimizer after 3 steps: the state is
  /// already whole on every rank; enable it before the first step".
  void enable_parallel_optimizer(context& ctx, parallel_options o = {}) {
    if (step_ != 0)
      throw error(name_ + ": enable_parallel_optimizer after " + std::to_string(step_) +
                  " steps: the state is already whole on every rank; enable it before the first step");
    parallel_.emplace();
    parallel_->opt = o;
    parallel_->ctx = &ctx;
  }

  /// For a network on pipeline stages, where each rank holds its stage's parameters:
  /// parameter i lives over the ranks of `ctx` (this rank's stage; optimizer parallel
  /// splits its state over that stage's replicas), or, with nullptr, on another stage
  /// only: this rank's steps pass it by (its gradient is not read, its state stays
  /// zero). By default every parameter lives over the ranks of enable_parallel_optimizer's
  /// context. train::model sets it from the plan. `ctx` must outlive the steps.
  void place_parameter(std::size_t i, context* ctx) {
    if (i >= params_.size())
      throw error(name_ + ": place_parameter: parameter " + std::to_string(i) + " of " + std::to_string(params_.size()));
    if (placed_.empty()) placed_.assign(params_.size(), placement{});
    placed_[i] = ctx ? placement{true, ctx} : placement{false, nullptr};
  }
  /// Whether this rank's steps update parameter i (place_parameter).
  bool updates_here(std::size_t i) const { return placed_.empty() || placed_[i].here; }
  /// Whether optimizer parallel is on: the step then takes the gradients as the
  /// backward pass leaves them and reduces them itself (train::model runs no gradient
  /// reducer for it).
  bool reduces_gradients() const { return parallel_.has_value(); }
  /// The layout of parameter i's state and update: state_layout of the parameter's
  /// with optimizer parallel on (above the threshold), else the parameter's own.
  layout state_layout(std::size_t i) const {
    if (i >= params_.size())
      throw error(name_ + ": state_layout: parameter " + std::to_string(i) + " of " + std::to_string(params_.size()));
    if (parallel_ && i < parallel_->layouts.size()) return parallel_->layouts[i];
    const nn::parameter<T, D>& p = *params_[i];
    if (!parallel_) return p.layout();
    const std::size_t bytes = std::size_t(p.shape().size()) * sizeof(T);
    return bytes < parallel_->opt.threshold_bytes ? p.layout() : optim::state_layout(p.layout(), p.shape());
  }

  /// The kinds of state the optimizer keeps per parameter (Momentum 1, Adam 2, SGD
  /// without momentum 0): what parallel_config::optimizer_slots counts for a memory
  /// budget (train::model sets it from here).
  int state_kinds() { return int(state_slots().size()); }

  /// The state as checkpoints hold it: for each kind of state_slots() and each
  /// parameter, a host copy named "<kind>.<parameter>" ("moments.fc.weight"), of the
  /// parameter's global shape laid out as state_layout(i) (zeros before the first step).
  /// Take it when the parameters have their training layouts (train::model calls it
  /// from its checkpoints, after its steps).
  std::vector<std::pair<std::string, dist_tensor<T>>> state_tensors() {
    for (std::size_t i = 0; i < state_order_.size(); ++i) state_in_order(i, nullptr);
    std::vector<std::pair<std::string, dist_tensor<T>>> out;
    for (auto& [kind, arrays] : state_slots())
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const nn::parameter<T, D>& p = *params_[i];
        const layout l = state_layout(i);
        dist_tensor<T> t(l, p.shape(), p.data().rank());
        if (i < arrays->size()) t.local() = storage<T, D>::to_host((*arrays)[i]);
        out.emplace_back(kind + "." + p.name(), std::move(t));
      }
    return out;
  }

  /// Sets the state from tensors named and laid out as state_tensors() gives them
  /// (filled from a checkpoint by io::load_distributed_checkpoint), and the step count,
  /// from which the learning rate goes on. Throws, naming the tensor, for one missing
  /// or of another shape or layout:
  /// "momentum: load_state: no tensor 'moments.fc.weight'".
  void load_state(const std::vector<std::pair<std::string, dist_tensor<T>>>& tensors, std::int64_t global_step) {
    if (global_step < 0)
      throw error(name_ + ": load_state: the step count must not be negative, got " + std::to_string(global_step));
    for (std::size_t i = 0; i < state_order_.size(); ++i) state_in_order(i, nullptr);
    for (auto& [kind, arrays] : state_slots()) {
      ensure_state(*arrays);
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const std::string want = kind + "." + params_[i]->name();
        const auto it = std::find_if(tensors.begin(), tensors.end(), [&](const auto& e) { return e.first == want; });
        if (it == tensors.end()) throw error(name_ + ": load_state: no tensor '" + want + "'");
        const dist_tensor<T>& t = it->second;
        const layout l = state_layout(i);
        if (!(t.layout() == l) || !(t.global_shape() == params_[i]->shape()))
          throw error(name_ + ": load_state: '" + want + "' is " + to_string(t.global_shape()) + " " +
                      to_string(t.layout()) + ", the state " + to_string(params_[i]->shape()) + " " + to_string(l));
        (*arrays)[i] = storage<T, D>::from_host(t.local());
      }
    }
    step_ = global_step;
  }

 protected:
  optimizer(std::string name, std::vector<nn::parameter<T, D>*> params, learning_rate<T> lr, T weight_decay)
      : name_(std::move(name)), params_(std::move(params)), lr_(std::move(lr)), weight_decay_(weight_decay) {
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!params_[i]) throw error(name_ + ": parameter " + std::to_string(i) + " is null");
  }

  /// Updates parameter i's shard `p` with its gradient `g` at learning rate `lr`.
  virtual void update(std::size_t i, std::span<T> p, std::span<const T> g, T lr) = 0;
  /// The same on a device other than the host, for the parameters `which` at once (their
  /// shards' arrays `p` and gradients' `g`, entry by entry): the backend's batched
  /// kernels, a few launches for a whole network.
  virtual void update_on_device(std::span<const std::size_t> which, std::span<array* const> p,
                                std::span<const array* const> g, T lr) {
    (void)which;
    (void)p;
    (void)g;
    (void)lr;
    throw error(name_ + ": no update of parameters on device " + std::string(D::name));
  }

  /// The optimizer's state arrays by kind, each a vector of one array per parameter (in
  /// the order of parameters(), empty until made), under MindSpore's names: Momentum's
  /// "moments", Adam's "moment1" and "moment2", SGD's "accum" (none without momentum).
  /// Checkpoints save and load the state through them (state_tensors, load_state).
  virtual std::vector<std::pair<std::string, std::vector<array>*>> state_slots() { return {}; }

  /// A zeroed state array per parameter, the shape of its piece of state (its shard, or
  /// less with optimizer parallel; made at first use).
  void ensure_state(std::vector<array>& state) const {
    if (!state.empty()) return;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      state.push_back(storage<T, D>::empty(state_shape(i)));
      storage<T, D>::fill(state.back(), T(0));
    }
  }
  /// A host state array as the span the host kernels take.
  static std::span<T> span_of(array& a) { return std::span<T>(a.data(), a.size()); }

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

 private:
  struct parallel_state {
    parallel_options opt;
    context* ctx = nullptr;       // the ranks of the parameters not placed elsewhere
    std::vector<layout> layouts;  // each parameter's state layout
  };
  std::optional<parallel_state> parallel_;
  struct placement {
    bool here = true;         // this rank updates the parameter
    context* ctx = nullptr;   // over these ranks (null: parallel_state's)
  };
  std::vector<placement> placed_;  // per parameter, set by place_parameter (empty: all here)

  // Moves parameter i's x into l over the parameter's ranks.
  tensor move_over_ranks(std::size_t i, const tensor& x, const layout& l) const {
    context* c = !placed_.empty() && placed_[i].ctx ? placed_[i].ctx : parallel_->ctx;
    return redistribute(x, l, *c);
  }

  // Per parameter, the order its state arrays hold their values in: a host form's
  // layout (the layout_only() of its weights' and gradient's form), or row-major (null).
  std::vector<std::unique_ptr<host_form<T>>> state_order_;

  // Brings parameter i's state arrays (each kind's) to the order of `order`, a form of
  // the parameter's shard, or to row-major order (null).
  void state_in_order(std::size_t i, const host_form<T>* order) {
    if (state_order_.size() < params_.size()) state_order_.resize(params_.size());
    std::unique_ptr<host_form<T>>& now = state_order_[i];
    if (order ? now && now->same_layout(*order) : !now) return;
    for (auto& slot : state_slots()) {
      if (i >= slot.second->size()) continue;  // made at the first update, zeros in any order
      T* a = (*slot.second)[i].data();
      if (now) {
        const std::unique_ptr<host_form<T>> f = now->empty_like();
        std::copy(a, a + f->values().size(), f->values().data());
        f->to_plain(a);
      }
      if (order) {
        const std::unique_ptr<host_form<T>> f = order->empty_like();
        f->from_plain(a);
        std::copy(f->values().begin(), f->values().end(), a);
      }
    }
    now = order ? order->layout_only() : nullptr;
  }

  // Parameter i's shard `p` moves by `g` (same layout). On the host, where the gradient
  // or the parameter is held in a form that only reorders the shard's elements (the
  // convolutions' weights, kernels/cpu/dnnl.hpp), the update runs on the forms' buffers,
  // the state in their order, and the parameter stays in that form for the next step:
  // the gradient's form, the parameter brought to it; else the parameter's, a plain
  // gradient (summed over the ranks in row-major order) brought to it.
  void apply(std::size_t i, tensor& p, const tensor& g, T lr) {
    if constexpr (std::is_same_v<D, cpu_device>) {
      if (const host_form<T>* gf = g.form(); gf && gf->is_permutation()) {
        if (!p.form() || !p.form()->same_layout(*gf)) {
          std::unique_ptr<host_form<T>> f = gf->empty_like();
          f->from_plain(std::as_const(p).local().data());
          p.keep_form(std::move(f));
        }
        update_in_form(i, p, *gf, lr);
        return;
      }
      if (const host_form<T>* pf = p.form(); pf && pf->is_permutation()) {
        const std::unique_ptr<host_form<T>> gf = pf->empty_like();
        gf->from_plain(g.data().data());
        update_in_form(i, p, *gf, lr);
        return;
      }
      state_in_order(i, nullptr);
      update(i, p.data(), g.data(), lr);
    } else {
      array* pa = &p.local();
      const array* ga = &g.local();
      update_on_device({&i, 1}, {&pa, 1}, {&ga, 1}, lr);
    }
  }

  // The update of parameter i where p holds a form laid out as gf (the gradient's
  // values in it): on the forms' buffers, the state brought to their order.
  void update_in_form(std::size_t i, tensor& p, const host_form<T>& gf, T lr) {
    state_in_order(i, &gf);
    host_form<T>& w = *p.form_for_update();
    update(i, w.values(), gf.values(), lr);
  }

  extents state_shape(std::size_t i) const { return local_shape(state_layout(i), params_[i]->shape()); }

  // Optimizer parallel's step: each gradient into its state layout (a ReduceScatter of
  // partial sums; a local slice of a reduced gradient), the parameter's piece updated
  // there and gathered back into the parameter's layout.
  void parallel_step(const std::vector<tensor>& grads) {
    parallel_state& par = *parallel_;
    if (par.layouts.empty())
      for (std::size_t i = 0; i < params_.size(); ++i) par.layouts.push_back(state_layout(i));
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!updates_here(i)) continue;
      const tensor& p = params_[i]->data();
      const tensor& g = grads[i];
      if (!(g.global_shape() == p.global_shape()) || g.layout().dev.size() != p.layout().dev.size())
        throw error(name_ + ": the gradient of parameter '" + params_[i]->name() + "' is " +
                    to_string(g.global_shape()) + " " + to_string(g.layout()) + " on mesh " + to_string(g.layout().dev) +
                    ", the parameter " + to_string(p.global_shape()) + " " + to_string(p.layout()) + " on mesh " +
                    to_string(p.layout().dev) + ": optimizer parallel needs the parameter's shape over the same ranks");
    }
    const T lr = lr_(step_);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!updates_here(i)) continue;
      nn::parameter<T, D>& p = *params_[i];
      const layout& sl = par.layouts[i];
      std::optional<tensor> moved;
      if (!(grads[i].layout() == sl)) moved = move_over_ranks(i, grads[i], sl);
      const tensor& g = moved ? *moved : grads[i];
      if (sl == p.layout()) {
        apply(i, p.data(), g, lr);
      } else {
        tensor piece = move_over_ranks(i, p.data(), sl);  // a local slice: this rank's piece
        apply(i, piece, g, lr);
        p.set_data(move_over_ranks(i, piece, p.layout()));  // AllGather over the replicas
      }
    }
    ++step_;
  }
};

}  // namespace tessera::optim
