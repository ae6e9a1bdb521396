// Sharded Softmax and LogSoftmax along one axis, and their backwards. The sharding
// rule is ops/softmax_axis_rule.hpp; the single-process reference kernels/cpu/softmax.hpp.
// With the softmax axis split, the row max and the row sums combine across the axis
// group (two all-reduces of one value per row), as softmax_cross_entropy does. The local
// pieces are the tensors' device's backend (kernels/cpu/sharded.hpp on the host).
#pragma once

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
#include <tessera/ops/softmax_axis_rule.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// Softmax (Log = false) or LogSoftmax (Log = true) along `axis` with a shard strategy,
/// as `Softmax(axis).shard(((2, 4),))`.
template <bool Log>
struct softmax_axis_op {
  strategy st;
  int axis = -1;

  static constexpr std::string_view name() { return Log ? "log_softmax" : "softmax"; }

  /// The rule on `device_num` devices for an input of global shape `shape`; throws
  /// tessera::error naming the operator, the rule broken, the numbers and the strategy:
  /// "log_softmax: softmax: the axis must name a dim of the input: axis 2, input rank 2;
  /// strategy ((2, 4),)".
  softmax_layouts rule(int device_num, const extents& shape) const {
    const status s = check_softmax(st, device_num, shape, axis);
    if (!s.ok()) throw error(s, name(), "strategy " + to_string(st));
    return softmax_rule(st, device_num, shape, axis);
  }
};

using softmax_op = softmax_axis_op<false>;
using log_softmax_op = softmax_axis_op<true>;

namespace detail {

// Combines a row array over the softmax axis group (nothing when the axis is not split).
template <class A, class C>
void combine_over_group(const softmax_layouts& r, A& acc, reduce_op how, device_context<C>& ctx) {
  using T = typename A::value_type;
  if (!r.group.empty()) ctx.on(r.dev).group(r.group).all_reduce(std::span<T>(acc.data(), acc.size()), how);
}

template <bool Log, class T, class D, class C>
tensor_on<T, D> softmax_axis_forward(const softmax_axis_op<Log>& op, const tensor_on<T, D>& x,
                                     device_context<C>& ctx) {
  using K = kernels::backend<D>;
  const softmax_layouts r = op.rule(ctx.size(), x.global_shape());
  const auto lx = in_layout(x, r.in, ctx);
  const auto& px = lx->local();
  // The GLOBAL row max, then the global sum of exp(x - max), as the kernel computes them.
  auto max = K::softmax_axis_max(px, r.axis);
  combine_over_group(r, max, reduce_op::max, ctx);
  auto sum = K::softmax_axis_sum(px, r.axis, max);
  combine_over_group(r, sum, reduce_op::sum, ctx);
  return tensor_on<T, D>(r.out, x.global_shape(), ctx.rank(), K::softmax_axis_out(px, r.axis, max, sum, Log));
}

template <bool Log, class T, class D, class C>
tensor_on<T, D> softmax_axis_backward(const softmax_axis_op<Log>& op, const tensor_on<T, D>& dy,
                                      const tensor_on<T, D>& y, device_context<C>& ctx) {
  using K = kernels::backend<D>;
  const softmax_layouts r = op.rule(ctx.size(), y.global_shape());
  if (!(dy.global_shape() == y.global_shape()))
    throw error(std::string(op.name()) + "_backward: dy is " + to_string(dy.global_shape()) +
                ", expected " + to_string(y.global_shape()) + ", the shape of y");
  const auto ldy = in_layout(dy, r.out, ctx), ly = in_layout(y, r.out, ctx);
  // softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy).
  auto acc = K::softmax_axis_grad_sum(ldy->local(), ly->local(), r.axis, Log);
  combine_over_group(r, acc, reduce_op::sum, ctx);
  return tensor_on<T, D>(r.in, y.global_shape(), ctx.rank(),
                         K::softmax_axis_grad(ldy->local(), ly->local(), r.axis, acc, Log));
}

}  // namespace detail

/// exp(x) / sum(exp(x)) along op.axis, on this rank's shard (x in any layout; brought to
/// the rule's). Computed around the GLOBAL max of each vector: no exp overflows. The
/// output has the input's rule layout.
template <class T, class D, class C>
tensor_on<T, D> softmax(const softmax_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::softmax_axis_forward(op, x, ctx);
}

/// x - logsumexp(x) along op.axis (see softmax); accurate where softmax underflows.
template <class T, class D, class C>
tensor_on<T, D> log_softmax(const log_softmax_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::softmax_axis_forward(op, x, ctx);
}

/// dx of y = softmax(x) given dy and the forward output y (any layouts of x's shape):
/// dx = y (dy - sum(dy y, axis)), in the rule's input layout.
template <class T, class D, class C>
tensor_on<T, D> softmax_backward(const softmax_op& op, const tensor_on<T, D>& dy, const tensor_on<T, D>& y,
                                 device_context<C>& ctx) {
  return detail::softmax_axis_backward(op, dy, y, ctx);
}

/// dx of y = log_softmax(x) given dy and y: dx = dy - exp(y) sum(dy, axis).
template <class T, class D, class C>
tensor_on<T, D> log_softmax_backward(const log_softmax_op& op, const tensor_on<T, D>& dy,
                                     const tensor_on<T, D>& y, device_context<C>& ctx) {
  return detail::softmax_axis_backward(op, dy, y, ctx);
}

}  // namespace tessera::ops
