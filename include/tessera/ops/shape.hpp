// Sharded data-movement operators: Transpose, Reshape, Flatten, StridedSlice and Concat,
// and their backwards. The sharding rules are ops/shape_rule.hpp, the local kernels the
// tensors' device's backend (kernels/cpu/shape.hpp on the host). Inputs in other
// layouts are redistributed first.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/ops/shape_rule.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

namespace detail {

template <class Tensor>
void require_dy(std::string_view fn, const Tensor& dy, const extents& expected) {
  if (!(dy.global_shape() == expected))
    throw error(std::string(fn) + "_backward: dy is " + to_string(dy.global_shape()) + ", expected " +
                to_string(expected));
}

template <class A>
A copy_of(const A& x) {
  return x;
}
}  // namespace detail

// ---- Transpose -----------------------------------------------------------------------

/// y = x permuted by op.perm, on this rank's shard: the output's layout is the input's,
/// permuted, so no data moves between ranks (x in another layout is redistributed first).
template <class T, class D, class C>
tensor_on<T, D> transpose(const transpose_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  const transpose_layouts r = pass_unary(op.rule(ctx.size(), x.global_shape()), x.layout());
  const auto lx = in_layout(x, r.in, ctx);
  return tensor_on<T, D>(r.out, r.shape, ctx.rank(), kernels::backend<D>::transpose(lx->local(), op.perm_vector(r)));
}

/// dx of y = transpose(x, perm): dy (any layout of y's shape) transposed back, in the
/// rule's input layout.
template <class T, class D, class C>
tensor_on<T, D> transpose_backward(const transpose_op& op, const tensor_on<T, D>& dy, const tensor_on<T, D>& x,
                                   device_context<C>& ctx) {
  const transpose_layouts r = pass_unary(op.rule(ctx.size(), x.global_shape()), x.layout());
  detail::require_dy(op.name(), dy, r.shape);
  const auto ldy = in_layout(dy, r.out.without_partial(), ctx);
  return tensor_on<T, D>(r.in.without_partial(), x.global_shape(), ctx.rank(),
                         kernels::backend<D>::transpose_grad(ldy->local(), op.perm_vector(r)));
}

// ---- Reshape and Flatten -----------------------------------------------------------

namespace detail {
template <class Op, class T, class D, class C>
tensor_on<T, D> reshape_forward(const Op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  const reshape_layouts r = pass_unary(op.rule(ctx.size(), x.global_shape()), x.layout());
  const auto lx = in_layout(x, r.in, ctx);  // a move when the strategy's splits do not survive
  return tensor_on<T, D>(r.out, r.shape, ctx.rank(), copy_of(lx->local()));
}
template <class Op, class T, class D, class C>
tensor_on<T, D> reshape_backward(const Op& op, const tensor_on<T, D>& dy, const tensor_on<T, D>& x,
                                 device_context<C>& ctx) {
  const reshape_layouts r = pass_unary(op.rule(ctx.size(), x.global_shape()), x.layout());
  require_dy(op.name(), dy, r.shape);
  const auto ldy = in_layout(dy, r.out.without_partial(), ctx);
  return tensor_on<T, D>(r.in.without_partial(), x.global_shape(), ctx.rank(), copy_of(ldy->local()));
}
}  // namespace detail

/// y = x's elements in row-major order in op.target's shape. Each rank reshapes its own
/// shard when the strategy's splits survive the reshape (see reshape_rule); otherwise x
/// is first redistributed to the rule's `in` layout, where they do.
template <class T, class D, class C>
tensor_on<T, D> reshape(const reshape_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::reshape_forward(op, x, ctx);
}

/// dx of y = reshape(x, target): dy reshaped back, in the rule's `in` layout.
template <class T, class D, class C>
tensor_on<T, D> reshape_backward(const reshape_op& op, const tensor_on<T, D>& dy, const tensor_on<T, D>& x,
                                 device_context<C>& ctx) {
  return detail::reshape_backward(op, dy, x, ctx);
}

/// y = x as (shape[0], the product of the other dims) (see reshape).
template <class T, class D, class C>
tensor_on<T, D> flatten(const flatten_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  return detail::reshape_forward(op, x, ctx);
}

