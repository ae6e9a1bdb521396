// Tests of kernels/cpu/conv.hpp: conv2d_forward, conv2d_backward_data,
// conv2d_backward_weights and conv2d_backward against direct loops in double, over a grid of shapes,
// strides (also larger than the kernel), asymmetric paddings, dilations and groups;
// the loops' own gradients against central finite differences; the fused bias and
// ReLU; each way of laying out plain arrays (conv_layouts); dnnl_tensor operands; the
// primitive cache; and the error texts.
#include <doctest/doctest.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <tessera/kernels/cpu/conv.hpp>

#include "finite_difference.hpp"

namespace kernels_test_conv {  // the file's own scope in its test group's translation unit

namespace cpu = tessera::kernels::cpu;
using tessera::index_t;
using tessera::kernels::conv2d_params;
using tessera::kernels::pad2d;
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

// Calls f(n, o, i, j, c, kh, kw, xi, xj) for every output position, every input channel
// c of o's group and every kernel tap whose input position (xi, xj) is inside x.
template <class F>
void for_each_tap(const shape_t& xs, const shape_t& ws, const shape_t& ys, const conv2d_params& p, F&& f) {
  const std::size_t cg = ws[1], og = ws[0] / std::size_t(p.groups);
  for (std::size_t n = 0; n < ys[0]; ++n)
    for (std::size_t o = 0; o < ys[1]; ++o)
      for (std::size_t i = 0; i < ys[2]; ++i)
        for (std::size_t j = 0; j < ys[3]; ++j)
          for (std::size_t cl = 0; cl < cg; ++cl)
            for (std::size_t kh = 0; kh < ws[2]; ++kh)
              for (std::size_t kw = 0; kw < ws[3]; ++kw) {
                const index_t xi = index_t(i) * p.stride_h - p.pad.top + index_t(kh) * p.dilation_h;
                const index_t xj = index_t(j) * p.stride_w - p.pad.left + index_t(kw) * p.dilation_w;
                if (xi < 0 || xj < 0 || xi >= index_t(xs[2]) || xj >= index_t(xs[3])) continue;
                const std::size_t c = (o / og) * cg + cl;
                f(n, o, i, j, c, cl, kh, kw, std::size_t(xi), std::size_t(xj));
              }
}

shape_t out_shape(const shape_t& xs, const shape_t& ws, const conv2d_params& p) {
  const auto s = tessera::kernels::conv2d_output_shape("test", xs, ws, p);
  return shape_t(s.begin(), s.end());
}

// The definition: y[n, o, i, j] = b[o] + sum x[n, c, xi, xj] * w[o, cl, kh, kw].
darray naive_conv(const darray& x, const darray& w, const darray* b, const conv2d_params& p) {
  const shape_t xs = shape_of(x), ws = shape_of(w), ys = out_shape(xs, ws, p);
  darray y = xt::zeros<double>(ys);
  for_each_tap(xs, ws, ys, p, [&](auto n, auto o, auto i, auto j, auto c, auto cl, auto kh, auto kw, auto xi, auto xj) {
    y(n, o, i, j) += x(n, c, xi, xj) * w(o, cl, kh, kw);
  });
  if (b)
    for (std::size_t i = 0; i < y.size(); ++i) y.data()[i] += (*b)(unravel(i, ys)[1]);
  return y;
}

// The adjoints of the same sum: dx[n, c, xi, xj] += dy * w, dw[o, cl, kh, kw] += dy * x.
darray naive_conv_dx(const darray& dy, const darray& w, const shape_t& xs, const conv2d_params& p) {
  darray dx = xt::zeros<double>(xs);
  for_each_tap(xs, shape_of(w), shape_of(dy), p,
               [&](auto n, auto o, auto i, auto j, auto c, auto cl, auto kh, auto kw, auto xi, auto xj) {
                 dx(n, c, xi, xj) += dy(n, o, i, j) * w(o, cl, kh, kw);
               });
  return dx;
}
darray naive_conv_dw(const darray& dy, const darray& x, const shape_t& ws, const conv2d_params& p) {
  darray dw = xt::zeros<double>(ws);
  for_each_tap(shape_of(x), ws, shape_of(dy), p,
               [&](auto n, auto o, auto i, auto j, auto c, auto cl, auto kh, auto kw, auto xi, auto xj) {
                 dw(o, cl, kh, kw) += dy(n, o, i, j) * x(n, c, xi, xj);
               });
  return dw;
}
darray naive_conv_db(const darray& dy) {
  const shape_t s = shape_of(dy);
  darray db = xt::zeros<double>({s[1]});
  for (std::size_t i = 0; i < dy.size(); ++i) db(unravel(i, s)[1]) += dy.data()[i];
  return db;
}

struct conv_case {
  shape_t x, w;
  conv2d_params p;
};

// The grid: 1x1 to 5x5 kernels, strides 1 to 3 (3 > kernel 2, 2 > kernel 1), even and
// odd sizes, non-square images, asymmetric padding, dilation 2 and 3, groups 2 and
// depthwise, one input channel.
std::vector<conv_case> conv_grid() {
  std::vector<conv_case> g;
  g.push_back({{2, 3, 8, 8}, {4, 3, 3, 3}, {1, 1, pad2d::uniform(1)}});
  g.push_back({{1, 4, 7, 9}, {6, 4, 3, 3}, {2, 2, pad2d::uniform(1)}});
  g.push_back({{2, 5, 6, 6}, {3, 5, 1, 1}, {1, 1}});
  g.push_back({{2, 5, 7, 7}, {3, 5, 1, 1}, {2, 2}});
  g.push_back({{1, 3, 9, 8}, {2, 3, 2, 2}, {3, 3}});
  g.push_back({{1, 2, 11, 10}, {3, 2, 5, 5}, {1, 2, {2, 1, 0, 2}}});
  g.push_back({{2, 3, 9, 9}, {4, 3, 3, 3}, {1, 1, pad2d::uniform(2), 2, 2}});
  g.push_back({{1, 2, 10, 11}, {2, 2, 3, 2}, {2, 1, {1, 0, 3, 1}, 3, 2}});
  g.push_back({{2, 4, 6, 6}, {6, 2, 3, 3}, {1, 1, pad2d::uniform(1), 1, 1, 2}});
  g.push_back({{1, 6, 7, 5}, {6, 1, 3, 3}, {2, 1, pad2d::symmetric(1, 0), 1, 1, 6}});
  g.push_back({{3, 1, 5, 5}, {2, 1, 4, 4}, {1, 1, {1, 2, 2, 1}}});
  g.push_back({{1, 8, 4, 4}, {4, 2, 1, 3}, {1, 3, pad2d::symmetric(0, 1), 1, 1, 4}});
  return g;
}

std::string case_text(const conv_case& c) {
  auto dims = [](const shape_t& s) {
    std::string t;
    for (std::size_t e : s) t += std::to_string(e) + " ";
    return t;
  };
  return "x " + dims(c.x) + "w " + dims(c.w) + "stride " + std::to_string(c.p.stride_h) + "," +
         std::to_string(c.p.stride_w) + " pad " + std::to_string(c.p.pad.top) + std::to_string(c.p.pad.bottom) +
         std::to_string(c.p.pad.left) + std::to_string(c.p.pad.right) + " dilation " +
         std::to_string(c.p.dilation_h) + "," + std::to_string(c.p.dilation_w) + " groups " +
         std::to_string(c.p.groups);
}

constexpr double tol = 2e-5;  // float kernels against double loops

// The convolutions' layouts set for a scope, measured again after it.
struct layouts_scope {
  explicit layouts_scope(cpu::conv_layouts l) { cpu::set_dnnl_conv_layouts(l); }
  ~layouts_scope() { cpu::set_dnnl_conv_layouts(cpu::conv_layouts::measured); }
  layouts_scope(const layouts_scope&) = delete;
  layouts_scope& operator=(const layouts_scope&) = delete;
};

}  // namespace

