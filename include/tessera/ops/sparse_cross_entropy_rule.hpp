// SparseSoftmaxCrossEntropyWithLogits' definition: the sharding rule (logits (B, C)
// split by ((b, c), (b,)), labels (B,) integer class indices split as the logits' rows;
// the output is the per-sample loss (B,)), constexpr, and the operator type
// ops::sparse_softmax_cross_entropy_op. Standard library only; the forward and backward
// are in ops/sparse_cross_entropy.hpp.
#pragma once

#include <string_view>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/split_check.hpp>

namespace tessera {

/// The layouts of loss = sparse_softmax_cross_entropy(logits, labels).
struct sparse_cross_entropy_layouts {
  mesh dev;             ///< the device matrix: (b, c), or (replicas, b, c)
  layout logits;        ///< rows split by the batch axis, classes by the class axis
  layout labels;        ///< (B,): split by the batch axis, replicated over the class axis
  layout out;           ///< the loss (B,): as the labels
  extents shape;        ///< the loss' global shape (B,)
  int batch_axis = 0;   ///< the device-matrix axis that splits the rows
  int class_axis = 1;   ///< the device-matrix axis that splits the classes
  int class_split = 1;  ///< c: > 1 when row max and row sums combine across class_axis
  friend constexpr bool operator==(const sparse_cross_entropy_layouts&,
                                   const sparse_cross_entropy_layouts&) = default;
};

/// Checks a SparseSoftmaxCrossEntropyWithLogits strategy on `device_num` devices for
/// logits (B, C) and labels (B,): two split tuples, of two entries and one, positive
/// splits whose product divides the device count, one label per row, the labels split
/// as the rows, and the logits' extents divisible by their splits. Example on 8 devices with logits (16, 8): ((2, 4), (2,)) is
/// valid; ((2, 4), (4,)) splits the labels unlike the rows.
constexpr status check_sparse_softmax_cross_entropy(const strategy& st, int device_num,
                                                    const extents& logits, const extents& labels) {
  if (st.n != 2) return fail(errc::op_inputs, -1, -1, st.n, 2);
  if (logits.ndim != 2) return fail(errc::sparse_cross_entropy_rank, 0, -1, logits.ndim);
  if (labels.ndim != 1) return fail(errc::sparse_cross_entropy_rank, 1, -1, labels.ndim);
  if (st.in[0].n != 2) return fail(errc::op_input_ndim, 0, -1, st.in[0].n, 2);
  if (st.in[1].n != 1) return fail(errc::op_input_ndim, 1, -1, st.in[1].n, 1);
  if (status s = check(st, device_num); !s.ok()) return s;
  if (labels.v[0] != logits.v[0] && labels.v[0] != dynamic_extent && logits.v[0] != dynamic_extent)
    return fail(errc::sparse_cross_entropy_shapes, -1, -1, labels.v[0], logits.v[0]);
  if (st.in[1].v[0] != st.in[0].v[0])
    return fail(errc::sparse_cross_entropy_split, -1, -1, st.in[1].v[0], st.in[0].v[0]);
  return detail::check_divides(st.in[0], logits);
}

/// The rule: the device matrix and the logits' layout are strategy_layout's for the
/// logits' split tuple (b, c); labels and loss are split by the batch axis and
/// replicated over the class axis. When the classes are split, each rank of a class
/// group holds the label of its rows, and the one holding that class contributes the
/// label's logit to the row sums combined over the group: every rank of it gets the
/// full loss of its rows.
/// Example: ((2, 2), (2,)) on 8 devices -> device matrix (2, 2, 2); logits split rows
/// by axis 1 and classes by axis 2; labels and loss split by axis 1.
/// @pre check_sparse_softmax_cross_entropy(st, device_num, logits, labels).ok()
constexpr sparse_cross_entropy_layouts sparse_softmax_cross_entropy_rule(const strategy& st, int device_num,
                                                                         const extents& logits) {
  sparse_cross_entropy_layouts r;
  r.logits = strategy_layout(st.in[0], device_num);
  r.dev = r.logits.dev;
  r.batch_axis = r.dev.ndim - 2;
  r.class_axis = r.dev.ndim - 1;
  r.class_split = st.in[0].v[1];
  r.labels = layout::replicated(r.dev, 1);
  r.labels.split[0] = axis_list{r.batch_axis};
  r.out = r.labels;
  r.shape = extents{logits.v[0]};
  return r;
}

/// The rule for a static strategy and shapes; an invalid one fails to compile with the
/// rule it breaks as the message.
template <strategy St, int DeviceNum, extents Logits, extents Labels>
inline constexpr sparse_cross_entropy_layouts static_sparse_softmax_cross_entropy_rule = [] {
  constexpr status s = check_sparse_softmax_cross_entropy(St, DeviceNum, Logits, Labels);
  detail::static_require<s>();
  if constexpr (s.ok()) return sparse_softmax_cross_entropy_rule(St, DeviceNum, Logits);
  else return sparse_cross_entropy_layouts{};
}();

namespace ops {

/// SparseSoftmaxCrossEntropyWithLogits with a shard strategy, as
/// `SparseSoftmaxCrossEntropyWithLogits().shard(((2, 4), (2,)))`: the logits' rows b
/// ways and classes c ways, the labels as the rows; rule
/// sparse_softmax_cross_entropy_rule. Returns the per-sample loss (as
/// SoftmaxCrossEntropyWithLogits does; reduce_mean gives MindSpore's mean loss). Labels
/// get no gradient. Candidates: every ((b, c), (b,)) with b | B, c | C and b c dividing
/// the device count. Data parallel: b = device count. A split class dim combines the
/// row maxima and sums over the class axis, forward and backward.
struct sparse_softmax_cross_entropy_op {
  strategy st;

