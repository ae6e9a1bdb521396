// Sharded OneHot: the sharding rule (ops/one_hot_rule.hpp) and the local kernel (the
// tensors' device's backend: one_hot on each rank's piece of the depth). Indices in
// other layouts are redistributed first. Indices are integers, so there is no backward.
#pragma once

#include <string>
#include <string_view>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/ops/one_hot_rule.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// OneHot with a shard strategy, as `OneHot().shard(((2, 4), (), ()))` applied with
/// `depth` classes (axis -1: the depth is the output's last dim).
struct one_hot_op {
  strategy st;
  index_t depth = 0;

  static constexpr std::string_view name() { return "one_hot"; }

  /// The rule on `device_num` devices for indices of global shape `indices`; throws
  /// tessera::error naming the rule broken, the numbers and the strategy:
  /// "one_hot: the strategy splits the output, whose shape is indices.shape + (depth,):
  /// 1 entries for an output of rank 2; strategy ((2,),)".
  one_hot_layouts rule(int device_num, const extents& indices) const {
    const status s = check_one_hot(st, device_num, indices, depth);
    if (!s.ok()) {
      const bool own = what_must_hold(s.code).starts_with("one_hot");
      throw error(s, own ? std::string_view{} : name(), "strategy " + to_string(st));
    }
    return one_hot_rule(st, device_num, indices, depth);
  }
};

/// indices (any layout, integer or integer-valued floating point) -> indices.shape +
/// (depth,): `on` where the last index equals the index, `off` elsewhere; an index
/// outside [0, depth) gives a row of `off` (-1 marks padding). Each rank writes its
/// piece of the depth from the indices it holds: no communication beyond bringing the
/// indices to the rule's layout. Throws on a non-integer index: "one_hot: index 2.5 at
/// local position 3 is not an integer".
template <class T, class I, class D, class C>
tensor_on<T, D> one_hot(const one_hot_op& op, const tensor_on<I, D>& indices, T on, T off, device_context<C>& ctx) {
  const one_hot_layouts r = op.rule(ctx.size(), indices.global_shape());
  const auto li = in_layout(indices, r.indices, ctx);
  const index_t local_depth = op.depth / r.depth_split;
  const index_t first = group_index(r.dev, axis_list{r.depth_axis}, ctx.rank()) * local_depth;
  return tensor_on<T, D>(r.out, r.shape, ctx.rank(),
                         kernels::backend<D>::template one_hot<T>(li->local(), op.depth, first, local_depth, on, off));
}

}  // namespace tessera::ops
