// Sharded Conv2D: the rule (ops/conv2d_rule.hpp), the local convolution of the tensors'
// device (oneDNN on the host, cuDNN on a GPU) on each rank's shard extended by its
// neighbours' halo (ops/halo.hpp), and its backward. Inputs in other layouts are
// redistributed first, by the cheapest plan.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/ops/conv2d_rule.hpp>
#include <tessera/ops/halo.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

namespace detail {

// Whether device D's backend has the convolutional kernels for T (float; on the host
// they throw where no file of the program brought oneDNN in: kernels/cpu/cnn_table.hpp).
template <class T, class D>
constexpr bool has_window_kernels() {
  using A = typename storage<T, D>::array;
  return std::is_same_v<T, float> && requires(const A& a, const kernels::conv2d_params& p) {
    kernels::backend<D>::conv2d_forward(a, a, &a, p, false);
  };
}

template <class T, class D>
void require_window_kernels(std::string_view op) {
  if constexpr (!has_window_kernels<T, D>())
    throw error(std::string(op) +
                ": no convolution kernels for these tensors (float only; on the host, link tessera::dnnl: oneDNN)");
}

// The two passes of halo_hw over the split spatial axes of a rank's (N, C, H, W) tensor.
// extend: the rank's input extended by each split axis's halo (halo_extend), H's rows
// first, then W's columns over the H-extended height. fold: the gradient of the rank's
// own input from that of its extended input (halo_fold), W's halo returned first, then
// H's: extend's transpose, in reverse order.
enum class halo_pass { extend, fold };

// x after pass P along each split spatial axis, in the pass's order. `next` walks the
// definition's exchanges (halo_exchanges' order).
template <halo_pass P, class T, class D, class C>
typename storage<T, D>::array halo_hw(typename storage<T, D>::array x, const window_split& s,
                                      const std::vector<internal_collective>& cs, std::size_t& next,
                                      device_context<C>& ctx, std::string_view op) {
  struct axis {
    int dim;  // 2: H, 3: W
    const window_axis& a;
  };
  const axis h{2, s.h}, w{3, s.w};
  for (const axis& ax : P == halo_pass::extend ? std::array{h, w} : std::array{w, h}) {
    if (ax.a.parts <= 1) continue;
    const internal_collective& ic = cs.at(next++);
    auto& group = ctx.on(ic.dev).group(ic.axes);
    if constexpr (P == halo_pass::extend) x = halo_extend<T, D>(x, ax.dim, ax.a, group, ic, ctx.rank(), op);
    else x = halo_fold<T, D>(x, ax.dim, ax.a, group, ic, ctx.rank(), op);
  }
  return x;
}

// The rank's input extended by its neighbours' halo where H or W is split (halo_hw's
// extend pass), else nothing: the convolution reads the input as it is, uncopied.
template <class T, class D, class C>
std::optional<typename storage<T, D>::array> extended_input(const typename storage<T, D>::array& x,
                                                            const window_split& s,
                                                            const std::vector<internal_collective>& cs,
                                                            std::size_t& next, device_context<C>& ctx,
                                                            std::string_view op) {
  if (s.h.parts <= 1 && s.w.parts <= 1) return std::nullopt;
  return halo_hw<halo_pass::extend, T, D>(x, s, cs, next, ctx, op);
}

// The padding of the rank's local window: the image's on the edges of a split axis
// (the first and last ranks), none inside it (the halo holds real rows).
inline kernels::pad2d local_padding(const window_split& s, int rank) {
  const int ch = s.coord_h(rank), cw = s.coord_w(rank);
  return {s.h.pad_before(ch), s.h.pad_after(ch), s.w.pad_before(cw), s.w.pad_after(cw)};
}

inline std::vector<std::size_t> dims_of(const extents& e) {
  return std::vector<std::size_t>(e.v.begin(), e.v.begin() + e.ndim);
}

// Whether backend<D> takes a convolution's weights as their tensor (the host's keeps
// them in its kernels' layout between calls, kernels/cpu/backend.hpp), rather than the
// shard's array.
template <class T, class D>
constexpr bool takes_weight_tensor() {
  using A = typename storage<T, D>::array;
  return requires(const A& a, const tensor_on<T, D>& w, const kernels::conv2d_params& p, const layout& l) {
    kernels::backend<D>::conv2d_forward(a, w, p);
    kernels::backend<D>::conv2d_backward(a, a, w, true, p, l);
  };
}

// The number of exchanges the forward runs.
inline std::size_t forward_exchanges(const window_split& s) {
  return std::size_t(s.h.parts > 1) + std::size_t(s.w.parts > 1);
}

}  // namespace detail

