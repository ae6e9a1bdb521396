// Sharded BatchMatMul: the sharding rule (ops/batch_matmul_rule.hpp), the local batched
// product (the tensors' device's backend: BLAS on the host, cuBLAS on a GPU) and its
// backward. Inputs in other layouts are redistributed first, by the cheapest plan.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/ops/batch_matmul_rule.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

namespace detail {

// A shard seen as the kernels' rank 2 or 3: leading batch dims folded into one (a
// row-major copy only when there are several of them). A is the shard's array type.
template <class A>
class batched_view {
 public:
  explicit batched_view(const A& x) : x_(&x) {
    if (x.dimension() <= 3) return;
    std::size_t b = 1;
    for (std::size_t d = 0; d + 2 < x.dimension(); ++d) b *= x.shape()[d];
    folded_ = x;
    folded_->reshape(std::vector<std::size_t>{b, x.shape()[x.dimension() - 2], x.shape()[x.dimension() - 1]});
  }
  const A& operator*() const { return folded_ ? *folded_ : *x_; }

 private:
  const A* x_;
  std::optional<A> folded_;
};

}  // namespace detail

/// C = op(A) op(B) for every batch entry, on this rank's shards. A and B are
/// redistributed to the rule's layouts if they are not in them; C comes back in the
/// rule's output layout, partial over the contraction axis when the strategy splits it.
template <class T, class D, class C>
tensor_on<T, D> batch_matmul(const batch_matmul_op& op, const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                             device_context<C>& ctx) {
  using A = typename tensor_on<T, D>::array_type;
  const batch_matmul_layouts r =
      pass_product(op.rule(ctx.size(), a.global_shape(), b.global_shape()), a.layout(), b.layout());
  const auto la = in_layout(a, r.a, ctx), lb = in_layout(b, r.b, ctx);
  const detail::batched_view<A> va(la->local()), vb(lb->local());
  return tensor_on<T, D>(r.c, r.shape, ctx.rank(),
                         kernels::backend<D>::batch_matmul(*va, *vb, op.trans_a, op.trans_b));
}

/// The gradients of C = batch_matmul(A, B) given dC (any layout of C's shape; partial
/// sums are resolved first): dA in the rule's grad_a layout, dB in grad_b. A shared
/// input's gradient is summed over the batch entries this rank holds, and partial over
/// the batch axes.
template <class T, class D, class C>
std::pair<tensor_on<T, D>, tensor_on<T, D>> batch_matmul_backward(const batch_matmul_op& op,
                                                                  const tensor_on<T, D>& dc,
                                                                  const tensor_on<T, D>& a,
                                                                  const tensor_on<T, D>& b,
                                                                  device_context<C>& ctx) {
  using A = typename tensor_on<T, D>::array_type;
  using K = kernels::backend<D>;
  const batch_matmul_layouts r =
      pass_product(op.rule(ctx.size(), a.global_shape(), b.global_shape()), a.layout(), b.layout());
  if (!(dc.global_shape() == r.shape))
    throw error("batch_matmul_backward: dc is " + to_string(dc.global_shape()) + ", expected " +
                to_string(r.shape));
  const auto ldc = in_layout(dc, r.c.without_partial(), ctx);
  const auto la = in_layout(a, r.a, ctx), lb = in_layout(b, r.b, ctx);
  const detail::batched_view<A> vdc(ldc->local()), va(la->local()), vb(lb->local());
  return {tensor_on<T, D>(r.grad_a, a.global_shape(), ctx.rank(),
                          K::batch_matmul_grad_a(*vdc, *va, *vb, op.trans_a, op.trans_b)),
          tensor_on<T, D>(r.grad_b, b.global_shape(), ctx.rank(),
                          K::batch_matmul_grad_b(*vdc, *va, *vb, op.trans_a, op.trans_b))};
}

/// BatchMatMul's forward and backward as every operator's (ops/run.hpp).
template <class T, class D, class C>
tensor_on<T, D> forward(const batch_matmul_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return batch_matmul(op, *x[0], *x[1], ctx);
}
template <class T, class D, class C>
op_grads<T, D> backward(const batch_matmul_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>&, device_context<C>& ctx) {
  auto [da, db] = batch_matmul_backward(op, dy, *x[0], *x[1], ctx);
  return grads_of(std::move(da), std::move(db));
}

}  // namespace tessera::ops