TEST_CASE("the loops' gradients equal central finite differences") {
  for (const conv_case& c : {conv_case{{1, 2, 5, 4}, {4, 1, 3, 2}, {2, 1, {1, 0, 2, 1}, 2, 1, 2}},
                             conv_case{{2, 3, 4, 4}, {2, 3, 2, 2}, {3, 3, pad2d::uniform(1)}}}) {
    CAPTURE(case_text(c));
    const darray x = random_array(c.x, 1), w = random_array(c.w, 2);
    CHECK(gradient_error([&](const darray& v) { return naive_conv(v, w, nullptr, c.p); },
                         [&](const darray& dy, const darray&) { return naive_conv_dx(dy, w, c.x, c.p); }, x) < 1e-8);
    CHECK(gradient_error([&](const darray& v) { return naive_conv(x, v, nullptr, c.p); },
                         [&](const darray& dy, const darray&) { return naive_conv_dw(dy, x, c.w, c.p); }, w) < 1e-8);
  }
}

TEST_CASE("conv2d forward, backward data, backward weights and both at once equal the loops, in each layout") {
  for (const cpu::conv_layouts layouts : {cpu::conv_layouts::measured, cpu::conv_layouts::blocked,
                                          cpu::conv_layouts::plain}) {
    const layouts_scope scope(layouts);
    CHECK(cpu::dnnl_conv_layouts() == layouts);
    std::uint64_t seed = 10;
    for (const conv_case& c : conv_grid()) {
      CAPTURE(int(layouts));
      CAPTURE(case_text(c));
      const darray x = random_array(c.x, seed++), w = random_array(c.w, seed++);
      const darray b = random_array({c.w[0]}, seed++);
      const shape_t ys = out_shape(c.x, c.w, c.p);
      const darray dy = random_array(ys, seed++);
      const farray xf = to_float(x), wf = to_float(w), bf = to_float(b), dyf = to_float(dy);

      CHECK(relative_error(to_double(cpu::conv2d_forward(xf, wf, nullptr, c.p)), naive_conv(x, w, nullptr, c.p)) <
            tol);
      CHECK(relative_error(to_double(cpu::conv2d_forward(xf, wf, &bf, c.p)), naive_conv(x, w, &b, c.p)) < tol);
      CHECK(relative_error(to_double(cpu::conv2d_backward_data(dyf, wf, c.x, c.p)), naive_conv_dx(dy, w, c.x, c.p)) <
            tol);
      const auto g = cpu::conv2d_backward_weights(dyf, xf, c.w, true, c.p);
      CHECK(relative_error(to_double(g.dw), naive_conv_dw(dy, x, c.w, c.p)) < tol);
      CHECK(relative_error(to_double(g.db), naive_conv_db(dy)) < tol);
      CHECK(cpu::conv2d_backward_weights(dyf, xf, c.w, false, c.p).db.size() == 0);

      // Both at once: dy reordered once, the same numbers; no dx unless asked.
      const auto all = cpu::conv2d_backward(dyf, xf, wf, true, true, c.p);
      CHECK(relative_error(to_double(all.dx), naive_conv_dx(dy, w, c.x, c.p)) < tol);
      CHECK(relative_error(to_double(all.dw), naive_conv_dw(dy, x, c.w, c.p)) < tol);
      CHECK(relative_error(to_double(all.db), naive_conv_db(dy)) < tol);
      const auto weights_only = cpu::conv2d_backward(dyf, xf, wf, false, false, c.p);
      CHECK(weights_only.dx.size() == 0);
      CHECK(weights_only.db.size() == 0);
      CHECK(weights_only.dw == all.dw);
    }
  }
}

