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
#include <tessera/ops/run.hpp>
#include <tessera/ops/softmax_rule.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

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
                                                           const tensor_on<T, D>& t, bool backward,
                                                           device_context<C>& ctx) {
  using K = kernels::backend<D>;
  const auto cs = softmax_cross_entropy_op::row_collectives(r, x.global_shape(), backward);
  auto m = K::ce_row_max(x.local());
  if (!cs.empty()) run_internal(cs[0], std::span<T>(m.data(), m.size()), ctx, softmax_cross_entropy_op::name());
  auto s = K::ce_row_terms(x.local(), t.local(), m);  // one all_reduce for the three
  if (!cs.empty()) run_internal(cs[1], std::span<T>(s.data(), s.size()), ctx, softmax_cross_entropy_op::name());
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
  const auto st = detail::ce_row_stats(r, *lx, *lt, false, ctx);
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
  const auto st = detail::ce_row_stats(r, *lx, *lt, true, ctx);
  return tensor_on<T, D>(r.logits, logits.global_shape(), ctx.rank(),
                         kernels::backend<D>::ce_grad(lg->local(), lx->local(), lt->local(), st.m, st.s));
}

/// SoftmaxCrossEntropyWithLogits' forward and backward as every operator's (ops/run.hpp):
/// the labels get no gradient.
template <class T, class D, class C>
tensor_on<T, D> forward(const softmax_cross_entropy_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return softmax_cross_entropy(op, *x[0], *x[1], ctx);
}
template <class T, class D, class C>
op_grads<T, D> backward(const softmax_cross_entropy_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>&, device_context<C>& ctx) {
  op_grads<T, D> g = grads_of(softmax_cross_entropy_backward(op, dy, *x[0], *x[1], ctx));
  g.emplace_back();
  return g;
}

}  // namespace tessera::ops
