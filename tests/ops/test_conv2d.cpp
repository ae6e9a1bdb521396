// Sharded Conv2D, MaxPool and AvgPool under mpiexec. On one rank: each operator against
// a direct loop written here (strides, paddings including uneven ones, dilations,
// groups, ceil_mode, count_include_pad) and its backward against finite differences. On
// N ranks: every candidate strategy (batch, channel, height and width splits with the
// halo exchange) gives the 1-rank output and gradients to float rounding, and moves
// exactly the bytes its definition lists, also where Conv2D's dx is not wanted. Bad
// shapes and strategies raise errors naming the operator, the dim and the numbers.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>
#include <xtensor/xmath.hpp>
#include <tessera/autodiff/ops.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/core/format.hpp>
#include "sharded_testing.hpp"

using namespace tessera;
using namespace tessera::testing;
using kernels::conv2d_params;
using kernels::pad2d;
using kernels::pool2d_params;

namespace {

using ctx_t = device_context<test_comm>;

// ---- direct references, in double ---------------------------------------------------

double at(const xt::xarray<float>& x, std::size_t n, std::size_t c, long i, long j) {
  if (i < 0 || j < 0 || i >= long(x.shape()[2]) || j >= long(x.shape()[3])) return 0.0;
  return double(x(n, c, std::size_t(i), std::size_t(j)));
}

xt::xarray<double> conv_ref(const xt::xarray<float>& x, const xt::xarray<float>& w, const conv2d_params& p) {
  const std::size_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
  const std::size_t O = w.shape()[0], CG = w.shape()[1], KH = w.shape()[2], KW = w.shape()[3];
  const long OH = kernels::window_output_size(long(H), long(KH), p.stride_h, p.pad.top, p.pad.bottom, p.dilation_h);
  const long OW = kernels::window_output_size(long(W), long(KW), p.stride_w, p.pad.left, p.pad.right, p.dilation_w);
  xt::xarray<double> y = xt::xarray<double>::from_shape({N, O, std::size_t(OH), std::size_t(OW)});
  const std::size_t per_group = O / std::size_t(p.groups);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t o = 0; o < O; ++o)
      for (long i = 0; i < OH; ++i)
        for (long j = 0; j < OW; ++j) {
          double s = 0;
          const std::size_t g = o / per_group;
          for (std::size_t cg = 0; cg < CG; ++cg)
            for (std::size_t kh = 0; kh < KH; ++kh)
              for (std::size_t kw = 0; kw < KW; ++kw)
                s += at(x, n, g * CG + cg, i * p.stride_h - p.pad.top + long(kh) * p.dilation_h,
                        j * p.stride_w - p.pad.left + long(kw) * p.dilation_w) *
                     double(w(o, cg, kh, kw));
          y(n, o, std::size_t(i), std::size_t(j)) = s;
        }
  (void)C;
  return y;
}

xt::xarray<double> pool_ref(const xt::xarray<float>& x, const pool2d_params& p, bool max) {
  const std::size_t N = x.shape()[0], C = x.shape()[1];
  const long H = long(x.shape()[2]), W = long(x.shape()[3]);
  const long OH = kernels::window_output_size(H, p.kernel_h, p.stride_h, p.pad.top, p.pad.bottom, 1, p.ceil_mode);
  const long OW = kernels::window_output_size(W, p.kernel_w, p.stride_w, p.pad.left, p.pad.right, 1, p.ceil_mode);
  xt::xarray<double> y = xt::xarray<double>::from_shape({N, C, std::size_t(OH), std::size_t(OW)});
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t c = 0; c < C; ++c)
      for (long i = 0; i < OH; ++i)
        for (long j = 0; j < OW; ++j) {
          double best = -std::numeric_limits<double>::infinity(), sum = 0;
          long inside = 0, padded = 0;
          for (long kh = 0; kh < p.kernel_h; ++kh)
            for (long kw = 0; kw < p.kernel_w; ++kw) {
              const long r = i * p.stride_h - p.pad.top + kh, q = j * p.stride_w - p.pad.left + kw;
              // PyTorch's divisor: the window clipped to the padded image.
              if (r < H + p.pad.bottom && q < W + p.pad.right) ++padded;
              if (r < 0 || q < 0 || r >= H || q >= W) continue;
              best = std::max(best, at(x, n, c, r, q));
              sum += at(x, n, c, r, q);
              ++inside;
            }
          y(n, c, std::size_t(i), std::size_t(j)) = max ? best : sum / double(p.count_include_pad ? padded : inside);
        }
  return y;
}

