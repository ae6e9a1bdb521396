// Sharded reductions: ReduceSum, ReduceMean, ReduceMax and ReduceMin over a list of dims, with
// keep_dims, and their backward. The sharding rule is ops/reduce_rule.hpp, the local
// math the tensors' device's backend (kernels/backend.hpp). A split reduced dim leaves
// the output partial.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/ops/reduce_rule.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// A reduction with a shard strategy, as `ReduceSum(keep_dims).shard(((2, 4),))`
/// applied over `dims`. How is sum, mean, max or min.
template <reduce_op How>
struct reduction_op {
  strategy st;
  dim_list dims;  ///< the reduced dims ({} = every dim; negative counts from the end)
  bool keep_dims = false;

  static constexpr std::string_view name() {
    switch (How) {
      case reduce_op::sum: return "reduce_sum";
      case reduce_op::mean: return "reduce_mean";
      case reduce_op::max: return "reduce_max";
      case reduce_op::min: return "reduce_min";
    }
    return "reduce";
  }

  /// The rule on `device_num` devices for an input of global shape `shape`; throws
  /// tessera::error naming the operator, the rule broken, the numbers and the strategy:
  /// "reduce_sum: reduce: each axis must name a dim of the input: axis 2, input rank 2;
  /// strategy ((2, 4),)".
  reduce_layouts rule(int device_num, const extents& shape) const {
    const status s = check_reduce(st, device_num, shape, dims);
    if (!s.ok()) throw error(s, name(), "strategy " + to_string(st));
    return reduce_rule(st, device_num, shape, dims, keep_dims, How);
  }
};

using reduce_sum_op = reduction_op<reduce_op::sum>;
using reduce_mean_op = reduction_op<reduce_op::mean>;
using reduce_max_op = reduction_op<reduce_op::max>;
using reduce_min_op = reduction_op<reduce_op::min>;

/// The rule's layouts for an input arriving in `x`: a partial input of ReduceSum or
/// ReduceMean whose partial axes the rule holds replicas on stays partial, and so does
/// the output (its gradient is `in` without them).
constexpr reduce_layouts reduce_pass(const reduce_layouts& r, reduce_op how, const layout& x) {
  return pass_unary(r, x, reduction_linearity(how));
}

namespace detail {

// The reduced dims as the kernels take them (non-negative, ascending).
inline std::vector<int> reduced_axes(const reduce_layouts& r, int ndim) {
  std::vector<int> axes;
  for (int d = 0; d < ndim; ++d)
    if (r.reduced >> d & 1u) axes.push_back(d);
  return axes;
}

template <reduce_op How, class T, class D, class C>
tensor_on<T, D> reduce_forward(const reduction_op<How>& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  using K = kernels::backend<D>;
  const reduce_layouts r = reduce_pass(op.rule(ctx.size(), x.global_shape()), How, x.layout());
  const auto lx = in_layout(x, r.in, ctx);
  const std::vector<int> axes = reduced_axes(r, x.ndim());
  if constexpr (How == reduce_op::max) {
    return tensor_on<T, D>(r.out, r.shape, ctx.rank(), K::reduce_max(lx->local(), axes, op.keep_dims));
  } else if constexpr (How == reduce_op::min) {
    // min(x) = -max(-x), exactly (negation is exact): no second kernel per device.
    return tensor_on<T, D>(r.out, r.shape, ctx.rank(),
                           K::neg(K::reduce_max(K::neg(lx->local()), axes, op.keep_dims)));
  } else {
    auto s = K::reduce_sum(lx->local(), axes, op.keep_dims);
    // The global count: the partial terms add up to the mean.
    if constexpr (How == reduce_op::mean) K::scale(s, T(1) / T(r.count));
    return tensor_on<T, D>(r.out, r.shape, ctx.rank(), std::move(s));
  }
}

// dy in the output's layout without partial sums, checked against the output's shape.
template <class T, class D, class C>
laid_out<T, D> reduce_dy(std::string_view fn, const reduce_layouts& r, const tensor_on<T, D>& dy,
                         device_context<C>& ctx) {
  if (!(dy.global_shape() == r.shape))
    throw error(std::string(fn) + "_backward: dy is " + to_string(dy.global_shape()) + ", expected " +
                to_string(r.shape));
  return in_layout(dy, r.out.without_partial(), ctx);
}

// dy broadcast back over the reduced dims, times `scale`, in x's rule layout.
template <class T, class D, class C>
tensor_on<T, D> reduce_spread(std::string_view fn, const reduce_layouts& r, bool keep_dims,
                              const tensor_on<T, D>& dy, const tensor_on<T, D>& x, T scale,
                              device_context<C>& ctx) {
  using K = kernels::backend<D>;
  const auto ldy = reduce_dy(fn, r, dy, ctx);
  auto g = K::reduce_sum_grad(ldy->local(), local_shape(r.in, x.global_shape()), reduced_axes(r, x.ndim()),
                              keep_dims);
  if (scale != T(1)) K::scale(g, scale);
  return tensor_on<T, D>(r.in.without_partial(), x.global_shape(), ctx.rank(), std::move(g));
}

}  // namespace detail

