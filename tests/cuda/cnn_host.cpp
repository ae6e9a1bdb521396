// cnn_host.hpp's functions: the host's oneDNN kernels, compiled by the host compiler.
#include "cnn_host.hpp"

#include <tessera/kernels/cpu/batch_norm.hpp>
#include <tessera/kernels/cpu/conv.hpp>
#include <tessera/kernels/cpu/pool.hpp>

namespace kh = tessera::kernels::cpu;

namespace cnn_host {

harray conv_forward(const harray& x, const harray& w, const harray* bias, const conv2d_params& p, bool relu) {
  return kh::conv2d_forward(x, w, bias, p, relu);
}
harray conv_backward_data(const harray& dy, const harray& w, const shape_t& x_shape, const conv2d_params& p) {
  return kh::conv2d_backward_data(dy, w, x_shape, p);
}
std::vector<harray> conv_backward_weights(const harray& dy, const harray& x, const shape_t& w_shape, bool bias,
                                          const conv2d_params& p) {
  auto g = kh::conv2d_backward_weights(dy, x, w_shape, bias, p);
  return {g.dw, g.db};
}
std::vector<harray> bn_forward_training(const harray& x, const harray& gamma, const harray& beta, float eps,
                                        bool relu) {
  auto f = kh::batch_norm_forward_training(x, gamma, beta, eps, relu);
  return {f.y, f.mean, f.variance};
}
harray bn_forward_inference(const harray& x, const harray& gamma, const harray& beta, const harray& mean,
                            const harray& variance, float eps, bool relu) {
  return kh::batch_norm_forward_inference(x, gamma, beta, mean, variance, eps, relu);
}
std::vector<harray> bn_backward(const harray& dy, const harray& x, const harray& gamma, const harray& beta, float eps,
                                bool relu) {
  auto f = kh::batch_norm_forward_training(x, gamma, beta, eps, relu);
  auto g = kh::batch_norm_backward(dy, x, gamma, f.mean, f.variance, f.workspace, eps, relu);
  return {g.dx, g.dgamma, g.dbeta};
}
harray max_pool_forward(const harray& x, const pool2d_params& p) { return kh::max_pool2d_forward(x, p).y; }
harray max_pool_backward(const harray& dy, const harray& x, const pool2d_params& p) {
  auto f = kh::max_pool2d_forward(x, p);
  return kh::max_pool2d_backward(dy, x, f.y, f.workspace, p);
}
harray avg_pool_forward(const harray& x, const pool2d_params& p) { return kh::avg_pool2d_forward(x, p); }
harray avg_pool_backward(const harray& dy, const shape_t& x_shape, const pool2d_params& p) {
  return kh::avg_pool2d_backward(dy, x_shape, p);
}
harray global_avg_pool_forward(const harray& x) { return kh::global_avg_pool2d_forward(x); }
harray global_avg_pool_backward(const harray& dy, const shape_t& x_shape) {
  return kh::global_avg_pool2d_backward(dy, x_shape);
}

namespace {
template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const tessera::error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

std::string conv_forward_error(const harray& x, const harray& w, const conv2d_params& p) {
  return thrown([&] { (void)kh::conv2d_forward(x, w, nullptr, p); });
}
std::string max_pool_forward_error(const harray& x, const pool2d_params& p) {
  return thrown([&] { (void)kh::max_pool2d_forward(x, p); });
}

}  // namespace cnn_host
