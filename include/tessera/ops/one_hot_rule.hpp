// OneHot's sharding rule: indices (...) -> (..., depth), the strategy splitting the
// output, i.e. the indices' dims and optionally the depth. Standard library only and
// constexpr.
#pragma once

#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/strategy.hpp>
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

}  // namespace tessera
