// Modules (MindSpore's Cell) and their parameters: a parameter is a named global shape
// with an initializer and, once the network is built, this rank's shard in the layout
// its module's operator strategies give it. A module lists its parameters and child
// modules; the network's dotted names ("seq.0.weight"), trainable parameters, train
// and eval modes and data-parallel strategies come from that list.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/autodiff/ops.hpp>
#include <tessera/autodiff/tape.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/refine.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/graph/graph.hpp>
#include <tessera/nn/init.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::nn {

template <class T, class D = cpu_device>
class parameter;

/// Told by a training step as each parameter's gradient becomes final during the
/// backward pass (train::distributed_grad_reducer is one: it starts reducing at once).
template <class T, class D = cpu_device>
class grad_listener {
 public:
  virtual ~grad_listener() = default;
  /// The backward pass of a step that differentiates `p` is about to run.
  virtual void backward_begin() = 0;
  /// The gradient of `p`, `g`, is final (in the layout the backward produced it,
  /// possibly partial). Its storage (g.data()) stays where it is until the listener is
  /// given the step's gradients back (the tensor object itself may move), so the
  /// listener may reduce it in place. `nodes_left` is the number of tape nodes the
  /// backward pass has still to visit.
  virtual void grad_ready(parameter<T, D>& p, tensor_on<T, D>& g, int nodes_left) = 0;
};

/// A trainable tensor of a module: a global shape, an initializer and, once built, this
/// rank's shard (a tensor of device D in the layout the module's strategy gives it).
/// The initializer draws on the host in the same order on every device, so a
/// parameter of a GPU network holds the very values of its host twin.
///
///     nn::parameter<float> w(extents{512, 784}, "normal");
///     w.build(layout::replicated(mesh{2}, 2), rank, seed);   // modules do this in build()
///     w.data().local();                                     // this rank's shard
template <class T, class D>
class parameter {
 public:
  using tensor = tensor_on<T, D>;
  /// The shard's array type (xt::xarray<T> on the host).
  using array = typename storage<T, D>::array;

  parameter(extents shape, initializer init, bool requires_grad = true)
      : shape_(shape), init_(std::move(init)), requires_grad_(requires_grad) {}

