// Sharded OneHot under mpiexec: for every strategy that fits the ranks (the indices'
// dims and the depth split), indices of rank 1 and 2 stored as int32 or as floats,
// with padding (-1) and out-of-range indices, the output equals the single-process
// kernel exactly, with no communication when the indices arrive in the rule's layout;
// bad strategies raise errors naming the rule and the numbers.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/one_hot.hpp>
#include "sharded_testing.hpp"

namespace ops_test_one_hot {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::testing;
namespace k = tessera::kernels::cpu;

namespace {

using ctx_t = device_context<test_comm>;

constexpr index_t depth = 8;

// Indices in [-1, depth]: -1 (padding) and depth (out of range) give rows of `off`.
xt::xarray<std::int32_t> indices_global(const extents& shape) {
  xt::xarray<std::int32_t> x = xt::xarray<std::int32_t>::from_shape(dims_of(shape));
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = std::int32_t((i * 5 + 3) % (depth + 2)) - 1;
  return x;
}

}  // namespace

TEST_CASE("one_hot rule: the output split by the strategy, the indices by its leading entries") {
  constexpr one_hot_layouts r = static_one_hot_rule<strategy{{2, 4}}, 8, extents{16}, 8>;
  static_assert(r.dev == mesh{2, 4});
  static_assert(r.indices == layout(mesh{2, 4}, {{0}}));
  static_assert(r.out == layout(mesh{2, 4}, {{0}, {1}}));
  static_assert(r.shape == extents{16, 8});
  static_assert(r.depth_axis == 1 && r.depth_split == 4);
  // MindSpore's form, with the on and off values' empty tuples; a replica axis leads.
  constexpr one_hot_layouts m =
      static_one_hot_rule<strategy{{2, 1, 2}, split_tuple{}, split_tuple{}}, 8, extents{4, 4}, 6>;
  static_assert(m.dev == mesh{2, 2, 1, 2});
  static_assert(m.indices == layout(mesh{2, 2, 1, 2}, {{1}, {2}}));
  CHECK(m.shape == extents{4, 4, 6});
}

TEST_CASE("one_hot: every strategy equals the single-process kernel") {
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  for (const extents& shape : {extents{16}, extents{4, 4}}) {
    const xt::xarray<std::int32_t> gi = indices_global(shape);
    const xt::xarray<float> gf = xt::cast<float>(gi);
    const xt::xarray<float> ref = k::one_hot<float>(gi, depth, 2.5f, -1.0f);
    extents out = shape;
    out.v[out.ndim++] = depth;
    for (const split_tuple& s : split_tuples(out, p)) {
      for (bool mindspore_form : {false, true}) {
        const strategy st = mindspore_form ? strategy{s, split_tuple{}, split_tuple{}} : strategy{s};
        CAPTURE(to_string(st));
        const ops::one_hot_op op{st, depth};
        const one_hot_layouts r = op.rule(p, shape);
        // int32 indices in the rule's layout: each rank writes its piece, no traffic.
        const dev_tensor<std::int32_t> idx = shard_of(gi, r.indices, me);
        ctx.reset_stats();
        const dev_tensor<float> y = ops::one_hot(op, idx, 2.5f, -1.0f, ctx);
        CHECK(ctx.total_stats().calls == 0);
        CHECK(y.layout() == r.out);
        CHECK(gather(y, ctx) == ref);
        // Float indices, replicated on the flat mesh: redistributed first.
        const dev_tensor<float> fidx = shard_of(gf, flat(p, shape.ndim), me);
        CHECK(gather(ops::one_hot(op, fidx, 2.5f, -1.0f, ctx), ctx) == ref);
        ++cases;
      }
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " one_hot strategy cases checked");
  CHECK(cases > 0);
}

TEST_CASE("one_hot: bad strategies, depths and indices give the rule and the numbers") {
  auto text = [](const strategy& st, const extents& shape, index_t d) {
    std::string out;
    try {
      ops::one_hot_op{st, d}.rule(8, shape);
    } catch (const error& e) {
      out = e.what();
    }
    return out;
  };
  CHECK(text(strategy{{2}}, extents{16}, 8) ==
        "one_hot: the strategy splits the output, whose shape is indices.shape + (depth,): 1 entries "
        "for an output of rank 2; strategy ((2,),)");
  CHECK(text(strategy{{2, 4}, split_tuple{}}, extents{16}, 8) ==
        "one_hot: a strategy is ((output splits),) or ((output splits), (), ()): 2 split tuples; "
        "strategy ((2, 4), ())");
  CHECK(text(strategy{{2, 4}, {1}, split_tuple{}}, extents{16}, 8) ==
        "one_hot: the on and off values are scalars, with empty split tuples: input 1 has 1 entries; "
        "strategy ((2, 4), (1,), ())");
  CHECK(text(strategy{{2, 4}}, extents{16}, 6) ==
        "one_hot: layout: a tensor dim must be divisible by the product of its splits: dim 1 has extent 6, "
        "split into 4 pieces; strategy ((2, 4),)");
  CHECK(text(strategy{{2, 4}}, extents{16}, -1) == "one_hot: depth must not be negative: depth -1; strategy ((2, 4),)");
  CHECK(text(strategy{{4, 4}}, extents{16}, 8) ==
        "one_hot: strategy: the product of an input's splits must divide the device count: input 0: "
        "product of splits 16, device count 8; strategy ((4, 4),)");
  test_comm world = test_world();
  ctx_t ctx(world);
  dev_tensor<float> half = shard_of(xt::xarray<float>{0.0f, 1.5f}, flat(world.size(), 1), world.rank());
  CHECK_THROWS_WITH_AS(ops::one_hot(ops::one_hot_op{strategy{{1, 1}}, 4}, half, 1.0f, 0.0f, ctx),
                       "one_hot: index 1.5 at local position 1 is not an integer", error);
}
}  // namespace ops_test_one_hot