/// dx of y = flatten(x): dy reshaped back to x's shape.
template <class T, class D, class C>
tensor_on<T, D> flatten_backward(const flatten_op& op, const tensor_on<T, D>& dy, const tensor_on<T, D>& x,
                                 device_context<C>& ctx) {
  return detail::reshape_backward(op, dy, x, ctx);
}

// ---- StridedSlice ------------------------------------------------------------------

/// y = x[begin:end:strides] on this rank's shard. Dims taken whole keep their splits;
/// a cut dim must be whole on every rank, so where the strategy splits one, x is first
/// gathered along it (the rule's `in` layout).
template <class T, class D, class C>
tensor_on<T, D> strided_slice(const strided_slice_op& op, const tensor_on<T, D>& x, device_context<C>& ctx) {
  const strided_slice_layouts r = pass_unary(op.rule(ctx.size(), x.global_shape()), x.layout());
  const auto lx = in_layout(x, r.in, ctx);
  const auto s = op.local(r);
  return tensor_on<T, D>(r.out, r.shape, ctx.rank(),
                         kernels::backend<D>::strided_slice(lx->local(), s.begin, s.end, s.strides));
}

/// dx of y = strided_slice(x, ...): dy (any layout of y's shape) scattered into zeros
/// at the sliced positions, in the rule's `in` layout.
template <class T, class D, class C>
tensor_on<T, D> strided_slice_backward(const strided_slice_op& op, const tensor_on<T, D>& dy,
                                       const tensor_on<T, D>& x, device_context<C>& ctx) {
  const strided_slice_layouts r = pass_unary(op.rule(ctx.size(), x.global_shape()), x.layout());
  detail::require_dy(op.name(), dy, r.shape);
  const auto ldy = in_layout(dy, r.out.without_partial(), ctx);
  const auto s = op.local(r);
  const extents ls = local_shape(r.in, x.global_shape());
  const std::vector<std::size_t> shard(ls.v.begin(), ls.v.begin() + ls.ndim);
  return tensor_on<T, D>(r.in.without_partial(), x.global_shape(), ctx.rank(),
                         kernels::backend<D>::strided_slice_grad(ldy->local(), shard, s.begin, s.end, s.strides));
}

// ---- Concat ------------------------------------------------------------------------

/// Concat's layouts for inputs arriving in `actual` (n of them): Concat is linear in all
/// its inputs together, so inputs that are all partial sums over the same mesh axes,
/// where the rule holds replicas, stay partial and so does the output.
constexpr concat_layouts concat_pass(concat_layouts r, const layout* actual, int n) {
  std::array<layout, max_strategy_inputs> want{};
  if (n > max_strategy_inputs) return r;
  for (int i = 0; i < n; ++i) want[std::size_t(i)] = r.in;
  const partial_pass p = pass_partial(linearity::all(n), actual, want.data(), n, r.out);
  if (!p.passes()) return r;
  r.in = p.input(r.in, 0);
  r.out = p.output(r.out);
  r.dev = p.dev;
  return r;
}

namespace detail {
template <class T, class D>
concat_layouts concat_layouts_for(const concat_op& op, int device_num, const std::vector<const tensor_on<T, D>*>& xs) {
  if (xs.empty() || xs.size() > std::size_t(max_strategy_inputs))
    throw error("concat: needs between 1 and " + std::to_string(max_strategy_inputs) + " inputs, got " +
                std::to_string(xs.size()));
  shape_list shapes;
  std::vector<layout> actual;
  for (const tensor_on<T, D>* x : xs) {
    shapes.v[shapes.n++] = x->global_shape();
    actual.push_back(x->layout());
  }
  return concat_pass(op.rule(device_num, shapes), actual.data(), int(actual.size()));
}
template <class T, class D>
std::vector<const tensor_on<T, D>*> pointers(const std::vector<tensor_on<T, D>>& xs) {
  std::vector<const tensor_on<T, D>*> p;
  for (const tensor_on<T, D>& x : xs) p.push_back(&x);
  return p;
}
}  // namespace detail