  /// The full dotted name ("dense_relu_sequential.0.weight") once the network is
  /// built; until then empty, or what set_name gave.
  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }
  const extents& shape() const { return shape_; }
  const initializer& init() const { return init_; }

  /// MindSpore's requires_grad: trainable_params() lists only these.
  bool requires_grad() const { return requires_grad_; }
  void set_requires_grad(bool r) { requires_grad_ = r; }

  /// MindSpore's layerwise_parallel (hybrid_parallel only): the parameter is each rank's
  /// own slice, and its gradient is not reduced over the ranks.
  bool layerwise_parallel() const { return layerwise_; }
  void set_layerwise_parallel(bool l) { layerwise_ = l; }

  bool built() const { return data_.has_value(); }
  /// This rank's shard; throws before the network is built:
  /// "parameter 'fc.weight': not built yet: call build(ctx) on the network first".
  tensor& data() {
    if (!data_) not_built();
    return *data_;
  }
  const tensor& data() const {
    if (!data_) not_built();
    return *data_;
  }
  const tessera::layout& layout() const { return data().layout(); }

  /// The layout build() will give the parameter (set by its module's place()).
  void set_target_layout(const tessera::layout& l) { target_ = l; }
  const std::optional<tessera::layout>& target_layout() const { return target_; }

  /// Draws the global tensor from the initializer under `seed` and keeps this rank's
  /// shard of `l`: the value at a global index depends only on (seed, name, index).
  /// The shard is drawn on the host and copied to device D.
  void build(const tessera::layout& l, int rank, std::uint64_t seed) {
    dist_tensor<T> t(l, shape_, rank);
    const initializer::drawer d = init_.draw(shape_, stream_key(seed, name_));
    index_t stride[max_tensor_ndim] = {};
    index_t s = 1;
    for (int k = shape_.ndim - 1; k >= 0; --k) {
      stride[k] = s;
      s *= shape_[k];
    }
    t.fill_global([&](const auto& idx) {
      index_t lin = 0;
      for (int k = 0; k < shape_.ndim; ++k) lin += idx[k] * stride[k];
      return T(d(std::uint64_t(lin)));
    });
    if constexpr (std::is_same_v<D, cpu_device>) {
      data_ = std::move(t);
    } else {
      data_ = tensor(t.layout(), t.global_shape(), t.rank(), storage<T, D>::from_host(t.local()));
    }
  }

  /// Replaces the value (same global shape; any layout).
  void set_data(tensor v) {
    if (!(v.global_shape() == shape_))
      throw error("parameter '" + name_ + "': set_data: the value is " + to_string(v.global_shape()) +
                  ", the parameter " + to_string(shape_));
    data_ = std::move(v);
  }

  // ---- use on a tape ----------------------------------------------------------

  /// The parameter's value on tape `t`: a leaf that refers to the shard (no copy),
  /// made at first use so that it sits on the tape just before the operators that use
  /// it (its gradient is then final as soon as the backward pass has passed them). It
  /// needs a gradient only when a training step asked for one (expect_grad).
  autodiff::var<T, D> on(autodiff::tape<T, D>& t) {
    if (bind_.serial != t.serial()) bind_ = binding{t.serial(), -1, false, -1};
    if (bind_.id < 0) bind_.id = t.leaf_view(data(), bind_.grad).id;
    return {&t, bind_.id};
  }
  /// The parameter on the tape of `like` (a value of a tape): on(*like.t).
  autodiff::var<T, D> on(const autodiff::var<T, D>& like) { return on(*like.t); }

  /// The parameter in the graph traced by the builder of `like`: a parameter node named
  /// with the parameter's dotted name and global shape, made at first use in that
  /// builder (a module called twice shares its parameters).
  graph::value on(const graph::value& like) {
    graph::graph_builder& b = like.builder();
    if (trace_serial_ != b.serial()) {
      if (name_.empty())
        throw error("parameter of shape " + to_string(shape_) +
                    ": traced without a name: trace the network from its root module (nn::trace), which names "
                    "every parameter");
      trace_node_ = b.parameter(name_, shape_, layerwise_).id();
      trace_serial_ = b.serial();
    }
    return b.value_of(trace_node_);
  }

  /// Marks the parameter as differentiated on the tape of serial `serial`, as slot
  /// `slot` of the step's gradient list. Called before the forward pass.
  void expect_grad(std::uint64_t serial, int slot) { bind_ = binding{serial, -1, true, slot}; }
  /// The leaf id on tape `serial` (-1 if the forward pass has not used it) and slot.
  int leaf_id(std::uint64_t serial) const { return bind_.serial == serial ? bind_.id : -1; }
  int grad_slot(std::uint64_t serial) const { return bind_.serial == serial ? bind_.slot : -1; }
  void unbind() { bind_ = binding{}; }

  /// The listener told of this parameter's final gradient during backward (or null).
  grad_listener<T, D>* listener() const { return listener_; }
  void set_listener(grad_listener<T, D>* l) { listener_ = l; }

  /// Storage for this parameter's next gradient shard, of shape `local_shape`: the
  /// last one given back (recycle_grad_storage) when it has that size, else new. A
  /// step then writes its gradient where the last step's was, instead of in fresh
  /// memory (which the system must map and zero page by page).
  array take_grad_storage(const extents& local_shape) {
    if constexpr (std::is_same_v<D, cpu_device>) {
      const std::vector<std::size_t> shape(local_shape.v.begin(), local_shape.v.begin() + local_shape.ndim);
      if (spare_ && index_t(spare_->size()) == local_shape.size()) {
        xt::xarray<T> a = std::move(*spare_);
        spare_.reset();
        a.reshape(shape);
        return a;
      }
      return xt::xarray<T>::from_shape(shape);
    } else {
      if (spare_ && index_t(spare_->size()) == local_shape.size()) {
        array a = std::move(*spare_);
        spare_.reset();
        a.reshape(typename array::shape_type(local_shape.v.begin(), local_shape.v.begin() + local_shape.ndim));
        return a;
      }
      return storage<T, D>::empty(local_shape);
    }
  }
  /// Gives a used gradient shard's storage back for the next step (the optimizer does
  /// after its update). On a device it is not kept: the device's kernels write new
  /// arrays, and its caching allocator reuses the block once the caller frees it.
  void recycle_grad_storage(array&& a) {
    if constexpr (std::is_same_v<D, cpu_device>) {
      if (data_ && index_t(a.size()) == data_->local_shape().size()) spare_ = std::move(a);
    } else {
      (void)a;
    }
  }

 private:
  [[noreturn]] void not_built() const {
    throw error("parameter '" + name_ + "': not built yet: call build(ctx) on the network first");
  }
  struct binding {
    std::uint64_t serial = 0;
    int id = -1;
    bool grad = false;
    int slot = -1;
  };

  std::string name_;
  extents shape_;
  initializer init_;
  bool requires_grad_ = true;
  bool layerwise_ = false;
  std::uint64_t trace_serial_ = 0;
  int trace_node_ = -1;
  std::optional<tensor> data_;
  std::optional<tessera::layout> target_;
  binding bind_;
  grad_listener<T, D>* listener_ = nullptr;
  std::optional<array> spare_;
};