  static constexpr std::string_view type() { return "SparseSoftmaxCrossEntropyWithLogits"; }
  static constexpr std::string_view name() { return "sparse_softmax_cross_entropy"; }
  static constexpr int arity = 2;

  bool differentiable(int i) const { return i == 0; }
  extents output_shape(const shape_list& in) const {
    require_shapes(check_sparse_softmax_cross_entropy(all_ones(in), 1, in[0], in[1]));
    return extents{in[0][0]};
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_sparse_softmax_cross_entropy(s, device_num, in[0], in[1]);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const sparse_cross_entropy_layouts r = sparse_softmax_cross_entropy_rule(s, device_num, in[0]);
    return {r.dev, {r.logits, r.labels}, r.out, {r.logits, r.labels}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    std::vector<strategy> c;
    for_each_split(in[0], device_num, [&](const split_tuple& t) { c.push_back(strategy{t, {t[0]}}); });
    order_candidates(c, [](const strategy& s) { return s.in[0].product(); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list&) const { return strategy{{device_num, 1}, {device_num}}; }
  std::vector<internal_collective> collectives(const strategy& s, int device_num, const shape_list& in) const {
    const sparse_cross_entropy_layouts r = sparse_softmax_cross_entropy_rule(s, device_num, in[0]);
    std::vector<internal_collective> c = row_collectives(r, in[0], false);
    for (const internal_collective& b : row_collectives(r, in[0], true)) c.push_back(b);
    return c;
  }
  /// The AllReduces over the class axis that combine each local row's statistics when
  /// the classes are split (none otherwise): [0] the row maxima (one per row), [1] the row
  /// sums and the labels' logits (two per row). The forward runs them, and the backward
  /// again.
  static std::vector<internal_collective> row_collectives(const sparse_cross_entropy_layouts& r,
                                                          const extents& logits, bool backward) {
    if (r.class_split <= 1) return {};
    const index_t rows = local_shape(r.logits, logits)[0];
    const axis_list axes{r.class_axis};
    return {all_reduce_of(reduce_op::max, r.dev, axes, rows, "row maxima", backward),
            all_reduce_of(reduce_op::sum, r.dev, axes, 2 * rows, "row sums and the labels' logits", backward)};
  }

  /// The rule on `device_num` devices for logits and labels of the given global shapes;
  /// throws tessera::error with the rule broken, the numbers and the strategy:
  /// "sparse_softmax_cross_entropy: labels must be split as the logits' batch dim: labels
  /// split 4 ways, the logits' batch dim 2 ways; strategy ((2, 4), (4,))".
  sparse_cross_entropy_layouts rule(int device_num, const extents& logits, const extents& labels) const {
    require_rule(check_sparse_softmax_cross_entropy(st, device_num, logits, labels), name(), st);
    return sparse_softmax_cross_entropy_rule(st, device_num, logits);
  }
};

}  // namespace ops

}  // namespace tessera
