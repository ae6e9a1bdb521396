// AllReduce's forward and backward (ops/all_reduce_rule.hpp): the sum of every rank's
// tensor over the definition's group, and of the gradients in the backward.
#pragma once

#include <span>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/ops/all_reduce_rule.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::ops {

/// x summed over the group of `op` on every rank (the input's layout kept).
template <class T, class D, class C>
tensor_on<T, D> all_reduce(const all_reduce_op& op, const tensor_on<T, D>& x, bool backward,
                           device_context<C>& ctx) {
  tensor_on<T, D> y(x);
  run_internal(op.sum(ctx.size(), index_t(y.data().size()), backward), y.data(), ctx, op.name());
  return y;
}

/// AllReduce's forward and backward as every operator's (ops/run.hpp).
template <class T, class D, class C>
tensor_on<T, D> forward(const all_reduce_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  return all_reduce(op, *x[0], false, ctx);
}
template <class T, class D, class C>
op_grads<T, D> backward(const all_reduce_op& op, const tensor_on<T, D>& dy, op_inputs<T, D>, const tensor_on<T, D>&,
                        device_context<C>& ctx) {
  return grads_of(all_reduce(op, dy, true, ctx));
}

}  // namespace tessera::ops
