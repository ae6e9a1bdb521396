// Sharded Softmax and LogSoftmax along one axis under mpiexec: for every strategy that
// fits the ranks and every axis (the softmax axis split or not), on 2-D and 3-D inputs,
// the output and the input's gradient equal the single-process kernels to float
// rounding, large inputs stay finite, and bad strategies and axes raise the rule's
// error with the numbers.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/softmax_axis.hpp>
#include "sharded_testing.hpp"

namespace ops_test_softmax_axis {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::testing;
namespace k = tessera::kernels::cpu;

namespace {
using ctx_t = device_context<test_comm>;
}  // namespace

TEST_CASE("softmax rule: the input's layout; a split axis names its group") {
  constexpr softmax_layouts r = static_softmax_rule<strategy{{2, 4}}, 8, extents{16, 8}, -1>;
  static_assert(r.dev == mesh{2, 4});
  static_assert(r.in == layout(mesh{2, 4}, {{0}, {1}}));
  static_assert(r.out == r.in);
  static_assert(r.axis == 1);
  static_assert(r.group == axis_list{1});
  constexpr softmax_layouts u = static_softmax_rule<strategy{{2, 1}}, 8, extents{16, 8}, 1>;
  static_assert(u.dev == mesh{4, 2, 1});
  CHECK(u.group.empty());
}

TEST_CASE("softmax, log_softmax: every strategy and axis equals the single-process kernels") {
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  for (const extents& shape : {extents{8, 16}, extents{4, 2, 8}}) {
    const xt::xarray<float> gx = smooth_tensor(shape, 1), gdy = smooth_tensor(shape, 2);
    for (int axis = -1; axis < shape.ndim; ++axis) {
      const xt::xarray<float> sm = k::softmax(gx, axis), lsm = k::log_softmax(gx, axis);
      const xt::xarray<float> dsm = k::softmax_grad(gdy, sm, axis), dlsm = k::log_softmax_grad(gdy, lsm, axis);
      for (const split_tuple& s : split_tuples(shape, p)) {
        const strategy st{s};
        CAPTURE(to_string(st));
        CAPTURE(axis);
        const ops::softmax_op op{st, axis};
        const ops::log_softmax_op lop{st, axis};
        const softmax_layouts r = op.rule(p, shape);
        const bool in_rule_layout = cases % 2 == 0;  // alternately: inputs redistributed first
        const layout l = in_rule_layout ? r.in : flat(p, shape.ndim);
        const dev_tensor<float> x = shard_of(gx, l, me), dy = shard_of(gdy, flat(p, shape.ndim), me);
        const dev_tensor<float> y = ops::softmax(op, x, ctx);
        CHECK(y.layout() == r.out);
        CHECK(close(gather(y, ctx), sm));
        const dev_tensor<float> dx = ops::softmax_backward(op, dy, y, ctx);
        CHECK(dx.layout() == r.in);
        CHECK(close(gather(dx, ctx), dsm));
        const dev_tensor<float> ly = ops::log_softmax(lop, x, ctx);
        CHECK(close(gather(ly, ctx), lsm));
        CHECK(close(gather(ops::log_softmax_backward(lop, dy, ly, ctx), ctx), dlsm));
        ++cases;
      }
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " softmax strategy and axis cases checked");
  CHECK(cases > 0);
}

TEST_CASE("softmax: numerically stable with the axis split") {
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  const extents shape{4, 16};
  const xt::xarray<float> gx = smooth_tensor(shape, 3) * 200.0f + 1000.0f;
  const ops::softmax_op op{strategy{{1, p}}, 1};
  const ops::log_softmax_op lop{strategy{{1, p}}, 1};
  const dev_tensor<float> x = shard_of(gx, op.rule(p, shape).in, me);
  const xt::xarray<float> y = gather(ops::softmax(op, x, ctx), ctx), ly = gather(ops::log_softmax(lop, x, ctx), ctx);
  for (float v : y) CHECK(std::isfinite(v));
  for (float v : ly) CHECK(std::isfinite(v));
  CHECK(close(y, k::softmax(gx, 1)));
  CHECK(close(ly, k::log_softmax(gx, 1)));
}

TEST_CASE("softmax: bad strategies and axes name the operator, the rule and the numbers") {
  CHECK_THROWS_WITH_AS((ops::log_softmax_op{strategy{{2, 4}}, 2}.rule(8, extents{16, 8})),
                       "log_softmax: softmax: the axis must name a dim of the input: axis 2, input rank 2; "
                       "strategy ((2, 4),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::softmax_op{strategy{{2}}, -1}.rule(8, extents{16, 8})),
                       "softmax: operator: each split tuple has one entry per dim of its input: input 0 has 1 "
                       "entries, the input has rank 2; strategy ((2,),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::softmax_op{strategy{{2, 4}, {2, 4}}, -1}.rule(8, extents{16, 8})),
                       "softmax: operator: a strategy has one split tuple per operator input: 2 split tuples "
                       "for 1 inputs; strategy ((2, 4), (2, 4))",
                       error);
  CHECK_THROWS_WITH_AS((ops::softmax_op{strategy{{3, 1}}, -1}.rule(8, extents{16, 8})),
                       "softmax: strategy: the product of an input's splits must divide the device count: "
                       "input 0: product of splits 3, device count 8; strategy ((3, 1),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::softmax_op{strategy{{2, 4}}, -1}.rule(8, extents{16, 6})),
                       "softmax: layout: a tensor dim must be divisible by the product of its splits: dim 1 has "
                       "extent 6, split into 4 pieces; strategy ((2, 4),)",
                       error);
  static_assert(check_softmax(strategy{{2, 4}}, 8, extents{16, 8}, -3) == fail(errc::softmax_axis, -1, -1, -3, 2));
}
}  // namespace ops_test_softmax_axis
