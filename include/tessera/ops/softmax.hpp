// Sharded SoftmaxCrossEntropyWithLogits: the per-sample loss of logits (B, C) against
// labels (B, C) and its gradient wrt the logits. The sharding rule is
// ops/softmax_rule.hpp; the single-process reference kernels/cpu/softmax.hpp. With the
// class dim split, the row max and the row sums are combined across the class axis.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/softmax.hpp>
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

// Per local row: the GLOBAL row max, the global sum of exp(x - max), the global label
// mass sum_j t_j, and the global sum_j t_j * (max - x_j) (all over the class group).
template <class T>
struct ce_rows {
  std::size_t rows = 0, cols = 0;
  std::vector<T> max, sum, mass, term;
};

template <class T, class C>
ce_rows<T> ce_row_stats(const cross_entropy_layouts& r, const dist_tensor<T>& x, const dist_tensor<T>& t,
                        device_context<C>& ctx) {
  const auto& px = x.local();
  const auto& pt = t.local();
  ce_rows<T> s;
  s.rows = px.shape()[0];
  s.cols = px.shape()[1];
  s.max.assign(s.rows, -std::numeric_limits<T>::infinity());
  for (std::size_t i = 0; i < s.rows; ++i)
    for (std::size_t j = 0; j < s.cols; ++j) s.max[i] = std::max(s.max[i], px.data()[i * s.cols + j]);
  C* group = r.class_split > 1 ? &ctx.on(r.dev).group(axis_list{r.class_axis}) : nullptr;
  if (group) group->all_reduce(std::span<T>(s.max), reduce_op::max);
  // sum, mass and term in one buffer: one all_reduce (sum) for the three.
  std::vector<T> acc(3 * s.rows, T(0));
  for (std::size_t i = 0; i < s.rows; ++i) {
    const T m = s.max[i];
    for (std::size_t j = 0; j < s.cols; ++j) {
      const T xv = px.data()[i * s.cols + j], tv = pt.data()[i * s.cols + j];
      acc[i] += std::exp(xv - m);
      acc[s.rows + i] += tv;
      acc[2 * s.rows + i] += tv * (m - xv);
    }
  }
  if (group) group->all_reduce(std::span<T>(acc), reduce_op::sum);
  s.sum.assign(acc.begin(), acc.begin() + std::ptrdiff_t(s.rows));
  s.mass.assign(acc.begin() + std::ptrdiff_t(s.rows), acc.begin() + std::ptrdiff_t(2 * s.rows));
  s.term.assign(acc.begin() + std::ptrdiff_t(2 * s.rows), acc.end());
  return s;
}

}  // namespace detail

/// The per-sample loss (B,) of softmax(logits) against labels (both (B, C), any
/// layouts; redistributed to the rule's):
///   loss_i = sum_j t_ij * (logsumexp(x_i) - x_ij)
/// with logsumexp taken around the GLOBAL row max (numerically stable). The result is
/// in the rule's output layout: split by the batch axis, and every rank of a class
/// group holds the full loss of its rows (not a partial one).
template <class T, class C>
dist_tensor<T> softmax_cross_entropy(const softmax_cross_entropy_op& op, const dist_tensor<T>& logits,
                                     const dist_tensor<T>& labels, device_context<C>& ctx) {
  const cross_entropy_layouts r = op.rule(ctx.size(), logits.global_shape(), labels.global_shape());
  const auto lx = in_layout(logits, r.logits, ctx);
  const auto lt = in_layout(labels, r.labels, ctx);
  const detail::ce_rows<T> s = detail::ce_row_stats(r, *lx, *lt, ctx);
  dist_tensor<T> y(r.out, r.shape, ctx.rank());
  T* o = y.local().data();
  for (std::size_t i = 0; i < s.rows; ++i)
    o[i] = s.sum[i] > T(0) ? s.term[i] + s.mass[i] * std::log(s.sum[i]) : T(0);
  return y;
}

/// dlogits of loss = softmax_cross_entropy(logits, labels) given dloss (B,) in any
/// layout (partial sums are resolved first):
///   dlogits_ij = dloss_i * (softmax(x_i)_j * sum_k t_ik - t_ij)
/// in the logits' rule layout. Labels get no gradient.
template <class T, class C>
dist_tensor<T> softmax_cross_entropy_backward(const softmax_cross_entropy_op& op, const dist_tensor<T>& dloss,
                                              const dist_tensor<T>& logits, const dist_tensor<T>& labels,
                                              device_context<C>& ctx) {
  const cross_entropy_layouts r = op.rule(ctx.size(), logits.global_shape(), labels.global_shape());
  if (!(dloss.global_shape() == r.shape))
    throw error(std::string(op.name()) + "_backward: dloss is " + to_string(dloss.global_shape()) +
                ", expected " + to_string(r.shape));
  const auto lg = in_layout(dloss, r.out, ctx);
  const auto lx = in_layout(logits, r.logits, ctx);
  const auto lt = in_layout(labels, r.labels, ctx);
  const detail::ce_rows<T> s = detail::ce_row_stats(r, *lx, *lt, ctx);
  dist_tensor<T> dx(r.logits, logits.global_shape(), ctx.rank());
  const T* px = lx->local().data();
  const T* pt = lt->local().data();
  const T* g = lg->local().data();
  T* o = dx.local().data();
  for (std::size_t i = 0; i < s.rows; ++i) {
    const T inv = s.sum[i] > T(0) ? T(1) / s.sum[i] : T(0);
    for (std::size_t j = 0; j < s.cols; ++j) {
      const std::size_t k = i * s.cols + j;
      o[k] = g[i] * (std::exp(px[k] - s.max[i]) * inv * s.mass[i] - pt[k]);
    }
  }
  return dx;
}

}  // namespace tessera::ops
