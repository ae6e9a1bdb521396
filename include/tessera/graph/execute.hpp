// Runs a parallel graph (graph/parallel.hpp) on each rank: the forward pass through
// the sharded operators of ops/ recorded on an autodiff tape, the redistributions the
// parallel pass planned on every edge (forward, and the gradients' backward), the
// backward pass, and an optimizer step. Returns the loss and the parameters'
// gradients in the parameters' layouts.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <typeindex>
#include <unordered_map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/autodiff/ops.hpp>
#include <tessera/autodiff/tape.hpp>
#include <tessera/comm/communicator.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/graph/dump.hpp>
#include <tessera/graph/op_def.hpp>
#include <tessera/graph/parallel.hpp>
#include <tessera/graph/pipeline.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/operators.hpp>
#include <tessera/tensor/copy_box.hpp>
#include <tessera/tensor/device.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::graph {

/// Runs one operator of the graph on the tape: given its op_def, its plan (strategy
/// and layouts) and its inputs (already in the layouts the plan names), records the
/// output and its backward, and returns the output.
template <class T, class D = cpu_device>
using op_runner = autodiff::var<T, D> (*)(const op_def&, const op_plan&, const std::vector<autodiff::var<T, D>>&);

namespace detail {

// The runner of every operator definition Op: the definition with the plan's strategy,
// recorded by autodiff::apply (its one forward and backward).
template <ops::operator_definition Op, class T, class D>
autodiff::var<T, D> run_definition(const op_def& d, const op_plan& p, const std::vector<autodiff::var<T, D>>& x) {
  Op op = *d.definition<Op>();
  op.st = p.st;
  if constexpr (requires { op.next_call(); }) op.next_call();  // a stateful operator's draw (Dropout)
  return autodiff::apply(op, x);
}

template <class T, class D, class... Ops>
void add_runners(std::unordered_map<std::type_index, op_runner<T, D>>& r, ops::type_list<Ops...>) {
  (r.emplace(std::type_index(typeid(Ops)), &run_definition<Ops, T, D>), ...);
}

}  // namespace detail

/// Runs a parallel graph on the ranks of a context (whose size must be the graph's
/// device count; every rank runs the same calls). Holds a copy of the graph and the
/// parameters, each rank its shards, or refers to parameters held elsewhere (a
/// module network's: bind_parameter).
///
///     graph::executor<float> ex(pg, world);             // world: any_communicator (or a context)
///     ex.set_parameter("w", w0);                       // the global value: each rank keeps its shard
///     auto batch = ex.slice_batch({x, label});          // this rank's part of a global batch
///     optim::momentum<float> opt(0.2f, 0.1f);
///     float loss = ex.train_step(batch, opt);
///
/// A plan with pipeline stages (parallel_config::pipeline_stages, micro_size) runs on
/// the ranks of every stage: each rank holds and runs its stage's part (its operators
/// and parameters; parameters() lists those), the operators sharded over the stage's
/// ranks. A step takes micro_size micro-batches (dim 0 of each input micro_size times
/// the traced one: slice_batch of a whole batch of micro_size traced batches gives it)
/// and runs their forward and backward passes in the schedule's order
/// (graph/pipeline.hpp), sending the values that cross stages, rank i of a stage to
/// rank i of the next, and their gradients back without waiting (the world's isend).
/// Each micro-batch's values are released once its backward has run. The loss is the
/// mean of the micro-batches' losses, on every rank; the gradients are those of that
/// mean, summed over the micro-batches on each stage as the backward passes make them
/// (partial sums included) and reduced into the parameters' layouts once a step (a
/// parameter read by several operators: each micro-batch), or handed unreduced to a
/// gradient hook.
template <class T, class D = cpu_device>
class executor {
 public:
  using var = autodiff::var<T, D>;
  using tape = autodiff::tape<T, D>;
  using tensor = tensor_on<T, D>;
  using storage_type = storage<T, D>;

  /// The loss (the same on every rank, except in hybrid_parallel where each rank has
  /// its own) and the gradient of every parameter, in parameter order: in the
  /// parameter's layout, or, when a gradient hook took them, as the backward pass made
  /// them (possibly partial).
  struct result {
    T loss{};
    std::vector<tensor> grads;
  };

  /// Told each parameter's gradient as the backward pass finishes with it: the index in
  /// the parameter list, the gradient as the pass made it (possibly partial sums; its
  /// storage stays where it is until value_and_grad returns), and the tape nodes the
  /// pass has still to visit. A gradient reducer starts its reduction there.
  using gradient_hook = std::function<void(std::size_t index, tensor& grad, int nodes_left)>;

  /// The executor on the ranks of `world`, with a context of its own.
  executor(const parallel_graph& pg, any_communicator& world)
      : pg_(pg), own_ctx_(std::make_unique<tessera::context>(world)), ctx_(own_ctx_.get()) {
    init();
  }
  /// The executor on the ranks of `ctx` (shared: its communicators are reused).
  executor(const parallel_graph& pg, tessera::context& ctx) : pg_(pg), ctx_(&ctx) { init(); }

  /// Lets the executor run an operator defined outside the library (the library's own,
  /// ops::builtin_operators, it knows): its definition's forward and backward, found by
  /// argument-dependent lookup, run on this executor's tensors.
  template <ops::operator_definition Op>
  void add_operator() {
    runners_[std::type_index(typeid(Op))] = &detail::run_definition<Op, T, D>;
  }

