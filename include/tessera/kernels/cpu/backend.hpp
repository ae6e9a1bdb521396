// The host's kernels under backend<cpu_device>'s names (kernels/backend.hpp): thin
// forwards to kernels/cpu/, which does the math on xt::xarray shards (the convolution,
// batch-norm and pooling kernels through oneDNN, where it is installed).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/kernels/cpu/elementwise.hpp>
#include <tessera/kernels/cpu/matmul.hpp>
#include <tessera/kernels/cpu/optim.hpp>
#include <tessera/kernels/cpu/reduce.hpp>
#include <tessera/kernels/cpu/shape.hpp>
#include <tessera/kernels/cpu/sharded.hpp>
#include <tessera/kernels/cpu/softmax.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/tensor/dist_tensor.hpp>
#include <tessera/tensor/host_storage.hpp>
// The convolutional network kernels through the program's table
// (kernels/cpu/cnn_table.hpp), which oneDNN's fill where the program asks for them
// (TESSERA_WITH_DNNL, defined by linking tessera::dnnl) in a translation unit of the host
// compiler: nvcc's front end cannot parse oneDNN 2.6's dnnl.hpp (an internal error), so
// a CUDA file compiles the same calls and finds the kernels a host file entered.
#include <tessera/kernels/cpu/cnn_table.hpp>
#if defined(TESSERA_WITH_DNNL) && __has_include(<oneapi/dnnl/dnnl.hpp>) && !defined(__CUDACC__)
#include <tessera/kernels/cpu/cnn_kernels.hpp>
#endif

namespace tessera::kernels {

template <>
struct backend<cpu_device> {
  template <class T>
  using array = xt::xarray<T>;

  // ---- element-wise ----
  template <class T> static array<T> add(const array<T>& a, const array<T>& b) { return cpu::add(a, b); }
  template <class T> static array<T> sub(const array<T>& a, const array<T>& b) { return cpu::sub(a, b); }
  template <class T> static array<T> mul(const array<T>& a, const array<T>& b) { return cpu::mul(a, b); }
  template <class T> static array<T> div(const array<T>& a, const array<T>& b) { return cpu::div(a, b); }
  template <class T> static array<T> relu(const array<T>& x) { return cpu::relu(x); }
  template <class T> static array<T> exp(const array<T>& x) { return cpu::exp(x); }
  template <class T> static array<T> log(const array<T>& x) { return cpu::log(x); }
  template <class T> static array<T> neg(const array<T>& x) { return cpu::neg(x); }
  template <class T> static array<T> relu_grad(const array<T>& dy, const array<T>& x) { return cpu::relu_grad(dy, x); }
  template <class T> static array<T> bias_add(const array<T>& x, const array<T>& b) { return cpu::bias_add(x, b); }
  template <class T, class F, class... X>
  static array<T> fused_map(const char* fn, F f, const array<T>& x0, const X&... xs) {
    return cpu::fused_map(fn, f, x0, xs...);
  }
  template <class T, class F, class... X>
  static array<T> fused_map(const char* fn, F f, array<T>&& x0, const X&... xs) {
    return cpu::fused_map(fn, f, std::move(x0), xs...);
  }
  template <class T, class F>
  static array<T> fused_bias_map(const char* fn, array<T> x, const array<T>& bias, F f) {
    return cpu::fused_bias_map(fn, std::move(x), bias, f);
  }
  template <class T>
  static array<T> reduce_to_shape(const array<T>& g, const extents& shape) {
    return cpu::reduce_to_shape(g, detail::shape_vector(shape));
  }
  template <class T>
  static array<T> reduce_to_shape(array<T>&& g, const extents& shape) {
    return cpu::reduce_to_shape(std::move(g), detail::shape_vector(shape));
  }
  template <class T> static void scale(array<T>& x, T s) { cpu::scale(x, s); }
  template <class T> static void add_to(array<T>& dst, const array<T>& src) { cpu::add_to(dst, src); }