TEST_CASE("a measured 1x1 convolution keeps one layout: later calls create no primitive and repeat its numbers") {
  const layouts_scope scope(cpu::conv_layouts::measured);
  const conv_case c{{2, 16, 28, 28}, {24, 16, 1, 1}, {1, 1}};  // a plane of 28 x 28: measured
  const farray x = to_float(random_array(c.x, 21)), w = to_float(random_array(c.w, 22));
  const farray dy = to_float(random_array(out_shape(c.x, c.w, c.p), 23));
  const farray y = cpu::conv2d_forward(x, w, nullptr, c.p);
  const auto g = cpu::conv2d_backward(dy, x, w, true, false, c.p);
  const farray dx = cpu::conv2d_backward_data(dy, w, c.x, c.p);
  const farray dw = cpu::conv2d_backward_weights(dy, x, c.w, false, c.p).dw;
  CHECK(relative_error(to_double(y), naive_conv(to_double(x), to_double(w), nullptr, c.p)) < tol);
  CHECK(relative_error(to_double(g.dx), naive_conv_dx(to_double(dy), to_double(w), c.x, c.p)) < tol);
  const std::size_t made = cpu::detail::primitives_created();
  for (int i = 0; i < 3; ++i) {
    CHECK(cpu::conv2d_forward(x, w, nullptr, c.p) == y);
    const auto again = cpu::conv2d_backward(dy, x, w, true, false, c.p);
    CHECK(again.dx == g.dx);
    CHECK(again.dw == g.dw);
    CHECK(cpu::conv2d_backward_data(dy, w, c.x, c.p) == dx);
    CHECK(cpu::conv2d_backward_weights(dy, x, c.w, false, c.p).dw == dw);
  }
  CHECK(cpu::detail::primitives_created() == made);
  // Other threads take the layout measured here: the same numbers.
  farray y_thread;
  std::thread([&] { y_thread = cpu::conv2d_forward(x, w, nullptr, c.p); }).join();
  CHECK(y_thread == y);
}

