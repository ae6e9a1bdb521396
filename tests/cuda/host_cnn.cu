// The host's convolution, batch-norm and pooling kernels called from a file nvcc
// compiles, which cannot include oneDNN: backend<cpu_device> finds them in the program's
// table (kernels/cpu/cnn_table.hpp), which host_cnn_entry.cpp's oneDNN entered. Runs
// without a GPU: nothing here touches the device.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/kernels/cpu/backend.hpp>

namespace {

using namespace tessera;
using K = kernels::backend<cpu_device>;
using kernels::conv2d_params;
using kernels::pad2d;

xt::xarray<float> ramp(const std::vector<std::size_t>& shape, float scale) {
  xt::xarray<float> a = xt::xarray<float>::from_shape(shape);
  for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = scale * float(int(i * 7 % 13) - 6);
  return a;
}

}  // namespace

TEST_CASE("host convolutions, batch norms and poolings run from a CUDA file through the table a host file filled") {
  REQUIRE(kernels::cpu::cnn_kernel_table() != nullptr);
  // A 3x3 convolution with padding 1 and stride 2 against the direct sum.
  const std::size_t n = 2, c = 3, h = 7, w = 6, o = 4;
  const xt::xarray<float> x = ramp({n, c, h, w}, 0.25f), k = ramp({o, c, 3, 3}, 0.125f);
  conv2d_params p;
  p.stride_h = p.stride_w = 2;
  p.pad = pad2d::uniform(1);
  const xt::xarray<float> y = K::conv2d_forward<float>(x, k, nullptr, p);
  const std::size_t oh = (h + 2 - 3) / 2 + 1, ow = (w + 2 - 3) / 2 + 1;
  REQUIRE(y.shape()[2] == oh);
  REQUIRE(y.shape()[3] == ow);
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t q = 0; q < o; ++q)
      for (std::size_t i = 0; i < oh; ++i)
        for (std::size_t j = 0; j < ow; ++j) {
          double s = 0;
          for (std::size_t ci = 0; ci < c; ++ci)
            for (std::size_t di = 0; di < 3; ++di)
              for (std::size_t dj = 0; dj < 3; ++dj) {
                const long r = long(2 * i + di) - 1, col = long(2 * j + dj) - 1;
                if (r < 0 || col < 0 || r >= long(h) || col >= long(w)) continue;
                s += double(x(b, ci, std::size_t(r), std::size_t(col))) * double(k(q, ci, di, dj));
              }
          CHECK(std::abs(double(y(b, q, i, j)) - s) <= 1e-5 * (1 + std::abs(s)));
        }
  // Batch norm in training: each channel of the output has mean 0 and variance 1.
  const xt::xarray<float> gamma = xt::ones<float>({c}), beta = xt::zeros<float>({c});
  const auto bn = K::batch_norm_forward_training<float>(x, gamma, beta, 1e-5f);
  for (std::size_t ci = 0; ci < c; ++ci) {
    double m = 0, v = 0;
    for (std::size_t b = 0; b < n; ++b)
      for (std::size_t i = 0; i < h * w; ++i) m += double(bn.y(b, ci, i / w, i % w));
    m /= double(n * h * w);
    for (std::size_t b = 0; b < n; ++b)
      for (std::size_t i = 0; i < h * w; ++i) v += std::pow(double(bn.y(b, ci, i / w, i % w)) - m, 2);
    CHECK(std::abs(m) < 1e-5);
    CHECK(std::abs(v / double(n * h * w) - 1) < 1e-3);
  }
  // Global average pooling: each (sample, channel) plane's mean.
  const xt::xarray<float> g = K::global_avg_pool2d_forward<float>(x);
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t ci = 0; ci < c; ++ci) {
      double s = 0;
      for (std::size_t i = 0; i < h * w; ++i) s += double(x(b, ci, i / w, i % w));
      CHECK(std::abs(double(g.data()[b * c + ci]) - s / double(h * w)) < 1e-6);
    }
}