template <class T, class D = cpu_device>
class module;

/// What a module's visit() is given: one call per direct parameter and child module.
template <class T, class D = cpu_device>
class visitor {
 public:
  virtual ~visitor() = default;
  virtual void param(std::string_view name, parameter<T, D>& p) = 0;
  virtual void child(std::string_view name, module<T, D>& m) = 0;
};

namespace detail {
template <class T, class D, class P, class M>
class lambda_visitor final : public visitor<T, D> {
 public:
  lambda_visitor(P p, M m) : p_(std::move(p)), m_(std::move(m)) {}
  void param(std::string_view name, parameter<T, D>& x) override { p_(name, x); }
  void child(std::string_view name, module<T, D>& x) override { m_(name, x); }

 private:
  P p_;
  M m_;
};
template <class T, class D, class P, class M>
void visit_with(module<T, D>& m, P p, M c) {
  lambda_visitor<T, D, P, M> v(std::move(p), std::move(c));
  m.visit(v);
}
}  // namespace detail

/// The base of every module, MindSpore's Cell. A module lists its direct parameters
/// and child modules in visit(); its forward pass is a call operator on tape values
/// (autodiff::var), so that value_and_grad differentiates it:
///
///     struct network : nn::module<float> {
///       nn::flatten<float> flatten;
///       nn::dense<float> fc{784, 10, "normal", "zeros"};
///       void visit(nn::visitor<float>& v) override {
///         v.child("flatten", flatten);
///         v.child("fc", fc);
///       }
///       template <class V> V operator()(V x) { return fc(flatten(x)); }
///     };
///     network net;
///     net.build(ctx);                         // parameters drawn, laid out, named "fc.weight", ...
///     auto params = net.trainable_params();
///
/// A module refers to its members, not to copies: once its parameters are given to an
/// optimizer, a network must stay where it is (not be moved or copied).
///
/// D is the device of the parameters and of the tapes the forward pass runs on: a
/// network of `nn::dense<float, cuda_device>` layers keeps its weights on the GPU and
/// takes `autodiff::var<float, C, cuda_device>` inputs.
template <class T, class D>
class module {
 public:
  using value_type = T;
  using device_type = D;
  virtual ~module() = default;

  /// Calls v.param(name, p) for each direct parameter and v.child(name, m) for each
  /// direct child module.
  virtual void visit(visitor<T, D>& v) = 0;