TEST_CASE("conv2d with a fused ReLU equals max(conv + bias, 0)") {
  const conv_case c{{2, 3, 7, 7}, {5, 3, 3, 3}, {1, 1, pad2d::uniform(1)}};
  const darray x = random_array(c.x, 3), w = random_array(c.w, 4), b = random_array({5}, 5);
  darray want = naive_conv(x, w, &b, c.p);
  for (std::size_t i = 0; i < want.size(); ++i) want.data()[i] = std::max(want.data()[i], 0.0);
  const farray bf = to_float(b);
  CHECK(relative_error(to_double(cpu::conv2d_forward(to_float(x), to_float(w), &bf, c.p, true)), want) < tol);
}

TEST_CASE("conv2d on dnnl_tensor operands equals the xarray path, in the format oneDNN chose") {
  for (const conv_case& c : {conv_case{{2, 16, 8, 8}, {32, 16, 3, 3}, {1, 1, pad2d::uniform(1)}},
                             conv_case{{2, 32, 8, 8}, {16, 32, 1, 1}, {2, 2}},
                             conv_case{{1, 3, 9, 9}, {16, 3, 3, 3}, {1, 1, pad2d::uniform(1)}}}) {
    CAPTURE(case_text(c));
    const farray x = to_float(random_array(c.x, 6)), w = to_float(random_array(c.w, 7));
    const farray b = to_float(random_array({c.w[0]}, 8));
    const farray dy = to_float(random_array(out_shape(c.x, c.w, c.p), 9));
    const cpu::dnnl_tensor tx = cpu::dnnl_tensor::from_xarray(x), tdy = cpu::dnnl_tensor::from_xarray(dy);
    CHECK(tx.is_plain());
    CHECK(tx.to_xarray() == x);

    const cpu::dnnl_tensor ty = cpu::conv2d_forward(tx, w, &b, c.p);
    CHECK(ty.shape() == out_shape(c.x, c.w, c.p));
    CHECK(relative_error(ty.to_xarray(), cpu::conv2d_forward(x, w, &b, c.p)) < 1e-6);
    // A layer's output feeds the next layer's backward as it is.
    CHECK(relative_error(cpu::conv2d_backward_data(tdy, w, c.x, c.p).to_xarray(),
                         cpu::conv2d_backward_data(dy, w, c.x, c.p)) < 1e-6);
    CHECK(relative_error(cpu::conv2d_backward_weights(tdy, tx, c.w, true, c.p).dw,
                         cpu::conv2d_backward_weights(dy, x, c.w, true, c.p).dw) < 1e-6);
    const auto both = cpu::conv2d_backward(tdy, tx, w, true, true, c.p);
    CHECK(relative_error(both.dx.to_xarray(), cpu::conv2d_backward_data(dy, w, c.x, c.p)) < 1e-6);
    CHECK(relative_error(both.dw, cpu::conv2d_backward_weights(dy, x, c.w, true, c.p).dw) < 1e-6);
    CHECK(!cpu::conv2d_backward(tdy, tx, w, false, false, c.p).dx);
    // dnnl_tensor's memory in oneDNN's own format goes in as it is.
    const cpu::dnnl_tensor ty2 = cpu::conv2d_forward(ty, to_float(random_array({8, c.w[0], 1, 1}, 10)), nullptr,
                                                     conv2d_params{});
    CHECK(ty2.shape()[1] == 8);
  }
}

