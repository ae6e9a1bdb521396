// Losses composed of sharded operators, so that they shard like any other part of a
// network (the seeds' advice: "a loss built from small operators can be sharded"):
// MindSpore's MSELoss and seed 003's SoftmaxCrossEntropyExpand. Each operator of a
// composition has its own strategy; the gradient comes from the operators' backwards.
#pragma once

#include <string>
#include <tessera/autodiff/ops.hpp>
#include <tessera/autodiff/tape.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>

namespace tessera::autodiff {

/// MSELoss with reduction "mean": mean((x - target)^2) over every element, as Sub, Mul
/// (the square) and ReduceMean, each with its strategy.
struct mse_loss_op {
  ops::sub_op sub;
  ops::mul_op square;
  ops::reduce_mean_op mean;  ///< over every dim ({}), to a scalar

  /// Every operator split as the inputs are: split tuple `s` for x and target alike.
  /// Example: mse_loss_op::split_as(split_tuple{8, 1}) is data parallel on 8 ranks.
  static mse_loss_op split_as(const split_tuple& s) {
    return {ops::sub_op{strategy{s, s}}, ops::mul_op{strategy{s, s}}, ops::reduce_mean_op{strategy{s}, {}, false}};
  }
};

/// mean((x - target)^2): a scalar whose partial sums the tape resolves (or the caller,
/// by redistributing it to a replicated layout).
template <class T, class D>
var<T, D> mse_loss(const mse_loss_op& op, var<T, D> x, var<T, D> target) {
  const var<T, D> d = autodiff::apply(op.sub, x, target);
  return autodiff::apply(op.mean, autodiff::apply(op.square, d, d));
}

/// Seed 003's SoftmaxCrossEntropyExpand: the mean over the batch of the softmax cross
/// entropy of logits (B, C), written with small operators as the seed writes it:
///
///     logit_max = ReduceMax(keep_dims)(logit, -1)
///     exp       = Exp(Sub(logit, logit_max))
///     exp_sum   = ReduceSum(keep_dims)(exp, -1)
///     softmax   = RealDiv(exp, exp_sum)
///     label     = OneHot(label, C, 1, 0)              (sparse labels only)
///     log       = Log(softmax + eps)                   (eps = 1e-24)
///     loss      = ReduceSum(Mul(log, label), -1)
///     loss      = Mul(-1, loss)
///     loss      = ReduceMean(loss, -1)
///
/// Every operator has its own strategy (fields below); one_hot's depth is the logits'
/// class count, set at the call.
struct softmax_cross_entropy_expand_op {
  bool sparse = false;                     ///< labels are class indices (B,), else (B, C)
  ops::reduce_max_op max;                  ///< ((b, c),) over {-1}, keep_dims
  ops::sub_op sub;                         ///< ((b, c), (b, 1))
  ops::exp_op exp;                         ///< ((b, c),)
  ops::reduce_sum_op sum;                  ///< ((b, c),) over {-1}, keep_dims
  ops::div_op div;                         ///< ((b, c), (b, 1))
  ops::one_hot_op onehot;                  ///< ((b, c), (), ())
  ops::add_op add_eps;                     ///< ((b, c), ())
  ops::log_op log;                         ///< ((b, c),)
  ops::mul_op mul;                         ///< ((b, c), (b, c))
  ops::reduce_sum_op sum_cross_entropy;    ///< ((b, c),) over {-1}
  ops::mul_op mul2;                        ///< ((), (b,)): -1 times the loss
  ops::reduce_mean_op mean;                ///< ((b,),) over {-1}, to a scalar
  double eps = 1e-24;

  /// Every operator split as MindSpore's semi-auto parallel would split it for logits
  /// split (b, c): rows b ways, classes c ways. Example: with_split(8, 1) is data
  /// parallel on 8 ranks; with_split(2, 4) also splits the classes, so the row max and
  /// row sums are partial over the class axis until Sub and RealDiv resolve them.
  static softmax_cross_entropy_expand_op with_split(int b, int c, bool sparse = false) {
    const split_tuple x{b, c}, row{b, 1}, batch{b};
    softmax_cross_entropy_expand_op op;
    op.sparse = sparse;
    op.max = ops::reduce_max_op{strategy{x}, {-1}, true};
    op.sub = ops::sub_op{strategy{x, row}};
    op.exp = ops::exp_op{strategy{x}};
    op.sum = ops::reduce_sum_op{strategy{x}, {-1}, true};
    op.div = ops::div_op{strategy{x, row}};
    op.onehot = ops::one_hot_op{strategy{x, split_tuple{}, split_tuple{}}, 0};
    op.add_eps = ops::add_op{strategy{x, split_tuple{}}};
    op.log = ops::log_op{strategy{x}};
    op.mul = ops::mul_op{strategy{x, x}};
    op.sum_cross_entropy = ops::reduce_sum_op{strategy{x}, {-1}, false};
    op.mul2 = ops::mul_op{strategy{split_tuple{}, batch}};
    op.mean = ops::reduce_mean_op{strategy{batch}, {-1}, false};
    return op;
  }
};

namespace detail {
// A scalar constant on the tape, laid out as operator input `i` needs it (no gradient).
template <class T, class D>
var<T, D> scalar_constant(tape<T, D>& t, const layout& l, T value) {
  tensor_on<T, D> c(l, extents{}, t.ctx().rank());
  tensor_on<T, D>::storage_type::fill(c.local(), value);
  return t.leaf(std::move(c), false);
}
}  // namespace detail

/// The mean cross entropy of softmax(logits) against `labels`: one-hot (or distribution)
/// labels (B, C), or class indices (B,) when op.sparse. A scalar, differentiable wrt
/// the logits.
template <class T, class D>
var<T, D> softmax_cross_entropy_expand(const softmax_cross_entropy_expand_op& op, var<T, D> logits,
                                          var<T, D> labels) {
  tape<T, D>& t = *logits.t;
  const extents xs = logits.value().global_shape();
  if (xs.ndim != 2)
    throw error("softmax_cross_entropy_expand: logits must have rank 2 (batch, classes), logits is " +
                to_string(xs));
  const int p = t.ctx().size();
  const var<T, D> logit_max = autodiff::apply(op.max, logits);
  const var<T, D> e = autodiff::apply(op.exp, autodiff::apply(op.sub, logits, logit_max));
  const var<T, D> exp_sum = autodiff::apply(op.sum, e);
  const var<T, D> softmax = autodiff::apply(op.div, e, exp_sum);
  var<T, D> label = labels;
  if (op.sparse) {
    ops::one_hot_op onehot = op.onehot;
    onehot.depth = xs.v[1];
    label = autodiff::apply(onehot, labels);
  }
  const shape_list eps_shapes{xs, extents{}};
  const var<T, D> eps = detail::scalar_constant(t, op.add_eps.rule(p, eps_shapes).in[1], T(op.eps));
  const var<T, D> log_softmax = autodiff::apply(op.log, autodiff::apply(op.add_eps, softmax, eps));
  const var<T, D> loss = autodiff::apply(op.sum_cross_entropy, autodiff::apply(op.mul, log_softmax, label));
  const shape_list neg_shapes{extents{}, extents{xs.v[0]}};
  const var<T, D> minus_one = detail::scalar_constant(t, op.mul2.rule(p, neg_shapes).in[0], T(-1));
  return autodiff::apply(op.mean, autodiff::apply(op.mul2, minus_one, loss));
}

}  // namespace tessera::autodiff
