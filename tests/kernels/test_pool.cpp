// Tests of kernels/cpu/pool.hpp and the window geometry of kernels/conv_params.hpp: max
// and average pooling forward and backward against loops in double over a grid of
// windows (strides above the kernel, asymmetric padding, ceil_mode, counting the padding
// or not; divisors as PyTorch's), the loops' gradients against central finite
// differences, global average pooling, dnnl_tensor operands; output sizes and 'same'
// paddings checked against values PyTorch gives.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>
#include <tessera/kernels/cpu/pool.hpp>

#include "finite_difference.hpp"

namespace kernels_test_pool {  // the file's own scope in its test group's translation unit

namespace cpu = tessera::kernels::cpu;
namespace k = tessera::kernels;
using tessera::index_t;
using k::pad2d;
using k::pool2d_params;
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

shape_t out_shape(const shape_t& xs, const pool2d_params& p) {
  const auto s = k::pool2d_output_shape("test", xs, p);
  return shape_t(s.begin(), s.end());
}

// Calls f(n, c, i, j, xi, xj) for each input element inside window (i, j), in row-major
// window order, and window(n, c, i, j, divisor) once per window first: PyTorch's divisor
// counts the window's part within the explicit padding, or the input part only.
template <class W, class F>
void for_each_window(const shape_t& xs, const pool2d_params& p, W&& window, F&& f) {
  const shape_t ys = out_shape(xs, p);
  const index_t h = index_t(xs[2]), w = index_t(xs[3]);
  for (std::size_t n = 0; n < ys[0]; ++n)
    for (std::size_t c = 0; c < ys[1]; ++c)
      for (std::size_t i = 0; i < ys[2]; ++i)
        for (std::size_t j = 0; j < ys[3]; ++j) {
          const index_t hs = index_t(i) * p.stride_h - p.pad.top, ws = index_t(j) * p.stride_w - p.pad.left;
          const index_t he = std::min(hs + p.kernel_h, h + p.pad.bottom);
          const index_t we = std::min(ws + p.kernel_w, w + p.pad.right);
          const index_t hs0 = std::max<index_t>(hs, 0), ws0 = std::max<index_t>(ws, 0);
          const index_t he0 = std::min(he, h), we0 = std::min(we, w);
          const double div = p.count_include_pad ? double((he - hs) * (we - ws)) : double((he0 - hs0) * (we0 - ws0));
          window(n, c, i, j, div);
          for (index_t xi = hs0; xi < he0; ++xi)
            for (index_t xj = ws0; xj < we0; ++xj) f(n, c, i, j, std::size_t(xi), std::size_t(xj));
        }
}

darray naive_max(const darray& x, const pool2d_params& p) {
  darray y = xt::zeros<double>(out_shape(shape_of(x), p));
  y.fill(-std::numeric_limits<double>::infinity());
  for_each_window(shape_of(x), p, [](auto...) {}, [&](auto n, auto c, auto i, auto j, auto xi, auto xj) {
    y(n, c, i, j) = std::max(y(n, c, i, j), x(n, c, xi, xj));
  });
  return y;
}
darray naive_max_dx(const darray& dy, const darray& x, const pool2d_params& p) {
  const darray y = naive_max(x, p);
  darray dx = xt::zeros<double>(shape_of(x));
  std::vector<bool> done(y.size(), false);
  const shape_t ys = shape_of(y);
  for_each_window(shape_of(x), p, [](auto...) {}, [&](auto n, auto c, auto i, auto j, auto xi, auto xj) {
    const std::size_t o = ravel({n, c, i, j}, ys);
    if (!done[o] && x(n, c, xi, xj) == y(n, c, i, j)) {  // the first maximum in window order
      dx(n, c, xi, xj) += dy(n, c, i, j);
      done[o] = true;
    }
  });
  return dx;
}
darray naive_avg(const darray& x, const pool2d_params& p) {
  darray y = xt::zeros<double>(out_shape(shape_of(x), p));
  darray div = y;
  for_each_window(
      shape_of(x), p, [&](auto n, auto c, auto i, auto j, double d) { div(n, c, i, j) = d; },
      [&](auto n, auto c, auto i, auto j, auto xi, auto xj) { y(n, c, i, j) += x(n, c, xi, xj); });
  return y / div;
}
darray naive_avg_dx(const darray& dy, const shape_t& xs, const pool2d_params& p) {
  darray dx = xt::zeros<double>(xs);
  double div = 1;
  for_each_window(
      xs, p, [&](auto, auto, auto, auto, double d) { div = d; },
      [&](auto n, auto c, auto i, auto j, auto xi, auto xj) { dx(n, c, xi, xj) += dy(n, c, i, j) / div; });
  return dx;
}

struct pool_case {
  shape_t x;
  pool2d_params p;
};

pool2d_params window(index_t kh, index_t kw, index_t sh, index_t sw, pad2d pad = {}, bool ceil = false,
                     bool include = true) {
  pool2d_params p{kh, kw, sh, sw, pad};
  p.ceil_mode = ceil;
  p.count_include_pad = include;
  return p;
}

std::vector<pool_case> pool_grid() {
  std::vector<pool_case> g;
  for (bool include : {true, false}) {
    g.push_back({{2, 3, 8, 8}, window(2, 2, 2, 2, {}, false, include)});
    g.push_back({{1, 2, 9, 7}, window(3, 3, 2, 2, pad2d::uniform(1), false, include)});
    g.push_back({{1, 2, 9, 7}, window(3, 3, 2, 2, pad2d::uniform(1), true, include)});
    g.push_back({{2, 2, 5, 5}, window(2, 2, 2, 2, {}, true, include)});
    g.push_back({{1, 3, 5, 5}, window(2, 2, 2, 2, pad2d::uniform(1), true, include)});
    g.push_back({{1, 1, 6, 8}, window(3, 2, 2, 3, {1, 0, 1, 1}, true, include)});
    g.push_back({{1, 2, 7, 7}, window(1, 1, 3, 2, {}, false, include)});    // stride > kernel
    g.push_back({{1, 2, 11, 10}, window(2, 3, 4, 4, {1, 1, 2, 0}, true, include)});
    g.push_back({{2, 3, 32, 32}, window(3, 3, 2, 2, pad2d::uniform(1), false, include)});  // ResNet's stem pool
    g.push_back({{1, 2, 8, 8}, window(4, 4, 3, 3, pad2d::uniform(2), true, include)});
  }
  return g;
}

std::string case_text(const pool_case& c) {
  const auto& p = c.p;
  return "x " + std::to_string(c.x[2]) + "x" + std::to_string(c.x[3]) + " kernel " + std::to_string(p.kernel_h) +
         "x" + std::to_string(p.kernel_w) + " stride " + std::to_string(p.stride_h) + "," +
         std::to_string(p.stride_w) + " pad " + std::to_string(p.pad.top) + std::to_string(p.pad.bottom) +
         std::to_string(p.pad.left) + std::to_string(p.pad.right) + (p.ceil_mode ? " ceil" : "") +
         (p.count_include_pad ? " include" : " exclude");
}

}  // namespace

