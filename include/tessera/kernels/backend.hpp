// The local math of each device, as the sharded operators call it: backend<D> holds
// device D's kernels under one set of names, so an operator is written once and runs
// on the device of its tensors. Standard library only; each device specialises it in
// its own header (kernels/cpu/backend.hpp, kernels/cuda/backend.cuh).
#pragma once

#include <tessera/tensor/device.hpp>

namespace tessera::kernels {

/// Device D's kernels over its arrays (`storage<T, D>::array`). Every specialisation
/// provides the same static member templates, each returning a new array unless it
/// says "in place":
///
///   element-wise (NumPy broadcasting): add sub mul div (a, b); relu exp log neg (x);
///     relu_grad(dy, x); bias_add(x, bias); reduce_to_shape(g, shape) (a broadcast's
///     backward); scale(x, s) and add_to(dst, src) in place
///   matrix products: matmul(a, b, ta, tb), matmul_grad_a(dc, a, b, ta, tb),
///     matmul_grad_b(dc, a, b, ta, tb)
///   reductions over `axes` (non-negative, ascending): reduce_sum(x, axes, keep),
///     reduce_max(x, axes, keep), reduce_sum_grad(dy, x_shape, axes, keep),
///     reduce_max_tie_counts(x, y, axes, keep), reduce_max_spread(dy, x, y, ties, axes, keep)
///   cross entropy pieces (kernels/cpu/softmax.hpp): ce_row_max(x), ce_row_terms(x, t, m),
///     ce_loss(s), ce_grad(dloss, x, t, m, s)
///   optimizer updates, in place: momentum_update(param, accum, grad, lr, momentum)
///
/// The primary template is never defined: using a device whose kernels are not
/// included is a compile error naming backend<D>.
template <class D>
struct backend;

}  // namespace tessera::kernels
