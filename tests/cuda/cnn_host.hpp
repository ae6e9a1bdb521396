// The host's convolutional network kernels (kernels/cpu/, oneDNN) behind plain
// functions, compiled by the host compiler in cnn_host.cpp: nvcc's front end cannot
// parse oneDNN's dnnl.hpp, so test_cnn_kernels.cu reaches them through this header.
#pragma once

#include <cstddef>
#include <string>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/kernels/conv_params.hpp>

namespace cnn_host {

using harray = xt::xarray<float>;
using shape_t = std::vector<std::size_t>;
using tessera::kernels::conv2d_params;
using tessera::kernels::pool2d_params;

harray conv_forward(const harray& x, const harray& w, const harray* bias, const conv2d_params& p, bool relu);
harray conv_backward_data(const harray& dy, const harray& w, const shape_t& x_shape, const conv2d_params& p);
/// {dw, db}
std::vector<harray> conv_backward_weights(const harray& dy, const harray& x, const shape_t& w_shape, bool bias,
                                          const conv2d_params& p);

/// {y, mean, variance}
std::vector<harray> bn_forward_training(const harray& x, const harray& gamma, const harray& beta, float eps,
                                        bool relu);
harray bn_forward_inference(const harray& x, const harray& gamma, const harray& beta, const harray& mean,
                            const harray& variance, float eps, bool relu);
/// {dx, dgamma, dbeta} of the training-mode batch norm of x (its forward rerun here).
std::vector<harray> bn_backward(const harray& dy, const harray& x, const harray& gamma, const harray& beta, float eps,
                                bool relu);

harray max_pool_forward(const harray& x, const pool2d_params& p);
harray max_pool_backward(const harray& dy, const harray& x, const pool2d_params& p);
harray avg_pool_forward(const harray& x, const pool2d_params& p);
harray avg_pool_backward(const harray& dy, const shape_t& x_shape, const pool2d_params& p);
harray global_avg_pool_forward(const harray& x);
harray global_avg_pool_backward(const harray& dy, const shape_t& x_shape);

/// The tessera::error text of the host's conv2d_forward(x, w) ("" if none).
std::string conv_forward_error(const harray& x, const harray& w, const conv2d_params& p);
std::string max_pool_forward_error(const harray& x, const pool2d_params& p);

}  // namespace cnn_host
