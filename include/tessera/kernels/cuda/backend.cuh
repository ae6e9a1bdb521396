// The GPU's kernels under backend<cuda_device>'s names (kernels/backend.hpp): thin
// forwards to kernels/cuda/, which does the math on cuda::device_array shards on
// tessera's stream (the convolutions through cuDNN, where it is installed). nvcc only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/kernels/cuda/elementwise.cuh>
#include <tessera/kernels/cuda/matmul.cuh>
#include <tessera/kernels/cuda/optim.cuh>
#include <tessera/kernels/cuda/reduce.cuh>
#include <tessera/kernels/cuda/shape.cuh>
#include <tessera/kernels/cuda/sharded.cuh>
#include <tessera/kernels/cuda/softmax.cuh>
#include <tessera/tensor/cuda_storage.cuh>
// The convolutional network kernels where the program asks for cuDNN (TESSERA_WITH_CUDNN,
// defined by linking tessera::cudnn); operators that need them throw where they are absent.
#if defined(TESSERA_WITH_CUDNN) && __has_include(<cudnn.h>)
#include <tessera/kernels/conv_params.hpp>
#include <tessera/kernels/cuda/batch_norm.cuh>
#include <tessera/kernels/cuda/conv.cuh>
#include <tessera/kernels/cuda/cudnn.cuh>
#include <tessera/kernels/cuda/pool.cuh>
#define TESSERA_KERNELS_CUDA_CNN 1
#endif

namespace tessera::kernels {

template <>
struct backend<cuda_device> {
  template <class T>
  using array = tessera::cuda::device_array<T>;

  // ---- element-wise ----
  template <class T> static array<T> add(const array<T>& a, const array<T>& b) { return cuda::add(a, b); }
  template <class T> static array<T> sub(const array<T>& a, const array<T>& b) { return cuda::sub(a, b); }
  template <class T> static array<T> mul(const array<T>& a, const array<T>& b) { return cuda::mul(a, b); }
  template <class T> static array<T> div(const array<T>& a, const array<T>& b) { return cuda::div(a, b); }
  template <class T> static array<T> relu(const array<T>& x) { return cuda::relu(x); }
  template <class T> static array<T> exp(const array<T>& x) { return cuda::exp(x); }
  template <class T> static array<T> log(const array<T>& x) { return cuda::log(x); }
  template <class T> static array<T> neg(const array<T>& x) { return cuda::neg(x); }
  template <class T> static array<T> relu_grad(const array<T>& dy, const array<T>& x) { return cuda::relu_grad(dy, x); }
  template <class T> static array<T> bias_add(const array<T>& x, const array<T>& b) { return cuda::bias_add(x, b); }
  template <class T, class F, class... X>
  static array<T> fused_map(const char* fn, F f, const array<T>& x0, const X&... xs) {
    return cuda::fused_map(fn, f, x0, xs...);
  }
  template <class T, class F, class... X>
  static array<T> fused_map(const char* fn, F f, array<T>&& x0, const X&... xs) {
    return cuda::fused_map(fn, f, std::move(x0), xs...);
  }
  template <class T, class F>
  static array<T> fused_bias_map(const char* fn, array<T> x, const array<T>& bias, F f) {
    return cuda::fused_bias_map(fn, std::move(x), bias, f);
  }
  template <class T>
  static array<T> reduce_to_shape(const array<T>& g, const extents& shape) {
    return cuda::reduce_to_shape(g, detail::shape_vector(shape));
  }
  template <class T> static void scale(array<T>& x, T s) { cuda::scale(x, s); }
  template <class T> static void add_to(array<T>& dst, const array<T>& src) { cuda::add_to(dst, src); }

