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
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// ArgMax along `axis` with a shard strategy, as `Argmax(axis).shard(((2, 4),))`.
struct argmax_op {
  strategy st;
  int axis = -1;

  static constexpr std::string_view name() { return "argmax"; }

  /// The rule; throws tessera::error naming the operator, the rule broken, the numbers
  /// and the strategy: "argmax: reduce: each axis must name a dim of the input: axis 2,
  /// input rank 2; strategy ((2, 4),)".
  argmax_layouts rule(int device_num, const extents& shape) const {
    const status s = check_argmax(st, device_num, shape, axis);
    if (!s.ok()) throw error(s, name(), "strategy " + to_string(st));
    return argmax_rule(st, device_num, shape, axis);
  }
};

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
  if (!r.group.empty()) {
    C& g = ctx.on(r.dev).group(r.group);
    auto top = best;
    g.all_reduce(std::span<T>(top.data(), top.size()), reduce_op::max);
    K::argmax_resolve(index, best, top);
    g.all_reduce(std::span<std::int64_t>(index.data(), index.size()), reduce_op::min);
  }
  return tensor_on<I, D>(r.out, r.shape, ctx.rank(), K::template convert<I>(index));
}

}  // namespace tessera::ops