  const parallel_graph& plan() const { return pg_; }
  /// The context the operators run on: with pipeline stages, the ranks of this rank's
  /// stage.
  tessera::context& context() { return *ctx_; }
  /// This rank in the job.
  int rank() const { return world_ctx_->rank(); }

  // ---- parameters -------------------------------------------------------------

  /// The parameters the executor holds, in the graph's order, each this rank's shard:
  /// what an optimizer steps (a bound parameter's entry is not used). With pipeline
  /// stages, the parameters of this rank's stage only.
  std::vector<tensor>& parameters() { return params_; }
  /// Whether this rank holds parameter `name` (with pipeline stages: it is its stage's).
  bool holds_parameter(std::string_view name) const { return bound_[param_index(name)] != nullptr; }
  const tensor& parameter(std::string_view name) const {
    const std::size_t i = param_index(name);
    if (!bound_[i])
      throw error("graph executor: parameter '" + std::string(name) + "' is on pipeline stage " +
                  std::to_string(pg_.physical_stage(param_stage(i))) + "; this rank runs stage " + std::to_string(stage_));
    return *bound_[i];
  }
  /// Sets a parameter from its whole value (the same on every rank); each rank keeps
  /// its shard (with pipeline stages, the ranks of the parameter's stage: the others
  /// ignore it). In hybrid_parallel the value is this rank's own (its shape the graph's).
  void set_parameter(std::string_view name, const xt::xarray<T>& value) {
    const std::size_t i = param_index(name);
    if (!bound_[i]) return;
    const int id = pg_.traced().parameters()[i];
    bound_[i]->assign_local(storage_type::from_host(
        slice(pg_.value_layout(id), pg_.traced().at(id).shape, value, "parameter '" + std::string(name) + "'")));
  }
  /// Runs parameter `name` from `storage` (kept by the caller, unchanged during a step;
  /// a module's parameter) instead of the executor's own: it must have the graph's
  /// shape and the plan's layout. "graph executor: parameter 'fc.weight' is laid out as
  /// ..., the plan gives ...".
  void bind_parameter(std::string_view name, tensor& storage) {
    const std::size_t i = param_index(name);
    if (!bound_[i]) return;  // another pipeline stage's
    const int id = pg_.traced().parameters()[i];
    if (!(storage.global_shape() == pg_.traced().at(id).shape))
      throw error("graph executor: parameter '" + std::string(name) + "' is " + to_string(storage.global_shape()) +
                  ", the graph's " + to_string(pg_.traced().at(id).shape));
    if (!same_placement(storage.layout(), pg_.value_layout(id)))
      throw error("graph executor: parameter '" + std::string(name) + "' is laid out as " + describe(storage.layout()) +
                  ", the plan gives " + describe(pg_.value_layout(id)));
    bound_[i] = &storage;
  }
  /// The whole value of a distributed tensor on every rank (collective): partial sums
  /// reduced, shards gathered.
  xt::xarray<T> gather(const tensor& t) {
    return storage_type::to_host(redistribute(t, layout::replicated(t.layout().dev, t.ndim()), *ctx_).local());
  }

  // ---- data ---------------------------------------------------------------------

  /// The shape of the data this rank feeds for input `name` (with micro-batches, dim 0
  /// holds micro_size of them, one after the other).
  extents input_local_shape(std::string_view name) const { return step_shape(pg_.local_shape(input_id(name))); }
  /// This rank's part of a whole batch of input `name`, as its dataset strategy gives it
  /// (with micro-batches: `whole` is micro_size traced batches along dim 0, and each is
  /// sliced so).
  xt::xarray<T> slice_input(std::string_view name, const xt::xarray<T>& whole) const {
    const int id = input_id(name);
    const std::string what = "input '" + std::string(name) + "'";
    const int M = pg_.micro_size();
    const extents& traced = pg_.traced().at(id).shape;
    if (M == 1 || traced.ndim == 0) return slice(pg_.value_layout(id), traced, whole, what);
    if (!(shape_of(whole) == step_shape(traced)))
      throw error("graph executor: " + what + " is " + to_string(traced) + " per micro-batch, so " +
                  to_string(step_shape(traced)) + " for " + std::to_string(M) + " micro-batches; the value given is " +
                  to_string(shape_of(whole)));
    std::vector<xt::xarray<T>> parts;
    for (int m = 0; m < M; ++m) parts.push_back(slice(pg_.value_layout(id), traced, rows(whole, m, M), what));
    return join_rows(parts);
  }
  /// slice_input for every input, the whole batch listing the inputs in graph order.
  std::vector<xt::xarray<T>> slice_batch(const std::vector<xt::xarray<T>>& whole) const {
    const std::vector<int> in = pg_.traced().inputs();
    check_count(whole.size(), in.size());
    std::vector<xt::xarray<T>> out;
    for (std::size_t i = 0; i < in.size(); ++i) out.push_back(slice_input(pg_.traced().at(in[i]).name, whole[i]));
    return out;
  }

  // ---- running -----------------------------------------------------------------