TEST_CASE("weights kept in the forward's layout give the plain weights' numbers; dw comes in the primitive's") {
  // A 3x3 and a strided 1x1 convolution (blocked weights), grouped (5-D weights), a stem
  // of 3 input channels (one-block weights), and weights whose channels leave partial
  // blocks (padded: not a permutation of the plain ones).
  for (const conv_case& c : {conv_case{{2, 16, 8, 8}, {32, 16, 3, 3}, {1, 1, pad2d::uniform(1)}},
                             conv_case{{2, 32, 8, 8}, {16, 32, 1, 1}, {2, 2}},
                             conv_case{{2, 32, 6, 6}, {64, 16, 3, 3}, {1, 1, pad2d::uniform(1), 1, 1, 2}},
                             conv_case{{2, 3, 9, 9}, {16, 3, 3, 3}, {1, 1, pad2d::uniform(1)}},
                             conv_case{{2, 20, 6, 6}, {24, 20, 3, 3}, {1, 1, pad2d::uniform(1)}}}) {
    CAPTURE(case_text(c));
    const layouts_scope blocked(cpu::conv_layouts::blocked);
    const farray x = to_float(random_array(c.x, 31)), w = to_float(random_array(c.w, 32));
    const farray dy = to_float(random_array(out_shape(c.x, c.w, c.p), 33));
    const std::optional<cpu::dnnl_form> f = cpu::conv2d_forward_weights<farray>(c.x, w, false, c.p);
    REQUIRE(f.has_value());
    CHECK(f->shape() == c.w);
    CHECK(!(f->memory().get_desc() == cpu::detail::plain_desc(cpu::detail::to_dims(c.w))));
    farray back = farray::from_shape(c.w);
    f->to_plain(back.data());
    CHECK(back == w);
    // The same primitives on the same values: equal, not merely close.
    CHECK(cpu::conv2d_forward(x, *f, nullptr, c.p) == cpu::conv2d_forward(x, w, nullptr, c.p));
    const auto kept = cpu::conv2d_backward(dy, x, *f, true, false, c.p);
    const auto plain = cpu::conv2d_backward(dy, x, w, true, false, c.p);
    CHECK(kept.dx == plain.dx);
    farray dw = farray::from_shape(c.w);
    kept.dw.to_plain(dw.data());
    CHECK(dw == plain.dw);
    CHECK(kept.dw.same_layout(*f));  // what the optimizers need to update weights and dw in place
    CHECK(cpu::conv2d_backward_data(dy, *f, c.x, c.p) == plain.dx);
    // A permutation where no channel block is partial; the copy's values are its own.
    CHECK(f->is_permutation() == (c.w[0] % 16 == 0 && (c.w[1] % 16 == 0 || c.w[1] == 3)));
    std::unique_ptr<tessera::host_form<float>> copy = f->empty_like();
    copy->from_plain(w.data());
    CHECK(copy->same_layout(*f));
    CHECK(std::vector<float>(copy->values().begin(), copy->values().end()) ==
          std::vector<float>(f->values().begin(), f->values().end()));
    CHECK(copy->values().data() != f->values().data());
    CHECK(f->layout_only()->same_layout(*f));
    CHECK_THROWS_WITH_AS(cpu::conv2d_backward(dy, x, *f, true, true, c.p),
                         "conv2d_backward: weights in a dnnl_form take no bias", tessera::error);
  }
  // Nothing where the forward reads the weights plain.
  const layouts_scope gemm(cpu::conv_layouts::plain);
  const conv_case c{{2, 16, 8, 8}, {32, 16, 1, 1}, {1, 1}};
  CHECK(!cpu::conv2d_forward_weights<farray>(c.x, to_float(random_array(c.w, 34)), false, c.p).has_value());
}

TEST_CASE("a repeated conv2d call creates no primitive") {
  const conv_case c{{2, 4, 6, 6}, {4, 4, 3, 3}, {1, 1, pad2d::uniform(1)}};
  const farray x = to_float(random_array(c.x, 1)), w = to_float(random_array(c.w, 2));
  const farray dy = to_float(random_array(out_shape(c.x, c.w, c.p), 3));
  auto step = [&] {
    (void)cpu::conv2d_forward(x, w, nullptr, c.p);
    (void)cpu::conv2d_backward_data(dy, w, c.x, c.p);
    (void)cpu::conv2d_backward_weights(dy, x, c.w, false, c.p);
    (void)cpu::conv2d_backward(dy, x, w, true, false, c.p);
  };
  step();
  const std::size_t made = cpu::detail::primitives_created();
  step();
  step();
  CHECK(cpu::detail::primitives_created() == made);
  // Another shape makes new ones.
  (void)cpu::conv2d_forward(to_float(random_array({1, 4, 6, 6}, 4)), w, nullptr, c.p);
  CHECK(cpu::detail::primitives_created() > made);
}

