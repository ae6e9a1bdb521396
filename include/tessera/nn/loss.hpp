// Losses as modules, built from the operators: MSELoss (Sub, Mul, ReduceMean or
// ReduceSum), CrossEntropyLoss with class-index labels (SparseSoftmaxCrossEntropy
// WithLogits, then ReduceMean or ReduceSum over the batch) and seed 003's
// SoftmaxCrossEntropyExpand (twelve small operators), each a scalar on the tape or in a
// traced graph. The reduction is over the GLOBAL batch: with the batch split over
// ranks the loss is a partial sum over them (resolved when read, or left for the
// gradient reducer: the gradients of a partial loss are partial too).
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <xtensor/xarray.hpp>
#include <tessera/autodiff/losses.hpp>
#include <tessera/autodiff/ops.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/graph/graph.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/module.hpp>

namespace tessera::nn {

/// How a loss combines the per-element (or per-sample) terms.
enum class reduction { mean, sum };

namespace detail {

/// The strategy of an operator over inputs laid out as `l` (one split tuple per
/// input, `inputs` of them): each splits them as `l` does.
inline strategy split_as(const layout& l, int inputs) {
  const split_tuple s = to_split_tuple(l);
  strategy st;
  for (int i = 0; i < inputs; ++i) st.in[st.n++] = s;
  return st;
}

/// The mean (or sum) of every element of x: a scalar, split as x is split.
template <class V>
V reduce_all(V x, reduction r, const strategy& st, const std::string& name) {
  if (r == reduction::mean) return apply_named(name, ops::reduce_mean_op{st, {}, false}, x);
  return apply_named(name, ops::reduce_sum_op{st, {}, false}, x);
}

/// The labels of a class-index loss, checked on the host ("cross_entropy_loss: label 12
/// of sample 3 is out of range for 10 classes") and made values of T on device D.
template <class T, class D, std::integral I>
tensor_on<T, D> class_values(const dist_tensor<I>& labels, index_t classes) {
  const index_t row0 = labels.local_offset()[0];
  xt::xarray<T> lab = xt::xarray<T>::from_shape(labels.local().shape());
  for (std::size_t i = 0; i < labels.local().size(); ++i) {
    const I v = labels.local().data()[i];
    if (v < 0 || std::uint64_t(v) >= std::uint64_t(classes))
      throw error("cross_entropy_loss: label " + std::to_string(v) + " of sample " +
                  std::to_string(row0 + index_t(i)) + " is out of range for " + std::to_string(classes) + " classes");
    lab.data()[i] = T(v);
  }
  return tensor_on<T, D>(labels.layout(), labels.global_shape(), labels.rank(), storage<T, D>::from_host(lab));
}

}  // namespace detail

/// MindSpore's nn.MSELoss: the mean (or sum) over every element of (x - target)^2, as
/// Sub, Mul (the square) and ReduceMean (ReduceSum). Eagerly the operators split as x
/// is and the target (data, no gradient, x's shape, any layout) is brought to x's
/// layout; traced, they are "<loss>.sub", ".mul", ".reduce_mean" and the parallel mode
/// gives their strategies.
template <class T = float, class D = cpu_device>
class mse_loss : public module<T, D> {
 public:
  explicit mse_loss(reduction r = reduction::mean) : r_(r) {}
  void visit(visitor<T, D>&) override {}

  /// `target` is on the network's device D.
  autodiff::var<T, D> operator()(autodiff::var<T, D> x, const tensor_on<T, D>& target) {
    if (!(target.global_shape() == x.value().global_shape()))
      throw error("mse_loss: the target is " + to_string(target.global_shape()) + ", the input " +
                  to_string(x.value().global_shape()));
    x = detail::resolved(x);
    const layout l = x.value().layout();  // a copy: recording moves the tape's values
    const autodiff::var<T, D> y = x.t->leaf(tensor_on<T, D>(target), false);
    const autodiff::var<T, D> d = autodiff::apply(ops::sub_op{detail::split_as(l, 2)}, x, y);
    return detail::reduce_all(autodiff::apply(ops::mul_op{detail::split_as(l, 2)}, d, d), r_, detail::split_as(l, 1),
                              "");
  }
  /// Traced: the target an input of the graph.
  graph::value operator()(graph::value x, graph::value target) {
    const graph::value d = apply_named(this->op_name("sub"), ops::sub_op{}, x, target);
    return detail::reduce_all(apply_named(this->op_name("mul"), ops::mul_op{}, d, d), r_, strategy{},
                              this->op_name(r_ == reduction::mean ? "reduce_mean" : "reduce_sum"));
  }

