// OneHot's definition: the sharding rule (indices (...) -> (..., depth), the strategy
// splitting the output, i.e. the indices' dims and optionally the depth), constexpr, and
// the operator type ops::one_hot_op. Standard library only; the forward is in
// ops/one_hot.hpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/split_check.hpp>

namespace tessera {

/// The layouts of y = one_hot(indices, depth, on, off).
struct one_hot_layouts {
  mesh dev;            ///< the output's split tuple, or (replicas, ...)
  layout indices;      ///< the output's layout without its depth dim (replicated over the depth axis)
  layout out;          ///< split by the strategy: (..., depth)
  extents shape;       ///< the output's global shape: indices.shape + (depth,)
  int depth_axis = 0;  ///< the device-matrix axis that splits the depth
  int depth_split = 1; ///< into how many pieces the depth is cut
  friend constexpr bool operator==(const one_hot_layouts&, const one_hot_layouts&) = default;
};

/// Checks a OneHot strategy on `device_num` devices for indices of shape `indices` and
/// `depth` classes: MindSpore's form ((b, d), (), ()) (the on and off values are
/// scalars) or just ((b, d),); one entry per output dim (the indices' dims, then the
/// depth); positive splits whose product divides the device count; depth >= 0; every
/// output extent divisible by its split.
/// Example: indices (16,), depth 8 on 8 devices: ((2, 4),) and ((8, 1), (), ()) are
/// valid; ((2,),) misses the depth's entry.
constexpr status check_one_hot(const strategy& st, int device_num, const extents& indices, index_t depth) {
  if (st.n != 1 && st.n != 3) return fail(errc::one_hot_inputs, -1, -1, st.n);
  for (int i = 1; i < st.n; ++i)
    if (st.in[i].n != 0) return fail(errc::one_hot_value_split, i, -1, st.in[i].n);
  if (indices.ndim + 1 > max_tensor_ndim)
    return fail(errc::layout_ndim, -1, -1, indices.ndim + 1, max_tensor_ndim);
  if (st.in[0].n != indices.ndim + 1) return fail(errc::one_hot_ndim, -1, -1, st.in[0].n, indices.ndim + 1);
  if (status s = check(st, device_num); !s.ok()) return s;
  if (depth < 0) return fail(errc::one_hot_depth, -1, -1, depth);
  extents out = indices;
  out.v[out.ndim++] = depth;
  return detail::check_divides(st.in[0], out);
}

/// The rule: the output's layout is strategy_layout's for the strategy's tuple (device
/// matrix (b, d), or (replicas, b, d)); the indices are split as the output's leading
/// dims and replicated over the depth axis, so each rank writes the columns of its
/// piece of the depth. No communication.
/// Example: ((2, 4),) on 8 devices, indices (16,), depth 8 -> device matrix (2, 4);
/// indices split by axis 0; the output's (8, 2) shards split rows by axis 0 and
/// columns by axis 1.
/// @pre check_one_hot(st, device_num, indices, depth).ok()
constexpr one_hot_layouts one_hot_rule(const strategy& st, int device_num, const extents& indices,
                                       index_t depth) {
  one_hot_layouts r;
  r.out = strategy_layout(st.in[0], device_num);
  r.dev = r.out.dev;
  r.indices = layout::replicated(r.dev, indices.ndim);
  for (int d = 0; d < indices.ndim; ++d) r.indices.split[d] = r.out.split[d];
  r.depth_axis = r.out.split[indices.ndim].v[0];
  r.depth_split = st.in[0].v[indices.ndim];
  r.shape = indices;
  r.shape.v[r.shape.ndim++] = depth;
  return r;
}

/// The rule for a static strategy, shape and depth; an invalid one fails to compile with
/// the rule it breaks as the message.
template <strategy St, int DeviceNum, extents Indices, index_t Depth>
inline constexpr one_hot_layouts static_one_hot_rule = [] {
  constexpr status s = check_one_hot(St, DeviceNum, Indices, Depth);
  detail::static_require<s>();
  if constexpr (s.ok()) return one_hot_rule(St, DeviceNum, Indices, Depth);
  else return one_hot_layouts{};
}();

namespace ops {

/// OneHot with a shard strategy, as `OneHot().shard(((2, 4), (), ()))` applied with
/// `depth` classes (axis -1: the depth is the output's last dim), `on` at each index and
/// `off` elsewhere; rule one_hot_rule. Its strategy splits the OUTPUT, as MindSpore's
/// ((b, d),): one entry per output dim. The indices get no gradient. Candidates: every
/// split tuple of the output. Data parallel: output dim 0.
struct one_hot_op {
  strategy st;
  index_t depth = 0;
  double on = 1;
  double off = 0;

  static constexpr std::string_view type() { return "OneHot"; }
  static constexpr std::string_view name() { return "one_hot"; }
  static constexpr int arity = 1;

  bool differentiable(int) const { return false; }
  std::string attributes() const { return "depth: " + std::to_string(depth) + ", axis: -1"; }
  extents output_shape(const shape_list& in) const {
    require_shapes(check_one_hot(strategy{ones(in[0].ndim + 1)}, 1, in[0], depth));
    extents out = in[0];
    out.v[out.ndim++] = depth;
    return out;
  }
  /// ((b, d),), or MindSpore's ((b, d), (), ()) (empty tuples for the on and off values).
  status check_form(const strategy& s, const shape_list& in) const {
    if (s.n != 1 && s.n != 3) return fail(errc::one_hot_inputs, -1, -1, s.n);
    for (int i = 1; i < s.n; ++i)
      if (s.in[i].n != 0) return fail(errc::one_hot_value_split, i, -1, s.in[i].n);
    if (s.in[0].n != in[0].ndim + 1) return fail(errc::one_hot_ndim, -1, -1, s.in[0].n, in[0].ndim + 1);
    for (int d = 0; d < s.in[0].n; ++d)
      if (s.in[0].v[d] < 1) return fail(errc::strategy_split, 0, d, s.in[0].v[d]);
    return {};
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_one_hot(s, device_num, in[0], depth);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const one_hot_layouts r = one_hot_rule(s, device_num, in[0], depth);
    return {r.dev, {r.indices}, r.out, {r.indices}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    return one_input_candidates(output_shape(in), device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const {
    return split_dim(output_shape(in), 0, device_num);
  }

  /// The rule on `device_num` devices for indices of global shape `indices`; throws
  /// tessera::error naming the rule broken, the numbers and the strategy:
  /// "one_hot: the strategy splits the output, whose shape is indices.shape + (depth,):
  /// 1 entries for an output of rank 2; strategy ((2,),)".
  one_hot_layouts rule(int device_num, const extents& indices) const {
    require_rule(check_one_hot(st, device_num, indices, depth), name(), st);
    return one_hot_rule(st, device_num, indices, depth);
  }
};

}  // namespace ops

}  // namespace tessera
