// ArgMax's sharding rule: the index of the maximum along one axis, as a reduction over
// that axis whose partial results (a maximum and its index per rank) the operator
// resolves itself, so the output holds whole indices. Standard library only and
// constexpr.
#pragma once

#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/reduce_rule.hpp>

namespace tessera {

/// The layouts of y = argmax(x, axis).
struct argmax_layouts {
  mesh dev;         ///< the input's split tuple, or (replicas, ...)
  layout in;        ///< the input, split by the strategy
  layout out;       ///< the kept dims keep their axes; replicated over the axis group
  extents shape;    ///< the input's shape without the axis
  int axis = 0;     ///< the reduced dim, in [0, rank)
  axis_list group;  ///< the mesh axes that split the axis (empty: no communication)
  friend constexpr bool operator==(const argmax_layouts&, const argmax_layouts&) = default;
};

/// Checks an ArgMax strategy: the reduction's checks (reduce_rule.hpp) for the one dim
/// `axis`.
constexpr status check_argmax(const strategy& st, int device_num, const extents& shape, int axis) {
  return check_reduce(st, device_num, shape, dim_list{axis});
}

/// The rule: reduce_rule's for a ReduceMax over `axis` without keep_dims, the output's
/// partial state resolved: when the axis is split, the ranks of `group` combine their
/// maxima and then the smallest global index that attains the maximum.
/// Example: (2, 4) on 8 devices, axis -1 -> device matrix (2, 4); x split rows by axis
/// 0 and columns by axis 1; y (B,) split by axis 0, group {1}.
/// @pre check_argmax(st, device_num, shape, axis).ok()
constexpr argmax_layouts argmax_rule(const strategy& st, int device_num, const extents& shape, int axis) {
  const reduce_layouts rr = reduce_rule(st, device_num, shape, dim_list{axis}, false, reduce_op::max);
  argmax_layouts r;
  r.dev = rr.dev;
  r.in = rr.in;
  r.out = rr.out.without_partial();
  r.shape = rr.shape;
  r.axis = axis < 0 ? axis + shape.ndim : axis;
  if (st.in[0].v[r.axis] > 1) r.group = r.in.split[r.axis];
  return r;
}

/// The rule for a static strategy, shape and axis; an invalid one fails to compile.
template <strategy St, int DeviceNum, extents Shape, int Axis = -1>
inline constexpr argmax_layouts static_argmax_rule = [] {
  constexpr status s = check_argmax(St, DeviceNum, Shape, Axis);
  detail::static_require<s>();
  if constexpr (s.ok()) return argmax_rule(St, DeviceNum, Shape, Axis);
  else return argmax_layouts{};
}();

}  // namespace tessera