 private:
  reduction r_;
};

/// MindSpore's nn.CrossEntropyLoss with class-index labels: for logits x (batch, C) and
/// labels y (batch,), the mean (or sum) over the batch of
///   -log softmax(x_i)[y_i] = logsumexp(x_i) - x_i[y_i]   (computed around the row max),
/// as SparseSoftmaxCrossEntropyWithLogits and ReduceMean (ReduceSum). Eagerly they split
/// as the logits are (a split class dim combines the row maxima and sums over its axis);
/// the labels, of an integer type, stay on the host, are checked there ("cross_entropy_
/// loss: label 12 of sample 3 is out of range for 10 classes") and enter the tape as
/// values of T. Traced, the labels are an input of the graph (integer values) and the
/// operators "<loss>.sparse_softmax_cross_entropy" and ".reduce_mean".
template <class T = float, class D = cpu_device>
class cross_entropy_loss : public module<T, D> {
 public:
  explicit cross_entropy_loss(reduction r = reduction::mean) : r_(r) {}
  void visit(visitor<T, D>&) override {}

  template <std::integral I>
  autodiff::var<T, D> operator()(autodiff::var<T, D> logits, const dist_tensor<I>& labels) {
    logits = detail::resolved(logits);
    const tensor_on<T, D>& xv = logits.value();
    const extents& gs = xv.global_shape();
    if (xv.ndim() != 2) throw error("cross_entropy_loss: the logits must be (batch, classes), got " + to_string(gs));
    if (labels.ndim() != 1 || labels.global_shape()[0] != gs[0])
      throw error("cross_entropy_loss: the labels are " + to_string(labels.global_shape()) + ", expected (" +
                  std::to_string(gs[0]) + ",) for logits " + to_string(gs));
    const int b = xv.layout().pieces(0), c = xv.layout().pieces(1);
    // Before the leaf: recording moves the tape's values.
    tensor_on<T, D> y = detail::class_values<T, D>(labels, gs[1]);
    const autodiff::var<T, D> yv = logits.t->leaf(std::move(y), false);
    const autodiff::var<T, D> per_sample =
        autodiff::apply(ops::sparse_softmax_cross_entropy_op{strategy{{b, c}, {b}}}, logits, yv);
    return detail::reduce_all(per_sample, r_, strategy{{b}}, "");
  }
  /// Traced: the labels an input of the graph.
  graph::value operator()(graph::value logits, graph::value labels) {
    const graph::value per_sample =
        apply_named(this->op_name("sparse_softmax_cross_entropy"), ops::sparse_softmax_cross_entropy_op{}, logits, labels);
    return detail::reduce_all(per_sample, r_, strategy{},
                              this->op_name(r_ == reduction::mean ? "reduce_mean" : "reduce_sum"));
  }

 private:
  reduction r_;
};

/// Seed 003's SoftmaxCrossEntropyExpand(sparse): the mean over the batch of the softmax
/// cross entropy of logits (batch, C), composed of small operators so that the parallel
/// pass gives each its own strategy: ReduceMax, Sub, Exp, ReduceSum, RealDiv, OneHot
/// (sparse: class-index labels (batch,)), Add of 1e-24, Log, Mul, ReduceSum, Mul by -1
/// and ReduceMean (autodiff::softmax_cross_entropy_expand_op lists them). Labels are
/// class indices (batch,) when `sparse`, else rows of class weights (batch, C). Eagerly
/// every operator splits as the logits are (autodiff::softmax_cross_entropy_expand_op::
/// with_split); traced they are "<loss>.reduce_max", ".sub", ".exp", ".reduce_sum",
/// ".div", ".one_hot", ".add_eps", ".log", ".mul", ".sum_cross_entropy", ".mul2" and
/// ".mean", the two scalars constants of the graph, and the parallel mode gives the
/// strategies (auto_parallel searches them, as seed 003 does).
template <class T = float, class D = cpu_device>
class softmax_cross_entropy_expand : public module<T, D> {
 public:
  explicit softmax_cross_entropy_expand(bool sparse = true) : sparse_(sparse) {}
  void visit(visitor<T, D>&) override {}
  bool sparse() const { return sparse_; }

