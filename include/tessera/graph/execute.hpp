// Runs a parallel graph (graph/parallel.hpp) on each rank: the forward pass through
// the sharded operators of ops/ recorded on an autodiff tape, the redistributions the
// parallel pass planned on every edge (forward, and the gradients' backward), the
// backward pass, and an optimizer step. Returns the loss and the parameters'
// gradients in the parameters' layouts.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
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
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/softmax.hpp>
#include <tessera/ops/argmax.hpp>
#include <tessera/ops/batch_matmul.hpp>
#include <tessera/ops/one_hot.hpp>
#include <tessera/ops/shape.hpp>
#include <tessera/ops/softmax_axis.hpp>
#include <tessera/ops/sparse_cross_entropy.hpp>
#include <tessera/tensor/copy_box.hpp>
#include <tessera/tensor/device.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::graph {

/// Runs one operator on the tape: given its definition, its plan (strategy and
/// layouts) and its inputs (already in the layouts the plan names), records the
/// output and its backward, and returns the output. The output must be in the plan's
/// out layout, and the backward must give each input's gradient in its in_grad layout.
template <class T, class C, class D = cpu_device>
using op_runner = std::function<autodiff::var<T, C, D>(autodiff::tape<T, C, D>&, const op_def&, const op_plan&,
                                                       const std::vector<autodiff::var<T, C, D>>&)>;

namespace detail {

template <class Def>
const Def& def_as(const op_def& d) {
  const Def* p = dynamic_cast<const Def*>(&d);
  if (!p) throw error("graph executor: operator " + d.type() + " is not of the class its runner expects");
  return *p;
}

}  // namespace detail

