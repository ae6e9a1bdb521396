// The local math of each device, as the sharded operators call it: backend<D> holds
// device D's kernels under one set of names, so an operator is written once and runs
// on the device of its tensors. Standard library only; each device specialises it in
// its own header (kernels/cpu/backend.hpp, kernels/cuda/backend.cuh).
#pragma once

#include <tessera/kernels/fused.hpp>
#include <tessera/tensor/device.hpp>

namespace tessera::kernels {

/// Device D's kernels over its arrays (`storage<T, D>::array`). Every specialisation
/// provides the same static member templates, each returning a new array unless it
/// says "in place":
///
///   element-wise (NumPy broadcasting): add sub mul div (a, b); relu exp log neg (x);
///     relu_grad(dy, x); bias_add(x, bias); reduce_to_shape(g, shape) (a broadcast's
///     backward); scale(x, s) and add_to(dst, src) in place
///   fused chains (kernels/fused.hpp's functors, callable on every device):
///     fused_map(fn, f, x0, xs...) (one pass over arrays of one shape, in x0's storage
///     when x0 is an rvalue),
///     fused_bias_map(fn, x, bias, f) (f(x, bias) with the bias repeated along the rows,
///     in x's storage when x is an rvalue)
///   matrix products: matmul(a, b, ta, tb), matmul_grad_a(dc, a, b, ta, tb),
///     matmul_grad_b(dc, a, b, ta, tb); gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
///     ldc) on pointers into the device's memory, row-major (returns nothing)
///   reductions over `axes` (non-negative, ascending): reduce_sum(x, axes, keep),
///     reduce_max(x, axes, keep), reduce_sum_grad(dy, x_shape, axes, keep),
///     reduce_max_tie_counts(x, y, axes, keep), reduce_max_spread(dy, x, y, ties, axes, keep)
///   cross entropy pieces (kernels/cpu/softmax.hpp): ce_row_max(x), ce_row_terms(x, t, m),
///     ce_loss(s), ce_grad(dloss, x, t, m, s)
///   batched products: batch_matmul(a, b, ta, tb), batch_matmul_grad_a(dc, a, b, ta, tb),
///     batch_matmul_grad_b(dc, a, b, ta, tb) (a 3-D batch with a 2-D operand shared)
///   data movement: transpose(x, perm), transpose_grad(dy, perm),
///     strided_slice(x, begin, end, strides), strided_slice_grad(dy, x_shape, begin, end,
///     strides), concat(pointers to the inputs, axis), split(x, sizes, axis) (a vector)
///   softmax along an axis (kernels/cpu/sharded.hpp; a row is one vector along the axis):
///     softmax_axis_max(x, axis), softmax_axis_sum(x, axis, max),
///     softmax_axis_out(x, axis, max, sum, log), softmax_axis_grad_sum(dy, y, axis, log),
///     softmax_axis_grad(dy, y, axis, acc, log)
///   sparse cross entropy pieces: sparse_ce_columns(labels, classes, first_row, first_col,
///     cols) (int64; checks the labels), sparse_ce_terms(x, column, max),
///     sparse_ce_loss(max, terms), sparse_ce_grad(dloss, x, column, max, terms)
///   argmax pieces: argmax_local(x, axis, first) (a pair: values, int64 indices);
///     argmax_resolve(index, best, top) in place
///   one_hot<T>(indices, depth, first, local_depth, on, off) (this rank's piece of the
///     depth); convert<To>(x) (element type conversion)
///   optimizer updates, in place: momentum_update(param, accum, grad, lr, momentum,
///     weight_decay, nesterov),
///     sgd_update(param, grad, lr, weight_decay), sgd_momentum_update(param, grad, buf, lr,
///     momentum, dampening, weight_decay, nesterov, first_step), adam_update(param, grad,
///     m, v, lr, beta1, beta2, eps, weight_decay, decoupled, t) (kernels/cpu/optim.hpp's
///     formulas)
///   convolutional networks on NCHW tensors (kernels/conv_params.hpp's parameters and
///     result types; the host's through oneDNN where it is installed, the GPU's through
///     cuDNN; float): conv2d_forward(x, w, bias or null, params, relu),
///     conv2d_backward(dy, x, w, need_dx, bias, params) ({dx, dw, db}: dw and db, and
///     dx when need_dx, else empty);
///     batch_norm_forward_training(x, gamma, beta, eps, relu) ({y, mean, variance,
///     workspace}), batch_norm_forward_inference(x, gamma, beta, mean, variance, eps,
///     relu), batch_norm_backward(dy, x, gamma, mean, variance, workspace, eps, relu)
///     ({dx, dgamma, dbeta}); the split batch norm whose sums are
///     added across ranks: batch_norm_sums(x), batch_norm_moments(sums, count),
///     batch_norm_backward_sums(dy, x, mean, variance, eps, relu_y),
///     batch_norm_backward_data(dy, x, gamma, mean, variance, sums, count, eps, relu_y);
///     batch_norm_update_running(...) in place; max_pool2d_forward(x, params) ({y,
///     workspace}), max_pool2d_backward(dy, x, y, workspace, params),
///     avg_pool2d_forward(x, params), avg_pool2d_backward(dy, x_shape, params),
///     global_avg_pool2d_forward(x), global_avg_pool2d_backward(dy, x_shape); the type
///     `workspace`
///
/// The primary template is never defined: using a device whose kernels are not
/// included is a compile error naming backend<D>.
template <class D>
struct backend;

}  // namespace tessera::kernels