  /// Forward and backward on this rank's batch (one tensor per input, in graph order,
  /// each of the shape input_local_shape gives): the loss and every parameter's
  /// gradient in the parameter's layout.
  result value_and_grad(const std::vector<xt::xarray<T>>& batch) { return value_and_grad(batch, {}); }

  /// As above, handing each parameter's gradient to `hook` as soon as the backward pass
  /// is done with it, unresolved (the hook's owner resolves it: a gradient reducer that
  /// overlaps its reductions with the rest of the pass); the result holds them so.
  /// With pipeline stages or micro-batches, this rank's parameters' gradients once the
  /// step's last backward has run, summed over the micro-batches and not reduced once
  /// a step (an optimizer with optimizer parallel reduce-scatters them).
  result value_and_grad(const std::vector<xt::xarray<T>>& batch, const gradient_hook& hook) {
    if (pg_.pipelined()) return pipelined_run(batch, hook, nullptr, nullptr);
    const traffic before = ctx_->total_stats();
    tape t(*ctx_);
    const var loss = forward(t, batch);
    result r;
    r.loss = fetch_loss(loss.value());
    var seed_from = loss;
    const int N = pg_.device_num();
    if (pg_.config().mode == parallel_mode::hybrid_parallel && N > 1) {
      // The objective is the mean of the ranks' losses: the gradient starts at 1 / N.
      seed_from = t.record(tensor(loss.value()), [id = loss.id, N](tape& tp, const tensor& g) {
        tensor s(g);
        kernels::backend<D>::scale(s.local(), T(1) / T(N));
        tp.add_grad(id, std::move(s));
      });
    }
    const std::vector<int> ps = pg_.traced().parameters();
    if (!hook) {
      backward_releasing(t, seed_from);
      for (std::size_t i = 0; i < ps.size(); ++i) r.grads.push_back(t.release_grad(param_vars_[i]));
    } else {
      // Each parameter's gradient as its leaf is reached: every node that could add to
      // it has run.
      std::vector<std::optional<tensor>> raw(ps.size());
      std::vector<int> slot_of(std::size_t(t.size()), -1);
      for (std::size_t i = 0; i < ps.size(); ++i) slot_of[std::size_t(param_vars_[i].id)] = int(i);
      auto deliver = [&](std::size_t i, std::optional<tensor> g, int nodes_left) {
        if (!g) g.emplace(bound_[i]->layout(), bound_[i]->global_shape(), ctx_->rank());  // no gradient: zeros
        raw[i] = std::move(g);
        hook(i, *raw[i], nodes_left);
      };
      t.set_leaf_hook([&](int id) {
        const int i = id < int(slot_of.size()) ? slot_of[std::size_t(id)] : -1;
        if (i >= 0) deliver(std::size_t(i), t.take_grad(id), id);
      });
      backward_releasing(t, seed_from);
      t.set_leaf_hook({});
      for (std::size_t i = 0; i < ps.size(); ++i) {
        if (!raw[i]) deliver(i, std::nullopt, 0);
        r.grads.push_back(std::move(*raw[i]));
      }
    }
    for (const gradient_reduction& gr : pg_.gradient_reductions()) {
      std::size_t i = 0;
      while (ps[i] != gr.parameter) ++i;
      ctx_->on(gr.dev).group(axis_list{0}).all_reduce(r.grads[i].data(), reduce_op::sum);
    }
    last_ = ctx_->total_stats() - before;
    return r;
  }

  /// The loss of a batch, forward only.
  T evaluate(const std::vector<xt::xarray<T>>& batch) { return evaluate(batch, {}).loss; }

  /// What evaluate() gives: the loss, and the values of the nodes asked for, each in its
  /// layout in the plan (this rank's shard).
  struct evaluation {
    T loss{};
    std::vector<tensor> values;
  };
  /// The loss of a batch, forward only, and the values of nodes `fetch` (ids in the
  /// traced graph: a network's logits, for its accuracy).
  ///
  /// With pipeline stages or micro-batches: the batch as value_and_grad takes it, the
  /// micro-batches' forward passes run in order (each released once done), the loss
  /// their mean on every rank, and `values` holds, micro-batch by micro-batch, the
  /// fetched nodes this rank's stage computes (in the order of `fetch`; nodes of other
  /// stages are not there).
  evaluation evaluate(const std::vector<xt::xarray<T>>& batch, const std::vector<int>& fetch) {
    if (pg_.pipelined()) {
      evaluation e;
      pipelined_run(batch, {}, &fetch, &e);
      return e;
    }
    tape t(*ctx_);
    std::vector<var> v;
    const var loss = forward(t, batch, &v);
    evaluation e;
    e.loss = fetch_loss(loss.value());
    for (int id : fetch) e.values.push_back(v.at(std::size_t(id)).value());
    return e;
  }

  /// value_and_grad, then opt.step(parameters(), gradients); returns the loss.
  template <class Optimizer>
  T train_step(const std::vector<xt::xarray<T>>& batch, Optimizer& opt) {
    result r = value_and_grad(batch);
    opt.step(params_, r.grads);
    return r.loss;
  }

  /// What this rank's communicators moved during the last value_and_grad (equal to
  /// plan().bytes_for_rank(rank()) in bytes; with pipeline stages, rank() of the job).
  traffic last_step_traffic() const { return last_; }
  /// With pipeline stages or micro-batches: the most values the step's tape held at
  /// once (operator outputs and the leaves copied in, parameters aside), counted after
  /// each forward and backward of a micro-batch; a schedule that releases each
  /// micro-batch's values after its backward keeps it level as micro-batches are added.
  int last_step_peak_values() const { return peak_values_; }