TEST_CASE("window output sizes and same paddings are PyTorch's and MindSpore's") {
  // PyTorch's F.max_pool2d(zeros(1, 1, h, h), k, s, p, ceil_mode).shape[-1]
  struct size_case {
    index_t in, k, s, p;
    bool ceil;
    index_t out;
  };
  for (const size_case& c : {size_case{5, 2, 2, 0, true, 3}, {4, 2, 2, 1, true, 3}, {32, 3, 2, 1, true, 17},
                             {7, 3, 3, 1, true, 3}, {6, 3, 2, 1, true, 4}, {5, 3, 2, 0, false, 2},
                             {1, 1, 2, 0, true, 1}, {8, 4, 3, 2, true, 4}, {32, 3, 2, 1, false, 16}}) {
    CAPTURE(c.in);
    CAPTURE(c.k);
    CHECK(k::window_output_size(c.in, c.k, c.s, c.p, c.p, 1, c.ceil) == c.out);
  }
  static_assert(k::window_output_size(32, 3, 1, 1, 1) == 32);
  static_assert(k::window_output_size(32, 3, 1, 2, 2, 2) == 32);  // dilation 2
  static_assert(k::window_output_size(2, 3, 1, 0, 0) == 0);
  // 'same': ceil(in / stride) outputs, the odd element after (MindSpore, TensorFlow, and
  // PyTorch's padding='same' at stride 1: total dilation * (kernel - 1), left total / 2).
  static_assert(k::same_padding(32, 3, 1) == std::array<index_t, 2>{1, 1});
  static_assert(k::same_padding(32, 4, 1) == std::array<index_t, 2>{1, 2});
  static_assert(k::same_padding(32, 3, 1, 2) == std::array<index_t, 2>{2, 2});
  static_assert(k::same_padding(32, 3, 2) == std::array<index_t, 2>{0, 1});
  static_assert(k::same_padding(33, 3, 2) == std::array<index_t, 2>{1, 1});
  static_assert(k::same_padding(5, 1, 2) == std::array<index_t, 2>{0, 0});
  for (index_t in : {5, 8, 31, 32})
    for (index_t kk : {1, 2, 3, 5})
      for (index_t s : {1, 2, 3}) {
        const auto pad = k::same_padding(in, kk, s);
        CHECK(k::window_output_size(in, kk, s, pad[0], pad[1]) == (in + s - 1) / s);
      }
  // MindSpore's pad modes.
  constexpr auto same = k::mindspore_conv2d(k::pad_mode::same, 32, 32, 3, 3, 2, 2);
  static_assert(same.pad == pad2d{0, 1, 0, 1});
  static_assert(k::mindspore_conv2d(k::pad_mode::valid, 32, 32, 3, 3).pad == pad2d{});
  static_assert(k::mindspore_conv2d(k::pad_mode::pad, 32, 32, 3, 3, 1, 1, pad2d::uniform(1)).pad == pad2d::uniform(1));
  constexpr auto pool_same = k::mindspore_pool2d(k::pad_mode::same, 5, 5, 2, 2, 2, 2);
  static_assert(pool_same.pad == pad2d{0, 1, 0, 1} && !pool_same.count_include_pad);
  CHECK(k::window_output_size(32, 3, 2, 0, 0) == 15);  // MindSpore valid: ceil((32 - 3 + 1) / 2)
}

