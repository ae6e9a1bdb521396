// Sharded SparseSoftmaxCrossEntropyWithLogits: the per-sample loss of logits (B, C)
// against integer class labels (B,) (stored as integers or integer-valued floats) and
// its gradient wrt the logits. The sharding rule is ops/sparse_cross_entropy_rule.hpp;
// the single-process reference kernels/cpu/softmax.hpp; the local pieces the tensors'
// device's backend (kernels/cpu/sharded.hpp on the host). With the class dim split, the
// row max and the row sums (with the label's logit) combine across the class axis.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/ops/sparse_cross_entropy_rule.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

namespace detail {

// Per local row: the label's local column (-1 on the other ranks of the class group),
// the GLOBAL row max, and the global terms (2, rows): the sum of exp(x - max) and the
// label's logit (from the rank of the class group that holds it).
template <class A, class I>
struct sparse_ce_rows {
  I column;
  A max, terms;
};

template <class T, class L, class D, class C>
sparse_ce_rows<typename tensor_on<T, D>::array_type, typename tensor_on<std::int64_t, D>::array_type>
sparse_ce_row_stats(const sparse_cross_entropy_layouts& r, const tensor_on<T, D>& x, const tensor_on<L, D>& t,
                    bool backward, device_context<C>& ctx) {
  using K = kernels::backend<D>;
  const auto cs = sparse_softmax_cross_entropy_op::row_collectives(r, x.global_shape(), backward);
  constexpr std::string_view who = sparse_softmax_cross_entropy_op::name();
  const auto& px = x.local();
  const index_t classes = x.global_shape().v[1];
  const index_t first_row = t.local_offset().v[0], first_col = x.local_offset().v[1];
  auto column = K::sparse_ce_columns(t.local(), classes, first_row, first_col, px.shape()[1]);
  auto max = K::softmax_axis_max(px, 1);
  if (!cs.empty()) run_internal(cs[0], std::span<T>(max.data(), max.size()), ctx, who);
  // The sums and the label's logit in one buffer: one all_reduce (sum) for both.
  auto terms = K::sparse_ce_terms(px, column, max);
  if (!cs.empty()) run_internal(cs[1], std::span<T>(terms.data(), terms.size()), ctx, who);
  return {std::move(column), std::move(max), std::move(terms)};
}

}  // namespace detail

/// The per-sample loss (B,) of softmax(logits) against class labels (logits (B, C) and
/// labels (B,) in any layouts; redistributed to the rule's):
///   loss_i = logsumexp(x_i) - x_i[label_i]
/// with logsumexp taken around the GLOBAL row max. The result is in the rule's output
/// layout: split by the batch axis, the full loss on every rank of a class group.
/// Throws on a label outside [0, C): "sparse_softmax_cross_entropy: label 9 at row 3 is
/// out of range [0, 8)", or one that is not an integer.
template <class T, class L, class D, class C>
tensor_on<T, D> sparse_softmax_cross_entropy(const sparse_softmax_cross_entropy_op& op,
                                             const tensor_on<T, D>& logits, const tensor_on<L, D>& labels,
                                             device_context<C>& ctx) {
  const sparse_cross_entropy_layouts r = op.rule(ctx.size(), logits.global_shape(), labels.global_shape());
  const auto lx = in_layout(logits, r.logits, ctx);
  const auto lt = in_layout(labels, r.labels, ctx);
  const auto s = detail::sparse_ce_row_stats(r, *lx, *lt, false, ctx);
  return tensor_on<T, D>(r.out, r.shape, ctx.rank(), kernels::backend<D>::sparse_ce_loss(s.max, s.terms));
}

/// dlogits of loss = sparse_softmax_cross_entropy(logits, labels) given dloss (B,) in any
/// layout (partial sums are resolved first):
///   dlogits_ij = dloss_i * (softmax(x_i)_j - [j == label_i])
/// in the logits' rule layout. Labels get no gradient.
template <class T, class L, class D, class C>
tensor_on<T, D> sparse_softmax_cross_entropy_backward(const sparse_softmax_cross_entropy_op& op,
                                                      const tensor_on<T, D>& dloss, const tensor_on<T, D>& logits,
                                                      const tensor_on<L, D>& labels, device_context<C>& ctx) {
  const sparse_cross_entropy_layouts r = op.rule(ctx.size(), logits.global_shape(), labels.global_shape());
  if (!(dloss.global_shape() == r.shape))
    throw error(std::string(op.name()) + "_backward: dloss is " + to_string(dloss.global_shape()) +
                ", expected " + to_string(r.shape));
  const auto lg = in_layout(dloss, r.out, ctx);
  const auto lx = in_layout(logits, r.logits, ctx);
  const auto lt = in_layout(labels, r.labels, ctx);
  const auto s = detail::sparse_ce_row_stats(r, *lx, *lt, true, ctx);
  return tensor_on<T, D>(r.logits, logits.global_shape(), ctx.rank(),
                         kernels::backend<D>::sparse_ce_grad(lg->local(), lx->local(), s.column, s.max, s.terms));
}

/// The sparse cross entropy's forward and backward as every operator's (ops/run.hpp):
/// labels of the tensors' type, integer-valued; they get no gradient.
template <class T, class D, class C>
tensor_on<T, D> forward(const sparse_softmax_cross_entropy_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return sparse_softmax_cross_entropy(op, *x[0], *x[1], ctx);
}
template <class T, class D, class C>
op_grads<T, D> backward(const sparse_softmax_cross_entropy_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>&, device_context<C>& ctx) {
  op_grads<T, D> g = grads_of(sparse_softmax_cross_entropy_backward(op, dy, *x[0], *x[1], ctx));
  g.emplace_back();
  return g;
}

}  // namespace tessera::ops
