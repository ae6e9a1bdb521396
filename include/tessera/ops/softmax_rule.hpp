// SoftmaxCrossEntropyWithLogits' definition: the sharding rule (logits (B, C) and
// one-hot (or distribution) labels (B, C) split alike by ((b, c), (b, c)), the class dim
// possibly split; the output is the per-sample loss (B,)), constexpr, and the operator
// type ops::softmax_cross_entropy_op. Standard library only; the forward and backward
// are in ops/softmax.hpp.
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

namespace tessera {

/// The layouts of loss = softmax_cross_entropy(logits, labels).
struct cross_entropy_layouts {
  mesh dev;             ///< the device matrix: (b, c), or (replicas, b, c)
  layout logits;        ///< rows split by the batch axis, classes by the class axis
  layout labels;        ///< as logits
  layout out;           ///< the loss (B,): split by the batch axis, replicated elsewhere
  extents shape;        ///< the loss' global shape (B,)
  int batch_axis = 0;   ///< the device-matrix axis that splits the rows
  int class_axis = 1;   ///< the device-matrix axis that splits the classes
  int class_split = 1;  ///< c: > 1 when row max and row sums combine across class_axis
  friend constexpr bool operator==(const cross_entropy_layouts&, const cross_entropy_layouts&) = default;
};

/// Checks a SoftmaxCrossEntropyWithLogits strategy on `device_num` devices for logits
/// and labels of the given shapes: two split tuples of two entries, positive splits
/// whose product divides the device count, both inputs of rank 2 and the same shape,
/// and labels split exactly as logits. Example on 8 devices with (16, 8) inputs:
/// ((2, 4), (2, 4)) is valid; ((2, 4), (2, 2)) splits the labels unlike the logits.
constexpr status check_softmax_cross_entropy(const strategy& st, int device_num, const extents& logits,
                                             const extents& labels) {
  if (st.n != 2) return fail(errc::op_inputs, -1, -1, st.n, 2);
  if (logits.ndim != 2) return fail(errc::cross_entropy_rank, 0, -1, logits.ndim);
  if (labels.ndim != 2) return fail(errc::cross_entropy_rank, 1, -1, labels.ndim);
  for (int i = 0; i < 2; ++i)
    if (st.in[i].n != 2) return fail(errc::op_input_ndim, i, -1, st.in[i].n, 2);
  if (status s = check(st, device_num); !s.ok()) return s;
  for (int d = 0; d < 2; ++d)
    if (labels.v[d] != logits.v[d] && labels.v[d] != dynamic_extent && logits.v[d] != dynamic_extent)
      return fail(errc::cross_entropy_shapes, d, -1, labels.v[d], logits.v[d]);
  for (int d = 0; d < 2; ++d)
    if (st.in[1].v[d] != st.in[0].v[d])
      return fail(errc::cross_entropy_split, d, -1, st.in[1].v[d], st.in[0].v[d]);
  return {};
}

/// The rule: the device matrix and the inputs' layouts are strategy_layout's for the
/// logits' split tuple (b, c), so a replica axis leads when b * c uses fewer devices.
/// The loss (B,) is split by the batch axis and replicated over the class axis: the
/// class group's row max and row sums are combined (all_reduce) so that every rank of
/// it holds the full per-sample loss, never a partial one.
/// Example: ((2, 2), (2, 2)) on 8 devices -> device matrix (2, 2, 2); logits and
/// labels split rows by axis 1 and classes by axis 2; the loss split by axis 1.
/// @pre check_softmax_cross_entropy(st, device_num, logits, labels).ok()
constexpr cross_entropy_layouts softmax_cross_entropy_rule(const strategy& st, int device_num,
                                                           const extents& logits) {
  cross_entropy_layouts r;
  r.logits = strategy_layout(st.in[0], device_num);
  r.labels = r.logits;
  r.dev = r.logits.dev;
  r.batch_axis = r.dev.ndim - 2;
  r.class_axis = r.dev.ndim - 1;
  r.class_split = st.in[0].v[1];
  r.out = layout::replicated(r.dev, 1);
  r.out.split[0] = axis_list{r.batch_axis};
  r.shape = extents{logits.v[0]};
  return r;
}

/// The rule for a static strategy and shapes; an invalid one fails to compile with the
/// rule it breaks as the message.
template <strategy St, int DeviceNum, extents Logits, extents Labels = Logits>
inline constexpr cross_entropy_layouts static_softmax_cross_entropy_rule = [] {
  constexpr status s = check_softmax_cross_entropy(St, DeviceNum, Logits, Labels);
  detail::static_require<s>();
  if constexpr (s.ok()) return softmax_cross_entropy_rule(St, DeviceNum, Logits);
  else return cross_entropy_layouts{};
}();

namespace ops {

/// SoftmaxCrossEntropyWithLogits with a shard strategy, as
/// `SoftmaxCrossEntropyWithLogits().shard(((2, 4), (2, 4)))`: logits and labels split
/// alike, rows b ways and classes c ways; rule softmax_cross_entropy_rule. Labels get no
/// gradient. Candidates: every ((b, c), (b, c)) with b | B, c | C and b c dividing the
/// device count. Data parallel: b = device count. With the class dim split (c > 1) it
/// combines row maxima and row sums over the class axis, forward and backward.
struct softmax_cross_entropy_op {
  strategy st;

