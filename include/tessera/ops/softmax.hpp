// Sharded SoftmaxCrossEntropyWithLogits: the per-sample loss of logits (B, C) against
// labels (B, C) and its gradient wrt the logits. The sharding rule is
// ops/softmax_rule.hpp; the local pieces are the backend's ce_* kernels
// (kernels/cpu/softmax.hpp explains them). With the class dim split, the row max and
// the row sums are combined across the class axis.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/ops/softmax_rule.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// SoftmaxCrossEntropyWithLogits with a shard strategy, as
/// `SoftmaxCrossEntropyWithLogits().shard(((2, 4), (2, 4)))`: logits and labels split
/// alike, rows b ways and classes c ways.
struct softmax_cross_entropy_op {
  strategy st;

  static constexpr std::string_view name() { return "softmax_cross_entropy"; }

  /// The rule on `device_num` devices for logits and labels of the given global
  /// shapes; throws tessera::error with the rule broken, the numbers and the strategy:
  /// "softmax_cross_entropy: logits and labels must be split alike: dim 1: labels split
  /// 2 ways, logits 4 ways; strategy ((2, 4), (2, 2))".
  cross_entropy_layouts rule(int device_num, const extents& logits, const extents& labels) const {
    const status s = check_softmax_cross_entropy(st, device_num, logits, labels);
    if (!s.ok()) {
      // The operator's own rules already start with its name.
      const bool own = s.code == errc::cross_entropy_rank || s.code == errc::cross_entropy_shapes ||
                       s.code == errc::cross_entropy_split;
      throw error(s, own ? std::string_view{} : name(), "strategy " + to_string(st));
    }
    return softmax_cross_entropy_rule(st, device_num, logits);
  }
};

namespace detail {

// Per local row: the GLOBAL row max m, and the global terms s (3, rows): the sum of
// exp(x - m), the label mass, and sum t (m - x), all over the class group.
template <class A>
struct ce_rows {
  A m, s;
};

template <class T, class D, class C>
ce_rows<typename tensor_on<T, D>::array_type> ce_row_stats(const cross_entropy_layouts& r,
                                                           const tensor_on<T, D>& x,
                                                           const tensor_on<T, D>& t,
                                                           device_context<C>& ctx) {
  using K = kernels::backend<D>;
  C* group = r.class_split > 1 ? &ctx.on(r.dev).group(axis_list{r.class_axis}) : nullptr;
  auto m = K::ce_row_max(x.local());
  if (group) group->all_reduce(std::span<T>(m.data(), m.size()), reduce_op::max);
  auto s = K::ce_row_terms(x.local(), t.local(), m);  // one all_reduce for the three
  if (group) group->all_reduce(std::span<T>(s.data(), s.size()), reduce_op::sum);
  return {std::move(m), std::move(s)};
}

}  // namespace detail

/// The per-sample loss (B,) of softmax(logits) against labels (both (B, C), any
/// layouts; redistributed to the rule's):
///   loss_i = sum_j t_ij * (logsumexp(x_i) - x_ij)
/// with logsumexp taken around the GLOBAL row max (numerically stable). The result is
/// in the rule's output layout: split by the batch axis, and every rank of a class
/// group holds the full loss of its rows (not a partial one).
template <class T, class D, class C>
tensor_on<T, D> softmax_cross_entropy(const softmax_cross_entropy_op& op, const tensor_on<T, D>& logits,
                                      const tensor_on<T, D>& labels, device_context<C>& ctx) {
  const cross_entropy_layouts r = op.rule(ctx.size(), logits.global_shape(), labels.global_shape());
  const auto lx = in_layout(logits, r.logits, ctx);
  const auto lt = in_layout(labels, r.labels, ctx);
  const auto st = detail::ce_row_stats(r, *lx, *lt, ctx);
  return tensor_on<T, D>(r.out, r.shape, ctx.rank(), kernels::backend<D>::ce_loss(st.s));
}

/// dlogits of loss = softmax_cross_entropy(logits, labels) given dloss (B,) in any
/// layout (partial sums are resolved first):
///   dlogits_ij = dloss_i * (softmax(x_i)_j * sum_k t_ik - t_ij)
/// in the logits' rule layout. Labels get no gradient.
template <class T, class D, class C>
tensor_on<T, D> softmax_cross_entropy_backward(const softmax_cross_entropy_op& op, const tensor_on<T, D>& dloss,
                                               const tensor_on<T, D>& logits, const tensor_on<T, D>& labels,
                                               device_context<C>& ctx) {
  const cross_entropy_layouts r = op.rule(ctx.size(), logits.global_shape(), labels.global_shape());
  if (!(dloss.global_shape() == r.shape))
    throw error(std::string(op.name()) + "_backward: dloss is " + to_string(dloss.global_shape()) +
                ", expected " + to_string(r.shape));
  const auto lg = in_layout(dloss, r.out, ctx);
  const auto lx = in_layout(logits, r.logits, ctx);
  const auto lt = in_layout(labels, r.labels, ctx);
  const auto st = detail::ce_row_stats(r, *lx, *lt, ctx);
  return tensor_on<T, D>(r.logits, logits.global_shape(), ctx.rank(),
                         kernels::backend<D>::ce_grad(lg->local(), lx->local(), lt->local(), st.m, st.s));
}

}  // namespace tessera::ops
