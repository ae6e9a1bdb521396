// Tests of kernels/cpu/batch_norm.hpp: training and inference forward and the backward
// against loops in double (the loops' gradient against central finite differences),
// with and without the fused ReLU, on xarrays and dnnl_tensors; the split form equal to
// the whole batch when the batch is cut in two halves and their sums added, as a
// sharded batch norm adds them across ranks; the split form on channel-blocked
// dnnl_tensors equal to it on plain arrays; the running statistics; the error texts.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <vector>
#include <tessera/kernels/cpu/batch_norm.hpp>

#include "finite_difference.hpp"

namespace kernels_test_batch_norm {  // the file's own scope in its test group's translation unit

namespace cpu = tessera::kernels::cpu;
using namespace kernel_test;

namespace {

using darray = xt::xarray<double>;
using farray = xt::xarray<float>;

farray to_float(const darray& x) {
  farray y = farray::from_shape(x.shape());
  for (std::size_t i = 0; i < x.size(); ++i) y.data()[i] = float(x.data()[i]);
  return y;
}
darray to_double(const farray& x) {
  darray y = darray::from_shape(x.shape());
  for (std::size_t i = 0; i < x.size(); ++i) y.data()[i] = double(x.data()[i]);
  return y;
}

std::size_t channel_of(std::size_t i, const shape_t& s) { return (i / (s[2] * s[3])) % s[1]; }

struct naive_bn {
  darray y, mean, var;
};

// The definition, in double: per channel, mean and biased variance over (N, H, W).
naive_bn naive_forward(const darray& x, const darray& gamma, const darray& beta, double eps, bool relu) {
  const shape_t s = shape_of(x);
  const double n = double(s[0] * s[2] * s[3]);
  naive_bn r{darray::from_shape(s), xt::zeros<double>({s[1]}), xt::zeros<double>({s[1]})};
  for (std::size_t i = 0; i < x.size(); ++i) r.mean(channel_of(i, s)) += x.data()[i] / n;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = x.data()[i] - r.mean(channel_of(i, s));
    r.var(channel_of(i, s)) += d * d / n;
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t c = channel_of(i, s);
    const double v = gamma(c) * (x.data()[i] - r.mean(c)) / std::sqrt(r.var(c) + eps) + beta(c);
    r.y.data()[i] = relu ? std::max(v, 0.0) : v;
  }
  return r;
}

// The training-mode gradient, written from the formula (dy masked by y > 0 with relu).
struct naive_grads {
  darray dx, dgamma, dbeta;
};
naive_grads naive_backward(const darray& dy_in, const darray& x, const darray& gamma, double eps, bool relu,
                           const darray& beta) {
  const shape_t s = shape_of(x);
  const naive_bn f = naive_forward(x, gamma, beta, eps, relu);
  const double n = double(s[0] * s[2] * s[3]);
  darray dy = dy_in;
  if (relu)
    for (std::size_t i = 0; i < dy.size(); ++i)
      if (!(f.y.data()[i] > 0)) dy.data()[i] = 0;
  naive_grads g{darray::from_shape(s), xt::zeros<double>({s[1]}), xt::zeros<double>({s[1]})};
  auto xhat = [&](std::size_t i) {
    const std::size_t c = channel_of(i, s);
    return (x.data()[i] - f.mean(c)) / std::sqrt(f.var(c) + eps);
  };
  for (std::size_t i = 0; i < x.size(); ++i) {
    g.dbeta(channel_of(i, s)) += dy.data()[i];
    g.dgamma(channel_of(i, s)) += dy.data()[i] * xhat(i);
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t c = channel_of(i, s);
    g.dx.data()[i] = gamma(c) / std::sqrt(f.var(c) + eps) *
                     (dy.data()[i] - g.dbeta(c) / n - xhat(i) * g.dgamma(c) / n);
  }
  return g;
}

// Rows [begin, end) of the batch dim.
template <class T>
xt::xarray<T> batch_rows(const xt::xarray<T>& x, std::size_t begin, std::size_t end) {
  shape_t s(x.shape().begin(), x.shape().end());
  const std::size_t per = x.size() / s[0];
  s[0] = end - begin;
  xt::xarray<T> out = xt::xarray<T>::from_shape(s);
  std::copy(x.data() + begin * per, x.data() + end * per, out.data());
  return out;
}

template <class T>
tessera::kernels::channel_sums<xt::xarray<T>> add(const tessera::kernels::channel_sums<xt::xarray<T>>& a,
                                     const tessera::kernels::channel_sums<xt::xarray<T>>& b) {
  return {a.sum + b.sum, a.sum_sq + b.sum_sq};
}

template <class T>
xt::xarray<T> concat_rows(const xt::xarray<T>& a, const xt::xarray<T>& b) {
  shape_t s(a.shape().begin(), a.shape().end());
  s[0] += b.shape()[0];
  xt::xarray<T> out = xt::xarray<T>::from_shape(s);
  std::copy(a.data(), a.data() + a.size(), out.data());
  std::copy(b.data(), b.data() + b.size(), out.data() + a.size());
  return out;
}

const shape_t bn_shapes[] = {{4, 3, 5, 5}, {2, 16, 4, 4}, {6, 5, 3, 7}, {3, 2, 1, 1}, {8, 17, 2, 3}};

}  // namespace