TEST_CASE("the loops' pooling gradients equal central finite differences") {
  for (const pool_case& c : {pool_case{{1, 2, 5, 5}, window(2, 2, 2, 2, pad2d::uniform(1), true, true)},
                             pool_case{{1, 1, 6, 5}, window(3, 2, 2, 1, {1, 0, 0, 1}, true, false)}}) {
    CAPTURE(case_text(c));
    const darray x = random_array(c.x, 3);
    CHECK(gradient_error([&](const darray& v) { return naive_max(v, c.p); },
                         [&](const darray& dy, const darray& v) { return naive_max_dx(dy, v, c.p); }, x) < 1e-8);
    CHECK(gradient_error([&](const darray& v) { return naive_avg(v, c.p); },
                         [&](const darray& dy, const darray&) { return naive_avg_dx(dy, c.x, c.p); }, x) < 1e-8);
  }
}

TEST_CASE("max and average pooling forward and backward equal the loops") {
  std::uint64_t seed = 50;
  for (const pool_case& c : pool_grid()) {
    CAPTURE(case_text(c));
    const darray x = random_array(c.x, seed++), dy = random_array(out_shape(c.x, c.p), seed++);
    const farray xf = to_float(x), dyf = to_float(dy);
    const darray xr = to_double(xf);  // the loops see the same (float) values, so ties agree
    const auto m = cpu::max_pool2d_forward(xf, c.p);
    CHECK(relative_error(to_double(m.y), naive_max(xr, c.p)) == 0);
    CHECK(relative_error(to_double(cpu::max_pool2d_backward(dyf, xf, m.y, m.workspace, c.p)),
                         naive_max_dx(dy, xr, c.p)) < 1e-6);
    CHECK(relative_error(to_double(cpu::avg_pool2d_forward(xf, c.p)), naive_avg(x, c.p)) < 1e-6);
    CHECK(relative_error(to_double(cpu::avg_pool2d_backward(dyf, c.x, c.p)), naive_avg_dx(dy, c.x, c.p)) < 1e-6);
  }
}

TEST_CASE("average pooling with ceil_mode and padding matches PyTorch's divisors") {
  // F.avg_pool2d(arange(1, 26).reshape(1, 1, 5, 5), 2, 2, 1, ceil_mode=True), and the
  // same with kernel 3: the last window's part in ceil_mode's extra row is not counted.
  farray x = farray::from_shape({1, 1, 5, 5});
  for (std::size_t i = 0; i < 25; ++i) x.data()[i] = float(i + 1);
  const farray y2 = cpu::avg_pool2d_forward(x, window(2, 2, 2, 2, pad2d::uniform(1), true, true));
  const float want2[] = {0.25f, 1.25f, 2.25f, 4.25f, 10.f, 12.f, 9.25f, 20.f, 22.f};
  for (std::size_t i = 0; i < 9; ++i) CHECK(y2.data()[i] == doctest::Approx(want2[i]));
  const farray y3 = cpu::avg_pool2d_forward(x, window(3, 3, 2, 2, pad2d::uniform(1), true, true));
  const float want3[] = {1.7778f, 3.6667f, 3.1111f, 7.6667f, 13.f, 9.6667f, 8.4444f, 13.6667f, 9.7778f};
  for (std::size_t i = 0; i < 9; ++i) CHECK(y3.data()[i] == doctest::Approx(want3[i]).epsilon(1e-4));
}

