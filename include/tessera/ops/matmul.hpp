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
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// MatMul with a shard strategy, as `MatMul(transpose_a, transpose_b).shard(st)`.
struct matmul_op {
  strategy st;
  bool trans_a = false;
  bool trans_b = false;

  /// The rule on `device_num` devices; throws tessera::error naming the rule broken,
  /// the numbers and the strategy.
  matmul_layouts rule(int device_num) const {
    const status s = check_matmul(st, device_num, trans_a, trans_b);
    if (!s.ok()) throw error(s, "", "strategy " + to_string(st));
    return matmul_rule(st, device_num, trans_a, trans_b);
  }
};

namespace detail {
inline extents matmul_output_shape(const extents& a, const extents& b, bool trans_a, bool trans_b,
                                   const strategy& st) {
  const index_t m = trans_a ? a[1] : a[0], ka = trans_a ? a[0] : a[1];
  const index_t kb = trans_b ? b[1] : b[0], n = trans_b ? b[0] : b[1];
  if (a.ndim != 2 || b.ndim != 2 || ka != kb)
    throw error("matmul: shapes " + to_string(a) + " and " + to_string(b) +
                " do not multiply (transpose_a " + (trans_a ? "true" : "false") + ", transpose_b " +
                (trans_b ? "true" : "false") + "); strategy " + to_string(st));
  return extents{m, n};
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
  const extents cs = detail::matmul_output_shape(a.global_shape(), b.global_shape(), op.trans_a,
                                                 op.trans_b, op.st);
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

}  // namespace tessera::ops