TEST_CASE("the loops' batch-norm gradient equals central finite differences") {
  for (bool relu : {false, true}) {
    const shape_t s{3, 2, 3, 2};
    const darray x = random_array(s, 1), gamma = random_array({2}, 2, 0.5, 1.5), beta = random_array({2}, 3);
    CHECK(gradient_error([&](const darray& v) { return naive_forward(v, gamma, beta, 1e-5, relu).y; },
                         [&](const darray& dy, const darray& v) {
                           return naive_backward(dy, v, gamma, 1e-5, relu, beta).dx;
                         },
                         x) < 1e-7);
    CHECK(gradient_error([&](const darray& g) { return naive_forward(x, g, beta, 1e-5, relu).y; },
                         [&](const darray& dy, const darray& g) {
                           return naive_backward(dy, x, g, 1e-5, relu, beta).dgamma;
                         },
                         gamma) < 1e-7);
  }
}

TEST_CASE("batch norm training forward and backward equal the loops, with and without the fused ReLU") {
  std::uint64_t seed = 20;
  for (const shape_t& s : bn_shapes)
    for (bool relu : {false, true}) {
      CAPTURE(s[0]);
      CAPTURE(s[1]);
      CAPTURE(relu);
      const darray x = random_array(s, seed++, -2.0, 3.0), dy = random_array(s, seed++);
      const darray gamma = random_array({s[1]}, seed++, 0.5, 1.5), beta = random_array({s[1]}, seed++);
      const float eps = 1e-5f;
      const naive_bn want = naive_forward(x, gamma, beta, eps, relu);
      const auto got = cpu::batch_norm_forward_training(to_float(x), to_float(gamma), to_float(beta), eps, relu);
      CHECK(relative_error(to_double(got.y), want.y) < 1e-5);
      CHECK(relative_error(to_double(got.mean), want.mean) < 1e-5);
      CHECK(relative_error(to_double(got.variance), want.var) < 1e-5);
      CHECK(got.workspace.empty() == !relu);
      const naive_grads wg = naive_backward(dy, x, gamma, eps, relu, beta);
      const auto g = cpu::batch_norm_backward(to_float(dy), to_float(x), to_float(gamma), got.mean, got.variance,
                                              got.workspace, eps, relu);
      CHECK(relative_error(to_double(g.dx), wg.dx) < 1e-4);
      CHECK(relative_error(to_double(g.dgamma), wg.dgamma) < 1e-5);
      CHECK(relative_error(to_double(g.dbeta), wg.dbeta) < 1e-5);
    }
}

TEST_CASE("batch norm inference normalises with the statistics given") {
  const shape_t s{3, 4, 5, 6};
  const darray x = random_array(s, 5), gamma = random_array({4}, 6), beta = random_array({4}, 7);
  const darray mean = random_array({4}, 8), var = random_array({4}, 9, 0.5, 2.0);
  for (bool relu : {false, true}) {
    darray want = darray::from_shape(s);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::size_t c = channel_of(i, s);
      const double v = gamma(c) * (x.data()[i] - mean(c)) / std::sqrt(var(c) + 1e-3) + beta(c);
      want.data()[i] = relu ? std::max(v, 0.0) : v;
    }
    const farray got = cpu::batch_norm_forward_inference(to_float(x), to_float(gamma), to_float(beta),
                                                         to_float(mean), to_float(var), 1e-3f, relu);
    CHECK(relative_error(to_double(got), want) < 1e-6);
  }
}

