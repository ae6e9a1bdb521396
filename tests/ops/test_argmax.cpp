// Sharded ArgMax under mpiexec: for every strategy that fits the ranks and every axis,
// with the axis split or not and with ties for the maximum (across ranks too), every
// rank holds the index of the FIRST maximum in the global tensor, as NumPy's argmax
// gives it; int32 and float outputs; bad axes raise the rule's error.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/argmax.hpp>
#include "sharded_testing.hpp"

namespace ops_test_argmax {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::testing;

namespace {

using ctx_t = device_context<test_comm>;

// The single-process reference: the first index of the maximum along `axis`.
xt::xarray<std::int32_t> argmax_ref(const xt::xarray<float>& x, int axis) {
  const std::size_t ax = std::size_t(axis < 0 ? axis + int(x.dimension()) : axis);
  std::size_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < ax; ++d) outer *= x.shape()[d];
  for (std::size_t d = ax + 1; d < x.dimension(); ++d) inner *= x.shape()[d];
  const std::size_t n = x.shape()[ax];
  std::vector<std::size_t> shape;
  for (std::size_t d = 0; d < x.dimension(); ++d)
    if (d != ax) shape.push_back(x.shape()[d]);
  xt::xarray<std::int32_t> y = xt::xarray<std::int32_t>::from_shape(shape);
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t i = 0; i < inner; ++i) {
      std::size_t best = 0;
      for (std::size_t j = 1; j < n; ++j)
        if (x.data()[(o * n + j) * inner + i] > x.data()[(o * n + best) * inner + i]) best = j;
      y.data()[o * inner + i] = std::int32_t(best);
    }
  return y;
}

}  // namespace

TEST_CASE("argmax rule: the reduction's layouts, resolved over the axis group") {
  constexpr argmax_layouts r = static_argmax_rule<strategy{{2, 4}}, 8, extents{16, 8}, -1>;
  static_assert(r.dev == mesh{2, 4});
  static_assert(r.out == layout(mesh{2, 4}, {{0}}));
  static_assert(r.group == axis_list{1});
  CHECK(r.shape == extents{16});
}

TEST_CASE("argmax: every strategy and axis gives the first global maximum's index") {
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  for (const extents& shape : {extents{8, 16}, extents{4, 2, 8}}) {
    // Small integers: many ties, some of them across shards.
    xt::xarray<float> gx = integer_tensor(shape, 1);
    for (std::size_t i = 0; i < gx.size(); ++i) gx.data()[i] = float(int(gx.data()[i]) % 3);
    for (int axis = -1; axis < shape.ndim; ++axis) {
      const xt::xarray<std::int32_t> ref = argmax_ref(gx, axis);
      for (const split_tuple& s : split_tuples(shape, p)) {
        const ops::argmax_op op{strategy{s}, axis};
        CAPTURE(to_string(op.st));
        CAPTURE(axis);
        const argmax_layouts r = op.rule(p, shape);
        const dev_tensor<float> x = shard_of(gx, cases % 2 ? r.in : flat(p, shape.ndim), me);
        const dev_tensor<std::int32_t> y = ops::argmax(op, x, ctx);
        CHECK(y.layout() == r.out);
        CHECK(!y.layout().has_partial());
        CHECK(gather(y, ctx) == ref);
        const dev_tensor<float> yf = ops::argmax<float>(op, x, ctx);
        CHECK(gather(yf, ctx) == xt::cast<float>(ref));
        ++cases;
      }
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " argmax cases checked");
  CHECK(cases > 0);
}

TEST_CASE("argmax: bad axes and strategies name the operator, the rule and the numbers") {
  CHECK_THROWS_WITH_AS((ops::argmax_op{strategy{{2, 4}}, 2}.rule(8, extents{16, 8})),
                       "argmax: reduce: each axis must name a dim of the input: axis 2, input rank 2; strategy "
                       "((2, 4),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::argmax_op{strategy{{2, 4, 1}}, -1}.rule(8, extents{16, 8})),
                       "argmax: operator: each split tuple has one entry per dim of its input: input 0 has 3 "
                       "entries, the input has rank 2; strategy ((2, 4, 1),)",
                       error);
}
}  // namespace ops_test_argmax