  /// Whether a step frees, as soon as the forward pass is done with it, each value that
  /// no operator's backward reads (ops::backward_reads_input): in ResNet-50, each
  /// block's last batch-norm output and its Add's output (a quarter less peak memory
  /// in the 224x224 step on the host). On by default; off keeps every value until its backward has run
  /// (the results are the same to the bit).
  void drop_unread_values(bool on) { drop_unread_ = on; }
  /// The values the last step's forward pass freed so (without pipeline stages).
  int last_step_dropped_values() const { return dropped_; }
  /// With pipeline stages: this rank's stage (0 without).
  int stage() const { return stage_; }

  /// Writes this rank's dumps under `dir` (graph/dump.hpp).
  void save_graphs(const std::filesystem::path& dir) const { tessera::graph::save_graphs(pg_, dir, world_ctx_->rank()); }

 private:
  // drop_after_[k]: the operator outputs no backward reads whose last reader in the
  // forward pass is node k (k itself for a value nothing reads). A reader that needs no
  // gradient runs no backward; an output that needs none has no backward either.
  void plan_drops() {
    const traced_graph& g = pg_.traced();
    drop_after_.assign(std::size_t(g.size()), {});
    for (int u = 0; u < g.size(); ++u) {
      const node& n = g.at(u);
      if (n.kind != node_kind::op || u == g.loss()) continue;
      bool read = pg_.needs_grad(u) && n.op->backward_reads_output();
      int last = u;
      for (const auto& [c, s] : g.consumers(u)) {
        read = read || (pg_.needs_grad(c) && g.at(c).op->backward_reads(s));
        last = std::max(last, c);
      }
      if (!read) drop_after_[std::size_t(last)].push_back(u);
    }
  }

  void init() {
    detail::add_runners<T, D>(runners_, ops::builtin_operators{});
    plan_drops();
    world_ctx_ = ctx_;
    if (ctx_->size() != pg_.device_num())
      throw error("graph executor: the graph was parallelized for " + std::to_string(pg_.device_num()) +
                  " devices, the communicator has " + std::to_string(ctx_->size()) + " ranks");
    if (index_t(sizeof(T)) != pg_.config().elem_bytes)
      throw error("graph executor: the graph was parallelized for " + std::to_string(pg_.config().elem_bytes) +
                  "-byte elements, the executor's are " + std::to_string(sizeof(T)) + " bytes");
    if constexpr (!std::is_same_v<D, cpu_device>)
      if (pg_.pipelined()) throw error("graph executor: pipeline stages and micro-batches run on host tensors");
    const int S = pg_.pipeline_stages();
    if (S > 1) {  // the operators run on the ranks of this rank's stage
      stage_ = pg_.stage_of_rank(ctx_->rank());
      stage_group_ = &ctx_->on(mesh{S, pg_.stage_device_num()}).group(axis_list{1});
      stage_ctx_ = std::make_unique<tessera::context>(*stage_group_);
      ctx_ = stage_ctx_.get();
      const index_t tags = index_t(pg_.boundaries().size()) * pg_.micro_size() * 2;
      if (tags > max_pipeline_tag)
        throw error("graph executor: " + std::to_string(pg_.boundaries().size()) + " values crossing stages times " +
                    std::to_string(pg_.micro_size()) + " micro-batches need " + std::to_string(tags) +
                    " message tags, more than " + std::to_string(max_pipeline_tag));
    }
    const traced_graph& g = pg_.traced();
    const std::vector<int> ps = g.parameters();
    std::size_t held = 0;
    for (std::size_t i = 0; i < ps.size(); ++i) held += pg_.physical_stage(param_stage(i)) == stage_ ? 1 : 0;
    params_.reserve(held);  // bound_ points into it
    for (std::size_t i = 0; i < ps.size(); ++i) {
      if (pg_.physical_stage(param_stage(i)) != stage_) {
        bound_.push_back(nullptr);
        continue;
      }
      params_.emplace_back(pg_.value_layout(ps[i]), g.at(ps[i]).shape, ctx_->rank());
      bound_.push_back(&params_.back());
    }
    for (int v = 0; v < S * pg_.pipeline_chunks(); ++v) stage_ops_.emplace_back();
    for (int id = 0; id < g.size(); ++id)
      if (g.at(id).kind == node_kind::op) stage_ops_[std::size_t(pg_.stage(id))].push_back(id);
  }