/// The inputs joined along op.axis, each rank joining its shards: no communication
/// beyond bringing inputs to the rule's layout.
template <class T, class D, class C>
tensor_on<T, D> concat(const concat_op& op, const std::vector<const tensor_on<T, D>*>& xs, device_context<C>& ctx) {
  const concat_layouts r = detail::concat_layouts_for(op, ctx.size(), xs);
  using laid = laid_out<T, D>;
  std::vector<laid> in;
  in.reserve(xs.size());
  for (const tensor_on<T, D>* x : xs) in.push_back(in_layout(*x, r.in, ctx));
  std::vector<const typename tensor_on<T, D>::array_type*> shards;
  for (const laid& x : in) shards.push_back(&x->local());
  return tensor_on<T, D>(r.out, r.shape, ctx.rank(), kernels::backend<D>::concat(shards, r.axis));
}
template <class T, class D, class C>
tensor_on<T, D> concat(const concat_op& op, const std::vector<tensor_on<T, D>>& xs, device_context<C>& ctx) {
  return concat(op, detail::pointers(xs), ctx);
}

/// The inputs' gradients of y = concat(xs, axis): dy (any layout of y's shape) cut
/// along the axis into the inputs' extents, each in the rule's input layout.
template <class T, class D, class C>
std::vector<tensor_on<T, D>> concat_backward(const concat_op& op, const tensor_on<T, D>& dy,
                                             const std::vector<const tensor_on<T, D>*>& xs,
                                             device_context<C>& ctx) {
  const concat_layouts r = detail::concat_layouts_for(op, ctx.size(), xs);
  detail::require_dy(op.name(), dy, r.shape);
  const auto ldy = in_layout(dy, r.out.without_partial(), ctx);
  std::vector<std::size_t> sizes;
  for (const tensor_on<T, D>* x : xs) sizes.push_back(std::size_t(x->global_shape().v[r.axis]));
  auto pieces = kernels::backend<D>::split(ldy->local(), sizes, r.axis);
  std::vector<tensor_on<T, D>> dxs;
  for (std::size_t i = 0; i < xs.size(); ++i)
    dxs.emplace_back(r.in.without_partial(), xs[i]->global_shape(), ctx.rank(), std::move(pieces[i]));
  return dxs;
}
template <class T, class D, class C>
std::vector<tensor_on<T, D>> concat_backward(const concat_op& op, const tensor_on<T, D>& dy,
                                             const std::vector<tensor_on<T, D>>& xs, device_context<C>& ctx) {
  return concat_backward(op, dy, detail::pointers(xs), ctx);
}

/// The data-movement operators' forwards and backwards as every operator's (ops/run.hpp).
template <class T, class D, class C>
tensor_on<T, D> forward(const transpose_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return transpose(op, *x[0], ctx);
}
template <class T, class D, class C>
op_grads<T, D> backward(const transpose_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>&, device_context<C>& ctx) {
  return grads_of(transpose_backward(op, dy, *x[0], ctx));
}
template <class T, class D, class C>
tensor_on<T, D> forward(const reshape_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return detail::reshape_forward(op, *x[0], ctx);
}
template <class T, class D, class C>
op_grads<T, D> backward(const reshape_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>&, device_context<C>& ctx) {
  return grads_of(detail::reshape_backward(op, dy, *x[0], ctx));
}
template <class T, class D, class C>
tensor_on<T, D> forward(const flatten_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return detail::reshape_forward(op, *x[0], ctx);
}
template <class T, class D, class C>
op_grads<T, D> backward(const flatten_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>&, device_context<C>& ctx) {
  return grads_of(detail::reshape_backward(op, dy, *x[0], ctx));
}
template <class T, class D, class C>
tensor_on<T, D> forward(const strided_slice_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return strided_slice(op, *x[0], ctx);
}
template <class T, class D, class C>
op_grads<T, D> backward(const strided_slice_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>&, device_context<C>& ctx) {
  return grads_of(strided_slice_backward(op, dy, *x[0], ctx));
}
template <class T, class D, class C>
tensor_on<T, D> forward(const concat_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return concat(op, std::vector<const tensor_on<T, D>*>(x.begin(), x.end()), ctx);
}
template <class T, class D, class C>
op_grads<T, D> backward(const concat_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>&, device_context<C>& ctx) {
  op_grads<T, D> g;
  for (tensor_on<T, D>& dx : concat_backward(op, dy, std::vector<const tensor_on<T, D>*>(x.begin(), x.end()), ctx))
    g.emplace_back(std::move(dx));
  return g;
}

}  // namespace tessera::ops