  // ---- matrix products ----
  template <class T>
  static array<T> matmul(const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cuda::matmul(a, b, ta, tb);
  }
  /// Row-major C (m x n, row stride ldc) = alpha op(A) op(B) + beta C on pointers into
  /// device memory, queued on tessera's stream (cuBLAS).
  template <class T>
  static void gemm(bool ta, bool tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb, T beta,
                   T* c, int ldc) {
    cuda::detail::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  template <class T>
  static array<T> matmul_grad_a(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cuda::matmul_grad_a(dc, a, b, ta, tb);
  }
  template <class T>
  static array<T> matmul_grad_b(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cuda::matmul_grad_b(dc, a, b, ta, tb);
  }

  // ---- batched products ----
  template <class T>
  static array<T> batch_matmul(const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cuda::batch_matmul(a, b, ta, tb);
  }
  template <class T>
  static array<T> batch_matmul_grad_a(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cuda::batch_matmul_grad_a(dc, a, b, ta, tb);
  }
  template <class T>
  static array<T> batch_matmul_grad_b(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cuda::batch_matmul_grad_b(dc, a, b, ta, tb);
  }

  // ---- data movement ----
  template <class T>
  static array<T> transpose(const array<T>& x, const std::vector<int>& perm) {
    return cuda::transpose(x, perm);
  }
  template <class T>
  static array<T> transpose_grad(const array<T>& dy, const std::vector<int>& perm) {
    return cuda::transpose_grad(dy, perm);
  }
  template <class T>
  static array<T> strided_slice(const array<T>& x, const std::vector<index_t>& begin, const std::vector<index_t>& end,
                                const std::vector<index_t>& strides) {
    return cuda::strided_slice(x, begin, end, strides);
  }
  template <class T>
  static array<T> strided_slice_grad(const array<T>& dy, const std::vector<std::size_t>& x_shape,
                                     const std::vector<index_t>& begin, const std::vector<index_t>& end,
                                     const std::vector<index_t>& strides) {
    return cuda::strided_slice_grad(dy, x_shape, begin, end, strides);
  }
  template <class T>
  static array<T> concat(const std::vector<const array<T>*>& xs, int axis) {
    return cuda::concat(xs, axis);
  }
  template <class T>
  static std::vector<array<T>> split(const array<T>& x, const std::vector<std::size_t>& sizes, int axis) {
    return cuda::split(x, sizes, axis);
  }

  // ---- reductions ----
  template <class T>
  static array<T> reduce_sum(const array<T>& x, const std::vector<int>& axes, bool keep) {
    return cuda::reduce_sum(x, axes, keep);
  }
  template <class T>
  static array<T> reduce_max(const array<T>& x, const std::vector<int>& axes, bool keep) {
    return cuda::reduce_max(x, axes, keep);
  }
  template <class T>
  static array<T> reduce_sum_grad(const array<T>& dy, const extents& x_shape, const std::vector<int>& axes,
                                  bool keep) {
    return cuda::reduce_sum_grad(dy, detail::shape_vector(x_shape), axes, keep);
  }
  template <class T>
  static array<T> reduce_max_tie_counts(const array<T>& x, const array<T>& y, const std::vector<int>& axes,
                                        bool keep) {
    return cuda::reduce_max_tie_counts(x, y, axes, keep);
  }
  template <class T>
  static array<T> reduce_max_spread(const array<T>& dy, const array<T>& x, const array<T>& y,
                                    const array<T>& ties, const std::vector<int>& axes, bool keep) {
    return cuda::reduce_max_spread(dy, x, y, ties, axes, keep);
  }

  // ---- cross entropy pieces ----
  template <class T> static array<T> ce_row_max(const array<T>& x) { return cuda::ce_row_max(x); }
  template <class T>
  static array<T> ce_row_terms(const array<T>& x, const array<T>& t, const array<T>& m) {
    return cuda::ce_row_terms(x, t, m);
  }
  template <class T> static array<T> ce_loss(const array<T>& s) { return cuda::ce_loss(s); }
  template <class T>
  static array<T> ce_grad(const array<T>& dloss, const array<T>& x, const array<T>& t, const array<T>& m,
                          const array<T>& s) {
    return cuda::ce_grad(dloss, x, t, m, s);
  }

  // ---- softmax along an axis, sparse cross entropy, argmax, one-hot (kernels/cuda/sharded.cuh) ----
  template <class T>
  static array<T> softmax_axis_max(const array<T>& x, int axis) {
    return cuda::softmax_axis_max(x, axis);
  }
  template <class T>
  static array<T> softmax_axis_sum(const array<T>& x, int axis, const array<T>& max) {
    return cuda::softmax_axis_sum(x, axis, max);
  }
  template <class T>
  static array<T> softmax_axis_out(const array<T>& x, int axis, const array<T>& max, const array<T>& sum, bool log) {
    return cuda::softmax_axis_out(x, axis, max, sum, log);
  }
  template <class T>
  static array<T> softmax_axis_grad_sum(const array<T>& dy, const array<T>& y, int axis, bool log) {
    return cuda::softmax_axis_grad_sum(dy, y, axis, log);
  }
  template <class T>
  static array<T> softmax_axis_grad(const array<T>& dy, const array<T>& y, int axis, const array<T>& acc, bool log) {
    return cuda::softmax_axis_grad(dy, y, axis, acc, log);
  }
  template <class L>
  static array<std::int64_t> sparse_ce_columns(const array<L>& labels, index_t classes, index_t first_row,
                                               index_t first_col, std::size_t cols) {
    return cuda::sparse_ce_columns(labels, classes, first_row, first_col, cols);
  }
  template <class T>
  static array<T> sparse_ce_terms(const array<T>& x, const array<std::int64_t>& column, const array<T>& max) {
    return cuda::sparse_ce_terms(x, column, max);
  }
  template <class T>
  static array<T> sparse_ce_loss(const array<T>& max, const array<T>& terms) {
    return cuda::sparse_ce_loss(max, terms);
  }
  template <class T>
  static array<T> sparse_ce_grad(const array<T>& dloss, const array<T>& x, const array<std::int64_t>& column,
                                 const array<T>& max, const array<T>& terms) {
    return cuda::sparse_ce_grad(dloss, x, column, max, terms);
  }
  template <class T>
  static std::pair<array<T>, array<std::int64_t>> argmax_local(const array<T>& x, int axis, std::int64_t first) {
    return cuda::argmax_local(x, axis, first);
  }
  template <class T>
  static void argmax_resolve(array<std::int64_t>& index, const array<T>& best, const array<T>& top) {
    cuda::argmax_resolve(index, best, top);
  }
  template <class T, class I>
  static array<T> one_hot(const array<I>& indices, index_t depth, index_t first, index_t local_depth, T on, T off) {
    return cuda::one_hot<T>(indices, depth, first, local_depth, on, off);
  }
  template <class To, class From>
  static array<To> convert(const array<From>& x) {
    return cuda::convert<To>(x);
  }

  // ---- optimizer updates ----
  template <class T>
  static void momentum_update(array<T>& param, array<T>& accum, const array<T>& grad, T lr, T momentum,
                              T weight_decay = T(0), bool nesterov = false) {
    cuda::momentum_update(param, accum, grad, lr, momentum, weight_decay, nesterov);
  }
  template <class T>
  static void sgd_update(array<T>& param, const array<T>& grad, T lr, T weight_decay) {
    cuda::sgd_update(param, grad, lr, weight_decay);
  }
  template <class T>
  static void sgd_momentum_update(array<T>& param, const array<T>& grad, array<T>& buf, T lr, T momentum,
                                  T dampening, T weight_decay, bool nesterov, bool first_step) {
    cuda::sgd_momentum_update(param, grad, buf, lr, momentum, dampening, weight_decay, nesterov, first_step);
  }
  template <class T>
  static void adam_update(array<T>& param, const array<T>& grad, array<T>& m, array<T>& v, T lr, T beta1, T beta2,
                          T eps, T weight_decay, bool decoupled, std::int64_t t) {
    cuda::adam_update(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, decoupled, t);
  }

  // Over many parameters at once, in a few launches (kernels/cuda/optim.cuh).
  template <class T>
  static void momentum_update_many(std::span<array<T>* const> params, std::span<array<T>* const> accums,
                                   std::span<const array<T>* const> grads, T lr, T momentum, T weight_decay,
                                   bool nesterov) {
    cuda::momentum_update_many(params, accums, grads, lr, momentum, weight_decay, nesterov);
  }
  template <class T>
  static void sgd_update_many(std::span<array<T>* const> params, std::span<const array<T>* const> grads, T lr,
                              T weight_decay) {
    cuda::sgd_update_many(params, grads, lr, weight_decay);
  }
  template <class T>
  static void sgd_momentum_update_many(std::span<array<T>* const> params, std::span<const array<T>* const> grads,
                                       std::span<array<T>* const> bufs, T lr, T momentum, T dampening,
                                       T weight_decay, bool nesterov, bool first_step) {
    cuda::sgd_momentum_update_many(params, grads, bufs, lr, momentum, dampening, weight_decay, nesterov, first_step);
  }
  template <class T>
  static void adam_update_many(std::span<array<T>* const> params, std::span<const array<T>* const> grads,
                               std::span<array<T>* const> ms, std::span<array<T>* const> vs, T lr, T beta1, T beta2,
                               T eps, T weight_decay, bool decoupled, std::int64_t t) {
    cuda::adam_update_many(params, grads, ms, vs, lr, beta1, beta2, eps, weight_decay, decoupled, t);
  }

#if defined(TESSERA_KERNELS_CUDA_CNN)
  // ---- convolutional networks (kernels/cuda/conv.cuh, batch_norm.cuh, pool.cuh; float) ----
  using workspace = cuda::device_workspace;

  template <class T>
  static array<T> conv2d_forward(const array<T>& x, const array<T>& w, const array<T>* bias,
                                 const conv2d_params& p, bool relu = false) {
    return cuda::conv2d_forward(x, w, bias, p, relu);
  }
  template <class T>
  static conv2d_grads<array<T>> conv2d_backward(const array<T>& dy, const array<T>& x, const array<T>& w,
                                                bool need_dx, bool bias, const conv2d_params& p) {
    return cuda::conv2d_backward(dy, x, w, need_dx, bias, p);
  }

  template <class T>
  static batch_norm_training<array<T>, array<T>, workspace> batch_norm_forward_training(
      const array<T>& x, const array<T>& gamma, const array<T>& beta, T eps, bool relu = false) {
    return cuda::batch_norm_forward_training(x, gamma, beta, eps, relu);
  }
  template <class T>
  static array<T> batch_norm_forward_inference(const array<T>& x, const array<T>& gamma, const array<T>& beta,
                                               const array<T>& mean, const array<T>& variance, T eps,
                                               bool relu = false) {
    return cuda::batch_norm_forward_inference(x, gamma, beta, mean, variance, eps, relu);
  }
  template <class T>
  static batch_norm_grads<array<T>, array<T>> batch_norm_backward(const array<T>& dy, const array<T>& x,
                                                                  const array<T>& gamma, const array<T>& mean,
                                                                  const array<T>& variance, const workspace& ws,
                                                                  T eps, bool relu = false) {
    return cuda::batch_norm_backward(dy, x, gamma, mean, variance, ws, eps, relu);
  }
  template <class T>
  static channel_sums<array<T>> batch_norm_sums(const array<T>& x) {
    return cuda::batch_norm_sums(x);
  }
  template <class T>
  static batch_norm_stats<array<T>> batch_norm_moments(const channel_sums<array<T>>& sums, std::size_t count) {
    return cuda::batch_norm_moments(sums, count);
  }
  template <class T>
  static channel_sums<array<T>> batch_norm_backward_sums(const array<T>& dy, const array<T>& x, const array<T>& mean,
                                                         const array<T>& variance, T eps,
                                                         const array<T>* relu_y = nullptr) {
    return cuda::batch_norm_backward_sums(dy, x, mean, variance, eps, relu_y);
  }
  template <class T>
  static array<T> batch_norm_backward_data(const array<T>& dy, const array<T>& x, const array<T>& gamma,
                                           const array<T>& mean, const array<T>& variance,
                                           const channel_sums<array<T>>& sums, std::size_t count, T eps,
                                           const array<T>* relu_y = nullptr) {
    return cuda::batch_norm_backward_data(dy, x, gamma, mean, variance, sums, count, eps, relu_y);
  }
  template <class T>
  static void batch_norm_update_running(array<T>& running_mean, array<T>& running_var, const array<T>& mean,
                                        const array<T>& variance, std::size_t count, T momentum,
                                        bool unbiased = true) {
    cuda::batch_norm_update_running(running_mean, running_var, mean, variance, count, momentum, unbiased);
  }

  template <class T>
  static max_pool2d_result<array<T>, workspace> max_pool2d_forward(const array<T>& x, const pool2d_params& p) {
    return cuda::max_pool2d_forward(x, p);
  }
  template <class T>
  static array<T> max_pool2d_backward(const array<T>& dy, const array<T>& x, const array<T>& y, const workspace& ws,
                                      const pool2d_params& p) {
    return cuda::max_pool2d_backward(dy, x, y, ws, p);
  }
  template <class T>
  static array<T> avg_pool2d_forward(const array<T>& x, const pool2d_params& p) {
    return cuda::avg_pool2d_forward(x, p);
  }
  template <class T>
  static array<T> avg_pool2d_backward(const array<T>& dy, const std::vector<std::size_t>& x_shape,
                                      const pool2d_params& p) {
    return cuda::avg_pool2d_backward(dy, x_shape, p);
  }
  template <class T>
  static array<T> global_avg_pool2d_forward(const array<T>& x) {
    return cuda::global_avg_pool2d_forward(x);
  }
  template <class T>
  static array<T> global_avg_pool2d_backward(const array<T>& dy, const std::vector<std::size_t>& x_shape) {
    return cuda::global_avg_pool2d_backward(dy, x_shape);
  }
#endif
};

}  // namespace tessera::kernels

#undef TESSERA_KERNELS_CUDA_CNN