  // ---- matrix products ----
  template <class T>
  static array<T> matmul(const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cpu::matmul(a, b, ta, tb);
  }
  /// Row-major C (m x n, row stride ldc) = alpha op(A) op(B) + beta C on pointers into
  /// this device's memory (BLAS's gemm).
  template <class T>
  static void gemm(bool ta, bool tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb, T beta,
                   T* c, int ldc) {
    cpu::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  template <class T>
  static array<T> matmul_grad_a(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cpu::matmul_grad_a(dc, a, b, ta, tb);
  }
  template <class T>
  static array<T> matmul_grad_b(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cpu::matmul_grad_b(dc, a, b, ta, tb);
  }

  // ---- batched products ----
  template <class T>
  static array<T> batch_matmul(const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cpu::batch_matmul(a, b, ta, tb);
  }
  template <class T>
  static array<T> batch_matmul_grad_a(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cpu::batch_matmul_grad_a(dc, a, b, ta, tb);
  }
  template <class T>
  static array<T> batch_matmul_grad_b(const array<T>& dc, const array<T>& a, const array<T>& b, bool ta, bool tb) {
    return cpu::batch_matmul_grad_b(dc, a, b, ta, tb);
  }

  // ---- data movement ----
  template <class T>
  static array<T> transpose(const array<T>& x, const std::vector<int>& perm) {
    return cpu::transpose(x, perm);
  }
  template <class T>
  static array<T> transpose_grad(const array<T>& dy, const std::vector<int>& perm) {
    return cpu::transpose_grad(dy, perm);
  }
  template <class T>
  static array<T> strided_slice(const array<T>& x, const std::vector<index_t>& begin, const std::vector<index_t>& end,
                                const std::vector<index_t>& strides) {
    return cpu::strided_slice(x, begin, end, strides);
  }
  template <class T>
  static array<T> strided_slice_grad(const array<T>& dy, const std::vector<std::size_t>& x_shape,
                                     const std::vector<index_t>& begin, const std::vector<index_t>& end,
                                     const std::vector<index_t>& strides) {
    return cpu::strided_slice_grad(dy, x_shape, begin, end, strides);
  }
  template <class T>
  static array<T> concat(const std::vector<const array<T>*>& xs, int axis) {
    return cpu::detail::concat_impl(xs, axis);
  }
  template <class T>
  static std::vector<array<T>> split(const array<T>& x, const std::vector<std::size_t>& sizes, int axis) {
    return cpu::split(x, sizes, axis);
  }

  // ---- reductions ----
  template <class T>
  static array<T> reduce_sum(const array<T>& x, const std::vector<int>& axes, bool keep) {
    return cpu::reduce_sum(x, axes, keep);
  }
  template <class T>
  static array<T> reduce_max(const array<T>& x, const std::vector<int>& axes, bool keep) {
    return cpu::reduce_max(x, axes, keep);
  }
  template <class T>
  static array<T> reduce_sum_grad(const array<T>& dy, const extents& x_shape, const std::vector<int>& axes,
                                  bool keep) {
    return cpu::reduce_sum_grad(dy, detail::shape_vector(x_shape), axes, keep);
  }
  template <class T>
  static array<T> reduce_max_tie_counts(const array<T>& x, const array<T>& y, const std::vector<int>& axes,
                                        bool keep) {
    return cpu::reduce_max_tie_counts(x, y, axes, keep);
  }
  template <class T>
  static array<T> reduce_max_spread(const array<T>& dy, const array<T>& x, const array<T>& y,
                                    const array<T>& ties, const std::vector<int>& axes, bool keep) {
    return cpu::reduce_max_spread(dy, x, y, ties, axes, keep);
  }

  // ---- cross entropy pieces ----
  template <class T> static array<T> ce_row_max(const array<T>& x) { return cpu::ce_row_max(x); }
  template <class T>
  static array<T> ce_row_terms(const array<T>& x, const array<T>& t, const array<T>& m) {
    return cpu::ce_row_terms(x, t, m);
  }
  template <class T> static array<T> ce_loss(const array<T>& s) { return cpu::ce_loss(s); }
  template <class T>
  static array<T> ce_grad(const array<T>& dloss, const array<T>& x, const array<T>& t, const array<T>& m,
                          const array<T>& s) {
    return cpu::ce_grad(dloss, x, t, m, s);
  }

  // ---- softmax along an axis, sparse cross entropy, argmax, one-hot (kernels/cpu/sharded.hpp) ----
  template <class T>
  static array<T> softmax_axis_max(const array<T>& x, int axis) {
    return cpu::softmax_axis_max(x, axis);
  }
  template <class T>
  static array<T> softmax_axis_sum(const array<T>& x, int axis, const array<T>& max) {
    return cpu::softmax_axis_sum(x, axis, max);
  }
  template <class T>
  static array<T> softmax_axis_out(const array<T>& x, int axis, const array<T>& max, const array<T>& sum, bool log) {
    return cpu::softmax_axis_out(x, axis, max, sum, log);
  }
  template <class T>
  static array<T> softmax_axis_grad_sum(const array<T>& dy, const array<T>& y, int axis, bool log) {
    return cpu::softmax_axis_grad_sum(dy, y, axis, log);
  }
  template <class T>
  static array<T> softmax_axis_grad(const array<T>& dy, const array<T>& y, int axis, const array<T>& acc, bool log) {
    return cpu::softmax_axis_grad(dy, y, axis, acc, log);
  }
  template <class L>
  static array<std::int64_t> sparse_ce_columns(const array<L>& labels, index_t classes, index_t first_row,
                                               index_t first_col, std::size_t cols) {
    return cpu::sparse_ce_columns(labels, classes, first_row, first_col, cols);
  }
  template <class T>
  static array<T> sparse_ce_terms(const array<T>& x, const array<std::int64_t>& column, const array<T>& max) {
    return cpu::sparse_ce_terms(x, column, max);
  }
  template <class T>
  static array<T> sparse_ce_loss(const array<T>& max, const array<T>& terms) {
    return cpu::sparse_ce_loss(max, terms);
  }
  template <class T>
  static array<T> sparse_ce_grad(const array<T>& dloss, const array<T>& x, const array<std::int64_t>& column,
                                 const array<T>& max, const array<T>& terms) {
    return cpu::sparse_ce_grad(dloss, x, column, max, terms);
  }
  template <class T>
  static std::pair<array<T>, array<std::int64_t>> argmax_local(const array<T>& x, int axis, std::int64_t first) {
    return cpu::argmax_local(x, axis, first);
  }
  template <class T>
  static void argmax_resolve(array<std::int64_t>& index, const array<T>& best, const array<T>& top) {
    cpu::argmax_resolve(index, best, top);
  }
  template <class T, class I>
  static array<T> one_hot(const array<I>& indices, index_t depth, index_t first, index_t local_depth, T on, T off) {
    return cpu::one_hot_piece<T>(indices, depth, first, local_depth, on, off);
  }
  template <class To, class From>
  static array<To> convert(const array<From>& x) {
    return cpu::convert<To>(x);
  }

  // ---- optimizer updates ----
  /// MindSpore's Momentum, kernels/cpu/optim.hpp's momentum_update: d = grad +
  /// weight_decay * param; accum = momentum * accum + d; param -= lr * (nesterov ?
  /// d + momentum * accum : accum).
  template <class T>
  static void momentum_update(array<T>& param, array<T>& accum, const array<T>& grad, T lr, T momentum,
                              T weight_decay = T(0), bool nesterov = false) {
    cpu::momentum_update(std::span<T>(param.data(), param.size()), std::span<const T>(grad.data(), grad.size()),
                         std::span<T>(accum.data(), accum.size()), lr, momentum, weight_decay, nesterov);
  }
  /// p -= lr * (g + weight_decay * p) (kernels/cpu/optim.hpp's sgd_update).
  template <class T>
  static void sgd_update(array<T>& param, const array<T>& grad, T lr, T weight_decay) {
    cpu::sgd_update(std::span<T>(param.data(), param.size()), std::span<const T>(grad.data(), grad.size()), lr,
                    weight_decay);
  }
  /// SGD with momentum, dampening, weight decay and Nesterov (kernels/cpu/optim.hpp).
  template <class T>
  static void sgd_momentum_update(array<T>& param, const array<T>& grad, array<T>& buf, T lr, T momentum,
                                  T dampening, T weight_decay, bool nesterov, bool first_step) {
    cpu::sgd_momentum_update(std::span<T>(param.data(), param.size()), std::span<const T>(grad.data(), grad.size()),
                             std::span<T>(buf.data(), buf.size()), lr, momentum, dampening, weight_decay, nesterov,
                             first_step);
  }
  /// Adam, or AdamW with `decoupled`, at step t >= 1 (kernels/cpu/optim.hpp's adam_update).
  template <class T>
  static void adam_update(array<T>& param, const array<T>& grad, array<T>& m, array<T>& v, T lr, T beta1, T beta2,
                          T eps, T weight_decay, bool decoupled, std::int64_t t) {
    cpu::adam_update(std::span<T>(param.data(), param.size()), std::span<const T>(grad.data(), grad.size()),
                     std::span<T>(m.data(), m.size()), std::span<T>(v.data(), v.size()), lr, beta1, beta2, eps,
                     weight_decay, decoupled, t);
  }

  // Over many parameters (the device backends' batched updates; here one call each).
  template <class T>
  static void momentum_update_many(std::span<array<T>* const> params, std::span<array<T>* const> accums,
                                   std::span<const array<T>* const> grads, T lr, T momentum, T weight_decay,
                                   bool nesterov) {
    check_update_lists("momentum_update", params.size(), {{"accumulator", accums.size()}, {"gradient", grads.size()}});
    for (std::size_t j = 0; j < params.size(); ++j)
      momentum_update(*params[j], *accums[j], *grads[j], lr, momentum, weight_decay, nesterov);
  }
  template <class T>
  static void sgd_update_many(std::span<array<T>* const> params, std::span<const array<T>* const> grads, T lr,
                              T weight_decay) {
    check_update_lists("sgd_update", params.size(), {{"gradient", grads.size()}});
    for (std::size_t j = 0; j < params.size(); ++j) sgd_update(*params[j], *grads[j], lr, weight_decay);
  }
  template <class T>
  static void sgd_momentum_update_many(std::span<array<T>* const> params, std::span<const array<T>* const> grads,
                                       std::span<array<T>* const> bufs, T lr, T momentum, T dampening,
                                       T weight_decay, bool nesterov, bool first_step) {
    check_update_lists("sgd_momentum_update", params.size(),
                       {{"gradient", grads.size()}, {"momentum buffer", bufs.size()}});
    for (std::size_t j = 0; j < params.size(); ++j)
      sgd_momentum_update(*params[j], *grads[j], *bufs[j], lr, momentum, dampening, weight_decay, nesterov,
                          first_step);
  }
  template <class T>
  static void adam_update_many(std::span<array<T>* const> params, std::span<const array<T>* const> grads,
                               std::span<array<T>* const> ms, std::span<array<T>* const> vs, T lr, T beta1, T beta2,
                               T eps, T weight_decay, bool decoupled, std::int64_t t) {
    check_update_lists("adam_update", params.size(),
                       {{"gradient", grads.size()}, {"first moment", ms.size()}, {"second moment", vs.size()}});
    for (std::size_t j = 0; j < params.size(); ++j)
      adam_update(*params[j], *grads[j], *ms[j], *vs[j], lr, beta1, beta2, eps, weight_decay, decoupled, t);
  }

  // ---- convolutional networks (float; kernels/cpu/cnn_table.hpp: oneDNN's) ----
  /// What a backward needs from its forward besides the arrays (max pooling's maxima, a
  /// fused batch norm's ReLU mask).
  using workspace = cpu::dnnl_workspace;

  template <class T>
    requires std::same_as<T, float>
  static array<T> conv2d_forward(const array<T>& x, const array<T>& w, const array<T>* bias,
                                 const conv2d_params& p, bool relu = false) {
    return cpu::cnn("conv2d_forward").conv2d_forward(x, w, bias, p, relu);
  }
  template <class T>
    requires std::same_as<T, float>
  static conv2d_grads<array<T>> conv2d_backward(const array<T>& dy, const array<T>& x, const array<T>& w,
                                                bool need_dx, bool bias, const conv2d_params& p) {
    return cpu::cnn("conv2d_backward").conv2d_backward(dy, x, w, need_dx, bias, p);
  }
  /// The same without bias, the weights given as their tensor, which keeps them in the
  /// layout the forward reads them in (a cpu::dnnl_form: made from the plain shard at the
  /// first call and kept beside it; updated in place by the optimizers) unless
  /// cpu::set_dnnl_conv_weights_kept(false).
  template <class T>
    requires std::same_as<T, float>
  static array<T> conv2d_forward(const array<T>& x, const tensor_on<T>& w, const conv2d_params& p) {
    return cpu::cnn("conv2d_forward").conv2d_forward_tensor(x, w, p);
  }
  /// Its backward: dx (empty unless `need_dx`), and dw as a tensor of layout `grad_w`,
  /// held in the layout the primitive wrote it in (a cpu::dnnl_form) where the weights
  /// are kept in one, else plain.
  template <class T>
    requires std::same_as<T, float>
  static std::pair<array<T>, tensor_on<T>> conv2d_backward(const array<T>& dy, const array<T>& x,
                                                           const tensor_on<T>& w, bool need_dx,
                                                           const conv2d_params& p, const layout& grad_w) {
    return cpu::cnn("conv2d_backward").conv2d_backward_tensor(dy, x, w, need_dx, p, grad_w);
  }

  template <class T>
    requires std::same_as<T, float>
  static batch_norm_training<array<T>, array<T>, workspace> batch_norm_forward_training(
      const array<T>& x, const array<T>& gamma, const array<T>& beta, T eps, bool relu = false) {
    return cpu::cnn("batch_norm_forward_training").batch_norm_forward_training(x, gamma, beta, eps, relu);
  }
  template <class T>
    requires std::same_as<T, float>
  static array<T> batch_norm_forward_inference(const array<T>& x, const array<T>& gamma, const array<T>& beta,
                                               const array<T>& mean, const array<T>& variance, T eps,
                                               bool relu = false) {
    return cpu::cnn("batch_norm_forward_inference")
        .batch_norm_forward_inference(x, gamma, beta, mean, variance, eps, relu);
  }
  template <class T>
    requires std::same_as<T, float>
  static batch_norm_grads<array<T>, array<T>> batch_norm_backward(const array<T>& dy, const array<T>& x,
                                                                  const array<T>& gamma, const array<T>& mean,
                                                                  const array<T>& variance, const workspace& ws,
                                                                  T eps, bool relu = false) {
    return cpu::cnn("batch_norm_backward").batch_norm_backward(dy, x, gamma, mean, variance, ws, eps, relu);
  }
  template <class T>
    requires std::same_as<T, float>
  static channel_sums<array<T>> batch_norm_sums(const array<T>& x) {
    return cpu::cnn("batch_norm_sums").batch_norm_sums(x);
  }
  template <class T>
    requires std::same_as<T, float>
  static batch_norm_stats<array<T>> batch_norm_moments(const channel_sums<array<T>>& sums, std::size_t count) {
    return cpu::cnn("batch_norm_moments").batch_norm_moments(sums, count);
  }
  template <class T>
    requires std::same_as<T, float>
  static channel_sums<array<T>> batch_norm_backward_sums(const array<T>& dy, const array<T>& x, const array<T>& mean,
                                                         const array<T>& variance, T eps,
                                                         const array<T>* relu_y = nullptr) {
    return cpu::cnn("batch_norm_backward_sums").batch_norm_backward_sums(dy, x, mean, variance, eps, relu_y);
  }
  template <class T>
    requires std::same_as<T, float>
  static array<T> batch_norm_backward_data(const array<T>& dy, const array<T>& x, const array<T>& gamma,
                                           const array<T>& mean, const array<T>& variance,
                                           const channel_sums<array<T>>& sums, std::size_t count, T eps,
                                           const array<T>* relu_y = nullptr) {
    return cpu::cnn("batch_norm_backward_data")
        .batch_norm_backward_data(dy, x, gamma, mean, variance, sums, count, eps, relu_y);
  }
  template <class T>
    requires std::same_as<T, float>
  static void batch_norm_update_running(array<T>& running_mean, array<T>& running_var, const array<T>& mean,
                                        const array<T>& variance, std::size_t count, T momentum,
                                        bool unbiased = true) {
    cpu::cnn("batch_norm_update_running")
        .batch_norm_update_running(running_mean, running_var, mean, variance, count, momentum, unbiased);
  }

  template <class T>
    requires std::same_as<T, float>
  static max_pool2d_result<array<T>, workspace> max_pool2d_forward(const array<T>& x, const pool2d_params& p) {
    return cpu::cnn("max_pool2d_forward").max_pool2d_forward(x, p);
  }
  template <class T>
    requires std::same_as<T, float>
  static array<T> max_pool2d_backward(const array<T>& dy, const array<T>& x, const array<T>& y, const workspace& ws,
                                      const pool2d_params& p) {
    return cpu::cnn("max_pool2d_backward").max_pool2d_backward(dy, x, y, ws, p);
  }
  template <class T>
    requires std::same_as<T, float>
  static array<T> avg_pool2d_forward(const array<T>& x, const pool2d_params& p) {
    return cpu::cnn("avg_pool2d_forward").avg_pool2d_forward(x, p);
  }
  template <class T>
    requires std::same_as<T, float>
  static array<T> avg_pool2d_backward(const array<T>& dy, const std::vector<std::size_t>& x_shape,
                                      const pool2d_params& p) {
    return cpu::cnn("avg_pool2d_backward").avg_pool2d_backward(dy, x_shape, p);
  }
  template <class T>
    requires std::same_as<T, float>
  static array<T> global_avg_pool2d_forward(const array<T>& x) {
    return cpu::cnn("global_avg_pool2d_forward").global_avg_pool2d_forward(x);
  }
  template <class T>
    requires std::same_as<T, float>
  static array<T> global_avg_pool2d_backward(const array<T>& dy, const std::vector<std::size_t>& x_shape) {
    return cpu::cnn("global_avg_pool2d_backward").global_avg_pool2d_backward(dy, x_shape);
  }
};

}  // namespace tessera::kernels