/// y = conv2d(x, w) on this rank's shards: x and w are brought to the rule's layouts, x
/// is extended by its neighbours' halo where H or W is split, and the local convolution
/// gives the rank's block of y (partial sums over the input-channel axis when it is split).
template <class T, class D, class C>
tensor_on<T, D> forward(const conv2d_op& op, op_inputs<T, D> in, device_context<C>& ctx) {
  const shape_list shapes{in[0]->global_shape(), in[1]->global_shape()};
  const extents ys = op.output_shape(shapes);
  const conv2d_layouts r = op.rule(ctx.size(), shapes);
  detail::require_window_kernels<T, D>(op.name());
  if constexpr (detail::has_window_kernels<T, D>()) {
    const auto lx = in_layout(*in[0], r.x, ctx), lw = in_layout(*in[1], r.w, ctx);
    const window_split s = op.split(op.st, ctx.size(), shapes);
    const std::vector<internal_collective> cs = op.collectives(op.st, ctx.size(), shapes);
    std::size_t next = 0;
    using A = typename storage<T, D>::array;
    const std::optional<A> extended = detail::extended_input<T, D>(lx->local(), s, cs, next, ctx, op.name());
    const A& xe = extended ? *extended : lx->local();
    kernels::conv2d_params p = op.p;
    p.pad = detail::local_padding(s, ctx.rank());
    if constexpr (detail::takes_weight_tensor<T, D>()) {
      return tensor_on<T, D>(r.y, ys, ctx.rank(), kernels::backend<D>::conv2d_forward(xe, *lw, p));
    } else {
      const A* no_bias = nullptr;
      return tensor_on<T, D>(r.y, ys, ctx.rank(),
                             kernels::backend<D>::conv2d_forward(xe, lw->local(), no_bias, p, false));
    }
  } else {
    return tensor_on<T, D>(r.y, ys, ctx.rank(), storage<T, D>::empty(local_shape(r.y, ys)));
  }
}

/// dx (x's layout, partial over the output-channel axis when it is split) and dw (w's
/// layout, partial over the batch, height and width axes) given dy, brought to y's layout
/// without partial sums. x's halo is fetched again for dw; dx's halo rows go back to
/// the ranks that own them. dx is not computed where `want` skips it (x is data), unless
/// H or W is split: the exchange that returns its halo rows is part of the backward the
/// graph prices.
template <class T, class D, class C>
op_grads<T, D> backward(const conv2d_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> in, const tensor_on<T, D>&,
                        device_context<C>& ctx, grads_wanted want = {}) {
  const shape_list shapes{in[0]->global_shape(), in[1]->global_shape()};
  const conv2d_layouts r = op.rule(ctx.size(), shapes);
  detail::require_window_kernels<T, D>(op.name());
  using A = typename storage<T, D>::array;
  op_grads<T, D> g(2);
  if constexpr (detail::has_window_kernels<T, D>()) {
    const auto ldy = in_layout(dy, r.y.without_partial(), ctx);
    const auto lx = in_layout(*in[0], r.x, ctx), lw = in_layout(*in[1], r.w, ctx);
    const window_split s = op.split(op.st, ctx.size(), shapes);
    const std::vector<internal_collective> cs = op.collectives(op.st, ctx.size(), shapes);
    std::size_t next = detail::forward_exchanges(s);
    const std::optional<A> extended = detail::extended_input<T, D>(lx->local(), s, cs, next, ctx, op.name());
    const A& xe = extended ? *extended : lx->local();
    kernels::conv2d_params p = op.p;
    p.pad = detail::local_padding(s, ctx.rank());
    const bool need_dx = want[0] || extended;
    auto dx_of = [&](A&& dx) {
      if (need_dx)
        g[0].emplace(r.grad_x, shapes[0], ctx.rank(),
                     detail::halo_hw<detail::halo_pass::fold, T, D>(std::move(dx), s, cs, next, ctx, op.name()));
    };
    if constexpr (detail::takes_weight_tensor<T, D>()) {
      auto [dx, dw] = kernels::backend<D>::conv2d_backward(ldy->local(), xe, *lw, need_dx, p, r.grad_w);
      dx_of(std::move(dx));
      g[1].emplace(std::move(dw));
    } else {
      auto k = kernels::backend<D>::conv2d_backward(ldy->local(), xe, lw->local(), need_dx, false, p);
      dx_of(std::move(k.dx));
      g[1].emplace(r.grad_w, shapes[1], ctx.rank(), std::move(k.dw));
    }
  } else {
    g[0].emplace(r.grad_x, shapes[0], ctx.rank(), A());
    g[1].emplace(r.grad_w, shapes[1], ctx.rank(), A());
  }
  return g;
}

}  // namespace tessera::ops