/// The runners of the operators of graph/op_def.hpp, by type.
template <class T, class C, class D = cpu_device>
std::map<std::string, op_runner<T, C, D>> builtin_runners() {
  using var = autodiff::var<T, C, D>;
  using tape = autodiff::tape<T, C, D>;
  using tensor = tensor_on<T, D>;
  using ins = std::vector<var>;
  std::map<std::string, op_runner<T, C, D>> r;
  r["MatMul"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
    const matmul_def& m = detail::def_as<matmul_def>(d);
    return autodiff::matmul(ops::matmul_op{p.st, m.transpose_a, m.transpose_b}, x[0], x[1]);
  };
  r["Add"] = [](tape&, const op_def&, const op_plan& p, const ins& x) { return autodiff::add(ops::add_op{p.st}, x[0], x[1]); };
  r["Sub"] = [](tape&, const op_def&, const op_plan& p, const ins& x) { return autodiff::sub(ops::sub_op{p.st}, x[0], x[1]); };
  r["Mul"] = [](tape&, const op_def&, const op_plan& p, const ins& x) { return autodiff::mul(ops::mul_op{p.st}, x[0], x[1]); };
  r["BiasAdd"] = [](tape&, const op_def&, const op_plan& p, const ins& x) {
    return autodiff::bias_add(ops::bias_add_op{p.st}, x[0], x[1]);
  };
  r["RealDiv"] = [](tape&, const op_def&, const op_plan& p, const ins& x) { return autodiff::div(ops::div_op{p.st}, x[0], x[1]); };
  r["ReLU"] = [](tape&, const op_def&, const op_plan& p, const ins& x) { return autodiff::relu(ops::relu_op{p.st}, x[0]); };
  r["Exp"] = [](tape&, const op_def&, const op_plan& p, const ins& x) { return autodiff::exp(ops::exp_op{p.st}, x[0]); };
  r["Log"] = [](tape&, const op_def&, const op_plan& p, const ins& x) { return autodiff::log(ops::log_op{p.st}, x[0]); };
  r["Neg"] = [](tape&, const op_def&, const op_plan& p, const ins& x) { return autodiff::neg(ops::neg_op{p.st}, x[0]); };
  r["ReduceSum"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
    const reduce_def& m = detail::def_as<reduce_def>(d);
    return autodiff::reduce_sum(ops::reduce_sum_op{p.st, m.dims, m.keep_dims}, x[0]);
  };
  r["ReduceMean"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
    const reduce_def& m = detail::def_as<reduce_def>(d);
    return autodiff::reduce_mean(ops::reduce_mean_op{p.st, m.dims, m.keep_dims}, x[0]);
  };
  r["ReduceMax"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
    const reduce_def& m = detail::def_as<reduce_def>(d);
    return autodiff::reduce_max(ops::reduce_max_op{p.st, m.dims, m.keep_dims}, x[0]);
  };
  r["ReduceMin"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
    const reduce_def& m = detail::def_as<reduce_def>(d);
    return autodiff::reduce_min(ops::reduce_min_op{p.st, m.dims, m.keep_dims}, x[0]);
  };
  r["SoftmaxCrossEntropyWithLogits"] = [](tape&, const op_def&, const op_plan& p, const ins& x) {
    return autodiff::softmax_cross_entropy(ops::softmax_cross_entropy_op{p.st}, x[0], x[1]);
  };
  r["AllReduce"] = [](tape& t, const op_def& d, const op_plan&, const ins& x) {
    const std::pair<mesh, axis_list> grp = detail::def_as<all_reduce_def>(d).group(t.ctx().size());
    const mesh m = grp.first;
    const axis_list axes = grp.second;
    auto sum = [m, axes](tape& tp, const tensor& v) {
      tensor y(v);
      tp.ctx().on(m).group(axes).all_reduce(y.data(), reduce_op::sum);
      return y;
    };
    return t.record(sum(t, x[0].value()), [sum, ix = x[0].id](tape& tp, const tensor& g) {
      tp.add_grad(ix, sum(tp, g));
    });
  };
  // The operators whose sharded implementation is host-only.
  if constexpr (std::is_same_v<D, cpu_device>) {
    r["BatchMatMul"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
      const batch_matmul_def& m = detail::def_as<batch_matmul_def>(d);
      return autodiff::batch_matmul(ops::batch_matmul_op{p.st, m.transpose_a, m.transpose_b}, x[0], x[1]);
    };
    r["OneHot"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
      return autodiff::one_hot(ops::one_hot_op{p.st, detail::def_as<one_hot_def>(d).depth}, x[0]);
    };
    r["Softmax"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
      return autodiff::softmax(ops::softmax_op{p.st, detail::def_as<softmax_def>(d).axis}, x[0]);
    };
    r["LogSoftmax"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
      return autodiff::log_softmax(ops::log_softmax_op{p.st, detail::def_as<softmax_def>(d).axis}, x[0]);
    };
    r["Transpose"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
      return autodiff::transpose(ops::transpose_op{p.st, detail::def_as<transpose_def>(d).perm}, x[0]);
    };
    r["Reshape"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
      return autodiff::reshape(ops::reshape_op{p.st, detail::def_as<reshape_def>(d).target}, x[0]);
    };
    r["Flatten"] = [](tape&, const op_def&, const op_plan& p, const ins& x) {
      return autodiff::flatten(ops::flatten_op{p.st}, x[0]);
    };
    r["StridedSlice"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
      const strided_slice_def& m = detail::def_as<strided_slice_def>(d);
      return autodiff::strided_slice(ops::strided_slice_op{p.st, m.begin, m.end, m.strides}, x[0]);
    };
    r["Concat"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
      return autodiff::concat(ops::concat_op{p.st, detail::def_as<concat_def>(d).axis}, x);
    };
    r["Argmax"] = [](tape&, const op_def& d, const op_plan& p, const ins& x) {
      return autodiff::argmax(ops::argmax_op{p.st, detail::def_as<argmax_def>(d).axis}, x[0]);
    };
    r["SparseSoftmaxCrossEntropyWithLogits"] = [](tape&, const op_def&, const op_plan& p, const ins& x) {
      return autodiff::sparse_softmax_cross_entropy(ops::sparse_softmax_cross_entropy_op{p.st}, x[0], x[1]);
    };
  }
  return r;
}

/// Runs a parallel graph on the ranks of `world` (whose size must be the graph's
/// device count; every rank runs the same calls). Holds a copy of the graph and the
/// parameters, each rank its shards.
///
///     graph::executor<float, mpi_communicator> ex(pg, world);
///     ex.set_parameter("w", w0);                       // the global value: each rank keeps its shard
///     auto batch = ex.slice_batch({x, label});          // this rank's part of a global batch
///     optim::momentum<float> opt(0.2f, 0.1f);
///     float loss = ex.train_step(batch, opt);
template <class T, communicator C, class D = cpu_device>
class executor {
 public:
  using var = autodiff::var<T, C, D>;
  using tape = autodiff::tape<T, C, D>;
  using tensor = tensor_on<T, D>;
  using storage_type = storage<T, D>;

