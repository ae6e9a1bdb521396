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
#include <tessera/ops/run.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

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

/// OneHot's forward as every operator's (ops/run.hpp), with the definition's on and off
/// values. It has no backward (the indices are data).
template <class T, class D, class C>
tensor_on<T, D> forward(const one_hot_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return one_hot(op, *x[0], T(op.on), T(op.off), ctx);
}

}  // namespace tessera::ops