// ---- running an operator ------------------------------------------------------------

struct result {
  xt::xarray<float> y;
  std::vector<xt::xarray<float>> grads;
  std::int64_t bytes = 0;
};

// The operator's output and input gradients for dy, run on the ranks of `ctx` with its
// inputs given replicated (so each is laid out by the operator), gathered whole.
template <class Op, class C>
result run(const Op& op, const std::vector<xt::xarray<float>>& xs, const xt::xarray<float>& dy, device_context<C>& ctx,
           ops::grads_wanted want = {}) {
  const int p = ctx.size(), me = ctx.rank();
  std::vector<tensor_on<float, test_device>> in;
  std::vector<const tensor_on<float, test_device>*> ptrs;
  shape_list shapes;
  for (const auto& x : xs) {
    in.push_back(shard_on<test_device>(x, flat(p, int(x.dimension())), me));
    shapes.v[shapes.n++] = extents_of(std::vector<std::size_t>(x.shape().begin(), x.shape().end()));
  }
  for (const auto& t : in) ptrs.push_back(&t);
  const op_layouts l = op.layouts(op.st, p, shapes);
  // Inputs laid out by the rule first, so the traffic counted is the operator's own.
  std::vector<tensor_on<float, test_device>> laid;
  for (std::size_t i = 0; i < in.size(); ++i) laid.push_back(redistribute(in[i], l.in[i], ctx));
  for (std::size_t i = 0; i < in.size(); ++i) ptrs[i] = &laid[i];
  const auto dyt = redistribute(shard_on<test_device>(dy, flat(p, 4), me), l.out_grad, ctx);
  ctx.reset_stats();
  const ops::op_inputs<float, test_device> span(ptrs.data(), ptrs.size());
  const auto y = ops::run_forward(op, span, ctx);
  const auto g = ops::run_backward(op, dyt, span, y, ctx, want);
  result r;
  r.bytes = ctx.total_stats().bytes;
  r.y = gather(y, ctx);
  // An input whose gradient the backward skipped gets an empty array.
  for (const auto& gi : g) r.grads.push_back(gi ? gather(*gi, ctx) : xt::xarray<float>::from_shape({0}));
  return r;
}

// The bytes rank `rank` receives in the forward and backward by the definition.
template <class Op>
std::int64_t priced(const Op& op, int p, const shape_list& shapes, int rank) {
  std::int64_t b = 0;
  for (const internal_collective& c : ops::collectives_of(op, op.st, p, shapes, 4)) b += c.bytes_on(rank);
  return b;
}

shape_list shapes_of(const std::vector<xt::xarray<float>>& xs) {
  shape_list s;
  for (const auto& x : xs) s.v[s.n++] = extents_of(std::vector<std::size_t>(x.shape().begin(), x.shape().end()));
  return s;
}

// sum(dy * op(x)) differentiated by central differences at element i of input k.
template <class F>
double numeric_grad(F&& f, std::vector<xt::xarray<float>> xs, std::size_t k, std::size_t i, const xt::xarray<float>& dy) {
  const float h = 1e-3f;
  auto loss = [&](float delta) {
    std::vector<xt::xarray<float>> ys = xs;
    ys[k].data()[i] += delta;
    const xt::xarray<double> y = f(ys);
    double s = 0;
    for (std::size_t j = 0; j < y.size(); ++j) s += double(y.data()[j]) * double(dy.data()[j]);
    return s;
  };
  return (loss(h) - loss(-h)) / (2.0 * double(h));
}

}  // namespace

