// The GPU's convolutional network kernels (kernels/cuda/conv.cuh, batch_norm.cuh,
// pool.cuh) against their host twins through oneDNN (kernels/cpu/, reached through
// cnn_host.hpp, compiled by the host compiler), on a grid of
// convolutions (strides above the kernel, uneven padding, dilation, groups), batch
// norms (training, inference, backward, fused ReLU, the split form over two halves of
// the batch) and poolings (padding, ceil_mode, counting the padding or not, global);
// backend<cuda_device> holds them; the error texts are the host's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>
#include <tessera/kernels/cuda/backend.cuh>
#include <tessera/kernels/cuda/batch_norm.cuh>
#include <tessera/kernels/cuda/conv.cuh>
#include <tessera/kernels/cuda/pool.cuh>

#include "cnn_host.hpp"

namespace cuda_test_cnn_kernels {  // the file's own scope in its test group's translation unit

namespace kc = tessera::kernels::cuda;
namespace kh = cnn_host;
using tessera::kernels::conv2d_params;
using tessera::kernels::pad2d;
using tessera::kernels::pool2d_params;
using darray = tessera::cuda::device_array<float>;
using harray = xt::xarray<float>;
using shape_t = std::vector<std::size_t>;

namespace {

harray host_array(const shape_t& shape, unsigned seed, float lo = -1.f, float hi = 1.f) {
  harray x = harray::from_shape(shape);
  std::mt19937 gen{seed};
  std::uniform_real_distribution<float> u(lo, hi);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = u(gen);
  return x;
}
darray dev(const harray& h) {
  return darray::from_host(h.data(), h.size(), shape_t(h.shape().begin(), h.shape().end()));
}
harray host(const darray& d) {
  harray h = harray::from_shape(d.shape());
  d.copy_to_host(h.data());
  return h;
}
// max |a - b| <= tol * max(max |b|, 1e-30), same shapes.
bool near(const harray& a, const harray& b, float tol = 1e-5f) {
  if (!std::ranges::equal(a.shape(), b.shape())) return false;
  float scale = 1e-30f, diff = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    scale = std::max(scale, std::abs(b.data()[i]));
    diff = std::max(diff, std::abs(a.data()[i] - b.data()[i]));
  }
  return diff <= tol * scale;
}
template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const tessera::error& e) {
    return e.what();
  }
  return "";
}

struct conv_case {
  shape_t x, w;
  conv2d_params p;
};

shape_t out_shape(const conv_case& c) {
  const auto s = tessera::kernels::conv2d_output_shape("test", c.x, c.w, c.p);
  return shape_t(s.begin(), s.end());
}

}  // namespace

TEST_CASE("conv2d on the GPU equals the host's") {
  const conv_case cases[] = {
      {{2, 3, 8, 8}, {4, 3, 3, 3}, {1, 1, pad2d::uniform(1)}},
      {{1, 4, 7, 9}, {6, 4, 3, 3}, {2, 2, pad2d::uniform(1)}},
      {{2, 5, 7, 7}, {3, 5, 1, 1}, {2, 2}},
      {{1, 3, 9, 8}, {2, 3, 2, 2}, {3, 3}},
      {{1, 2, 11, 10}, {3, 2, 5, 5}, {1, 2, {2, 1, 0, 2}}},  // uneven padding
      {{2, 3, 9, 9}, {4, 3, 3, 3}, {1, 1, pad2d::uniform(2), 2, 2}},
      {{2, 4, 6, 6}, {6, 2, 3, 3}, {1, 1, pad2d::uniform(1), 1, 1, 2}},
      {{1, 6, 7, 5}, {6, 1, 3, 3}, {2, 1, pad2d::symmetric(1, 0), 1, 1, 6}},
      {{4, 64, 32, 32}, {64, 64, 3, 3}, {1, 1, pad2d::uniform(1)}},
      {{4, 64, 32, 32}, {128, 64, 3, 3}, {2, 2, {0, 1, 0, 1}}},  // MindSpore's 'same', stride 2
  };
  unsigned seed = 1;
  for (const conv_case& c : cases) {
    CAPTURE(c.x[1]);
    CAPTURE(c.w[0]);
    CAPTURE(c.p.stride_h);
    const harray x = host_array(c.x, seed++), w = host_array(c.w, seed++), b = host_array({c.w[0]}, seed++);
    const harray dy = host_array(out_shape(c), seed++);
    const darray dx_ = dev(x), dw_ = dev(w), db_ = dev(b), ddy = dev(dy);
    CHECK(near(host(kc::conv2d_forward(dx_, dw_, &db_, c.p)), kh::conv_forward(x, w, &b, c.p, false)));
    CHECK(near(host(kc::conv2d_forward(dx_, dw_, &db_, c.p, true)), kh::conv_forward(x, w, &b, c.p, true)));
    CHECK(near(host(kc::conv2d_backward_data(ddy, dw_, c.x, c.p)), kh::conv_backward_data(dy, w, c.x, c.p)));
    const auto g = kc::conv2d_backward_weights(ddy, dx_, c.w, true, c.p);
    const auto hg = kh::conv_backward_weights(dy, x, c.w, true, c.p);
    CHECK(near(host(g.dw), hg[0], 1e-4f));
    CHECK(near(host(g.db), hg[1], 1e-4f));
    // Both at once: the same numbers; no dx unless asked.
    const auto both = kc::conv2d_backward(ddy, dx_, dw_, true, true, c.p);
    CHECK(near(host(both.dx), kh::conv_backward_data(dy, w, c.x, c.p)));
    CHECK(near(host(both.dw), hg[0], 1e-4f));
    CHECK(near(host(both.db), hg[1], 1e-4f));
    CHECK(kc::conv2d_backward(ddy, dx_, dw_, false, false, c.p).dx.size() == 0);
  }
}

