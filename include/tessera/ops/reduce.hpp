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
#include <tessera/ops/run.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

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

// The backward of ReduceMax (negate = false) and ReduceMin (negate = true: min(x) =
// -max(-x), negation is exact, so the same ties) given dy and the forward output y. The
// partial extrema and the tie counts are resolved by the definition's two collectives
// (reduction_op::backward_collectives); a y in another layout is redistributed.
template <reduce_op How, class T, class D, class C>
tensor_on<T, D> reduce_extremum_backward(const reduction_op<How>& op, const tensor_on<T, D>& dy,
                                         const tensor_on<T, D>& x, const tensor_on<T, D>& y,
                                         device_context<C>& ctx, bool negate) {
  using K = kernels::backend<D>;
  const reduce_layouts r = op.rule(ctx.size(), x.global_shape());
  const std::vector<internal_collective> cs = reduction_op<How>::backward_collectives(r);
  const auto ldy = reduce_dy(op.name(), r, dy, ctx);
  const auto lx = in_layout(x, r.in, ctx);
  // y resolved: the forward's partial extrema reduced by the first collective.
  if (!(y.global_shape() == r.shape))
    throw error(std::string(op.name()) + "_backward: y is " + to_string(y.global_shape()) + ", expected " +
                to_string(r.shape));
  typename tensor_on<T, D>::array_type ys;
  if (!cs.empty() && y.layout() == r.out) {
    ys = y.local();
    run_internal(cs[0], std::span<T>(ys.data(), ys.size()), ctx, op.name());
  } else {
    ys = in_layout(y, r.out.without_partial(), ctx)->local();
  }
  auto xs = lx->local();
  if (negate) {
    xs = K::neg(xs);
    ys = K::neg(ys);
  }
  const std::vector<int> axes = reduced_axes(r, x.ndim());
  // Local tie counts, summed over the reduced dims' axes by the second collective.
  auto ties = K::reduce_max_tie_counts(xs, ys, axes, op.keep_dims);
  if (!cs.empty()) run_internal(cs[1], std::span<T>(ties.data(), ties.size()), ctx, op.name());
  return tensor_on<T, D>(r.in, x.global_shape(), ctx.rank(),
                         K::reduce_max_spread(ldy->local(), xs, ys, ties, axes, op.keep_dims));
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
  return detail::reduce_extremum_backward(op, dy, x, y, ctx, false);
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
  return detail::reduce_extremum_backward(op, dy, x, y, ctx, true);
}

/// The reductions' forward and backward as every operator's (ops/run.hpp).
template <reduce_op How, class T, class D, class C>
tensor_on<T, D> forward(const reduction_op<How>& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return detail::reduce_forward(op, *x[0], ctx);
}
template <reduce_op How, class T, class D, class C>
op_grads<T, D> backward(const reduction_op<How>& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>& y, device_context<C>& ctx) {
  if constexpr (How == reduce_op::sum) return grads_of(reduce_sum_backward(op, dy, *x[0], ctx));
  else if constexpr (How == reduce_op::mean) return grads_of(reduce_mean_backward(op, dy, *x[0], ctx));
  else return grads_of(detail::reduce_extremum_backward(op, dy, *x[0], y, ctx, How == reduce_op::min));
}

}  // namespace tessera::ops