  // The virtual stage of parameter i (of the graph's list): its readers'.
  int param_stage(std::size_t i) const {
    const int p = pg_.traced().parameters()[i];
    return pg_.stage(pg_.traced().consumers(p).front().first);
  }
  extents step_shape(extents e) const {
    if (e.ndim > 0) e.v[0] *= pg_.micro_size();
    return e;
  }
  // Micro-batch m of M of a step's data: rows [m d, (m + 1) d) of dim 0.
  static xt::xarray<T> rows(const xt::xarray<T>& a, int m, int M) {
    extents e = shape_of(a);
    if (e.ndim == 0) return a;
    const std::size_t per = a.size() / std::size_t(M);
    e.v[0] /= M;
    xt::xarray<T> out = storage<T, cpu_device>::empty(e);
    std::copy_n(a.data() + per * std::size_t(m), per, out.data());
    return out;
  }
  static xt::xarray<T> join_rows(const std::vector<xt::xarray<T>>& parts) {
    extents e = shape_of(parts.front());
    e.v[0] *= index_t(parts.size());
    xt::xarray<T> out = storage<T, cpu_device>::empty(e);
    T* at = out.data();
    for (const xt::xarray<T>& p : parts) at = std::copy_n(p.data(), p.size(), at);
    return out;
  }

  std::size_t param_index(std::string_view name) const {
    const std::vector<int> ps = pg_.traced().parameters();
    for (std::size_t i = 0; i < ps.size(); ++i)
      if (pg_.traced().at(ps[i]).name == name) return i;
    throw error("graph executor: no parameter named '" + std::string(name) + "'");
  }
  int input_id(std::string_view name) const {
    for (int id : pg_.traced().inputs())
      if (pg_.traced().at(id).name == name) return id;
    throw error("graph executor: no input named '" + std::string(name) + "'");
  }
  void check_count(std::size_t got, std::size_t want) const {
    if (got != want)
      throw error("graph executor: a batch of " + std::to_string(got) + " tensors for " + std::to_string(want) +
                  (want == 1 ? " input" : " inputs"));
  }
  static extents shape_of(const xt::xarray<T>& a) {
    extents e;
    e.ndim = int(a.dimension());
    for (int d = 0; d < e.ndim; ++d) e.v[std::size_t(d)] = index_t(a.shape()[std::size_t(d)]);
    return e;
  }
  // This rank's shard of a whole tensor under layout l.
  xt::xarray<T> slice(const layout& l, const extents& global, const xt::xarray<T>& whole, const std::string& what) const {
    if (!(shape_of(whole) == global))
      throw error("graph executor: " + what + " is " + to_string(global) + ", the value given is " + to_string(shape_of(whole)));
    const extents ls = local_shape(l, global);
    xt::xarray<T> out = storage<T, cpu_device>::empty(ls);
    tessera::detail::copy_box(whole.data(), global, local_offset(l, global, ctx_->rank()), out.data(), ls,
                              tessera::detail::origin(ls.ndim), ls);
    return out;
  }

  // The backward pass from the scalar `from` (gradient 1), releasing each operator's
  // value, gradient and saved state as soon as its backward has run: the step's peak
  // memory is the forward's activations, not those and every gradient besides.
  static void backward_releasing(tape& t, const var& from) {
    const tensor& l = from.value();
    tensor seed(l.layout().without_partial(), l.global_shape(), l.rank());
    storage_type::fill(seed.local(), T(1));
    t.backward(from, std::move(seed));
  }

  // Moves x along a planned route into `to`.
  tensor move_along(const route& r, const tensor& x, const layout& to, const char* what) {
    if (!same_placement(x.layout(), r.from))
      throw error(std::string("graph executor: ") + what + " arrived as " + describe(x.layout()) + ", the plan expects " +
                  describe(r.from));
    if (r.p.empty()) return tensor(to, x.global_shape(), x.rank(), typename tensor::array_type(x.local()));
    return tensor(to, x.global_shape(), x.rank(), execute(r.p, x.local(), ctx_->on(r.fine)));
  }

  // The value of producer `x` as edge `e`'s consumer wants it, recording the gradient's
  // way back.
  var along_edge(tape& t, const edge_plan& e, var x) {
    const layout& to = e.forward.to;
    const bool back = e.has_backward && !(e.backward.empty() && e.backward.from == e.backward.to);
    if (e.forward.empty() && x.value().layout() == to && !back) return x;
    // An operator's output whose route moves nothing between layouts placing every
    // element alike (operators with different device matrices): the consumer takes it as
    // it is (operators borrow an input placed as they need it), and its gradient comes
    // back the same way. A parameter's gradient keeps the parameter's own layout.
    if (pg_.traced().at(e.producer).kind != node_kind::parameter && e.forward.empty() &&
        same_placement(x.value().layout(), to) &&
        (!e.has_backward || (e.backward.empty() && same_placement(e.backward.from, e.backward.to))))
      return x;
    // A parameter placed as its consumer wants it: read where it is (no copy, and a
    // kernel's form of it kept there stays). Its gradient goes back along the route,
    // or, where that moves nothing, is relabeled with the parameter's own layout.
    if (pg_.traced().at(e.producer).kind == node_kind::parameter && e.forward.empty() &&
        same_placement(x.value().layout(), to) && e.has_backward && !pg_.reduces_gradient_once(e.producer)) {
      if (e.backward.empty() && same_placement(e.backward.from, e.backward.to))
        return t.record_view(x.value(), [ix = x.id, back = e.backward.to](tape& tp, tensor&& g) {
          tp.add_grad(ix, std::move(g).relabeled(back));
        });
      return t.record_view(x.value(), [this, &e, ix = x.id](tape& tp, const tensor& g) {
        tp.add_grad(ix, move_along(e.backward, g, e.backward.to, "a gradient"));
      });
    }
    tensor y = move_along(e.forward, x.value(), to, "a value");
    if (!e.has_backward) return t.leaf(std::move(y), false);
    if (pg_.reduces_gradient_once(e.producer))  // summed over the micro-batches, resolved once a step
      return t.record(std::move(y), [ix = x.id](tape& tp, tensor&& g) { tp.add_grad(ix, std::move(g)); });
    return t.record(std::move(y), [this, &e, ix = x.id](tape& tp, const tensor& g) {
      tp.add_grad(ix, move_along(e.backward, g, e.backward.to, "a gradient"));
    });
  }