TEST_CASE("batch norm on the GPU equals the host's, whole and split") {
  unsigned seed = 30;
  // The last two split each channel's samples over several blocks (10 parts of 2
  // samples; 3 uneven parts of 10), their halves over fewer. Batches are even: the
  // second half below is as large as the first.
  for (const shape_t& s : {shape_t{4, 3, 5, 5}, shape_t{8, 64, 16, 16}, shape_t{6, 5, 3, 7}, shape_t{20, 4, 64, 64},
                           shape_t{10, 2, 56, 56}})
    for (bool relu : {false, true}) {
      CAPTURE(s[1]);
      CAPTURE(relu);
      const harray x = host_array(s, seed++, -2.f, 3.f), dy = host_array(s, seed++);
      const harray gamma = host_array({s[1]}, seed++, 0.5f, 1.5f), beta = host_array({s[1]}, seed++);
      const darray gx = dev(x), gdy = dev(dy), gg = dev(gamma), gb = dev(beta);
      const auto hf = kh::bn_forward_training(x, gamma, beta, 1e-5f, relu);  // y, mean, variance
      const auto df = kc::batch_norm_forward_training(gx, gg, gb, 1e-5f, relu);
      CHECK(near(host(df.y), hf[0]));
      CHECK(near(host(df.mean), hf[1]));
      CHECK(near(host(df.variance), hf[2]));
      const auto hb = kh::bn_backward(dy, x, gamma, beta, 1e-5f, relu);  // dx, dgamma, dbeta
      const auto db = kc::batch_norm_backward(gdy, gx, gg, df.mean, df.variance, df.workspace, 1e-5f, relu);
      CHECK(near(host(db.dx), hb[0], 1e-4f));
      CHECK(near(host(db.dgamma), hb[1], 1e-4f));
      CHECK(near(host(db.dbeta), hb[2], 1e-4f));
      CHECK(near(host(kc::batch_norm_forward_inference(gx, gg, gb, df.mean, df.variance, 1e-5f, relu)),
                 kh::bn_forward_inference(x, gamma, beta, hf[1], hf[2], 1e-5f, relu)));

      // Two halves of the batch, their sums added as ranks would.
      const std::size_t half = s[0] / 2, per = x.size() / s[0], count = s[0] * s[2] * s[3];
      shape_t hs = s;
      hs[0] = half;
      harray x0 = harray::from_shape(hs), x1 = harray::from_shape(hs), dy0 = x0, dy1 = x0;
      std::copy(x.data(), x.data() + half * per, x0.data());
      std::copy(x.data() + half * per, x.data() + x.size(), x1.data());
      std::copy(dy.data(), dy.data() + half * per, dy0.data());
      std::copy(dy.data() + half * per, dy.data() + dy.size(), dy1.data());
      const darray g0 = dev(x0), g1 = dev(x1), gd0 = dev(dy0), gd1 = dev(dy1);
      auto s0 = kc::batch_norm_sums(g0), s1 = kc::batch_norm_sums(g1);
      const harray sum = host(s0.sum) + host(s1.sum), sum_sq = host(s0.sum_sq) + host(s1.sum_sq);
      const tessera::kernels::channel_sums<darray> all{dev(sum), dev(sum_sq)};
      const auto m = kc::batch_norm_moments(all, count);
      CHECK(near(host(m.mean), hf[1]));
      CHECK(near(host(m.variance), hf[2], 1e-4f));
      const darray y0 = kc::batch_norm_forward_inference(g0, gg, gb, m.mean, m.variance, 1e-5f, relu);
      const darray y1 = kc::batch_norm_forward_inference(g1, gg, gb, m.mean, m.variance, 1e-5f, relu);
      auto r0 = kc::batch_norm_backward_sums(gd0, g0, m.mean, m.variance, 1e-5f, relu ? &y0 : nullptr);
      auto r1 = kc::batch_norm_backward_sums(gd1, g1, m.mean, m.variance, 1e-5f, relu ? &y1 : nullptr);
      const tessera::kernels::channel_sums<darray> r{dev(host(r0.sum) + host(r1.sum)),
                                                     dev(host(r0.sum_sq) + host(r1.sum_sq))};
      CHECK(near(host(r.sum), hb[2], 1e-4f));
      CHECK(near(host(r.sum_sq), hb[1], 1e-4f));
      const harray dx0 = host(kc::batch_norm_backward_data(gd0, g0, gg, m.mean, m.variance, r, count, 1e-5f,
                                                           relu ? &y0 : nullptr));
      const harray dx1 = host(kc::batch_norm_backward_data(gd1, g1, gg, m.mean, m.variance, r, count, 1e-5f,
                                                           relu ? &y1 : nullptr));
      harray dx = harray::from_shape(s);
      std::copy(dx0.data(), dx0.data() + dx0.size(), dx.data());
      std::copy(dx1.data(), dx1.data() + dx1.size(), dx.data() + dx0.size());
      CHECK(near(dx, hb[0], 1e-4f));
    }
}

