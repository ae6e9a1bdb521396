// The sharding rule of SparseSoftmaxCrossEntropyWithLogits: logits (B, C) split by
// ((b, c), (b,)), labels (B,) integer class indices split as the logits' rows; the
// output is the per-sample loss (B,). Standard library only and constexpr.
#pragma once

#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/strategy.hpp>
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

}  // namespace tessera
