// Sharded MatMul: the sharding rule (ops/matmul_rule.hpp), the local product (the
// tensors' device's backend: BLAS on the host, cuBLAS on a GPU) and its backward.
// Inputs in other layouts are redistributed first, by the cheapest plan.
#pragma once

#include <string>
#include <utility>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/ops/matmul_rule.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

namespace detail {
// C's shape, or the shape error with the operator and the strategy:
// "matmul: shapes (8, 8) and (5, 8) do not multiply (...); strategy ((1, 1), (1, 2))".
inline extents matmul_output_shape(const extents& a, const extents& b, const matmul_op& op) {
  try {
    return op.output_shape(shape_list{a, b});
  } catch (const error& e) {
    throw error("matmul: " + std::string(e.what()) + "; strategy " + to_string(op.st));
  }
}
}  // namespace detail

/// C = op(A) op(B) on this rank's shards. A and B are redistributed to the rule's
/// layouts if they are not in them; C comes back in the rule's output layout, with
/// partial sums over the contraction axis when the strategy splits it (the next
/// operator decides how they are resolved: a ReduceScatter when it wants C split).
/// A partial operand whose partial axes the rule holds replicas on stays partial, and
/// C is partial over them too (ops/linear_rule.hpp: pass_product).
template <class T, class D, class C>
tensor_on<T, D> matmul(const matmul_op& op, const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                       device_context<C>& ctx) {
  const matmul_layouts r = pass_product(op.rule(ctx.size()), a.layout(), b.layout());
  const extents cs = detail::matmul_output_shape(a.global_shape(), b.global_shape(), op);
  const auto la = in_layout(a, r.a, ctx), lb = in_layout(b, r.b, ctx);
  using K = kernels::backend<D>;
  return tensor_on<T, D>(r.c, cs, ctx.rank(), K::matmul(la->local(), lb->local(), op.trans_a, op.trans_b));
}

/// The gradients of C = op(A) op(B) given dC: dA in the rule's grad_a layout (A's, partial
/// over the n axis) and dB in grad_b (B's, partial over the m axis). dC is first brought
/// to C's layout without partial sums (the gradient of a sum reaches every partial term).
template <class T, class D, class C>
std::pair<tensor_on<T, D>, tensor_on<T, D>> matmul_backward(const matmul_op& op, const tensor_on<T, D>& dc,
                                                            const tensor_on<T, D>& a, const tensor_on<T, D>& b,
                                                            device_context<C>& ctx) {
  using K = kernels::backend<D>;
  const matmul_layouts r = pass_product(op.rule(ctx.size()), a.layout(), b.layout());
  const auto ldc = in_layout(dc, r.c.without_partial(), ctx);
  const auto la = in_layout(a, r.a, ctx), lb = in_layout(b, r.b, ctx);
  return {tensor_on<T, D>(r.grad_a, a.global_shape(), ctx.rank(),
                          K::matmul_grad_a(ldc->local(), la->local(), lb->local(), op.trans_a, op.trans_b)),
          tensor_on<T, D>(r.grad_b, b.global_shape(), ctx.rank(),
                          K::matmul_grad_b(ldc->local(), la->local(), lb->local(), op.trans_a, op.trans_b))};
}

/// MatMul's forward and backward as every operator's (ops/run.hpp).
template <class T, class D, class C>
tensor_on<T, D> forward(const matmul_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return matmul(op, *x[0], *x[1], ctx);
}
template <class T, class D, class C>
op_grads<T, D> backward(const matmul_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x, const tensor_on<T, D>&,
                        device_context<C>& ctx) {
  auto [da, db] = matmul_backward(op, dy, *x[0], *x[1], ctx);
  return grads_of(std::move(da), std::move(db));
}

}  // namespace tessera::ops