TEST_CASE("pooling on the GPU equals the host's") {
  auto window = [](tessera::index_t k, tessera::index_t s, pad2d pad, bool ceil, bool include) {
    pool2d_params p{k, k, s, s, pad};
    p.ceil_mode = ceil;
    p.count_include_pad = include;
    return p;
  };
  unsigned seed = 60;
  for (bool include : {true, false})
    for (const auto& [xs, p] : {std::pair{shape_t{2, 3, 8, 8}, window(2, 2, {}, false, include)},
                                std::pair{shape_t{1, 2, 9, 7}, window(3, 2, pad2d::uniform(1), true, include)},
                                std::pair{shape_t{1, 3, 5, 5}, window(2, 2, pad2d::uniform(1), true, include)},
                                std::pair{shape_t{1, 2, 7, 7}, window(1, 3, {}, false, include)},
                                std::pair{shape_t{4, 64, 32, 32}, window(3, 2, pad2d::uniform(1), false, include)},
                                std::pair{shape_t{1, 2, 11, 10}, window(3, 2, {1, 0, 2, 1}, true, include)}}) {
      CAPTURE(xs[2]);
      CAPTURE(include);
      const harray x = host_array(xs, seed++);
      const auto ys = tessera::kernels::pool2d_output_shape("test", xs, p);
      const harray dy = host_array(shape_t(ys.begin(), ys.end()), seed++);
      const darray gx = dev(x), gdy = dev(dy);
      const auto dm = kc::max_pool2d_forward(gx, p);
      CHECK(host(dm.y) == kh::max_pool_forward(x, p));
      CHECK(near(host(kc::max_pool2d_backward(gdy, gx, dm.y, dm.workspace, p)), kh::max_pool_backward(dy, x, p)));
      CHECK(near(host(kc::avg_pool2d_forward(gx, p)), kh::avg_pool_forward(x, p)));
      CHECK(near(host(kc::avg_pool2d_backward(gdy, xs, p)), kh::avg_pool_backward(dy, xs, p)));
    }
  const harray x = host_array({2, 5, 7, 3}, 9);
  CHECK(near(host(kc::global_avg_pool2d_forward(dev(x))), kh::global_avg_pool_forward(x)));
  const harray dy = host_array({2, 5, 1, 1}, 10);
  CHECK(near(host(kc::global_avg_pool2d_backward(dev(dy), {2, 5, 7, 3})),
             kh::global_avg_pool_backward(dy, {2, 5, 7, 3})));
}

TEST_CASE("backend<cuda_device> holds the kernels, and the errors are the host's") {
  using be = tessera::kernels::backend<tessera::cuda_device>;
  const harray x = host_array({2, 3, 8, 8}, 1), w = host_array({4, 3, 3, 3}, 2);
  const conv2d_params p{1, 1, pad2d::uniform(1)};
  CHECK(near(host(be::conv2d_forward(dev(x), dev(w), static_cast<const darray*>(nullptr), p)),
             kh::conv_forward(x, w, nullptr, p, false)));
  const harray bad = host_array({4, 2, 3, 3}, 3);
  CHECK(thrown([&] { (void)kc::conv2d_forward(dev(x), dev(bad), nullptr, p); }) == kh::conv_forward_error(x, bad, p));
  CHECK(thrown([&] { (void)kc::max_pool2d_forward(dev(x), pool2d_params::square(2, 2, 2)); }) ==
        kh::max_pool_forward_error(x, pool2d_params::square(2, 2, 2)));
}
}  // namespace cuda_test_cnn_kernels
