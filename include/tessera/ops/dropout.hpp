// Dropout's forward and backward (ops/dropout_rule.hpp): the input times a mask of 0
// and 1 / (1 - p) drawn from the layer's counter-based stream at each element's global
// index (on the host, so every device multiplies by the same numbers), and the same
// mask on the gradient.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/kernels/random.hpp>
#include <tessera/ops/dropout_rule.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/tensor/dist_tensor.hpp>
#include <tessera/tensor/host_storage.hpp>

namespace tessera::ops {

namespace detail {

/// Calls f(local offset, global row-major offset) for every element of the shard of
/// `l` on `rank` of a tensor of global shape `g`.
template <class F>
void for_each_global(const layout& l, const extents& g, int rank, F&& f) {
  const extents off = local_offset(l, g, rank);
  index_t stride[max_tensor_ndim] = {};
  index_t s = 1;
  for (int k = g.ndim - 1; k >= 0; --k) {
    stride[k] = s;
    s *= g[k];
  }
  tessera::detail::for_each_index(local_shape(l, g), [&](const auto& idx, index_t lin) {
    index_t glob = 0;
    for (int k = 0; k < g.ndim; ++k) glob += (off.v[k] + idx[k]) * stride[k];
    f(std::size_t(lin), std::uint64_t(glob));
  });
}

}  // namespace detail

/// Whether application `call` of the dropout of stream `key` keeps the element at
/// global index i (probability 1 - p).
inline bool dropout_keeps(std::uint64_t key, double p, std::uint64_t call, std::uint64_t i) {
  return kernels::random_stream(kernels::mix64(key ^ kernels::mix64(call + 1))).uniform01(i) >= p;
}

/// Dropout's factors for the shard of `l` on `rank` (global shape `g`) in application
/// op.call: 1 / (1 - p) where the element is kept, 0 where it is dropped. Drawn on the
/// host and copied to device D.
template <class T, class D = cpu_device>
typename storage<T, D>::array dropout_factors(const dropout_op& op, const layout& l, const extents& g, int rank) {
  const T scale = T(1.0 / (1.0 - op.p));
  const extents ls = local_shape(l, g);
  xt::xarray<T> m = xt::xarray<T>::from_shape(std::vector<std::size_t>(ls.v.begin(), ls.v.begin() + ls.ndim));
  T* pm = m.data();
  detail::for_each_global(l, g, rank, [&](std::size_t i, std::uint64_t gi) {
    pm[i] = dropout_keeps(op.key, op.p, op.call, gi) ? scale : T(0);
  });
  if constexpr (std::is_same_v<D, cpu_device>) return m;
  else return storage<T, D>::from_host(m);
}

namespace detail {
// The rule's layouts for an input arriving in `x` (partial sums pass through).
inline elementwise_layouts dropout_layouts(const dropout_op& op, int device_num, const extents& shape, const layout& x) {
  const elementwise_layouts r = op.rule(device_num, shape_list{shape});
  return with_pass(r, pass_partial(op.linear(), &x, r.in.data(), 1, r.out));
}
}  // namespace detail

/// y = x * mask (op.call's), in the rule's output layout; x itself, laid out, when the
/// layer does not drop (evaluation, or p = 0).
template <class T, class D, class C>
tensor_on<T, D> forward(const dropout_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  const elementwise_layouts r = detail::dropout_layouts(op, ctx.size(), x[0]->global_shape(), x[0]->layout());
  const auto lx = in_layout(*x[0], r.in[0], ctx);
  if (!op.active()) return tensor_on<T, D>(r.out, r.shape, ctx.rank(), typename tensor_on<T, D>::array_type(lx->local()));
  return tensor_on<T, D>(r.out, r.shape, ctx.rank(),
                         kernels::backend<D>::mul(lx->local(), dropout_factors<T, D>(op, r.out, r.shape, ctx.rank())));
}

/// dx = dy * mask (the forward's), in the input's gradient layout.
template <class T, class D, class C>
op_grads<T, D> backward(const dropout_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x, const tensor_on<T, D>&,
                        device_context<C>& ctx) {
  const elementwise_layouts r = detail::dropout_layouts(op, ctx.size(), x[0]->global_shape(), x[0]->layout());
  const layout out = r.out.without_partial();
  const auto ldy = in_layout(dy, out, ctx);
  typename tensor_on<T, D>::array_type dx =
      op.active() ? kernels::backend<D>::mul(ldy->local(), dropout_factors<T, D>(op, out, r.shape, ctx.rank()))
                  : typename tensor_on<T, D>::array_type(ldy->local());
  return grads_of(tensor_on<T, D>(r.grad[0], x[0]->global_shape(), ctx.rank(), std::move(dx)));
}

}  // namespace tessera::ops