TEST_CASE("the split form over two halves of the batch equals the whole batch") {
  std::uint64_t seed = 40;
  // Planes below the kernels' small_plane (64), walked a batch row at a time, and at or
  // above it, plane by plane; the last two are large enough for two threads where there
  // are two (channels split between them).
  for (const shape_t& s : {shape_t{4, 3, 5, 5}, shape_t{2, 16, 4, 4}, shape_t{6, 5, 3, 7}, shape_t{3, 8, 8, 8},
                           shape_t{4, 64, 16, 16}, shape_t{32, 2048, 1, 1}})
    for (bool relu : {false, true}) {
      CAPTURE(s[0]);
      CAPTURE(s[1]);
      CAPTURE(relu);
      const farray x = to_float(random_array(s, seed++, -2.0, 3.0)), dy = to_float(random_array(s, seed++));
      const farray gamma = to_float(random_array({s[1]}, seed++, 0.5, 1.5));
      const farray beta = to_float(random_array({s[1]}, seed++));
      const float eps = 1e-5f;
      const std::size_t half = s[0] / 2, count = s[0] * s[2] * s[3];
      const farray x0 = batch_rows(x, 0, half), x1 = batch_rows(x, half, s[0]);
      const farray dy0 = batch_rows(dy, 0, half), dy1 = batch_rows(dy, half, s[0]);

      const auto whole = cpu::batch_norm_forward_training(x, gamma, beta, eps, relu);
      const auto whole_grads =
          cpu::batch_norm_backward(dy, x, gamma, whole.mean, whole.variance, whole.workspace, eps, relu);

      // Forward: local sums, "all-reduced", moments, normalise each half.
      const auto sums = add(cpu::batch_norm_sums(x0), cpu::batch_norm_sums(x1));
      const auto all = cpu::batch_norm_sums(x);
      CHECK(relative_error(sums.sum, all.sum) < 1e-6);
      CHECK(relative_error(sums.sum_sq, all.sum_sq) < 1e-6);
      const auto m = cpu::batch_norm_moments(sums, count);
      CHECK(relative_error(m.mean, whole.mean) < 1e-5);
      CHECK(relative_error(m.variance, whole.variance) < 1e-5);
      const farray y0 = cpu::batch_norm_forward_inference(x0, gamma, beta, m.mean, m.variance, eps, relu);
      const farray y1 = cpu::batch_norm_forward_inference(x1, gamma, beta, m.mean, m.variance, eps, relu);
      CHECK(relative_error(concat_rows(y0, y1), whole.y) < 1e-5);

      // Backward: local sums, "all-reduced" (= dbeta, dgamma), then dx of each half.
      const auto r = add(cpu::batch_norm_backward_sums(dy0, x0, m.mean, m.variance, eps, relu ? &y0 : nullptr),
                         cpu::batch_norm_backward_sums(dy1, x1, m.mean, m.variance, eps, relu ? &y1 : nullptr));
      CHECK(relative_error(r.sum, whole_grads.dbeta) < 1e-5);
      CHECK(relative_error(r.sum_sq, whole_grads.dgamma) < 1e-4);
      const farray dx0 =
          cpu::batch_norm_backward_data(dy0, x0, gamma, m.mean, m.variance, r, count, eps, relu ? &y0 : nullptr);
      const farray dx1 =
          cpu::batch_norm_backward_data(dy1, x1, gamma, m.mean, m.variance, r, count, eps, relu ? &y1 : nullptr);
      CHECK(relative_error(concat_rows(dx0, dx1), whole_grads.dx) < 1e-4);
    }
}

TEST_CASE("the split form in double equals the loops") {
  // Planes of 20 (below small_plane: summed a batch row at a time) and of 81 (ten blocks
  // of the sums' eight lanes and one value after them).
  for (const shape_t& s : {shape_t{4, 3, 5, 4}, shape_t{2, 3, 9, 9}}) {
    CAPTURE(s[2]);
    const darray x = random_array(s, 1), dy = random_array(s, 2);
    const darray gamma = random_array({3}, 3, 0.5, 1.5), beta = random_array({3}, 4);
    const std::size_t count = s[0] * s[2] * s[3];
    const auto m = cpu::batch_norm_moments(cpu::batch_norm_sums(x), count);
    const naive_bn f = naive_forward(x, gamma, beta, 1e-5, false);
    CHECK(relative_error(m.mean, f.mean) < 1e-13);
    CHECK(relative_error(m.variance, f.var) < 1e-12);
    const auto r = cpu::batch_norm_backward_sums(dy, x, m.mean, m.variance, 1e-5);
    const naive_grads g = naive_backward(dy, x, gamma, 1e-5, false, beta);
    CHECK(relative_error(r.sum, g.dbeta) < 1e-13);
    CHECK(relative_error(r.sum_sq, g.dgamma) < 1e-12);
    CHECK(relative_error(cpu::batch_norm_backward_data(dy, x, gamma, m.mean, m.variance, r, count, 1e-5), g.dx) <
          1e-12);
  }
}