TEST_CASE("conv2d rule: device matrix (n, ci, h, w, co), partial sums over ci, halo geometry") {
  constexpr conv2d_layouts r =
      static_conv2d_rule<strategy{{2, 1, 2, 1}, {2, 1, 1, 1}}, 8, extents{4, 3, 8, 8}, extents{4, 3, 3, 3},
                         conv2d_params{1, 1, pad2d::uniform(1)}>;
  static_assert(r.dev == mesh{2, 1, 2, 1, 2});
  static_assert(r.x == layout(mesh{2, 1, 2, 1, 2}, {{0}, {1}, {2}, {3}}));
  static_assert(r.y.partial == 0);
  static_assert(r.grad_x == r.x.with_partial(4));
  constexpr conv2d_layouts c = static_conv2d_rule<strategy{{1, 2, 1, 1}, {1, 2, 1, 1}}, 4, extents{2, 4, 4, 4},
                                                  extents{2, 4, 1, 1}>;
  static_assert(c.dev == mesh{2, 1, 2, 1, 1, 1});
  static_assert(c.y == layout(c.dev, {{1}, {5}, {3}, {4}}).with_partial(2));
  // A 3x3 stride-1 window with padding 1 over 8 rows split 4 ways: 1 halo row each side.
  constexpr ops::window_axis a{8, 3, 1, 1, 1, 1, 4};
  static_assert(a.halo_before() == 1 && a.halo_after() == 1);
  static_assert(a.recv_before(0) == 0 && a.recv_after(3) == 0 && a.extended(1) == 4);
  static_assert(a.check(2).ok());
  // 7x7 stride 2 padding 3 (ResNet's stem) over 32 rows split 4 ways: 3 rows before, 2 after.
  constexpr ops::window_axis stem{32, 7, 1, 2, 3, 3, 4};
  static_assert(stem.halo_before() == 3 && stem.halo_after() == 2 && stem.check(2).ok());
  // Split finer than the halo: 2 rows per rank, a halo of 3.
  static_assert(ops::window_axis{8, 7, 1, 1, 3, 3, 4}.check(2).code == errc::window_halo);
}

TEST_CASE("conv2d on one rank equals the direct loop over strides, paddings, dilations and groups") {
  any_communicator one = test_solo();
  context ctx(one);
  struct conv_case {
    extents x, w;
    conv2d_params p;
  };
  const std::vector<conv_case> cases = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1, pad2d::uniform(1)}},
      {{1, 2, 9, 8}, {3, 2, 3, 2}, {2, 3, {0, 1, 2, 0}}},
      {{2, 2, 8, 8}, {2, 2, 3, 3}, {1, 1, pad2d::uniform(2), 2, 2}},
      {{1, 4, 6, 6}, {6, 2, 3, 3}, {1, 1, pad2d::uniform(1), 1, 1, 2}},
      {{2, 3, 8, 8}, {4, 3, 1, 1}, {2, 2}},
      {{1, 3, 11, 11}, {2, 3, 7, 7}, {2, 2, pad2d::uniform(3)}},
  };
  for (const conv_case& c : cases) {
    CAPTURE(to_string(c.x));
    CAPTURE(to_string(c.w));
    const xt::xarray<float> x = smooth_tensor(c.x, 1), w = smooth_tensor(c.w, 2);
    const xt::xarray<float> want = xt::cast<float>(conv_ref(x, w, c.p));
    const ops::conv2d_op op{ops::all_ones(shape_list{c.x, c.w}), c.p};
    const extents ys = op.output_shape(shape_list{c.x, c.w});
    const xt::xarray<float> dy = smooth_tensor(ys, 3);
    const result r = run(op, {x, w}, dy, ctx);
    CHECK(close(r.y, want, 1e-4));
    // Finite differences of sum(dy * y) at a few elements of x and of w.
    auto f = [&](const std::vector<xt::xarray<float>>& v) { return conv_ref(v[0], v[1], c.p); };
    for (std::size_t k = 0; k < 2; ++k)
      for (std::size_t i : {std::size_t(0), r.grads[k].size() / 2, r.grads[k].size() - 1}) {
        const double num = numeric_grad(f, {x, w}, k, i, dy);
        CHECK(std::abs(double(r.grads[k].data()[i]) - num) <= 2e-3 * (1.0 + std::abs(num)));
      }
  }
}