/// The sum of x over op.dims on this rank's shard: the output keeps the kept dims'
/// splits and is partial (sum) over the mesh axes of split reduced dims.
template <class T, class D, class C>
tensor_on<T, D> reduce_sum(const reduce_sum_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::reduce_forward(op, x, ctx);
}

/// The mean of x over op.dims: each rank divides its local sum by the global number of
/// reduced elements, so the output's partial sums (as in reduce_sum) add up to the mean.
template <class T, class D, class C>
tensor_on<T, D> reduce_mean(const reduce_mean_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::reduce_forward(op, x, ctx);
}

/// The maximum of x over op.dims: the output is partial (max) over the mesh axes of
/// split reduced dims.
template <class T, class D, class C>
tensor_on<T, D> reduce_max(const reduce_max_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::reduce_forward(op, x, ctx);
}

/// dx of y = reduce_sum(x): dy (any layout of y's shape; partial sums are resolved
/// first) broadcast back, in x's rule layout.
template <class T, class D, class C>
tensor_on<T, D> reduce_sum_backward(const reduce_sum_op& op, const tensor_on<T, D>& dy,
                                    const tensor_on<T, D>& x, device_context<C>& ctx) {
  const reduce_layouts r = reduce_pass(op.rule(ctx.size(), x.global_shape()), reduce_op::sum, x.layout());
  return detail::reduce_spread(op.name(), r, op.keep_dims, dy, x, T(1), ctx);
}

/// dx of y = reduce_mean(x): dy broadcast back and divided by the GLOBAL number of
/// reduced elements, in x's rule layout.
template <class T, class D, class C>
tensor_on<T, D> reduce_mean_backward(const reduce_mean_op& op, const tensor_on<T, D>& dy,
                                     const tensor_on<T, D>& x, device_context<C>& ctx) {
  const reduce_layouts r = reduce_pass(op.rule(ctx.size(), x.global_shape()), reduce_op::mean, x.layout());
  return detail::reduce_spread(op.name(), r, op.keep_dims, dy, x, T(1) / T(r.count), ctx);
}

/// dx of y = reduce_max(x), given dy and the forward output y (any layouts; y's
/// partial maxima are resolved first, so every rank compares its shard with the GLOBAL
/// maximum). Each dy element goes to the positions of its slice where x equals the
/// maximum. Ties split it equally among ALL tied positions of the global slice, on
/// whichever ranks they lie (the local tie counts are summed over the reduced dims'
/// mesh axes), exactly as the single-process kernels::cpu::reduce_max_grad does. A NaN
/// maximum gets no gradient (NaN equals nothing).
template <class T, class D, class C>
tensor_on<T, D> reduce_max_backward(const reduce_max_op& op, const tensor_on<T, D>& dy,
                                    const tensor_on<T, D>& x, const tensor_on<T, D>& y,
                                    device_context<C>& ctx) {
  using K = kernels::backend<D>;
  const reduce_layouts r = op.rule(ctx.size(), x.global_shape());
  const auto ldy = detail::reduce_dy(op.name(), r, dy, ctx);
  const auto ly = detail::reduce_dy(op.name(), r, y, ctx);
  const auto lx = in_layout(x, r.in, ctx);
  const std::vector<int> axes = detail::reduced_axes(r, x.ndim());
  // Local tie counts, partial sums over the reduced dims' axes, then resolved.
  layout count_layout = r.out;
  count_layout.op = reduce_op::sum;
  const tensor_on<T, D> ties(count_layout, r.shape, ctx.rank(),
                             K::reduce_max_tie_counts(lx->local(), ly->local(), axes, op.keep_dims));
  const auto all_ties = in_layout(ties, r.out.without_partial(), ctx);
  return tensor_on<T, D>(r.in, x.global_shape(), ctx.rank(),
                         K::reduce_max_spread(ldy->local(), lx->local(), ly->local(), all_ties->local(), axes,
                                              op.keep_dims));
}

/// The minimum of x over op.dims: the output is partial (min) over the mesh axes of
/// split reduced dims.
template <class T, class D, class C>
tensor_on<T, D> reduce_min(const reduce_min_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::reduce_forward(op, x, ctx);
}

/// dx of y = reduce_min(x), given dy and the forward output y (any layouts), with ties
/// split as in reduce_max_backward. min(x) = -max(-x) and the gradient is linear in dy,
/// so this is reduce_max_backward of dy at -x and -y (negation is exact: the same ties).
template <class T, class D, class C>
tensor_on<T, D> reduce_min_backward(const reduce_min_op& op, const tensor_on<T, D>& dy,
                                    const tensor_on<T, D>& x, const tensor_on<T, D>& y,
                                    device_context<C>& ctx) {
  using K = kernels::backend<D>;
  const reduce_layouts r = op.rule(ctx.size(), x.global_shape());
  // Resolved first: a negated partial minimum would be a partial maximum.
  const auto lx = in_layout(x, r.in, ctx);
  const auto ly = detail::reduce_dy(op.name(), r, y, ctx);
  const tensor_on<T, D> nx(lx->layout(), x.global_shape(), ctx.rank(), K::neg(lx->local()));
  const tensor_on<T, D> ny(ly->layout(), y.global_shape(), ctx.rank(), K::neg(ly->local()));
  return reduce_max_backward(reduce_max_op{op.st, op.dims, op.keep_dims}, dy, nx, ny, ctx);
}

}  // namespace tessera::ops