  /// The loss (the same on every rank, except in hybrid_parallel where each rank has
  /// its own) and the gradient of every parameter in its layout, in parameter order.
  struct result {
    T loss{};
    std::vector<tensor> grads;
  };

  executor(const parallel_graph& pg, C& world) : pg_(pg), ctx_(world), runners_(builtin_runners<T, C, D>()) {
    if (world.size() != pg_.device_num())
      throw error("graph executor: the graph was parallelized for " + std::to_string(pg_.device_num()) +
                  " devices, the communicator has " + std::to_string(world.size()) + " ranks");
    if (index_t(sizeof(T)) != pg_.config().elem_bytes)
      throw error("graph executor: the graph was parallelized for " + std::to_string(pg_.config().elem_bytes) +
                  "-byte elements, the executor's are " + std::to_string(sizeof(T)) + " bytes");
    const traced_graph& g = pg_.traced();
    for (int p : g.parameters()) params_.emplace_back(pg_.value_layout(p), g.at(p).shape, ctx_.rank());
  }

  /// Adds or replaces the runner of an operator type (the extension point of
  /// op_def's defined outside graph/op_def.hpp).
  void add_runner(const std::string& type, op_runner<T, C, D> r) { runners_[type] = std::move(r); }

  const parallel_graph& plan() const { return pg_; }
  device_context<C>& context() { return ctx_; }
  int rank() const { return ctx_.rank(); }

  // ---- parameters -------------------------------------------------------------

  /// The parameters in the graph's order, each this rank's shard: what an optimizer steps.
  std::vector<tensor>& parameters() { return params_; }
  const tensor& parameter(std::string_view name) const { return params_[param_index(name)]; }
  /// Sets a parameter from its whole value (the same on every rank); each rank keeps
  /// its shard. In hybrid_parallel the value is this rank's own (its shape the graph's).
  void set_parameter(std::string_view name, const xt::xarray<T>& value) {
    const std::size_t i = param_index(name);
    const int id = pg_.traced().parameters()[i];
    params_[i].assign_local(storage_type::from_host(
        slice(pg_.value_layout(id), pg_.traced().at(id).shape, value, "parameter '" + std::string(name) + "'")));
  }
  /// The whole value of a distributed tensor on every rank (collective): partial sums
  /// reduced, shards gathered.
  xt::xarray<T> gather(const tensor& t) {
    return storage_type::to_host(redistribute(t, layout::replicated(t.layout().dev, t.ndim()), ctx_).local());
  }

  // ---- data ---------------------------------------------------------------------

  /// The shape of the data this rank feeds for input `name`.
  extents input_local_shape(std::string_view name) const { return pg_.local_shape(input_id(name)); }
  /// This rank's part of a whole batch of input `name`, as its dataset strategy gives it.
  xt::xarray<T> slice_input(std::string_view name, const xt::xarray<T>& whole) const {
    const int id = input_id(name);
    return slice(pg_.value_layout(id), pg_.traced().at(id).shape, whole, "input '" + std::string(name) + "'");
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
  result value_and_grad(const std::vector<xt::xarray<T>>& batch) {
    const traffic before = ctx_.total_stats();
    tape t(ctx_);
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
    t.backward(seed_from);
    const std::vector<int> ps = pg_.traced().parameters();
    for (std::size_t i = 0; i < ps.size(); ++i) r.grads.push_back(t.grad(param_vars_[i]));
    for (const gradient_reduction& gr : pg_.gradient_reductions()) {
      std::size_t i = 0;
      while (ps[i] != gr.parameter) ++i;
      ctx_.on(gr.dev).group(axis_list{0}).all_reduce(r.grads[i].data(), reduce_op::sum);
    }
    last_ = ctx_.total_stats() - before;
    return r;
  }

  /// The loss of a batch, forward only.
  T evaluate(const std::vector<xt::xarray<T>>& batch) {
    tape t(ctx_);
    return fetch_loss(forward(t, batch).value());
  }

  /// value_and_grad, then opt.step(parameters(), gradients); returns the loss.
  template <class Optimizer>
  T train_step(const std::vector<xt::xarray<T>>& batch, Optimizer& opt) {
    result r = value_and_grad(batch);
    opt.step(params_, r.grads);
    return r.loss;
  }

  /// What this rank's communicators moved during the last value_and_grad (equal to
  /// plan().bytes_for_rank(rank()) in bytes).
  traffic last_step_traffic() const { return last_; }

  /// Writes this rank's dumps under `dir` (graph/dump.hpp).
  void save_graphs(const std::filesystem::path& dir) const { tessera::graph::save_graphs(pg_, dir, ctx_.rank()); }

 private:
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
    tessera::detail::copy_box(whole.data(), global, local_offset(l, global, ctx_.rank()), out.data(), ls,
                              tessera::detail::origin(ls.ndim), ls);
    return out;
  }