TEST_CASE("max and avg pooling on one rank equal the direct loop, the backward finite differences") {
  any_communicator one = test_solo();
  context ctx(one);
  struct pool_case {
    extents x;
    pool2d_params p;
  };
  pool2d_params ceil = pool2d_params::square(2, 2);
  ceil.ceil_mode = true;
  pool2d_params exclude = pool2d_params::square(3, 2, 1);
  exclude.count_include_pad = false;
  const std::vector<pool_case> cases = {
      {{2, 3, 8, 8}, pool2d_params::square(3, 2, 1)},
      {{1, 2, 7, 5}, ceil},
      {{1, 2, 9, 9}, exclude},
      {{2, 1, 6, 8}, {2, 3, 1, 2, {1, 0, 1, 1}}},
  };
  for (const pool_case& c : cases) {
    CAPTURE(to_string(c.x));
    const xt::xarray<float> x = smooth_tensor(c.x, 4);
    for (bool max : {true, false}) {
      CAPTURE(max);
      const strategy st = ops::all_ones(shape_list{c.x});
      const extents ys = ops::max_pool2d_op{st, c.p}.output_shape(shape_list{c.x});
      const xt::xarray<float> dy = smooth_tensor(ys, 5);
      const result r = max ? run(ops::max_pool2d_op{st, c.p}, {x}, dy, ctx) : run(ops::avg_pool2d_op{st, c.p}, {x}, dy, ctx);
      CHECK(close(r.y, xt::xarray<float>(xt::cast<float>(pool_ref(x, c.p, max))), 1e-5));
      auto f = [&](const std::vector<xt::xarray<float>>& v) { return pool_ref(v[0], c.p, max); };
      for (std::size_t i : {std::size_t(1), x.size() / 3, x.size() / 2 + 1, x.size() - 2}) {
        const double num = numeric_grad(f, {x}, 0, i, dy);
        CHECK(std::abs(double(r.grads[0].data()[i]) - num) <= 2e-3 * (1.0 + std::abs(num)));
      }
    }
  }
}

TEST_CASE("conv2d and pooling: every candidate strategy equals one rank and moves the priced bytes") {
  test_comm world = test_world();
  ctx_t ctx(world);
  any_communicator one = test_solo();
  context solo(one);
  const int p = world.size(), me = world.rank();
  int runs = 0;
  auto check_all = [&](const auto& proto, const std::vector<xt::xarray<float>>& xs) {
    const shape_list shapes = shapes_of(xs);
    const extents ys = proto.output_shape(shapes);
    const xt::xarray<float> dy = smooth_tensor(ys, 9);
    auto op1 = proto;
    op1.st = ops::all_ones(shapes);
    const result want = run(op1, xs, dy, solo);
    const auto candidates = proto.candidates(p, shapes);
    CHECK(!candidates.empty());
    for (const strategy& st : candidates) {
      CAPTURE(to_string(st));
      auto op = proto;
      op.st = st;
      const result got = run(op, xs, dy, ctx);
      CHECK(close(got.y, want.y, 1e-4));
      for (std::size_t k = 0; k < xs.size(); ++k) CHECK(close(got.grads[k], want.grads[k], 1e-4));
      CHECK(got.bytes == priced(op, p, shapes, me));
      ++runs;
      if constexpr (std::is_same_v<std::decay_t<decltype(proto)>, ops::conv2d_op>) {
        // x as data: the same dw and the same priced bytes; dx skipped unless H or W is
        // split (the exchange returning its halo rows is part of the priced backward).
        ops::grads_wanted only_w;
        only_w.skip(0);
        const result w_only = run(op, xs, dy, ctx, only_w);
        CHECK(close(w_only.grads[1], want.grads[1], 1e-4));
        CHECK(w_only.bytes == got.bytes);
        const ops::window_split s = op.split(op.st, p, shapes);
        CHECK(w_only.grads[0].size() == (s.h.parts > 1 || s.w.parts > 1 ? xs[0].size() : 0));
      }
    }
  };
  SUBCASE("3x3 convolution, padding 1") {
    check_all(ops::conv2d_op{{}, {1, 1, pad2d::uniform(1)}}, {smooth_tensor({4, 4, 8, 8}, 1), smooth_tensor({4, 4, 3, 3}, 2)});
  }
  SUBCASE("7x7 stride-2 convolution, padding 3 (ResNet's stem)") {
    check_all(ops::conv2d_op{{}, {2, 2, pad2d::uniform(3)}}, {smooth_tensor({2, 2, 16, 16}, 1), smooth_tensor({2, 2, 7, 7}, 2)});
  }
  SUBCASE("1x1 stride-2 convolution (a downsampling shortcut)") {
    check_all(ops::conv2d_op{{}, {2, 2}}, {smooth_tensor({2, 4, 8, 8}, 1), smooth_tensor({8, 4, 1, 1}, 2)});
  }
  SUBCASE("grouped, dilated convolution") {
    check_all(ops::conv2d_op{{}, {1, 1, pad2d::uniform(2), 2, 2, 2}}, {smooth_tensor({2, 4, 8, 8}, 1), smooth_tensor({4, 2, 3, 3}, 2)});
  }
  SUBCASE("3x3 stride-2 max pooling, padding 1 (ResNet's)") {
    check_all(ops::max_pool2d_op{{}, pool2d_params::square(3, 2, 1)}, {smooth_tensor({2, 4, 16, 16}, 3)});
  }
  SUBCASE("2x2 average pooling") {
    check_all(ops::avg_pool2d_op{{}, pool2d_params::square(2, 2)}, {smooth_tensor({4, 2, 8, 8}, 3)});
  }
  SUBCASE("3x3 stride-1 average pooling, padding 1, padding not counted") {
    pool2d_params q = pool2d_params::square(3, 1, 1);
    q.count_include_pad = false;
    check_all(ops::avg_pool2d_op{{}, q}, {smooth_tensor({2, 2, 8, 8}, 3)});
  }
  if (me == 0) MESSAGE(runs << " strategies on " << p << " ranks");
}

