// Sharded Transpose, Reshape, Flatten, StridedSlice and Concat under mpiexec: for every
// strategy that fits the ranks, the output and the gradients equal the single-process
// kernels exactly. What the rules promise about communication is measured: Transpose
// and Concat move no data; Reshape moves none unless its rule says `moves`, StridedSlice
// none unless a cut dim was split; every layout is the rule's. Bad strategies and
// shapes raise the rule's error with the numbers.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/shape.hpp>
#include "sharded_testing.hpp"

namespace ops_test_shape {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::testing;
namespace k = tessera::kernels::cpu;

namespace {

using ctx_t = device_context<test_comm>;
constexpr index_t end_of_dim = std::numeric_limits<index_t>::max();
constexpr index_t before_start = std::numeric_limits<index_t>::min();

std::vector<int> to_vector(const dim_list& l) { return std::vector<int>(l.v.begin(), l.v.begin() + l.n); }
std::vector<index_t> to_vector(const index_list& l) { return std::vector<index_t>(l.v.begin(), l.v.begin() + l.n); }

// The number of communicating calls `f` makes on every rank's communicators.
template <class F>
std::int64_t calls_of(ctx_t& ctx, F&& f) {
  ctx.reset_stats();
  f();
  return ctx.total_stats().calls;
}

}  // namespace

TEST_CASE("shape rules: the layouts of the doc examples") {
  // Transpose permutes the splits.
  constexpr transpose_layouts t = static_transpose_rule<strategy{{2, 4}}, 8, extents{16, 8}, dim_list{1, 0}>;
  static_assert(t.out == layout(mesh{2, 4}, {{1}, {0}}));
  static_assert(t.shape == extents{8, 16});
  // Reshape (16, 6) -> (2, 8, 6) with (4, 2): 4 pieces do not divide the first target
  // dim (2), so axis 0 is gathered; dim 1's split survives.
  constexpr reshape_layouts a = static_reshape_rule<strategy{{4, 2}}, 8, extents{16, 6}, extents{2, 8, 6}>;
  static_assert(a.moves);
  static_assert(a.in == layout(mesh{4, 2}, {{}, {1}}));
  static_assert(a.out == layout(mesh{4, 2}, {{}, {}, {1}}));
  // (4, 6) -> (24,) with (2, 1) on 8 devices: the rows' split survives as the split of
  // the flat dim (the axis of size 1 stays on dim 1: it moves nothing).
  constexpr reshape_layouts b = static_reshape_rule<strategy{{2, 1}}, 8, extents{4, 6}, extents{-1}>;
  static_assert(!b.moves);
  static_assert(b.in == layout(mesh{4, 2, 1}, {{1}, {2}}));
  static_assert(b.out == layout(mesh{4, 2, 1}, {{1}}));
  static_assert(b.shape == extents{24});
  // (4, 6) -> (24,) with (1, 2): the split moves to dim 0 (an AllToAll), then survives.
  constexpr reshape_layouts c = static_reshape_rule<strategy{{1, 2}}, 8, extents{4, 6}, extents{24}>;
  static_assert(c.moves);
  static_assert(c.in == layout(mesh{4, 1, 2}, {{1, 2}, {}}));
  static_assert(c.out == layout(mesh{4, 1, 2}, {{2}}));
  // (4, 6) -> (2, 2, 6) with (2, 2): groups (4) -> (2, 2) and (6) -> (6); both survive.
  constexpr reshape_layouts d = static_reshape_rule<strategy{{2, 2}}, 4, extents{4, 6}, extents{2, 2, 6}>;
  static_assert(!d.moves);
  static_assert(d.out == layout(mesh{2, 2}, {{0}, {}, {1}}));
  // Flatten (4, 2, 6) -> (4, 12) with (2, 2, 1): the rows keep axis 0; the group
  // (2, 6) -> (12) keeps axis 1 (2 divides 2 and 12).
  constexpr reshape_layouts f = static_flatten_rule<strategy{{2, 2, 1}}, 4, extents{4, 2, 6}>;
  static_assert(!f.moves && f.shape == extents{4, 12});
  static_assert(f.out == layout(mesh{2, 2, 1}, {{0}, {1}}));
  // StridedSlice: dim 1 cut, dim 0 taken whole keeps its split.
  constexpr strided_slice_layouts s = static_strided_slice_rule<strategy{{2, 4}}, 8, extents{8, 16},
                                                                index_list{0, 2}, index_list{8, 10},
                                                                index_list{1, 2}>;
  static_assert(s.moves && s.cut == 2u);
  static_assert(s.in == layout(mesh{2, 4}, {{0}, {}}));
  static_assert(s.shape == extents{8, 4});
  static_assert(python_slice(6, 4, -7, -2) == slice_range{4, -2, 3});
  // Concat of (8, 4) and (8, 12) along axis 1, rows split 2 ways on 8 devices.
  constexpr concat_layouts cc =
      static_concat_rule<strategy{{2, 1}, {2, 1}}, 8, shape_list{extents{8, 4}, extents{8, 12}}, 1>;
  static_assert(cc.dev == mesh{4, 2, 1});
  static_assert(cc.out == layout(mesh{4, 2, 1}, {{1}, {2}}));
  CHECK(cc.shape == extents{8, 16});
}

TEST_CASE("transpose: every strategy and perm, without communication") {
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  struct perm_case {
    extents shape;
    std::vector<dim_list> perms;
  };
  const std::vector<perm_case> all = {
      {extents{8, 4}, {dim_list{1, 0}, dim_list{0, 1}, dim_list{-1, 0}}},
      {extents{4, 2, 8}, {dim_list{0, 2, 1}, dim_list{1, 0, 2}, dim_list{1, 2, 0}, dim_list{2, 0, 1}, dim_list{2, 1, 0}}},
  };
  for (const perm_case& pc : all) {
    const xt::xarray<float> gx = integer_tensor(pc.shape, 1);
    for (const dim_list& perm : pc.perms) {
      const xt::xarray<float> y_ref = k::transpose(gx, to_vector(perm));
      const extents ys = extents_of(std::vector<std::size_t>(y_ref.shape().begin(), y_ref.shape().end()));
      const xt::xarray<float> gdy = integer_tensor(ys, 2);
      const xt::xarray<float> dx_ref = k::transpose_grad(gdy, to_vector(perm));
      for (const split_tuple& s : split_tuples(pc.shape, p)) {
        const ops::transpose_op op{strategy{s}, perm};
        CAPTURE(to_string(op.st));
        const transpose_layouts r = op.rule(p, pc.shape);
        const dev_tensor<float> x = shard_of(gx, r.in, me);
        dev_tensor<float> y(r.out, ys, me);
        CHECK(calls_of(ctx, [&] { y = ops::transpose(op, x, ctx); }) == 0);
        CHECK(y.layout() == r.out);
        CHECK(gather(y, ctx) == y_ref);
        const dev_tensor<float> dy = shard_of(gdy, r.out, me);
        dev_tensor<float> dx(r.in, pc.shape, me);
        CHECK(calls_of(ctx, [&] { dx = ops::transpose_backward(op, dy, x, ctx); }) == 0);
        CHECK(gather(dx, ctx) == dx_ref);
        // From the flat mesh: redistributed, same values.
        CHECK(gather(ops::transpose(op, shard_of(gx, flat(p, pc.shape.ndim), me), ctx), ctx) == y_ref);
        ++cases;
      }
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " transpose cases checked");
  CHECK(cases > 0);
}

TEST_CASE("reshape and flatten: every strategy; shards stay in place unless the rule moves them") {
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0, kept = 0;
  struct reshape_case {
    extents shape;
    std::vector<extents> targets;
  };
  const std::vector<reshape_case> all = {
      {extents{8, 6}, {extents{48}, extents{4, 12}, extents{2, 4, 6}, extents{-1, 3}, extents{6, 8}, extents{8, 6}}},
      {extents{4, 2, 6}, {extents{8, 6}, extents{4, 12}, extents{48}, extents{2, 2, 2, 6}, extents{4, 1, 2, 6}}},
      {extents{8, 1, 4}, {extents{8, 4}, extents{2, 16}}},
      {extents{16}, {extents{2, 8}, extents{4, -1}, extents{16, 1}}},
  };
  for (const reshape_case& rc : all) {
    const xt::xarray<float> gx = integer_tensor(rc.shape, 1);
    for (const extents& target : rc.targets) {
      const xt::xarray<float> y_ref = k::reshape(gx, std::vector<index_t>(target.v.begin(), target.v.begin() + target.ndim));
      const extents ys = extents_of(std::vector<std::size_t>(y_ref.shape().begin(), y_ref.shape().end()));
      const xt::xarray<float> gdy = integer_tensor(ys, 2);
      const xt::xarray<float> dx_ref =
          k::reshape(gdy, std::vector<index_t>(rc.shape.v.begin(), rc.shape.v.begin() + rc.shape.ndim));
      for (const split_tuple& s : split_tuples(rc.shape, p)) {
        const ops::reshape_op op{strategy{s}, target};
        CAPTURE(to_string(op.st));
        CAPTURE(to_string(rc.shape));
        CAPTURE(to_string(target));
        const reshape_layouts r = op.rule(p, rc.shape);
        CHECK(r.shape == ys);
        // x as the strategy lays it out: no traffic exactly when the rule keeps it in place.
        const dev_tensor<float> x = shard_of(gx, strategy_layout(s, p), me);
        dev_tensor<float> y(r.out, ys, me);
        const std::int64_t calls = calls_of(ctx, [&] { y = ops::reshape(op, x, ctx); });
        if (p > 1) CHECK((calls == 0) == !r.moves);
        kept += r.moves ? 0 : 1;
        CHECK(y.layout() == r.out);
        CHECK(gather(y, ctx) == y_ref);
        const dev_tensor<float> dy = shard_of(gdy, r.out, me);
        dev_tensor<float> dx(r.in, rc.shape, me);
        CHECK(calls_of(ctx, [&] { dx = ops::reshape_backward(op, dy, x, ctx); }) == 0);
        CHECK(dx.layout() == r.in);
        CHECK(gather(dx, ctx) == dx_ref);
        ++cases;
      }
    }
  }
  // Flatten keeps the batch dim: (4, 2, 6) -> (4, 12).
  const extents fs{4, 2, 6};
  const xt::xarray<float> gx = integer_tensor(fs, 3);
  for (const split_tuple& s : split_tuples(fs, p)) {
    const ops::flatten_op op{strategy{s}};
    CAPTURE(to_string(op.st));
    const dev_tensor<float> x = shard_of(gx, flat(p, 3), me);
    const dev_tensor<float> y = ops::flatten(op, x, ctx);
    CHECK(y.global_shape() == extents{4, 12});
    CHECK(gather(y, ctx) == k::reshape(gx, {4, 12}));
    CHECK(gather(ops::flatten_backward(op, y, x, ctx), ctx) == gx);
    ++cases;
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " reshape cases checked, " << kept << " without moving data");
  CHECK(cases > 0);
}

TEST_CASE("strided_slice: every strategy; whole dims keep their splits, cut dims are gathered") {
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  struct slice_case {
    extents shape;
    index_list begin, end, strides;
  };
  const std::vector<slice_case> all = {
      {extents{8, 12}, index_list{0, 2}, index_list{8, 10}, index_list{1, 2}},
      {extents{8, 12}, index_list{1}, index_list{7}, index_list{}},
      {extents{8, 12}, index_list{-1, 0}, index_list{before_start, end_of_dim}, index_list{-2, 1}},
      {extents{8, 12}, index_list{0, 0}, index_list{8, 12}, index_list{}},
      {extents{4, 2, 8}, index_list{0, 0, 1}, index_list{4, 2, 8}, index_list{1, 1, 3}},
      {extents{4, 2, 8}, index_list{-3, 1}, index_list{end_of_dim, 2}, index_list{1, 1}},
  };
  for (const slice_case& sc : all) {
    const xt::xarray<float> gx = integer_tensor(sc.shape, 1);
    const auto b = to_vector(sc.begin), e = to_vector(sc.end), st = to_vector(sc.strides);
    const xt::xarray<float> y_ref = k::strided_slice(gx, b, e, st);
    const extents ys = extents_of(std::vector<std::size_t>(y_ref.shape().begin(), y_ref.shape().end()));
    const xt::xarray<float> gdy = integer_tensor(ys, 2);
    const xt::xarray<float> dx_ref = k::strided_slice_grad(gdy, gx.shape(), b, e, st);
    for (const split_tuple& s : split_tuples(sc.shape, p)) {
      const ops::strided_slice_op op{strategy{s}, sc.begin, sc.end, sc.strides};
      CAPTURE(to_string(op.st));
      CAPTURE(cases);
      const strided_slice_layouts r = op.rule(p, sc.shape);
      CHECK(r.shape == ys);
      const dev_tensor<float> x = shard_of(gx, strategy_layout(s, p), me);
      dev_tensor<float> y(r.out, ys, me);
      const std::int64_t calls = calls_of(ctx, [&] { y = ops::strided_slice(op, x, ctx); });
      if (p > 1) CHECK((calls == 0) == !r.moves);
      CHECK(y.layout() == r.out);
      CHECK(gather(y, ctx) == y_ref);
      const dev_tensor<float> dy = shard_of(gdy, flat(p, ys.ndim), me);
      const dev_tensor<float> dx = ops::strided_slice_backward(op, dy, x, ctx);
      CHECK(dx.layout() == r.in);
      CHECK(gather(dx, ctx) == dx_ref);
      ++cases;
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " strided_slice cases checked");
  CHECK(cases > 0);
}

TEST_CASE("concat: every strategy with the axis unsplit, without communication") {
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  struct concat_case {
    std::vector<extents> shapes;
    int axis;
  };
  const std::vector<concat_case> all = {
      {{extents{8, 4}, extents{8, 12}}, 1},
      {{extents{2, 4}, extents{6, 4}, extents{8, 4}}, 0},
      {{extents{4, 2, 8}, extents{4, 2, 4}}, -1},
  };
  for (const concat_case& cc : all) {
    std::vector<xt::xarray<float>> gxs;
    for (std::size_t i = 0; i < cc.shapes.size(); ++i) gxs.push_back(integer_tensor(cc.shapes[i], int(i) + 1));
    const xt::xarray<float> y_ref = k::concat(gxs, cc.axis);
    const extents ys = extents_of(std::vector<std::size_t>(y_ref.shape().begin(), y_ref.shape().end()));
    const xt::xarray<float> gdy = integer_tensor(ys, 7);
    std::vector<std::size_t> sizes;
    const std::size_t ax = std::size_t(cc.axis < 0 ? cc.axis + ys.ndim : cc.axis);
    for (const auto& x : gxs) sizes.push_back(x.shape()[ax]);
    const std::vector<xt::xarray<float>> dx_ref = k::split(gdy, sizes, cc.axis);
    std::vector<int> fixed(std::size_t(ys.ndim), 0);
    fixed[ax] = 1;
    for (const split_tuple& s : split_tuples(ys, p, fixed)) {
      strategy st;
      for (std::size_t i = 0; i < cc.shapes.size(); ++i) st.in[st.n++] = s;
      const ops::concat_op op{st, cc.axis};
      CAPTURE(to_string(st));
      shape_list shapes;
      for (const extents& e : cc.shapes) shapes.v[shapes.n++] = e;
      const concat_layouts r = op.rule(p, shapes);
      std::vector<dev_tensor<float>> xs;
      for (const auto& g : gxs) xs.push_back(shard_of(g, r.in, me));
      dev_tensor<float> y(r.out, ys, me);
      CHECK(calls_of(ctx, [&] { y = ops::concat(op, xs, ctx); }) == 0);
      CHECK(y.layout() == r.out);
      CHECK(gather(y, ctx) == y_ref);
      const dev_tensor<float> dy = shard_of(gdy, r.out, me);
      std::vector<dev_tensor<float>> dxs;
      CHECK(calls_of(ctx, [&] { dxs = ops::concat_backward(op, dy, xs, ctx); }) == 0);
      for (std::size_t i = 0; i < dxs.size(); ++i) {
        CHECK(dxs[i].layout() == r.in);
        CHECK(gather(dxs[i], ctx) == dx_ref[i]);
      }
      ++cases;
    }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " concat cases checked");
  CHECK(cases > 0);
}

TEST_CASE("shape operators: bad strategies and shapes name the rule, the numbers and the strategy") {
  const extents x{16, 8};
  CHECK_THROWS_WITH_AS((ops::transpose_op{strategy{{2, 4}}, dim_list{0, 0}}.rule(8, x)),
                       "transpose: perm must be a permutation of the input's dims: entry 1 is 0, input rank 2; "
                       "strategy ((2, 4),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::transpose_op{strategy{{2, 4}}, dim_list{1, 0, 2}}.rule(8, x)),
                       "transpose: perm must have one entry per input dim: perm has 3 entries, the input has rank "
                       "2; strategy ((2, 4),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::transpose_op{strategy{{2, 4}}, dim_list{1, 0}}.rule(8, extents{16, 6})),
                       "transpose: layout: a tensor dim must be divisible by the product of its splits: dim 1 has "
                       "extent 6, split into 4 pieces; strategy ((2, 4),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::reshape_op{strategy{{2, 1}}, extents{12, 8}}.rule(8, x)),
                       "reshape: the target shape must have the input's number of elements: the input has 128 "
                       "elements, the target 96; strategy ((2, 1),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::reshape_op{strategy{{2, 1}}, extents{-1, -1}}.rule(8, x)),
                       "reshape: each target dim must be non-negative, or -1 (inferred) for one dim: dim 1 is -1; "
                       "strategy ((2, 1),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::reshape_op{strategy{{2, 1}}, extents{-1, 5}}.rule(8, x)),
                       "reshape: the target shape must have the input's number of elements: the input has 128 "
                       "elements, the target 5; strategy ((2, 1),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::flatten_op{strategy{{2}}}.rule(8, x)),
                       "flatten: operator: each split tuple has one entry per dim of its input: input 0 has 1 "
                       "entries, the input has rank 2; strategy ((2,),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::strided_slice_op{strategy{{2, 4}}, index_list{0, 0}, index_list{8, 8}, index_list{1, 0}}.rule(8, x)),
                       "strided_slice: a stride must not be 0: dim 1; strategy ((2, 4),)", error);
  CHECK_THROWS_WITH_AS((ops::strided_slice_op{strategy{{2, 4}}, index_list{0, 0}, index_list{8}, index_list{}}.rule(8, x)),
                       "strided_slice: begin, end and strides must have the same length (strides may be empty): "
                       "begin has 2 entries, end or strides 1; strategy ((2, 4),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::strided_slice_op{strategy{{2, 4}}, index_list{0, 0, 0}, index_list{1, 1, 1}, index_list{}}.rule(8, x)),
                       "strided_slice: begin must not name more dims than the input has: 3 entries, input rank 2; "
                       "strategy ((2, 4),)",
                       error);
  const shape_list two{extents{8, 4}, extents{8, 12}};
  CHECK_THROWS_WITH_AS((ops::concat_op{strategy{{2, 4}, {2, 4}}, 1}.rule(8, two)),
                       "concat: the concat axis cannot be split: input 0 splits dim 1 4 ways; strategy ((2, 4), "
                       "(2, 4))",
                       error);
  CHECK_THROWS_WITH_AS((ops::concat_op{strategy{{2, 1}, {4, 1}}, 1}.rule(8, two)),
                       "concat: every input must be split alike: input 1, dim 0: split 4, input 0 2; strategy ((2, "
                       "1), (4, 1))",
                       error);
  CHECK_THROWS_WITH_AS((ops::concat_op{strategy{{2, 1}, {2, 1}}, 0}.rule(8, two)),
                       "concat: the inputs' dims other than the axis must agree: input 1, dim 1: extent 12, input 0 "
                       "4; strategy ((2, 1), (2, 1))",
                       error);
  CHECK_THROWS_WITH_AS((ops::concat_op{strategy{{2, 1}, {2, 1, 1}}, 0}.rule(8, shape_list{extents{8, 4}, extents{8, 4, 1}})),
                       "concat: every input must have input 0's rank: input 1 has rank 3, input 0 2; strategy ((2, "
                       "1), (2, 1, 1))",
                       error);
  CHECK_THROWS_WITH_AS((ops::concat_op{strategy{{2, 1}, {2, 1}}, 2}.rule(8, two)),
                       "concat: the axis must name a dim of the inputs: axis 2, input rank 2; strategy ((2, 1), "
                       "(2, 1))",
                       error);
  CHECK_THROWS_WITH_AS((ops::concat_op{strategy{{2, 1}}, 1}.rule(8, two)),
                       "concat: operator: a strategy has one split tuple per operator input: 1 split tuples for 2 "
                       "inputs; strategy ((2, 1),)",
                       error);
}
}  // namespace ops_test_shape
