// The host's convolutional-network kernels (convolution, batch norm, pooling) as a
// table of functions, which kernels/cpu/cnn_kernels.hpp fills with oneDNN's kernels
// when a translation unit of the host compiler includes it (backend<cpu_device> does
// wherever tessera::dnnl is linked). backend<cpu_device> calls through the table.
//
// Why a table: nvcc's front end cannot parse oneDNN 2.6's dnnl.hpp in C++20 (an
// internal error), so a program's CUDA files see no oneDNN. Were the kernels inline
// functions, a host operator instantiated in both a CUDA and a host file would have two
// definitions, with and without the kernels, and the linker would keep either one. Through
// the table, every file compiles the same operator, and the kernels are found at run time
// wherever one host file of the program brought them in.
#pragma once

#include <memory>
#include <string>
#include <tessera/core/error.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/tensor/dist_tensor.hpp>
#include <utility>
#include <vector>
#include <xtensor/xarray.hpp>

namespace dnnl {
struct memory;
}

namespace tessera::kernels::cpu {

/// What a kernel's backward needs from its forward besides the arrays (the positions of
/// the maxima of a max pooling, the ReLU mask of a fused batch norm): opaque, empty
/// where the forward keeps nothing. Copies share the buffer.
struct dnnl_workspace {
  std::shared_ptr<dnnl::memory> memory;
  bool empty() const { return !memory; }
};

/// The kernels, on float NCHW shards (each as kernels/cpu/conv.hpp, batch_norm.hpp and
/// pool.hpp define it; the convolutions given the weights' tensor keep them in oneDNN's
/// layout, as backend<cpu_device> documents).
struct cnn_kernels {
  using array = xt::xarray<float>;
  using tensor = tensor_on<float>;
  using workspace = dnnl_workspace;

  array (*conv2d_forward)(const array& x, const array& w, const array* bias, const conv2d_params& p, bool relu);
  conv2d_grads<array> (*conv2d_backward)(const array& dy, const array& x, const array& w, bool need_dx, bool bias,
                                         const conv2d_params& p);
  array (*conv2d_forward_tensor)(const array& x, const tensor& w, const conv2d_params& p);
  std::pair<array, tensor> (*conv2d_backward_tensor)(const array& dy, const array& x, const tensor& w, bool need_dx,
                                                     const conv2d_params& p, const layout& grad_w);
  batch_norm_training<array, array, workspace> (*batch_norm_forward_training)(const array& x, const array& gamma,
                                                                              const array& beta, float eps, bool relu);
  array (*batch_norm_forward_inference)(const array& x, const array& gamma, const array& beta, const array& mean,
                                        const array& variance, float eps, bool relu);
  batch_norm_grads<array, array> (*batch_norm_backward)(const array& dy, const array& x, const array& gamma,
                                                        const array& mean, const array& variance, const workspace& ws,
                                                        float eps, bool relu);
  channel_sums<array> (*batch_norm_sums)(const array& x);
  batch_norm_stats<array> (*batch_norm_moments)(const channel_sums<array>& sums, std::size_t count);
  channel_sums<array> (*batch_norm_backward_sums)(const array& dy, const array& x, const array& mean,
                                                  const array& variance, float eps, const array* relu_y);
  array (*batch_norm_backward_data)(const array& dy, const array& x, const array& gamma, const array& mean,
                                    const array& variance, const channel_sums<array>& sums, std::size_t count,
                                    float eps, const array* relu_y);
  void (*batch_norm_update_running)(array& running_mean, array& running_var, const array& mean, const array& variance,
                                    std::size_t count, float momentum, bool unbiased);
  max_pool2d_result<array, workspace> (*max_pool2d_forward)(const array& x, const pool2d_params& p);
  array (*max_pool2d_backward)(const array& dy, const array& x, const array& y, const workspace& ws,
                               const pool2d_params& p);
  array (*avg_pool2d_forward)(const array& x, const pool2d_params& p);
  array (*avg_pool2d_backward)(const array& dy, const std::vector<std::size_t>& x_shape, const pool2d_params& p);
  array (*global_avg_pool2d_forward)(const array& x);
  array (*global_avg_pool2d_backward)(const array& dy, const std::vector<std::size_t>& x_shape);
};

/// The program's table: null until a host translation unit with oneDNN registers its
/// kernels (at static initialisation).
inline const cnn_kernels*& cnn_kernel_table() {
  static const cnn_kernels* table = nullptr;
  return table;
}

/// The table, for kernel `fn`; throws when no file of the program brought oneDNN in.
inline const cnn_kernels& cnn(const char* fn) {
  if (const cnn_kernels* t = cnn_kernel_table()) return *t;
  throw error(std::string(fn) +
              ": the host's convolution kernels are missing: link tessera::dnnl (oneDNN) and include tessera from "
              "at least one file the host compiler builds (nvcc cannot parse oneDNN's headers)");
}

}  // namespace tessera::kernels::cpu