  // Data input `id`'s leaf from this rank's data (checked against its shard's shape).
  var input_leaf(tape& t, int id, const xt::xarray<T>& data) {
    const node& n = pg_.traced().at(id);
    const extents want = pg_.local_shape(id);
    if (!(shape_of(data) == want))
      throw error("graph executor: input '" + n.name + "': this rank's data is " + to_string(shape_of(data)) +
                  ", dataset_strategy " + pg_.config().dataset.to_string() + " gives each rank " + to_string(want) +
                  " of " + to_string(n.shape));
    return t.leaf(tensor(pg_.value_layout(id), n.shape, ctx_->rank(), storage_type::from_host(data)), false);
  }
  var constant_leaf(tape& t, int id) {
    tensor c(pg_.value_layout(id), pg_.traced().at(id).shape, ctx_->rank());
    storage_type::fill(c.local(), T(pg_.traced().at(id).constant));
    return t.leaf(std::move(c), false);
  }
  // Runs operator `id` on the values `v` of its inputs (by node id), each moved along
  // its edge. With `drop`, an input moved into a copy of its own that the operator's
  // backward does not read is freed once the operator has run.
  var run_op(tape& t, int id, const std::vector<var>& v, bool drop = false) {
    const traced_graph& g = pg_.traced();
    const node& n = g.at(id);
    std::vector<var> in;
    for (std::size_t s = 0; s < n.inputs.size(); ++s)
      in.push_back(along_edge(t, pg_.edge(id, int(s)), v[std::size_t(n.inputs[s])]));
    const auto it = runners_.find(n.op->definition_type());
    if (it == runners_.end())
      throw error("graph executor: " + g.describe(id) + " is an operator defined outside the library (" +
                  n.op->definition_type().name() + "); let the executor run it with add_operator<Op>()");
    var out = it->second(*n.op, pg_.op(id), in);
    if (drop)
      for (std::size_t s = 0; s < in.size(); ++s)
        if (in[s].id != v[std::size_t(n.inputs[s])].id && !n.op->backward_reads(int(s))) {
          t.drop_elements(in[s].id);
          ++dropped_;
        }
    // Placed as the rule says (an operator may keep its input's device matrix when
    // that input arrived under another, placing alike: see along_edge).
    if (!same_placement(out.value().layout(), pg_.value_layout(id)))
      throw error("graph executor: " + g.describe(id) + " gave " + describe(out.value().layout()) +
                  ", its rule says " + describe(pg_.value_layout(id)));
    if (!pg_.needs_grad(id)) out = t.leaf(out.value(), false);
    return out;
  }

  // The forward pass on this rank's batch. Unless `values` asks for every value, or
  // drop_unread_values(false) was called, each value no backward reads is freed once
  // its last reader has run (drop_after_).
  var forward(tape& t, const std::vector<xt::xarray<T>>& batch, std::vector<var>* values = nullptr) {
    const traced_graph& g = pg_.traced();
    check_count(batch.size(), g.inputs().size());
    std::vector<var> v(std::size_t(g.size()));
    const bool drop = drop_unread_ && !values;
    dropped_ = 0;
    param_vars_.clear();
    std::size_t next_input = 0, next_param = 0;
    for (int id = 0; id < g.size(); ++id) {
      const node& n = g.at(id);
      if (n.kind == node_kind::input) {
        v[std::size_t(id)] = input_leaf(t, id, batch[next_input++]);
      } else if (n.kind == node_kind::parameter) {
        v[std::size_t(id)] = t.leaf_view(*bound_[next_param++], true);
        param_vars_.push_back(v[std::size_t(id)]);
      } else if (n.kind == node_kind::constant) {
        v[std::size_t(id)] = constant_leaf(t, id);
      } else {
        v[std::size_t(id)] = run_op(t, id, v, drop);
        if (drop)
          for (int u : drop_after_[std::size_t(id)]) {
            t.drop_elements(v[std::size_t(u)].id);
            ++dropped_;
          }
      }
    }
    const var loss = v[std::size_t(g.loss())];
    if (values) *values = std::move(v);
    return loss;
  }

  // ---- pipeline stages ---------------------------------------------------------

  // Sends in flight, each with the copy it reads (dropped once sent), and the values
  // handed from one chunk of this rank to another, by tag.
  struct pipeline_flight {
    std::deque<std::pair<any_request, tensor>> sends;
    std::map<int, tensor> local;
    void drop_sent() {
      while (!sends.empty() && sends.front().first.test()) sends.pop_front();
    }
    void wait() {
      for (auto& [q, x] : sends) q.wait();
      sends.clear();
    }
  };
  // One chunk's part of one micro-batch on the tape.
  struct pipeline_part {
    int first = -1, last = -1;                 // its nodes on the tape
    std::vector<std::pair<std::size_t, var>> received, sent;  // (boundary, value)
    std::optional<var> loss;
  };
  static constexpr index_t max_pipeline_tag = 32767;  // the least MPI_TAG_UB the MPI standard allows
  int pipeline_tag(std::size_t boundary, int micro, int gradient) const {
    return int((index_t(micro) * index_t(pg_.boundaries().size()) + index_t(boundary)) * 2 + gradient);
  }
  int peer(int stage) const { return stage * pg_.stage_device_num() + ctx_->rank(); }

