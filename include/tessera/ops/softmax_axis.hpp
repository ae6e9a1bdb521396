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
#include <tessera/ops/run.hpp>
#include <tessera/ops/softmax_axis_rule.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

namespace detail {


template <bool Log, class T, class D, class C>
tensor_on<T, D> softmax_axis_forward(const softmax_axis_op<Log>& op, const tensor_on<T, D>& x,
                                     device_context<C>& ctx) {
  using K = kernels::backend<D>;
  const softmax_layouts r = op.rule(ctx.size(), x.global_shape());
  const auto lx = in_layout(x, r.in, ctx);
  const auto& px = lx->local();
  // The GLOBAL row max, then the global sum of exp(x - max), as the kernel computes them.
  const auto cs = softmax_axis_op<Log>::forward_collectives(r, x.global_shape());
  auto max = K::softmax_axis_max(px, r.axis);
  if (!cs.empty()) run_internal(cs[0], std::span<T>(max.data(), max.size()), ctx, op.name());
  auto sum = K::softmax_axis_sum(px, r.axis, max);
  if (!cs.empty()) run_internal(cs[1], std::span<T>(sum.data(), sum.size()), ctx, op.name());
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
  if (!r.group.empty())
    run_internal(softmax_axis_op<Log>::backward_collective(r, y.global_shape()), std::span<T>(acc.data(), acc.size()),
                 ctx, op.name());
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

/// Softmax's and LogSoftmax's forward and backward as every operator's (ops/run.hpp):
/// the backward reads the output.
template <bool Log, class T, class D, class C>
tensor_on<T, D> forward(const softmax_axis_op<Log>& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return detail::softmax_axis_forward(op, *x[0], ctx);
}
template <bool Log, class T, class D, class C>
op_grads<T, D> backward(const softmax_axis_op<Log>& op, const tensor_on<T, D>& dy, op_inputs<T, D>,
                        const tensor_on<T, D>& y, device_context<C>& ctx) {
  return grads_of(detail::softmax_axis_backward(op, dy, y, ctx));
}

}  // namespace tessera::ops
