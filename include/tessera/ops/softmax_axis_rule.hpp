// Softmax's and LogSoftmax's definition along one axis: the sharding rule (the input's
// split tuple gives the layouts; a split softmax axis is allowed, its row max and row
// sums then combine across the axis group), constexpr, and the operator type
// ops::softmax_axis_op<Log>. Standard library only; the forward and backward are in
// ops/softmax_axis.hpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/split_check.hpp>

namespace tessera {

/// The layouts of y = softmax(x, axis) or log_softmax(x, axis).
struct softmax_layouts {
  mesh dev;         ///< the input's split tuple, or (replicas, ...)
  layout in;        ///< the input, split by the strategy
  layout out;       ///< the output (and the input's gradient): as the input
  int axis = 0;     ///< the softmax dim, in [0, rank)
  axis_list group;  ///< the mesh axes that split the softmax dim (empty: no communication)
  friend constexpr bool operator==(const softmax_layouts&, const softmax_layouts&) = default;
};

/// Checks a Softmax strategy on `device_num` devices for an input of shape `shape`: one
/// split tuple with one entry per dim, positive splits whose product divides the
/// device count, an axis in [-rank, rank), and every extent divisible by its split.
constexpr status check_softmax(const strategy& st, int device_num, const extents& shape, int axis) {
  if (st.n != 1) return fail(errc::op_inputs, -1, -1, st.n, 1);
  if (st.in[0].n != shape.ndim) return fail(errc::op_input_ndim, 0, -1, st.in[0].n, shape.ndim);
  if (status s = check(st, device_num); !s.ok()) return s;
  if (axis < -shape.ndim || axis >= shape.ndim) return fail(errc::softmax_axis, -1, -1, axis, shape.ndim);
  return detail::check_divides(st.in[0], shape);
}

/// The rule: input and output are strategy_layout's for the split tuple, so a softmax
/// needs no communication unless its axis is split; then each rank's partial row max
/// and row sums combine over `group` (an all-reduce of one value per row each).
/// Example: (2, 4) on 8 devices, axis -1 -> device matrix (2, 4); rows split by axis 0,
/// the softmax dim by axis 1: group {1}.
/// @pre check_softmax(st, device_num, shape, axis).ok()
constexpr softmax_layouts softmax_rule(const strategy& st, int device_num, const extents& shape, int axis) {
  softmax_layouts r;
  r.in = strategy_layout(st.in[0], device_num);
  r.out = r.in;
  r.dev = r.in.dev;
  r.axis = axis < 0 ? axis + shape.ndim : axis;
  if (st.in[0].v[r.axis] > 1) r.group = r.in.split[r.axis];
  return r;
}

/// The rule for a static strategy, shape and axis; an invalid one fails to compile with
/// the rule it breaks as the message.
template <strategy St, int DeviceNum, extents Shape, int Axis = -1>
inline constexpr softmax_layouts static_softmax_rule = [] {
  constexpr status s = check_softmax(St, DeviceNum, Shape, Axis);
  detail::static_require<s>();
  if constexpr (s.ok()) return softmax_rule(St, DeviceNum, Shape, Axis);
  else return softmax_layouts{};
}();

namespace ops {

/// Softmax (Log = false) or LogSoftmax (Log = true) along `axis` with a shard strategy,
/// as `Softmax(axis).shard(((2, 4),))`; rule softmax_rule. Candidates: every split tuple
/// of the input; a split axis combines the rows' maxima and sums over its group (forward
/// two all-reduces of one value per row, backward one). Data parallel: dim 0.
template <bool Log>
struct softmax_axis_op {
  strategy st;
  int axis = -1;

  static constexpr std::string_view type() { return Log ? "LogSoftmax" : "Softmax"; }
  static constexpr std::string_view name() { return Log ? "log_softmax" : "softmax"; }
  static constexpr int arity = 1;

  std::string attributes() const { return "axis: " + std::to_string(axis); }
  extents output_shape(const shape_list& in) const {
    require_shapes(check_softmax(all_ones(in), 1, in[0], axis));
    return in[0];
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_softmax(s, device_num, in[0], axis);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const softmax_layouts r = softmax_rule(s, device_num, in[0], axis);
    return {r.dev, {r.in}, r.out, {r.in}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    return one_input_candidates(in[0], device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const { return split_dim(in[0], 0, device_num); }
  std::vector<internal_collective> collectives(const strategy& s, int device_num, const shape_list& in) const {
    const softmax_layouts r = softmax_rule(s, device_num, in[0], axis);
    std::vector<internal_collective> c = forward_collectives(r, in[0]);
    if (!c.empty()) c.push_back(backward_collective(r, in[0]));
    return c;
  }
  /// The AllReduces of the forward over the axis group when the axis is split (none
  /// otherwise): [0] the row maxima, [1] the row sums, one value per local row each.
  static std::vector<internal_collective> forward_collectives(const softmax_layouts& r, const extents& shape) {
    if (r.group.empty()) return {};
    const index_t rows = local_rows(r.in, shape, r.axis);
    return {all_reduce_of(reduce_op::max, r.dev, r.group, rows, "row maxima"),
            all_reduce_of(reduce_op::sum, r.dev, r.group, rows, "row sums")};
  }
  /// The backward's AllReduce of the gradient's row sums over the axis group.
  static internal_collective backward_collective(const softmax_layouts& r, const extents& shape) {
    return all_reduce_of(reduce_op::sum, r.dev, r.group, local_rows(r.in, shape, r.axis),
                         "row sums of the gradient", true);
  }

  /// The rule on `device_num` devices for an input of global shape `shape`; throws
  /// tessera::error naming the operator, the rule broken, the numbers and the strategy:
  /// "log_softmax: softmax: the axis must name a dim of the input: axis 2, input rank 2;
  /// strategy ((2, 4),)".
  softmax_layouts rule(int device_num, const extents& shape) const {
    require_rule(check_softmax(st, device_num, shape, axis), name(), st);
    return softmax_rule(st, device_num, shape, axis);
  }
};

using softmax_op = softmax_axis_op<false>;
using log_softmax_op = softmax_axis_op<true>;

}  // namespace ops

}  // namespace tessera
