// oneDNN's convolution, batch-norm and pooling kernels entered in the program's table
// (kernels/cpu/cnn_table.hpp) when this header is first included by a translation unit
// of the host compiler; backend<cpu_device> includes it wherever tessera::dnnl is
// linked. Also where the convolutions keep their weights in oneDNN's layout, on the
// weights' tensor (a dnnl_form made from the plain shard at the first call and kept
// beside it, updated in place by the optimizers) unless set_dnnl_conv_weights_kept(false).
#pragma once

#include <memory>
#include <optional>
#include <tessera/kernels/cpu/batch_norm.hpp>
#include <tessera/kernels/cpu/cnn_table.hpp>
#include <tessera/kernels/cpu/conv.hpp>
#include <tessera/kernels/cpu/pool.hpp>
#include <utility>
#include <vector>

namespace tessera::kernels::cpu {

namespace detail {

/// The weights' kept form, or null (none, another kind, or keeping turned off).
inline const dnnl_form* kept_weights(const tensor_on<float>& w) {
  const host_form<float>* f = w.form();
  if (!f || f->kind() != dnnl_form::tag || !dnnl_conv_weights_kept()) return nullptr;
  return static_cast<const dnnl_form*>(f);
}

/// The forward without bias given the weights' tensor: on their kept form, or on a form
/// made now and kept on the tensor (none while a measured layout is still undecided).
inline xt::xarray<float> conv2d_forward_tensor(const xt::xarray<float>& x, const tensor_on<float>& w,
                                               const conv2d_params& p) {
  if (const dnnl_form* f = kept_weights(w)) return cpu::conv2d_forward(x, *f, nullptr, p);
  if (dnnl_conv_weights_kept() && w.plain_current())
    if (std::optional<dnnl_form> f = cpu::conv2d_forward_weights<xt::xarray<float>>(shape_of(x), w.local(), false, p)) {
      w.keep_form(std::make_unique<dnnl_form>(*f));
      return cpu::conv2d_forward(x, *f, nullptr, p);
    }
  return cpu::conv2d_forward(x, w.local(), nullptr, p);
}

/// Its backward: dx (empty unless `need_dx`), and dw as a tensor of layout `grad_w`, held
/// in the layout the primitive wrote it in (a dnnl_form) where the weights are kept in
/// one, else plain.
inline std::pair<xt::xarray<float>, tensor_on<float>> conv2d_backward_tensor(const xt::xarray<float>& dy,
                                                                             const xt::xarray<float>& x,
                                                                             const tensor_on<float>& w, bool need_dx,
                                                                             const conv2d_params& p,
                                                                             const tessera::layout& grad_w) {
  if (const dnnl_form* f = kept_weights(w)) {
    auto k = cpu::conv2d_backward(dy, x, *f, need_dx, false, p);
    return {std::move(k.dx),
            tensor_on<float>(grad_w, w.global_shape(), w.rank(), std::make_unique<dnnl_form>(std::move(k.dw)))};
  }
  auto k = cpu::conv2d_backward(dy, x, w.local(), need_dx, false, p);
  return {std::move(k.dx), tensor_on<float>(grad_w, w.global_shape(), w.rank(), std::move(k.dw))};
}

using cnn_array = xt::xarray<float>;

/// The table of oneDNN's kernels.
inline constexpr cnn_kernels onednn_cnn_kernels{
    [](const cnn_array& x, const cnn_array& w, const cnn_array* bias, const conv2d_params& p, bool relu) {
      return cpu::conv2d_forward(x, w, bias, p, relu);
    },
    [](const cnn_array& dy, const cnn_array& x, const cnn_array& w, bool need_dx, bool bias, const conv2d_params& p) {
      return cpu::conv2d_backward(dy, x, w, need_dx, bias, p);
    },
    conv2d_forward_tensor,
    conv2d_backward_tensor,
    [](const cnn_array& x, const cnn_array& gamma, const cnn_array& beta, float eps, bool relu) {
      return cpu::batch_norm_forward_training(x, gamma, beta, eps, relu);
    },
    [](const cnn_array& x, const cnn_array& gamma, const cnn_array& beta, const cnn_array& mean,
       const cnn_array& variance, float eps,
       bool relu) { return cpu::batch_norm_forward_inference(x, gamma, beta, mean, variance, eps, relu); },
    [](const cnn_array& dy, const cnn_array& x, const cnn_array& gamma, const cnn_array& mean,
       const cnn_array& variance, const dnnl_workspace& ws, float eps,
       bool relu) { return cpu::batch_norm_backward(dy, x, gamma, mean, variance, ws, eps, relu); },
    [](const cnn_array& x) { return cpu::batch_norm_sums(x); },
    [](const channel_sums<cnn_array>& sums, std::size_t count) { return cpu::batch_norm_moments(sums, count); },
    [](const cnn_array& dy, const cnn_array& x, const cnn_array& mean, const cnn_array& variance, float eps,
       const cnn_array* relu_y) { return cpu::batch_norm_backward_sums(dy, x, mean, variance, eps, relu_y); },
    [](const cnn_array& dy, const cnn_array& x, const cnn_array& gamma, const cnn_array& mean,
       const cnn_array& variance, const channel_sums<cnn_array>& sums, std::size_t count, float eps,
       const cnn_array* relu_y) {
      return cpu::batch_norm_backward_data(dy, x, gamma, mean, variance, sums, count, eps, relu_y);
    },
    [](cnn_array& running_mean, cnn_array& running_var, const cnn_array& mean, const cnn_array& variance,
       std::size_t count, float momentum, bool unbiased) {
      cpu::batch_norm_update_running(running_mean, running_var, mean, variance, count, momentum, unbiased);
    },
    [](const cnn_array& x, const pool2d_params& p) { return cpu::max_pool2d_forward(x, p); },
    [](const cnn_array& dy, const cnn_array& x, const cnn_array& y, const dnnl_workspace& ws, const pool2d_params& p) {
      return cpu::max_pool2d_backward(dy, x, y, ws, p);
    },
    [](const cnn_array& x, const pool2d_params& p) { return cpu::avg_pool2d_forward(x, p); },
    [](const cnn_array& dy, const std::vector<std::size_t>& x_shape, const pool2d_params& p) {
      return cpu::avg_pool2d_backward(dy, x_shape, p);
    },
    [](const cnn_array& x) { return cpu::global_avg_pool2d_forward(x); },
    [](const cnn_array& dy, const std::vector<std::size_t>& x_shape) {
      return cpu::global_avg_pool2d_backward(dy, x_shape);
    },
};

/// Enters the kernels at static initialisation (once, whichever file does it first).
inline const bool onednn_cnn_kernels_entered = (cnn_kernel_table() = &onednn_cnn_kernels, true);

}  // namespace detail

}  // namespace tessera::kernels::cpu