TEST_CASE("global average pooling is the mean over (H, W)") {
  const shape_t s{2, 5, 7, 3};
  const darray x = random_array(s, 9);
  const farray y = cpu::global_avg_pool2d_forward(to_float(x));
  CHECK(shape_of(to_double(y)) == shape_t{2, 5, 1, 1});
  const pool2d_params whole = window(7, 3, 1, 1);
  CHECK(relative_error(to_double(y), naive_avg(x, whole)) < 1e-6);
  const darray dy = random_array({2, 5, 1, 1}, 10);
  CHECK(relative_error(to_double(cpu::global_avg_pool2d_backward(to_float(dy), s)), naive_avg_dx(dy, s, whole)) < 1e-6);
}

TEST_CASE("pooling on dnnl_tensors in a blocked format equals the xarray path") {
  const shape_t s{2, 16, 8, 8};
  const farray x = to_float(random_array(s, 11));
  // A blocked tensor, as a convolution leaves it.
  const cpu::dnnl_tensor tx = cpu::dnnl_tensor::from_xarray(x).in_format(dnnl::memory::format_tag::nChw16c);
  CHECK(!tx.is_plain());
  CHECK(tx.to_xarray() == x);
  for (const pool2d_params& p : {window(3, 3, 2, 2, pad2d::uniform(1)), window(2, 2, 2, 2, {}, true, false)}) {
    const auto a = cpu::max_pool2d_forward(x, p);
    const auto b = cpu::max_pool2d_forward(tx, p);
    CHECK(b.y.to_xarray() == a.y);
    const farray dy = to_float(random_array(out_shape(s, p), 12));
    const cpu::dnnl_tensor tdy = cpu::dnnl_tensor::from_xarray(dy);
    CHECK(relative_error(cpu::max_pool2d_backward(tdy, tx, b.y, b.workspace, p).to_xarray(),
                         cpu::max_pool2d_backward(dy, x, a.y, a.workspace, p)) < 1e-6);
    CHECK(relative_error(cpu::avg_pool2d_forward(tx, p).to_xarray(), cpu::avg_pool2d_forward(x, p)) < 1e-6);
    CHECK(relative_error(cpu::avg_pool2d_backward(tdy, s, p).to_xarray(), cpu::avg_pool2d_backward(dy, s, p)) < 1e-6);
  }
  CHECK(relative_error(cpu::global_avg_pool2d_forward(tx).to_xarray(), cpu::global_avg_pool2d_forward(x)) < 1e-6);
}

TEST_CASE("pooling errors name the kernel and the numbers") {
  const farray x = xt::zeros<float>({1, 2, 4, 4});
  CHECK(thrown([&] { (void)cpu::max_pool2d_forward(x, window(2, 2, 2, 2, pad2d::uniform(2))); }) ==
        "max_pool2d_forward: padding must be smaller than the kernel (2, 2), padding is (top 2, bottom 2, left 2, "
        "right 2)");
  CHECK(thrown([&] { (void)cpu::avg_pool2d_forward(x, window(5, 2, 1, 1)); }) ==
        "avg_pool2d_forward: the window does not fit along H: input 4 + padding 0 + 0 < window extent 5 (kernel 5, "
        "dilation 1)");
  CHECK(thrown([&] { (void)cpu::avg_pool2d_backward(x, {1, 2, 4, 4}, window(2, 2, 2, 2)); }) ==
        "avg_pool2d_backward: dy must be (1, 2, 2, 2), dy is (1, 2, 4, 4)");
  CHECK(thrown([&] { (void)cpu::max_pool2d_backward(x, x, x, cpu::dnnl_workspace{}, window(1, 1, 1, 1)); }) ==
        "max_pool2d_backward: the workspace is empty (max_pool2d_forward's)");
}
}  // namespace kernels_test_pool
