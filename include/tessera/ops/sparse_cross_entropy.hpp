// Sharded SparseSoftmaxCrossEntropyWithLogits: the per-sample loss of logits (B, C)
// against integer class labels (B,) (stored as integers or integer-valued floats) and
// its gradient wrt the logits. The sharding rule is ops/sparse_cross_entropy_rule.hpp;
// the single-process reference kernels/cpu/softmax.hpp. With the class dim split, the
// row max and the row sums (with the label's logit) combine across the class axis.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/ops/sparse_cross_entropy_rule.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// SparseSoftmaxCrossEntropyWithLogits with a shard strategy, as
/// `SparseSoftmaxCrossEntropyWithLogits().shard(((2, 4), (2,)))`: the logits' rows b
/// ways and classes c ways, the labels as the rows. Returns the per-sample loss (as
/// SoftmaxCrossEntropyWithLogits does; reduce_mean gives MindSpore's mean loss).
struct sparse_softmax_cross_entropy_op {
  strategy st;

  static constexpr std::string_view name() { return "sparse_softmax_cross_entropy"; }

  /// The rule on `device_num` devices for logits and labels of the given global shapes;
  /// throws tessera::error with the rule broken, the numbers and the strategy:
  /// "sparse_softmax_cross_entropy: labels must be split as the logits' batch dim: labels
  /// split 4 ways, the logits' batch dim 2 ways; strategy ((2, 4), (4,))".
  sparse_cross_entropy_layouts rule(int device_num, const extents& logits, const extents& labels) const {
    const status s = check_sparse_softmax_cross_entropy(st, device_num, logits, labels);
    if (!s.ok()) {
      const bool own = what_must_hold(s.code).starts_with("sparse_softmax_cross_entropy");
      throw error(s, own ? std::string_view{} : name(), "strategy " + to_string(st));
    }
    return sparse_softmax_cross_entropy_rule(st, device_num, logits);
  }
};

namespace detail {

// Per local row: the GLOBAL row max, the global sum of exp(x - max), the label's logit
// (from the rank of the class group that holds it) and the label's local column (-1
// on the other ranks).
template <class T>
struct sparse_ce_rows {
  std::size_t rows = 0, cols = 0;
  std::vector<T> max, sum, picked;
  std::vector<std::int64_t> column;
};

template <class T, class L, class C>
sparse_ce_rows<T> sparse_ce_row_stats(const sparse_cross_entropy_layouts& r, const dist_tensor<T>& x,
                                      const dist_tensor<L>& t, device_context<C>& ctx) {
  const auto& px = x.local();
  sparse_ce_rows<T> s;
  s.rows = px.shape()[0];
  s.cols = px.shape()[1];
  const index_t classes = x.global_shape().v[1];
  const index_t first_row = t.local_offset().v[0], first_col = x.local_offset().v[1];
  s.column.assign(s.rows, -1);
  for (std::size_t i = 0; i < s.rows; ++i) {
    const L v = t.local().data()[i];
    auto where = [&] { return " at row " + std::to_string(first_row + index_t(i)); };
    if constexpr (std::floating_point<L>) {
      if (!(std::floor(v) == v)) {
        std::ostringstream text;
        text << "sparse_softmax_cross_entropy: label " << v << where() << " is not an integer";
        throw error(text.str());
      }
    }
    const auto k = std::int64_t(v);
    if (k < 0 || k >= classes)
      throw error("sparse_softmax_cross_entropy: label " + std::to_string(k) + where() +
                  " is out of range [0, " + std::to_string(classes) + ")");
    if (k >= first_col && k < first_col + index_t(s.cols)) s.column[i] = k - first_col;
  }
  s.max.assign(s.rows, -std::numeric_limits<T>::infinity());
  for (std::size_t i = 0; i < s.rows; ++i)
    for (std::size_t j = 0; j < s.cols; ++j) s.max[i] = std::max(s.max[i], px.data()[i * s.cols + j]);
  C* group = r.class_split > 1 ? &ctx.on(r.dev).group(axis_list{r.class_axis}) : nullptr;
  if (group) group->all_reduce(std::span<T>(s.max), reduce_op::max);
  // The sums and the label's logit in one buffer: one all_reduce (sum) for both.
  std::vector<T> acc(2 * s.rows, T(0));
  for (std::size_t i = 0; i < s.rows; ++i) {
    for (std::size_t j = 0; j < s.cols; ++j) acc[i] += std::exp(px.data()[i * s.cols + j] - s.max[i]);
    if (s.column[i] >= 0) acc[s.rows + i] = px.data()[i * s.cols + std::size_t(s.column[i])];
  }
  if (group) group->all_reduce(std::span<T>(acc), reduce_op::sum);
  s.sum.assign(acc.begin(), acc.begin() + std::ptrdiff_t(s.rows));
  s.picked.assign(acc.begin() + std::ptrdiff_t(s.rows), acc.end());
  return s;
}

}  // namespace detail