  void pipeline_send(pipeline_flight& f, tensor x, int stage, int tag) {
    if (stage == stage_) {
      f.local.insert_or_assign(tag, std::move(x));
      return;
    }
    auto& [q, b] = f.sends.emplace_back(any_request{}, std::move(x));
    q = world_ctx_->world().isend(std::span<const T>(b.local().data(), b.local().size()), peer(stage), tag);
  }
  tensor pipeline_receive(pipeline_flight& f, const layout& l, const extents& shape, int stage, int tag) {
    if (stage == stage_) {
      auto it = f.local.find(tag);
      tensor x = std::move(it->second);
      f.local.erase(it);
      return x;
    }
    tensor x(l, shape, ctx_->rank());
    world_ctx_->world().recv(std::span<T>(x.local().data(), x.local().size()), peer(stage), tag);
    return x;
  }

  // A step of micro-batches in the schedule's order, or, with `ev`, their forward passes
  // alone in order (micro-batch by micro-batch, each rank's chunks in turn: every value
  // a unit waits for comes from a unit earlier in that order), fetching nodes `fetch`.
  result pipelined_run(const std::vector<xt::xarray<T>>& batch, const gradient_hook& hook,
                       const std::vector<int>* fetch, evaluation* ev) {
    const bool grads = ev == nullptr;
    const traced_graph& g = pg_.traced();
    check_count(batch.size(), g.inputs().size());
    const std::vector<int> in_ids = g.inputs();
    for (std::size_t k = 0; k < in_ids.size(); ++k)
      if (!(shape_of(batch[k]) == step_shape(pg_.local_shape(in_ids[k]))))
        throw error("graph executor: input '" + g.at(in_ids[k]).name + "': this rank's data is " +
                    to_string(shape_of(batch[k])) + ", " + std::to_string(pg_.micro_size()) +
                    " micro-batches of dataset_strategy " + pg_.config().dataset.to_string() + "'s " +
                    to_string(pg_.local_shape(in_ids[k])) + " make " + to_string(step_shape(pg_.local_shape(in_ids[k]))));
    const traffic before = ctx_->total_stats(), before_world = world_ctx_->total_stats();
    const traffic before_group = stage_group_ ? stage_group_->stats() : traffic{};
    const int S = pg_.pipeline_stages(), V = pg_.pipeline_chunks(), M = pg_.micro_size();
    const std::vector<pipeline_boundary>& bs = pg_.boundaries();
    std::vector<int> input_index(std::size_t(g.size()), -1);
    for (std::size_t k = 0; k < in_ids.size(); ++k) input_index[std::size_t(in_ids[k])] = int(k);

    tape t(*ctx_);
    std::vector<var> pvar(std::size_t(g.size()));
    param_vars_.clear();
    const std::vector<int> ps = g.parameters();
    for (std::size_t i = 0; i < ps.size(); ++i)
      if (bound_[i]) param_vars_.push_back(pvar[std::size_t(ps[i])] = t.leaf_view(*bound_[i], grads));
    std::vector<pipeline_part> parts(std::size_t(V * M));
    pipeline_flight flight;
    T loss_sum = T(0);
    peak_values_ = 0;

    auto forward_part = [&](int c, int m) {
      const int v = c * S + stage_;
      pipeline_part& part = parts[std::size_t(c * M + m)];
      part.first = t.size();
      std::vector<var> val(std::size_t(g.size()));
      for (std::size_t b = 0; b < bs.size(); ++b)
        if (bs[b].to_stage == v) {
          const int p = bs[b].producer;
          tensor x = pipeline_receive(flight, pg_.value_layout(p), g.at(p).shape, pg_.physical_stage(bs[b].from_stage),
                                      pipeline_tag(b, m, 0));
          val[std::size_t(p)] = t.leaf(std::move(x), grads && bs[b].has_backward);
          part.received.emplace_back(b, val[std::size_t(p)]);
        }
      for (int id : stage_ops_[std::size_t(v)]) {
        for (int p : g.at(id).inputs) {
          if (val[std::size_t(p)].t) continue;
          const node& pn = g.at(p);
          if (pn.kind == node_kind::input)
            val[std::size_t(p)] = input_leaf(t, p, rows(batch[std::size_t(input_index[std::size_t(p)])], m, M));
          else if (pn.kind == node_kind::constant)
            val[std::size_t(p)] = constant_leaf(t, p);
          else if (pn.kind == node_kind::parameter)
            val[std::size_t(p)] = pvar[std::size_t(p)];
        }
        val[std::size_t(id)] = run_op(t, id, val);
      }
      for (std::size_t b = 0; b < bs.size(); ++b)
        if (bs[b].from_stage == v) {
          const var y = val[std::size_t(bs[b].producer)];
          pipeline_send(flight, y.value(), pg_.physical_stage(bs[b].to_stage), pipeline_tag(b, m, 0));
          part.sent.emplace_back(b, y);
        }
      if (pg_.stage(g.loss()) == v) {
        part.loss = val[std::size_t(g.loss())];
        loss_sum += fetch_loss(part.loss->value());
      }
      if (fetch)
        for (int id : *fetch)
          if (pg_.stage(id) == v) ev->values.push_back(val[std::size_t(id)].value());
      part.last = t.size() - 1;
    };
    auto backward_part = [&](int c, int m) {
      pipeline_part& part = parts[std::size_t(c * M + m)];
      std::vector<std::pair<var, tensor>> seeds;
      if (part.loss) {  // the step's loss is the mean of the micro-batches'
        const tensor& l = part.loss->value();
        tensor seed(l.layout().without_partial(), l.global_shape(), l.rank());
        storage_type::fill(seed.local(), T(1) / T(M));
        seeds.emplace_back(*part.loss, std::move(seed));
      }
      for (const auto& [b, y] : part.sent)
        if (bs[b].has_backward) {
          const int p = bs[b].producer;
          seeds.emplace_back(y, pipeline_receive(flight, pg_.grad_layout(p), g.at(p).shape,
                                                 pg_.physical_stage(bs[b].to_stage), pipeline_tag(b, m, 1)));
        }
      t.backward(std::move(seeds));
      for (const auto& [b, x] : part.received)
        if (bs[b].has_backward) {
          const int p = bs[b].producer;
          std::optional<tensor> dx = t.take_grad(x.id);
          tensor d = dx ? std::move(*dx) : tensor(pg_.grad_layout(p), g.at(p).shape, ctx_->rank());
          if (!same_placement(d.layout(), pg_.grad_layout(p))) d = redistribute(d, pg_.grad_layout(p), *ctx_);
          pipeline_send(flight, std::move(d), pg_.physical_stage(bs[b].from_stage), pipeline_tag(b, m, 1));
        }
      t.release_range(part.first, part.last);
    };
    if (grads) {
      for (const pipeline_unit& u : schedule_order(pg_.config().schedule, S, V, M, stage_)) {
        if (u.forward) forward_part(u.chunk, u.micro);
        else backward_part(u.chunk, u.micro);
        flight.drop_sent();
        peak_values_ = std::max(peak_values_, t.live_values());
      }
    } else {
      for (int m = 0; m < M; ++m)
        for (int c = 0; c < V; ++c) {
          forward_part(c, m);
          t.release_range(parts[std::size_t(c * M + m)].first, parts[std::size_t(c * M + m)].last);
          flight.drop_sent();
        }
    }
    flight.wait();

    result r;
    if (grads && hook) {  // as the micro-batches summed them, to the hook's owner
      std::size_t k = 0;
      for (std::size_t i = 0; i < ps.size(); ++i) {
        if (!bound_[i]) continue;
        std::optional<tensor> grad = t.take_grad(param_vars_[k++].id);
        if (!grad) grad.emplace(bound_[i]->layout(), bound_[i]->global_shape(), ctx_->rank());  // zeros
        hook(i, *grad, 0);
        r.grads.push_back(std::move(*grad));
      }
    } else if (grads) {
      for (const var& pv : param_vars_) r.grads.push_back(t.release_grad(pv));
    }
    if (S > 1) {  // the loss, from the first rank of the loss's stage to every rank
      std::vector<double> l{stage_ == pg_.physical_stage(pg_.stage(g.loss())) && ctx_->rank() == 0
                                ? double(loss_sum) / M : 0.0};
      world_ctx_->world().all_reduce(std::span<double>(l), reduce_op::sum);
      r.loss = T(l[0]);
      if (grads)
        last_ = (ctx_->total_stats() - before) + (world_ctx_->total_stats() - before_world) -
                (stage_group_->stats() - before_group);
    } else {
      r.loss = loss_sum / T(M);
      if (grads) last_ = ctx_->total_stats() - before;
    }
    if (ev) ev->loss = r.loss;
    return r;
  }

  T fetch_loss(const tensor& loss) {
    const route& r = pg_.loss_fetch();
    const xt::xarray<T> l =
        storage_type::to_host(r.p.empty() ? loss.local() : execute(r.p, loss.local(), ctx_->on(r.fine)));
    return *l.data();
  }

  const parallel_graph pg_;
  std::unique_ptr<tessera::context> own_ctx_;
  tessera::context* ctx_;  // the operators' ranks: the world's, or this rank's pipeline stage's
  tessera::context* world_ctx_ = nullptr;
  std::unique_ptr<tessera::context> stage_ctx_;
  any_communicator* stage_group_ = nullptr;  // the stage's ranks in the world's context
  int stage_ = 0;
  std::vector<std::vector<int>> stage_ops_;  // per virtual stage, its operators in node order
  int peak_values_ = 0;
  bool drop_unread_ = true;
  std::vector<std::vector<int>> drop_after_;
  int dropped_ = 0;
  std::unordered_map<std::type_index, op_runner<T, D>> runners_;
  std::vector<tensor> params_;
  std::vector<tensor*> bound_;  // each parameter's storage: params_'s, or bound
  std::vector<var> param_vars_;
  traffic last_{};
};

}  // namespace tessera::graph