TEST_CASE("conv2d and pooling: bad shapes and strategies name the operator, the dim and the numbers") {
  const shape_list in{extents{2, 3, 8, 8}, extents{4, 4, 3, 3}};
  CHECK_THROWS_WITH_AS(ops::conv2d_op{}.output_shape(in),
                       "conv2d: w (4, 4, 3, 3) needs x with 4 * groups 1 = 4 channels, x is (2, 3, 8, 8)", error);
  const shape_list ok{extents{2, 4, 8, 8}, extents{4, 4, 3, 3}};
  CHECK_THROWS_WITH_AS((ops::conv2d_op{}.output_shape(shape_list{extents{1, 4, 2, 8}, extents{4, 4, 3, 3}})),
                       doctest::Contains("the window does not fit along H: input 2 + padding 0 + 0 < window extent 3"),
                       error);
  CHECK_THROWS_WITH_AS((ops::conv2d_op{strategy{{1, 2, 1, 1}, {1, 1, 1, 1}}, {1, 1, pad2d::uniform(1)}}.rule(2, ok)),
                       doctest::Contains("conv2d: w is split (co, ci, 1, 1) with ci as x's channel split: w dim 1: "
                                         "split 1, wanted 2"),
                       error);
  // 8 rows split 8 ways under a 5x5 window with padding 2: a halo of 2 rows, 1 row per rank.
  CHECK_THROWS_WITH_AS((ops::conv2d_op{strategy{{1, 1, 8, 1}, {1, 1, 1, 1}}, {1, 1, pad2d::uniform(2)}}.rule(
                           8, shape_list{extents{1, 4, 8, 8}, extents{4, 4, 5, 5}})),
                       doctest::Contains("must hold the kernel's halo on each rank (split less finely): dim 2: halo 2 "
                                         "rows, 1 rows per rank"),
                       error);
  // Padding 0 under a 3x3 window: 6 outputs from 8 rows, not 8 / 1.
  CHECK_THROWS_WITH_AS((ops::conv2d_op{strategy{{1, 1, 2, 1}, {1, 1, 1, 1}}, {}}.rule(2, ok)),
                       doctest::Contains("dim 2: output 6, input / stride 8"), error);
  CHECK_THROWS_WITH_AS((ops::max_pool2d_op{strategy{{1, 1, 1, 4}}, pool2d_params::square(2, 2)}.rule(
                           4, shape_list{extents{1, 1, 12, 12}})),
                       doctest::Contains("max_pool2d: window: a split height or width must hold a multiple of the "
                                         "stride on each rank: dim 3: 3 rows per rank, stride 2"),
                       error);
}