/// The per-sample loss (B,) of softmax(logits) against class labels (logits (B, C) and
/// labels (B,) in any layouts; redistributed to the rule's):
///   loss_i = logsumexp(x_i) - x_i[label_i]
/// with logsumexp taken around the GLOBAL row max. The result is in the rule's output
/// layout: split by the batch axis, the full loss on every rank of a class group.
/// Throws on a label outside [0, C): "sparse_softmax_cross_entropy: label 9 at row 3 is
/// out of range [0, 8)", or one that is not an integer.
template <class T, class L, class C>
dist_tensor<T> sparse_softmax_cross_entropy(const sparse_softmax_cross_entropy_op& op,
                                            const dist_tensor<T>& logits, const dist_tensor<L>& labels,
                                            device_context<C>& ctx) {
  const sparse_cross_entropy_layouts r = op.rule(ctx.size(), logits.global_shape(), labels.global_shape());
  const auto lx = in_layout(logits, r.logits, ctx);
  const auto lt = in_layout(labels, r.labels, ctx);
  const detail::sparse_ce_rows<T> s = detail::sparse_ce_row_stats(r, *lx, *lt, ctx);
  dist_tensor<T> y(r.out, r.shape, ctx.rank());
  T* o = y.local().data();
  for (std::size_t i = 0; i < s.rows; ++i) o[i] = s.max[i] + std::log(s.sum[i]) - s.picked[i];
  return y;
}

/// dlogits of loss = sparse_softmax_cross_entropy(logits, labels) given dloss (B,) in any
/// layout (partial sums are resolved first):
///   dlogits_ij = dloss_i * (softmax(x_i)_j - [j == label_i])
/// in the logits' rule layout. Labels get no gradient.
template <class T, class L, class C>
dist_tensor<T> sparse_softmax_cross_entropy_backward(const sparse_softmax_cross_entropy_op& op,
                                                     const dist_tensor<T>& dloss, const dist_tensor<T>& logits,
                                                     const dist_tensor<L>& labels, device_context<C>& ctx) {
  const sparse_cross_entropy_layouts r = op.rule(ctx.size(), logits.global_shape(), labels.global_shape());
  if (!(dloss.global_shape() == r.shape))
    throw error(std::string(op.name()) + "_backward: dloss is " + to_string(dloss.global_shape()) +
                ", expected " + to_string(r.shape));
  const auto lg = in_layout(dloss, r.out, ctx);
  const auto lx = in_layout(logits, r.logits, ctx);
  const auto lt = in_layout(labels, r.labels, ctx);
  const detail::sparse_ce_rows<T> s = detail::sparse_ce_row_stats(r, *lx, *lt, ctx);
  dist_tensor<T> dx(r.logits, logits.global_shape(), ctx.rank());
  const T* px = lx->local().data();
  const T* g = lg->local().data();
  T* o = dx.local().data();
  for (std::size_t i = 0; i < s.rows; ++i) {
    const T inv = T(1) / s.sum[i];
    for (std::size_t j = 0; j < s.cols; ++j) {
      const std::size_t k = i * s.cols + j;
      const T hot = std::int64_t(j) == s.column[i] ? T(1) : T(0);
      o[k] = g[i] * (std::exp(px[k] - s.max[i]) * inv - hot);
    }
  }
  return dx;
}

}  // namespace tessera::ops