  /// Eager, class-index labels (sparse): checked on the host as cross_entropy_loss's.
  template <std::integral I>
  autodiff::var<T, D> operator()(autodiff::var<T, D> logits, const dist_tensor<I>& labels) {
    if (!sparse_)
      throw error("softmax_cross_entropy_expand: class-index labels need sparse = true; this loss takes (batch, "
                  "classes) label rows");
    logits = detail::resolved(logits);
    const extents& gs = check_logits(logits.value().global_shape());
    if (labels.ndim() != 1 || labels.global_shape()[0] != gs[0])
      throw error("softmax_cross_entropy_expand: the labels are " + to_string(labels.global_shape()) +
                  ", expected (" + std::to_string(gs[0]) + ",) for logits " + to_string(gs));
    tensor_on<T, D> y = detail::class_values<T, D>(labels, gs[1]);  // before the leaf: recording moves values
    return expand(logits, logits.t->leaf(std::move(y), false));
  }
  /// Eager, label rows (batch, C) on device D (not sparse).
  autodiff::var<T, D> operator()(autodiff::var<T, D> logits, const tensor_on<T, D>& labels) {
    if (sparse_)
      throw error("softmax_cross_entropy_expand: label rows need sparse = false; this loss takes class indices");
    logits = detail::resolved(logits);
    const extents& gs = check_logits(logits.value().global_shape());
    if (!(labels.global_shape() == gs))
      throw error("softmax_cross_entropy_expand: the labels are " + to_string(labels.global_shape()) +
                  ", expected the logits' shape " + to_string(gs));
    return expand(logits, logits.t->leaf(tensor_on<T, D>(labels), false));
  }

  /// Traced: the labels an input of the graph.
  graph::value operator()(graph::value logits, graph::value labels) {
    const extents gs = check_logits(logits.shape());
    graph::graph_builder& b = logits.builder();
    auto op = [&](const char* what, const auto& o, auto... in) { return apply_named(this->op_name(what), o, in...); };
    const graph::value m = op("reduce_max", ops::reduce_max_op{{}, {-1}, true}, logits);
    const graph::value e = op("exp", ops::exp_op{}, op("sub", ops::sub_op{}, logits, m));
    const graph::value softmax = op("div", ops::div_op{}, e, op("reduce_sum", ops::reduce_sum_op{{}, {-1}, true}, e));
    const graph::value label = sparse_ ? op("one_hot", ops::one_hot_op{{}, gs[1]}, labels) : labels;
    const graph::value eps = b.constant(this->op_name("eps"), epsilon);
    const graph::value log = op("log", ops::log_op{}, op("add_eps", ops::add_op{}, softmax, eps));
    const graph::value per_sample =
        op("sum_cross_entropy", ops::reduce_sum_op{{}, {-1}, false}, op("mul", ops::mul_op{}, log, label));
    const graph::value minus_one = b.constant(this->op_name("minus_one"), -1.0);
    return op("mean", ops::reduce_mean_op{{}, {-1}, false}, op("mul2", ops::mul_op{}, minus_one, per_sample));
  }

  static constexpr double epsilon = 1e-24;  ///< added to the softmax before the Log, as the seed's

 private:
  static const extents& check_logits(const extents& s) {
    if (s.ndim != 2)
      throw error("softmax_cross_entropy_expand: the logits must be (batch, classes), got " + to_string(s));
    return s;
  }
  autodiff::var<T, D> expand(autodiff::var<T, D> logits, autodiff::var<T, D> labels) {
    const layout& l = logits.value().layout();
    autodiff::softmax_cross_entropy_expand_op o =
        autodiff::softmax_cross_entropy_expand_op::with_split(l.pieces(0), l.pieces(1), sparse_);
    o.eps = epsilon;
    return autodiff::softmax_cross_entropy_expand(o, logits, labels);
  }

  bool sparse_;
};

}  // namespace tessera::nn