TEST_CASE("batch norm on dnnl_tensors equals the xarray path") {
  const shape_t s{2, 16, 4, 4};
  const farray x = to_float(random_array(s, 1)), dy = to_float(random_array(s, 2));
  const farray gamma = to_float(random_array({16}, 3, 0.5, 1.5)), beta = to_float(random_array({16}, 4));
  for (bool relu : {false, true}) {
    const auto a = cpu::batch_norm_forward_training(x, gamma, beta, 1e-5f, relu);
    const auto b = cpu::batch_norm_forward_training(cpu::dnnl_tensor::from_xarray(x), gamma, beta, 1e-5f, relu);
    CHECK(relative_error(b.y.to_xarray(), a.y) < 1e-6);
    const auto ga = cpu::batch_norm_backward(dy, x, gamma, a.mean, a.variance, a.workspace, 1e-5f, relu);
    const auto gb = cpu::batch_norm_backward(cpu::dnnl_tensor::from_xarray(dy), cpu::dnnl_tensor::from_xarray(x),
                                             gamma, b.mean, b.variance, b.workspace, 1e-5f, relu);
    CHECK(relative_error(gb.dx.to_xarray(), ga.dx) < 1e-6);
    CHECK(relative_error(gb.dgamma, ga.dgamma) < 1e-6);
    CHECK(relative_error(cpu::batch_norm_forward_inference(cpu::dnnl_tensor::from_xarray(x), gamma, beta, a.mean,
                                                           a.variance, 1e-5f, relu)
                             .to_xarray(),
                         cpu::batch_norm_forward_inference(x, gamma, beta, a.mean, a.variance, 1e-5f, relu)) < 1e-6);
  }
}

TEST_CASE("the split form on channel-blocked dnnl_tensors equals the plain arrays'") {
  using tag = dnnl::memory::format_tag;
  std::uint64_t seed = 90;
  // Whole blocks, channels padded up to the block (20 of 24 or 32), and 1 x 1 planes.
  for (const shape_t& s : {shape_t{2, 16, 4, 4}, shape_t{3, 20, 5, 7}, shape_t{4, 64, 1, 1}, shape_t{2, 8, 9, 9}})
    for (const tag t : {tag::nChw16c, tag::nChw8c})
      for (const bool relu : {false, true}) {
        CAPTURE(s[1]);
        CAPTURE(s[2]);
        CAPTURE(int(t == tag::nChw16c));
        CAPTURE(relu);
        const farray x = to_float(random_array(s, seed++, -2.0, 3.0)), dy = to_float(random_array(s, seed++));
        const farray gamma = to_float(random_array({s[1]}, seed++, 0.5, 1.5));
        const farray beta = to_float(random_array({s[1]}, seed++));
        const auto blocked = [t](const farray& a) { return cpu::dnnl_tensor::from_xarray(a).in_format(t); };
        const cpu::dnnl_tensor xb = blocked(x), dyb = blocked(dy);
        const std::size_t count = s[0] * s[2] * s[3];
        const float eps = 1e-5f;

        const auto sums = cpu::batch_norm_sums(x), sums_b = cpu::batch_norm_sums(xb);
        CHECK(relative_error(sums_b.sum, sums.sum) < 1e-6);
        CHECK(relative_error(sums_b.sum_sq, sums.sum_sq) < 1e-6);
        const auto m = cpu::batch_norm_moments(sums, count);
        const farray y = cpu::batch_norm_forward_inference(x, gamma, beta, m.mean, m.variance, eps, relu);
        const cpu::dnnl_tensor yb = blocked(y);

        const auto r = cpu::batch_norm_backward_sums(dy, x, m.mean, m.variance, eps, relu ? &y : nullptr);
        const auto rb = cpu::batch_norm_backward_sums(dyb, xb, m.mean, m.variance, eps, relu ? &yb : nullptr);
        CHECK(relative_error(rb.sum, r.sum) < 1e-6);
        CHECK(relative_error(rb.sum_sq, r.sum_sq) < 1e-5);
        const farray dx =
            cpu::batch_norm_backward_data(dy, x, gamma, m.mean, m.variance, r, count, eps, relu ? &y : nullptr);
        const cpu::dnnl_tensor dxb =
            cpu::batch_norm_backward_data(dyb, xb, gamma, m.mean, m.variance, r, count, eps, relu ? &yb : nullptr);
        CHECK(dxb.desc() == xb.desc());
        CHECK(relative_error(dxb.to_xarray(), dx) < 1e-5);
      }
  const shape_t s{2, 16, 3, 3};
  const farray x = to_float(random_array(s, 1)), mean = xt::zeros<float>({16}), var = xt::ones<float>({16});
  CHECK_THROWS_WITH(cpu::batch_norm_sums(cpu::dnnl_tensor::from_xarray(x)),
                    "batch_norm_sums: x must be in oneDNN's nChw16c or nChw8c layout");
  const cpu::dnnl_tensor x16 = cpu::dnnl_tensor::from_xarray(x).in_format(tag::nChw16c);
  const cpu::dnnl_tensor x8 = cpu::dnnl_tensor::from_xarray(x).in_format(tag::nChw8c);
  CHECK_THROWS_WITH(cpu::batch_norm_backward_sums(x8, x16, mean, var, 1e-5f),
                    "batch_norm_backward_sums: dy must be laid out as x");
}