  static constexpr std::string_view type() { return "SoftmaxCrossEntropyWithLogits"; }
  static constexpr std::string_view name() { return "softmax_cross_entropy"; }
  static constexpr int arity = 2;

  bool differentiable(int i) const { return i == 0; }
  extents output_shape(const shape_list& in) const {
    require_shapes(check_softmax_cross_entropy(all_ones(in), 1, in[0], in[1]));
    return extents{in[0][0]};
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_softmax_cross_entropy(s, device_num, in[0], in[1]);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const cross_entropy_layouts r = softmax_cross_entropy_rule(s, device_num, in[0]);
    return {r.dev, {r.logits, r.labels}, r.out, {r.logits, r.labels}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    std::vector<strategy> c;
    for_each_split(in[0], device_num, [&](const split_tuple& t) { c.push_back(strategy{t, t}); });
    order_candidates(c, [](const strategy& s) { return s.in[0].product(); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list&) const {
    return strategy{{device_num, 1}, {device_num, 1}};
  }
  std::vector<internal_collective> collectives(const strategy& s, int device_num, const shape_list& in) const {
    const cross_entropy_layouts r = softmax_cross_entropy_rule(s, device_num, in[0]);
    std::vector<internal_collective> c = row_collectives(r, in[0], false);
    for (const internal_collective& b : row_collectives(r, in[0], true)) c.push_back(b);
    return c;
  }
  /// The AllReduces over the class axis that combine each local row's statistics when
  /// the classes are split (none otherwise): [0] the row maxima (one per row), [1] the row
  /// sums, label masses and label-weighted terms (three per row). The forward runs them,
  /// and the backward again.
  static std::vector<internal_collective> row_collectives(const cross_entropy_layouts& r, const extents& logits,
                                                          bool backward) {
    if (r.class_split <= 1) return {};
    const index_t rows = local_shape(r.logits, logits)[0];
    const axis_list axes{r.class_axis};
    return {all_reduce_of(reduce_op::max, r.dev, axes, rows, "row maxima", backward),
            all_reduce_of(reduce_op::sum, r.dev, axes, 3 * rows, "row sums", backward)};
  }

  /// The rule on `device_num` devices for logits and labels of the given global
  /// shapes; throws tessera::error with the rule broken, the numbers and the strategy:
  /// "softmax_cross_entropy: logits and labels must be split alike: dim 1: labels split
  /// 2 ways, logits 4 ways; strategy ((2, 4), (2, 2))".
  cross_entropy_layouts rule(int device_num, const extents& logits, const extents& labels) const {
    require_rule(check_softmax_cross_entropy(st, device_num, logits, labels), name(), st);
    return softmax_cross_entropy_rule(st, device_num, logits);
  }
};

}  // namespace ops

}  // namespace tessera
