// Sharded Softmax and LogSoftmax along one axis, and their backwards. The sharding
// rule is ops/softmax_axis_rule.hpp; the single-process reference kernels/cpu/softmax.hpp.
// With the softmax axis split, the row max and the row sums combine across the axis
// group (two all-reduces of one value per row), as softmax_cross_entropy does.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/softmax.hpp>
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

// Calls f(row, base) for every vector along the axis of a shard (row = o * inner + i).
template <class F>
void for_each_row(const kernels::cpu::detail::axis_view& v, F&& f) {
  for (std::size_t o = 0; o < v.outer; ++o)
    for (std::size_t i = 0; i < v.inner; ++i) f(o * v.inner + i, o * v.n * v.inner + i);
}

// Sums `acc` over the softmax axis group (nothing when the axis is not split).
template <class T, class C>
void sum_over_group(const softmax_layouts& r, std::vector<T>& acc, reduce_op how, device_context<C>& ctx) {
  if (!r.group.empty()) ctx.on(r.dev).group(r.group).all_reduce(std::span<T>(acc), how);
}

template <bool Log, class T, class C>
dist_tensor<T> softmax_axis_forward(const softmax_axis_op<Log>& op, const dist_tensor<T>& x,
                                    device_context<C>& ctx) {
  const softmax_layouts r = op.rule(ctx.size(), x.global_shape());
  const auto lx = in_layout(x, r.in, ctx);
  const xt::xarray<T>& px = lx->local();
  namespace kd = kernels::cpu::detail;
  const kd::axis_view v = kd::view_around(op.name(), px.shape(), r.axis);
  const std::size_t rows = v.outer * v.inner;
  // The GLOBAL row max, then the global sum of exp(x - max), as the kernel computes them.
  std::vector<T> max(rows, -std::numeric_limits<T>::infinity()), sum(rows, T(0));
  const T* p = px.data();
  for_each_row(v, [&](std::size_t row, std::size_t b) {
    for (std::size_t j = 0; j < v.n; ++j) max[row] = std::max(max[row], p[b + j * v.inner]);
  });
  sum_over_group(r, max, reduce_op::max, ctx);
  for_each_row(v, [&](std::size_t row, std::size_t b) {
    for (std::size_t j = 0; j < v.n; ++j) sum[row] += std::exp(p[b + j * v.inner] - max[row]);
  });
  sum_over_group(r, sum, reduce_op::sum, ctx);
  auto y = kd::empty_array<T>(px.shape());
  T* o = y.data();
  for_each_row(v, [&](std::size_t row, std::size_t b) {
    if constexpr (Log) {
      const T lse = max[row] + std::log(sum[row]);
      for (std::size_t j = 0; j < v.n; ++j) o[b + j * v.inner] = p[b + j * v.inner] - lse;
    } else {
      const T inv = T(1) / sum[row];
      for (std::size_t j = 0; j < v.n; ++j) o[b + j * v.inner] = std::exp(p[b + j * v.inner] - max[row]) * inv;
    }
  });
  return dist_tensor<T>(r.out, x.global_shape(), ctx.rank(), std::move(y));
}

template <bool Log, class T, class C>
dist_tensor<T> softmax_axis_backward(const softmax_axis_op<Log>& op, const dist_tensor<T>& dy,
                                     const dist_tensor<T>& y, device_context<C>& ctx) {
  const softmax_layouts r = op.rule(ctx.size(), y.global_shape());
  if (!(dy.global_shape() == y.global_shape()))
    throw error(std::string(op.name()) + "_backward: dy is " + to_string(dy.global_shape()) +
                ", expected " + to_string(y.global_shape()) + ", the shape of y");
  const auto ldy = in_layout(dy, r.out, ctx), ly = in_layout(y, r.out, ctx);
  const xt::xarray<T>& g = ldy->local();
  const xt::xarray<T>& py = ly->local();
  namespace kd = kernels::cpu::detail;
  const kd::axis_view v = kd::view_around(std::string(op.name()) + "_backward", py.shape(), r.axis);
  // softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy).
  std::vector<T> acc(v.outer * v.inner, T(0));
  for_each_row(v, [&](std::size_t row, std::size_t b) {
    for (std::size_t j = 0; j < v.n; ++j) {
      const std::size_t at = b + j * v.inner;
      acc[row] += Log ? g.data()[at] : g.data()[at] * py.data()[at];
    }
  });
  sum_over_group(r, acc, reduce_op::sum, ctx);
  auto dx = kd::empty_array<T>(py.shape());
  T* o = dx.data();
  for_each_row(v, [&](std::size_t row, std::size_t b) {
    for (std::size_t j = 0; j < v.n; ++j) {
      const std::size_t at = b + j * v.inner;
      if constexpr (Log) o[at] = g.data()[at] - std::exp(py.data()[at]) * acc[row];
      else o[at] = py.data()[at] * (g.data()[at] - acc[row]);
    }
  });
  return dist_tensor<T>(r.in, y.global_shape(), ctx.rank(), std::move(dx));
}

}  // namespace detail

/// exp(x) / sum(exp(x)) along op.axis, on this rank's shard (x in any layout; brought to
/// the rule's). Computed around the GLOBAL max of each vector: no exp overflows. The
/// output has the input's rule layout.
template <class T, class C>
dist_tensor<T> softmax(const softmax_op& op, const dist_tensor<T>& x, device_context<C>& ctx) {
  return detail::softmax_axis_forward(op, x, ctx);
}

/// x - logsumexp(x) along op.axis (see softmax); accurate where softmax underflows.
template <class T, class C>
dist_tensor<T> log_softmax(const log_softmax_op& op, const dist_tensor<T>& x, device_context<C>& ctx) {
  return detail::softmax_axis_forward(op, x, ctx);
}

/// dx of y = softmax(x) given dy and the forward output y (any layouts of x's shape):
/// dx = y (dy - sum(dy y, axis)), in the rule's input layout.
template <class T, class C>
dist_tensor<T> softmax_backward(const softmax_op& op, const dist_tensor<T>& dy, const dist_tensor<T>& y,
                                device_context<C>& ctx) {
  return detail::softmax_axis_backward(op, dy, y, ctx);
}

/// dx of y = log_softmax(x) given dy and y: dx = dy - exp(y) sum(dy, axis).
template <class T, class C>
dist_tensor<T> log_softmax_backward(const log_softmax_op& op, const dist_tensor<T>& dy,
                                    const dist_tensor<T>& y, device_context<C>& ctx) {
  return detail::softmax_axis_backward(op, dy, y, ctx);
}

}  // namespace tessera::ops