TEST_CASE("running statistics follow PyTorch's update") {
  farray rm = {0.f, 1.f}, rv = {1.f, 2.f};
  const farray mean = {2.f, -1.f}, var = {3.f, 0.5f};
  cpu::batch_norm_update_running(rm, rv, mean, var, 4, 0.1f);
  CHECK(rm(0) == doctest::Approx(0.2));
  CHECK(rm(1) == doctest::Approx(0.9 * 1 + 0.1 * -1));
  CHECK(rv(0) == doctest::Approx(0.9 * 1 + 0.1 * 3 * 4.0 / 3.0));
  CHECK(rv(1) == doctest::Approx(0.9 * 2 + 0.1 * 0.5 * 4.0 / 3.0));
  farray rm2 = {0.f, 1.f}, rv2 = {1.f, 2.f};
  cpu::batch_norm_update_running(rm2, rv2, mean, var, 4, 0.1f, false);
  CHECK(rv2(0) == doctest::Approx(0.9 + 0.3));
}

TEST_CASE("batch norm errors name the kernel and the numbers") {
  const farray x = xt::zeros<float>({2, 3, 4, 4});
  const farray g3 = xt::ones<float>({3}), g2 = xt::ones<float>({2});
  CHECK(thrown([&] { (void)cpu::batch_norm_forward_training(x, g2, g3, 1e-5f); }) ==
        "batch_norm_forward_training: gamma must be (3,), gamma is (2,)");
  CHECK(thrown([&] { (void)cpu::batch_norm_forward_training(farray(xt::zeros<float>({2, 3})), g3, g3, 1e-5f); }) ==
        "batch_norm_forward_training: x must be 4-D (N, C, H, W), x is (2, 3)");
  const auto f = cpu::batch_norm_forward_training(x, g3, g3, 1e-5f);
  CHECK(thrown([&] { (void)cpu::batch_norm_backward(x, x, g3, f.mean, f.variance, f.workspace, 1e-5f, true); }) ==
        "batch_norm_backward: relu needs the workspace of batch_norm_forward_training(..., relu = true)");
  const farray dy5 = xt::zeros<float>({2, 3, 4, 5});
  CHECK(thrown([&] { (void)cpu::batch_norm_backward_sums(dy5, x, g3, g3, 1e-5f); }) ==
        "batch_norm_backward_sums: dy must be (2, 3, 4, 4), dy is (2, 3, 4, 5)");
  CHECK(thrown([&] { (void)cpu::batch_norm_moments(cpu::batch_norm_sums(x), 0); }) ==
        "batch_norm_moments: count must be positive");
}
}  // namespace kernels_test_batch_norm
