// Sharded ArgMax (for accuracy): the index of the first maximum along one axis. The
// sharding rule is ops/argmax_rule.hpp. With the axis split, each rank finds its local
// maximum and index; one all-reduce (max) of the values and one (min) of the indices
// that attain the global maximum give every rank of the axis group the global index.
// Indices are not differentiable: there is no backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/reduce.hpp>
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
template <class I = std::int32_t, class T, class C>
dist_tensor<I> argmax(const argmax_op& op, const dist_tensor<T>& x, device_context<C>& ctx) {
  const argmax_layouts r = op.rule(ctx.size(), x.global_shape());
  if (x.global_shape().v[r.axis] == 0)
    throw error("argmax: cannot take the argmax over an empty dim: dim " + std::to_string(r.axis) +
                " of x " + to_string(x.global_shape()) + " has extent 0");
  const auto lx = in_layout(x, r.in, ctx);
  const xt::xarray<T>& px = lx->local();
  namespace kd = kernels::cpu::detail;
  const kd::reduction red = kd::plan_reduction("argmax", px.shape(), {r.axis}, false);
  const std::size_t n = px.shape()[std::size_t(r.axis)];
  std::size_t inner = 1;
  for (std::size_t d = std::size_t(r.axis) + 1; d < px.dimension(); ++d) inner *= px.shape()[d];
  const std::int64_t first = lx->local_offset().v[r.axis];
  const std::size_t outs = px.size() / (n == 0 ? 1 : n);
  std::vector<T> best(outs, std::numeric_limits<T>::lowest());
  std::vector<std::int64_t> index(outs, -1);
  const T* p = px.data();
  kd::strided_loop<1>(px.shape(), {&red.strides}, {0}, [&](std::size_t i, const auto& off) {
    const std::size_t o = std::size_t(off[0]);
    if (index[o] < 0 || p[i] > best[o]) {
      best[o] = p[i];
      index[o] = first + std::int64_t(i / inner % n);
    }
  });
  if (!r.group.empty()) {
    C& g = ctx.on(r.dev).group(r.group);
    std::vector<T> top = best;
    g.all_reduce(std::span<T>(top), reduce_op::max);
    for (std::size_t o = 0; o < outs; ++o)
      if (!(best[o] == top[o])) index[o] = std::numeric_limits<std::int64_t>::max();
    g.all_reduce(std::span<std::int64_t>(index), reduce_op::min);
  }
  xt::xarray<I> y = xt::xarray<I>::from_shape({outs});
  for (std::size_t o = 0; o < outs; ++o) y.data()[o] = I(index[o]);
  return dist_tensor<I>(r.out, r.shape, ctx.rank(), std::move(y));
}

}  // namespace tessera::ops