TEST_CASE("threads run conv2d at once, each with its own stream, primitives and scratch buffers") {
  const conv_case c{{2, 16, 8, 8}, {16, 16, 3, 3}, {1, 1, pad2d::uniform(1)}};
  const farray w = to_float(random_array(c.w, 1));
  std::vector<farray> xs, want(4), got(4);
  for (std::uint64_t i = 0; i < 4; ++i) xs.push_back(to_float(random_array(c.x, 10 + i)));
  for (std::size_t i = 0; i < 4; ++i) want[i] = cpu::conv2d_forward(xs[i], w, nullptr, c.p);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 5; ++k) got[i] = cpu::conv2d_forward(xs[i], w, nullptr, c.p);
    });
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < 4; ++i) CHECK(got[i] == want[i]);
  const cpu::dnnl_tensor t = cpu::dnnl_tensor::from_xarray(xs[0]).in_format(dnnl::memory::format_tag::nChw16c);
  CHECK(!t.is_plain());
  CHECK(t.in_format(dnnl::memory::format_tag::nchw).is_plain());
  CHECK(t.to_xarray() == xs[0]);
}

TEST_CASE("the kernels keep freed scratch buffers within a byte budget per thread") {
  const conv_case c{{2, 16, 8, 8}, {16, 16, 3, 3}, {1, 1, pad2d::uniform(1)}};
  const farray x = to_float(random_array(c.x, 3)), w = to_float(random_array(c.w, 4));
  const farray want = cpu::conv2d_forward(x, w, nullptr, c.p);
  const auto& pool = cpu::detail::scratch_pool();
  cpu::set_dnnl_scratch_budget(std::size_t(64) << 20);  // the default; frees what was kept
  CHECK(pool.bytes == 0);
  // Plain arrays are reordered into the layouts the primitive computes in: those copies
  // are kept after the call and taken again by the next one.
  CHECK(cpu::conv2d_forward(x, w, nullptr, c.p) == want);
  const std::size_t kept = pool.bytes;
  CHECK(kept > 0);
  CHECK(cpu::conv2d_forward(x, w, nullptr, c.p) == want);
  CHECK(pool.bytes == kept);
  // A budget below one buffer keeps none.
  cpu::set_dnnl_scratch_budget(64);
  CHECK(pool.bytes == 0);
  CHECK(cpu::conv2d_forward(x, w, nullptr, c.p) == want);
  CHECK(pool.bytes == 0);
  cpu::set_dnnl_scratch_budget(std::size_t(64) << 20);
}

TEST_CASE("conv2d errors name the kernel and the numbers") {
  const farray x = xt::zeros<float>({2, 3, 8, 8});
  const farray w = xt::zeros<float>({4, 3, 3, 3});
  CHECK(thrown([&] { (void)cpu::conv2d_forward(farray(xt::zeros<float>({3, 8, 8})), w, nullptr, {}); }) ==
        "conv2d_forward: x must be 4-D (N, C, H, W), x is (3, 8, 8)");
  CHECK(thrown([&] { (void)cpu::conv2d_forward(x, farray(xt::zeros<float>({4, 2, 3, 3})), nullptr, {}); }) ==
        "conv2d_forward: w (4, 2, 3, 3) needs x with 2 * groups 1 = 2 channels, x is (2, 3, 8, 8)");
  conv2d_params g2;
  g2.groups = 2;
  const farray x6 = xt::zeros<float>({2, 6, 8, 8}), w3 = xt::zeros<float>({3, 3, 3, 3});
  CHECK(thrown([&] { (void)cpu::conv2d_forward(x6, w3, nullptr, g2); }) ==
        "conv2d_forward: groups 2 must divide the output channels of w (3, 3, 3, 3)");
  CHECK(thrown([&] { (void)cpu::conv2d_forward(x, farray(xt::zeros<float>({4, 3, 9, 3})), nullptr, {}); }) ==
        "conv2d_forward: the window does not fit along H: input 8 + padding 0 + 0 < window extent 9 (kernel 9, "
        "dilation 1)");
  conv2d_params bad;
  bad.stride_w = 0;
  CHECK(thrown([&] { (void)cpu::conv2d_forward(x, w, nullptr, bad); }) ==
        "conv2d_forward: stride must be positive, stride is (1, 0)");
  const farray b = xt::zeros<float>({3});
  CHECK(thrown([&] { (void)cpu::conv2d_forward(x, w, &b, {}); }) == "conv2d_forward: bias must be (4,), bias is (3,)");
  CHECK(thrown([&] { (void)cpu::conv2d_backward_data(farray(xt::zeros<float>({2, 4, 5, 6})), w, {2, 3, 8, 8}, {}); }) ==
        "conv2d_backward_data: dy must be (2, 4, 6, 6), dy is (2, 4, 5, 6)");
}
}  // namespace kernels_test_conv
