// Sharded ArgMax (for accuracy): the index of the first maximum along one axis. The
// sharding rule is ops/argmax_rule.hpp. With the axis split, each rank finds its local
// maximum and index; one all-reduce (max) of the values and one (min) of the indices
// that attain the global maximum give every rank of the axis group the global index.
// Indices are not differentiable: there is no backward. The local pieces are the
// tensors' device's backend (kernels/cpu/sharded.hpp on the host).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/ops/argmax_rule.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// The index (along op.axis, in the global tensor) of the first maximum of every
/// vector along the axis, as integers of type I, in the rule's output layout. x (any
/// layout) is brought to the rule's layout first. The axis must not be empty. (NaN
/// inputs give unspecified indices.)
template <class I = std::int32_t, class T, class D, class C>
tensor_on<I, D> argmax(const argmax_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  using K = kernels::backend<D>;
  const argmax_layouts r = op.rule(ctx.size(), x.global_shape());
  if (x.global_shape().v[r.axis] == 0)
    throw error("argmax: cannot take the argmax over an empty dim: dim " + std::to_string(r.axis) +
                " of x " + to_string(x.global_shape()) + " has extent 0");
  const auto lx = in_layout(x, r.in, ctx);
  auto [best, index] = K::argmax_local(lx->local(), r.axis, std::int64_t(lx->local_offset().v[r.axis]));
  if (const auto cs = argmax_op::group_collectives(r, x.global_shape()); !cs.empty()) {
    auto top = best;
    run_internal(cs[0], std::span<T>(top.data(), top.size()), ctx, op.name());
    K::argmax_resolve(index, best, top);
    run_internal(cs[1], std::span<std::int64_t>(index.data(), index.size()), ctx, op.name());
  }
  return tensor_on<I, D>(r.out, r.shape, ctx.rank(), K::template convert<I>(index));
}

/// ArgMax's forward as every operator's (ops/run.hpp): the indices as values of T. It
/// has no backward (nothing is differentiable).
template <class T, class D, class C>
tensor_on<T, D> forward(const argmax_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return argmax<T>(op, *x[0], ctx);
}

}  // namespace tessera::ops