  /// Sets the target layouts of the module's own parameters for `device_num` devices,
  /// from its operators' strategies (data parallel where none is set).
  virtual void place(int device_num) { (void)device_num; }
  /// Sets the module's own operators back to data-parallel strategies.
  virtual void reset_strategies() {}
  /// Told the module's dotted name and the network's seed when the network is built or
  /// traced (modules that draw random numbers, such as dropout, key their streams on
  /// them). Overrides call module::named first, which keeps the name (full_name()).
  virtual void named(std::string_view full_name, std::uint64_t seed) {
    full_name_ = std::string(full_name);
    (void)seed;
  }
  /// Told when set_train changes the mode of this module (dropout tells its operator).
  virtual void training_changed(bool mode) { (void)mode; }
  /// MindSpore's `cell.pipeline_stage = k`: in a traced graph (nn::trace), the module's
  /// operators, and its descendants' where they set none, are on pipeline stage k
  /// (graph/pipeline.hpp; parallel_config::pipeline_stages). -1 (the start): the
  /// enclosing module's, or, for none, the latest stage of the operator's inputs.
  auto set_pipeline_stage(int stage) -> module& {
    if (stage < -1)
      throw error("module '" + full_name_ + "': set_pipeline_stage: a stage is 0 or more (or -1: none), got " +
                  std::to_string(stage));
    pipeline_stage_ = stage;
    return *this;
  }
  int pipeline_stage() const { return pipeline_stage_; }

  /// The dotted name from the root module ("dense_relu_sequential.0"; "" for the root):
  /// traced operators are named after it ("dense_relu_sequential.0.matmul").
  const std::string& full_name() const { return full_name_; }
  /// The name of this module's operator `op` in a traced graph: "<full name>.<op>".
  std::string op_name(std::string_view op) const { return join(full_name_, op); }

  /// Every parameter of the module and its descendants with its dotted name, in visit
  /// order (MindSpore's parameters_and_names).
  std::vector<std::pair<std::string, parameter<T, D>*>> named_parameters(const std::string& prefix = "") {
    std::vector<std::pair<std::string, parameter<T, D>*>> out;
    collect(*this, prefix, out);
    return out;
  }
  /// Every parameter, in visit order.
  std::vector<parameter<T, D>*> parameters() {
    std::vector<parameter<T, D>*> out;
    for (auto& [n, p] : named_parameters()) out.push_back(p);
    return out;
  }
  /// The parameters that require a gradient (MindSpore's trainable_params).
  std::vector<parameter<T, D>*> trainable_params() {
    std::vector<parameter<T, D>*> out;
    for (auto& [n, p] : named_parameters())
      if (p->requires_grad()) out.push_back(p);
    return out;
  }

  /// Training (true) or evaluation mode, for this module and its descendants (dropout
  /// is the identity in evaluation mode). Modules start in training mode.
  auto set_train(bool mode = true) -> module& {
    training_ = mode;
    training_changed(mode);
    detail::visit_with<T, D>(*this, [](std::string_view, parameter<T, D>&) {},
                          [mode](std::string_view, module<T, D>& m) { m.set_train(mode); });
    return *this;
  }
  bool training() const { return training_; }

  /// MindSpore's set_data_parallel: every operator of the module and its descendants
  /// gets the data-parallel strategy (the batch split over all ranks, parameters
  /// replicated). Call before build().
  auto set_data_parallel() -> module& {
    reset_strategies();
    detail::visit_with<T, D>(*this, [](std::string_view, parameter<T, D>&) {},
                          [](std::string_view, module<T, D>& m) { m.set_data_parallel(); });
    return *this;
  }

  /// Names every parameter with its dotted path, lays each out as its module's
  /// strategy says on the ranks of `ctx`, and draws it: every rank keeps its shard of
  /// the same global tensor, whatever the number of ranks (seeded by `seed` and the
  /// parameter's name). A parameter that already has a value (a second build, or
  /// set_data) keeps it, redistributed to its new layout.
  void build(context& ctx, std::uint64_t seed = 0) {
    seed_ = seed;
    prepare(*this, "", ctx.size(), seed);
    for (auto& [name, p] : named_parameters()) {
      const tessera::layout l = p->target_layout() ? *p->target_layout()
                                                   : tessera::layout::replicated(mesh{ctx.size()}, p->shape().ndim);
      if (p->built()) {
        if (!(p->data().layout() == l)) p->set_data(redistribute(p->data(), l, ctx));
      } else {
        p->build(l, ctx.rank(), seed);
      }
    }
    built_ = true;
  }
  bool built() const { return built_; }
  /// The seed of the last build (0 before any).
  std::uint64_t seed() const { return seed_; }