  // Moves x along a planned route into `to`.
  tensor move_along(const route& r, const tensor& x, const layout& to, const char* what) {
    if (!(x.layout() == r.from))
      throw error(std::string("graph executor: ") + what + " arrived as " + describe(x.layout()) + ", the plan expects " +
                  describe(r.from));
    if (r.p.empty()) return tensor(to, x.global_shape(), x.rank(), typename tensor::array_type(x.local()));
    return tensor(to, x.global_shape(), x.rank(), execute(r.p, x.local(), ctx_.on(r.fine)));
  }

  // The value of producer `x` as edge `e`'s consumer wants it, recording the gradient's
  // way back.
  var along_edge(tape& t, const edge_plan& e, var x) {
    const layout& to = e.forward.to;
    const bool back = e.has_backward && !(e.backward.empty() && e.backward.from == e.backward.to);
    if (e.forward.empty() && x.value().layout() == to && !back) return x;
    tensor y = move_along(e.forward, x.value(), to, "a value");
    if (!e.has_backward) return t.leaf(std::move(y), false);
    return t.record(std::move(y), [this, &e, ix = x.id](tape& tp, const tensor& g) {
      tp.add_grad(ix, move_along(e.backward, g, e.backward.to, "a gradient"));
    });
  }

  var forward(tape& t, const std::vector<xt::xarray<T>>& batch) {
    const traced_graph& g = pg_.traced();
    check_count(batch.size(), g.inputs().size());
    std::vector<var> v(std::size_t(g.size()));
    param_vars_.clear();
    std::size_t next_input = 0, next_param = 0;
    for (int id = 0; id < g.size(); ++id) {
      const node& n = g.at(id);
      if (n.kind == node_kind::input) {
        const xt::xarray<T>& data = batch[next_input++];
        const extents want = pg_.local_shape(id);
        if (!(shape_of(data) == want))
          throw error("graph executor: input '" + n.name + "': this rank's data is " + to_string(shape_of(data)) +
                      ", dataset_strategy " + pg_.config().dataset.to_string() + " gives each rank " + to_string(want) +
                      " of " + to_string(n.shape));
        v[std::size_t(id)] = t.leaf(tensor(pg_.value_layout(id), n.shape, ctx_.rank(), storage_type::from_host(data)), false);
      } else if (n.kind == node_kind::parameter) {
        v[std::size_t(id)] = t.leaf(params_[next_param++], true);
        param_vars_.push_back(v[std::size_t(id)]);
      } else {
        std::vector<var> in;
        for (std::size_t s = 0; s < n.inputs.size(); ++s)
          in.push_back(along_edge(t, pg_.edge(id, int(s)), v[std::size_t(n.inputs[s])]));
        const auto it = runners_.find(n.op->type());
        if (it == runners_.end())
          throw error("graph executor: no runner for operator type " + n.op->type() + " (" + g.describe(id) +
                      "); add one with executor::add_runner");
        var out = it->second(t, *n.op, pg_.op(id), in);
        if (!(out.value().layout() == pg_.value_layout(id)))
          throw error("graph executor: " + g.describe(id) + " gave " + describe(out.value().layout()) +
                      ", its rule says " + describe(pg_.value_layout(id)));
        if (!pg_.needs_grad(id)) out = t.leaf(out.value(), false);
        v[std::size_t(id)] = out;
      }
    }
    return v[std::size_t(g.loss())];
  }

  T fetch_loss(const tensor& loss) {
    const route& r = pg_.loss_fetch();
    const xt::xarray<T> l =
        storage_type::to_host(r.p.empty() ? loss.local() : execute(r.p, loss.local(), ctx_.on(r.fine)));
    return *l.data();
  }

  const parallel_graph pg_;
  device_context<C> ctx_;
  std::map<std::string, op_runner<T, C, D>> runners_;
  std::vector<tensor> params_;
  std::vector<var> param_vars_;
  traffic last_{};
};

}  // namespace tessera::graph
