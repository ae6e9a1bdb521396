// ArgMax's definition: the sharding rule (the index of the maximum along one axis, as a
// reduction over that axis whose partial results, a maximum and its index per rank, the
// operator resolves itself, so the output holds whole indices), constexpr, and the
// operator type ops::argmax_op. Standard library only; the forward is in ops/argmax.hpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>
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

namespace ops {

/// ArgMax along `axis` with a shard strategy, as `Argmax(axis).shard(((2, 4),))`: the
/// index of the maximum (as a value of the tensors' type in the graph), data with no
/// gradient; rule argmax_rule. Candidates: every split tuple of the input; a split axis
/// combines the maxima and then the indices over its group. Data parallel: dim 0.
struct argmax_op {
  strategy st;
  int axis = -1;

  static constexpr std::string_view type() { return "Argmax"; }
  static constexpr std::string_view name() { return "argmax"; }
  static constexpr int arity = 1;

  bool differentiable(int) const { return false; }
  std::string attributes() const { return "axis: " + std::to_string(axis); }
  extents output_shape(const shape_list& in) const {
    require_shapes(check_argmax(all_ones(in), 1, in[0], axis));
    return argmax_rule(all_ones(in), 1, in[0], axis).shape;
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_argmax(s, device_num, in[0], axis);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const argmax_layouts r = argmax_rule(s, device_num, in[0], axis);
    return {r.dev, {r.in}, r.out, {r.in}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    return one_input_candidates(in[0], device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const { return split_dim(in[0], 0, device_num); }
  std::vector<internal_collective> collectives(const strategy& s, int device_num, const shape_list& in) const {
    return group_collectives(argmax_rule(s, device_num, in[0], axis), in[0]);
  }
  /// The AllReduces over the axis group when the axis is split (none otherwise): [0] the
  /// maxima, [1] the first index of each maximum (8-byte integers), one per local row.
  static std::vector<internal_collective> group_collectives(const argmax_layouts& r, const extents& shape) {
    if (r.group.empty()) return {};
    const index_t rows = local_rows(r.in, shape, r.axis);
    internal_collective index = all_reduce_of(reduce_op::min, r.dev, r.group, rows, "the first index of each maximum");
    index.element_bytes = 8;
    return {all_reduce_of(reduce_op::max, r.dev, r.group, rows, "the maxima"), index};
  }

  /// The rule; throws tessera::error naming the operator, the rule broken, the numbers
  /// and the strategy: "argmax: reduce: each axis must name a dim of the input: axis 2,
  /// input rank 2; strategy ((2, 4),)".
  argmax_layouts rule(int device_num, const extents& shape) const {
    require_rule(check_argmax(st, device_num, shape, axis), name(), st);
    return argmax_rule(st, device_num, shape, axis);
  }
};

}  // namespace ops

}  // namespace tessera