  /// Names every module and parameter with its dotted path, as build() does, without
  /// drawing anything (what tracing needs).
  void name_all(std::uint64_t seed = 0) { name_tree(*this, "", seed); }

 private:
  static void collect(module<T, D>& m, const std::string& prefix,
                      std::vector<std::pair<std::string, parameter<T, D>*>>& out) {
    detail::visit_with<T, D>(
        m, [&](std::string_view name, parameter<T, D>& p) { out.emplace_back(join(prefix, name), &p); },
        [&](std::string_view name, module<T, D>& c) { collect(c, join(prefix, name), out); });
  }
  static void prepare(module<T, D>& m, const std::string& prefix, int device_num, std::uint64_t seed) {
    m.named(prefix, seed);
    m.place(device_num);
    detail::visit_with<T, D>(
        m, [&](std::string_view name, parameter<T, D>& p) { p.set_name(join(prefix, name)); },
        [&](std::string_view name, module<T, D>& c) { prepare(c, join(prefix, name), device_num, seed); });
  }
  static void name_tree(module<T, D>& m, const std::string& prefix, std::uint64_t seed) {
    m.named(prefix, seed);
    detail::visit_with<T, D>(
        m, [&](std::string_view name, parameter<T, D>& p) { p.set_name(join(prefix, name)); },
        [&](std::string_view name, module<T, D>& c) { name_tree(c, join(prefix, name), seed); });
  }
  static std::string join(const std::string& prefix, std::string_view name) {
    return prefix.empty() ? std::string(name) : prefix + "." + std::string(name);
  }

  bool training_ = true;
  bool built_ = false;
  int pipeline_stage_ = -1;
  std::uint64_t seed_ = 0;
  std::string full_name_;
};

/// op(x, more...) on tape values (autodiff::apply) or traced on graph values
/// (graph::apply): a module's forward pass written once runs eagerly and traces.
///
///     template <class V> V operator()(V x) { return nn::apply(ops::relu_op{}, x); }
template <ops::operator_definition Op, class V, class... More>
  requires(std::same_as<More, V> && ...)
V apply(const Op& op, V x, More... more) {
  if constexpr (std::same_as<V, graph::value>) return graph::apply(op, x, more...);
  else return autodiff::apply(op, x, more...);
}

/// apply, naming the traced node `name` (numbered if taken); eager values ignore it.
template <ops::operator_definition Op, class V, class... More>
  requires(std::same_as<More, V> && ...)
V apply_named(const std::string& name, const Op& op, V x, More... more) {
  if constexpr (std::same_as<V, graph::value>) return x.builder().apply(op, {x, more...}, name);
  else return autodiff::apply(op, x, more...);
}

/// Whether V is a traced graph value (else a tape value).
template <class V>
inline constexpr bool is_traced = std::same_as<V, graph::value>;

namespace detail {

/// `x` as a shard of layout `l`: x itself (borrowed, no copy) when it is placed the
/// same way (core/refine.hpp's same_placement: operators with different strategies have
/// different device matrices, (2, 1, 1) for MatMul ((2, 1), (1, 1)) and (2, 1) for ReLU
/// ((2, 1)), that place a batch-split tensor identically), else its redistribution:
/// exec/redistribute.hpp's in_layout.
template <class T, class D>
laid_out<T, D> placed_as(const tensor_on<T, D>& x, const layout& l, context& ctx) {
  return in_layout(x, l, ctx);
}

/// The mesh axes that split dim `d` of `l` (as an axis mask).
inline axis_mask axes_splitting(const layout& l, int d) { return l.split[d].mask(); }

/// The data-parallel strategy of an operator with inputs of the given ranks on
/// `device_num` devices: the first dim of each input split device_num ways, the others
/// whole. ((2, 1), (2, 1)) for two matrices on 2 devices.
inline strategy data_parallel_strategy(std::initializer_list<int> ndims, int device_num) {
  strategy st;
  for (int nd : ndims) {
    split_tuple t;
    t.n = nd;
    for (int d = 0; d < nd; ++d) t.v[d] = d == 0 ? device_num : 1;
    st.in[st.n++] = t;
  }
  return st;
}

}  // namespace detail

}  // namespace tessera::nn
