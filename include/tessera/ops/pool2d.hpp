// Sharded MaxPool and AvgPool: the rule (ops/pool2d_rule.hpp), the local pooling of the
// tensors' device (oneDNN on the host, cuDNN on a GPU) on each rank's shard extended by
// its neighbours' halo (ops/halo.hpp), and the backward.
#pragma once

#include <utility>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/ops/conv2d.hpp>
#include <tessera/ops/halo.hpp>
#include <tessera/ops/pool2d_rule.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// y = the pooling of this rank's shard of x, extended by its neighbours' halo where H or
/// W is split; y is laid out as x.
template <pool_kind Kind, class T, class D, class C>
tensor_on<T, D> forward(const pool2d_op<Kind>& op, op_inputs<T, D> in, device_context<C>& ctx) {
  const shape_list shapes{in[0]->global_shape()};
  const extents ys = op.output_shape(shapes);
  const pool2d_layouts r = op.rule(ctx.size(), shapes);
  detail::require_window_kernels<T, D>(op.name());
  if constexpr (detail::has_window_kernels<T, D>()) {
    using K = kernels::backend<D>;
    const auto lx = in_layout(*in[0], r.x, ctx);
    const window_split s = op.split(op.st, ctx.size(), shapes);
    const std::vector<internal_collective> cs = op.collectives(op.st, ctx.size(), shapes);
    std::size_t next = 0;
    const auto xe = detail::halo_hw<detail::halo_pass::extend, T, D>(lx->local(), s, cs, next, ctx, op.name());
    kernels::pool2d_params p = op.p;
    p.pad = detail::local_padding(s, ctx.rank());
    if constexpr (Kind == pool_kind::max) return tensor_on<T, D>(r.x, ys, ctx.rank(), K::max_pool2d_forward(xe, p).y);
    else return tensor_on<T, D>(r.x, ys, ctx.rank(), K::avg_pool2d_forward(xe, p));
  } else {
    return tensor_on<T, D>(r.x, ys, ctx.rank(), storage<T, D>::empty(local_shape(r.x, ys)));
  }
}

/// dx in x's layout given dy: the local pooling's backward on the extended shard (a max
/// pooling fetches the halo again to find its maxima), whose halo rows go back to the
/// ranks that own them.
template <pool_kind Kind, class T, class D, class C>
op_grads<T, D> backward(const pool2d_op<Kind>& op, const tensor_on<T, D>& dy, op_inputs<T, D> in,
                        const tensor_on<T, D>&, device_context<C>& ctx) {
  const shape_list shapes{in[0]->global_shape()};
  const pool2d_layouts r = op.rule(ctx.size(), shapes);
  detail::require_window_kernels<T, D>(op.name());
  using A = typename storage<T, D>::array;
  A dx;
  if constexpr (detail::has_window_kernels<T, D>()) {
    using K = kernels::backend<D>;
    const auto ldy = in_layout(dy, r.x, ctx);
    const window_split s = op.split(op.st, ctx.size(), shapes);
    const std::vector<internal_collective> cs = op.collectives(op.st, ctx.size(), shapes);
    std::size_t next = detail::forward_exchanges(s);
    kernels::pool2d_params p = op.p;
    p.pad = detail::local_padding(s, ctx.rank());
    A dxe;
    if constexpr (Kind == pool_kind::max) {
      const auto lx = in_layout(*in[0], r.x, ctx);
      const A xe = detail::halo_hw<detail::halo_pass::extend, T, D>(lx->local(), s, cs, next, ctx, op.name());
      const auto f = K::max_pool2d_forward(xe, p);
      dxe = K::max_pool2d_backward(ldy->local(), xe, f.y, f.workspace, p);
    } else {
      extents xes = local_shape(r.x, shapes[0]);
      xes.v[2] = s.h.extended(s.coord_h(ctx.rank()));
      xes.v[3] = s.w.extended(s.coord_w(ctx.rank()));
      dxe = K::avg_pool2d_backward(ldy->local(), detail::dims_of(xes), p);
    }
    dx = detail::halo_hw<detail::halo_pass::fold, T, D>(std::move(dxe), s, cs, next, ctx, op.name());
  }
  return grads_of(tensor_on<T, D>(r.x, shapes[0], ctx.rank(), std::move(dx)));
}

}  // namespace tessera::ops
