// The sharding rule of Softmax and LogSoftmax along one axis: the input's split tuple
// gives the layouts; a split softmax axis is allowed, its row max and row sums then
// combine across the axis group. Standard library only and constexpr.
#pragma once

#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/strategy.hpp>
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

}  // namespace tessera
