// backend<cpu_device> holds the convolutional network kernels under the names every
// device shares (kernels/backend.hpp): one step of conv, batch norm + ReLU, max pool and
// global average pool through them equals the kernels of kernels/cpu/ called directly.
#include <doctest/doctest.h>

#include <tessera/kernels/cpu/backend.hpp>

#include "finite_difference.hpp"

namespace cpu = tessera::kernels::cpu;
using be = tessera::kernels::backend<tessera::cpu_device>;
using tessera::kernels::conv2d_params;
using tessera::kernels::pad2d;
using tessera::kernels::pool2d_params;
using farray = xt::xarray<float>;
using namespace kernel_test;

TEST_CASE("backend<cpu_device> runs a conv, batch norm, pooling step as kernels/cpu/ does") {
  const farray x = random_array<float>({2, 3, 8, 8}, 1), w = random_array<float>({8, 3, 3, 3}, 2);
  const farray gamma = random_array<float>({8}, 3, 0.5, 1.5), beta = random_array<float>({8}, 4);
  const conv2d_params cp{1, 1, pad2d::uniform(1)};
  const farray c = be::conv2d_forward(x, w, static_cast<const farray*>(nullptr), cp);
  CHECK(c == cpu::conv2d_forward(x, w, nullptr, cp));
  const auto bn = be::batch_norm_forward_training(c, gamma, beta, 1e-5f, true);
  const auto pooled = be::max_pool2d_forward(bn.y, pool2d_params::square(3, 2, 1));
  const farray g = be::global_avg_pool2d_forward(pooled.y);
  CHECK(g.shape()[2] == 1);

  const farray dg = random_array<float>({2, 8, 1, 1}, 5);
  const farray dpooled = be::global_avg_pool2d_backward(dg, {2, 8, 4, 4});
  const farray dbn = be::max_pool2d_backward(dpooled, bn.y, pooled.y, pooled.workspace, pool2d_params::square(3, 2, 1));
  const auto bg = be::batch_norm_backward(dbn, c, gamma, bn.mean, bn.variance, bn.workspace, 1e-5f, true);
  const auto both = be::conv2d_backward(bg.dx, x, w, true, false, cp);
  CHECK(both.dx == cpu::conv2d_backward_data(bg.dx, w, {2, 3, 8, 8}, cp));
  CHECK(both.dw == cpu::conv2d_backward_weights(bg.dx, x, {8, 3, 3, 3}, false, cp).dw);
  const auto no_dx = be::conv2d_backward(bg.dx, x, w, false, false, cp);
  CHECK(no_dx.dx.size() == 0);
  CHECK(no_dx.dw == both.dw);

  // The split batch norm through the backend equals the whole-batch one on one rank.
  const auto m = be::batch_norm_moments(be::batch_norm_sums(c), 2 * 8 * 8);
  const farray y = be::batch_norm_forward_inference(c, gamma, beta, m.mean, m.variance, 1e-5f, true);
  CHECK(relative_error(y, bn.y) < 1e-5);
  const auto r = be::batch_norm_backward_sums(dbn, c, m.mean, m.variance, 1e-5f, &y);
  CHECK(relative_error(be::batch_norm_backward_data(dbn, c, gamma, m.mean, m.variance, r, 2 * 8 * 8, 1e-5f, &y),
                       bg.dx) < 1e-4);
}
