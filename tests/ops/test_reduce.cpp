// Sharded reductions under mpiexec: for every strategy that fits the ranks, every list
// of reduced dims and both keep_dims, ReduceSum, ReduceMean and ReduceMax and their
// gradients equal the single-process kernels. Values are small integers and extents
// powers of two, so sums and means are exact and compared for equality; the data have
// ties for the maximum, which the gradient splits among all tied positions.
#include <doctest/doctest.h>

#include "device_under_test.hpp"

#include <functional>
#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/reduce.hpp>

namespace ops_test_reduce {  // the file's own scope in its test group's translation unit

using namespace tessera;
namespace k = tessera::kernels::cpu;

namespace {

using ctx_t = device_context<testing::test_comm>;

std::vector<std::size_t> dims_of(const extents& e) {
  return std::vector<std::size_t>(e.v.begin(), e.v.begin() + e.ndim);
}

xt::xarray<float> global_tensor(const extents& shape, int seed) {
  xt::xarray<float> x = xt::xarray<float>::from_shape(dims_of(shape));
  const std::vector<std::size_t> dims = dims_of(shape);
  for (std::size_t lin = 0; lin < x.size(); ++lin) {
    std::size_t rest = lin;
    long h = seed;
    for (int d = shape.ndim - 1; d >= 0; --d) {
      h += long(rest % dims[d]) * (3 + 4 * d);
      rest /= dims[d];
    }
    x.data()[lin] = float(h % 7 - 3);
  }
  return x;
}

testing::test_tensor shard_of(const xt::xarray<float>& g, const layout& l, int rank) {
  extents shape;
  shape.ndim = int(g.dimension());
  for (int d = 0; d < shape.ndim; ++d) shape.v[d] = index_t(g.shape()[d]);
  dist_tensor<float> t(l, shape, rank);
  t.fill_global([&](const auto& i) {
    std::size_t lin = 0;
    for (int d = 0; d < shape.ndim; ++d) lin = lin * g.shape()[d] + std::size_t(i[d]);
    return g.data()[lin];
  });
  return testing::to_test_device(t);
}

xt::xarray<float> gather(const testing::test_tensor& x, ctx_t& ctx) {
  return testing::host_shard(redistribute(x, layout::replicated(mesh{ctx.size()}, x.ndim()), ctx));
}

std::vector<split_tuple> split_tuples(const extents& shape, int p) {
  std::vector<split_tuple> out;
  split_tuple cur;
  cur.n = shape.ndim;
  std::function<void(int, int)> rec = [&](int d, int prod) {
    if (d == shape.ndim) {
      out.push_back(cur);
      return;
    }
    for (int s = 1; s <= p; ++s)
      if (p % (prod * s) == 0 && shape.v[d] % s == 0) {
        cur.v[d] = s;
        rec(d + 1, prod * s);
      }
  };
  rec(0, 1);
  return out;
}

std::vector<int> to_vector(const dim_list& l) { return std::vector<int>(l.v.begin(), l.v.begin() + l.n); }

}  // namespace

TEST_CASE("reduce rule: kept dims keep their axes, split reduced dims leave partial results") {
  constexpr reduce_layouts r =
      static_reduce_rule<strategy{{2, 4}}, 8, extents{16, 32}, dim_list{1}, false, reduce_op::sum>;
  static_assert(r.dev == mesh{2, 4});
  static_assert(r.in == layout(mesh{2, 4}, {{0}, {1}}));
  static_assert(r.out == layout(mesh{2, 4}, {{0}}).with_partial(1));
  static_assert(r.shape == extents{16});
  static_assert(r.count == 32);
  constexpr reduce_layouts m =
      static_reduce_rule<strategy{{2, 1}}, 8, extents{16, 32}, dim_list{0, -1}, true, reduce_op::max>;
  static_assert(m.dev == mesh{4, 2, 1});
  static_assert(m.out == layout(mesh{4, 2, 1}, {{}, {}}).with_partial(1, reduce_op::max));
  static_assert(m.shape == extents{1, 1});
  constexpr reduce_layouts mean =
      static_reduce_rule<strategy{{2, 4}}, 8, extents{16, 32}, dim_list{0}, true, reduce_op::mean>;
  static_assert(mean.out == layout(mesh{2, 4}, {{}, {1}}).with_partial(0, reduce_op::sum));
  CHECK(mean.shape == extents{1, 32});
}

TEST_CASE("reduce: every strategy, dims and keep_dims of reduce_sum, reduce_mean, reduce_max") {
  testing::test_comm world = testing::test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  struct shape_dims {
    extents shape;
    std::vector<dim_list> dims;
  };
  const std::vector<shape_dims> all = {
      {extents{8, 16}, {dim_list{}, dim_list{0}, dim_list{1}, dim_list{-1}, dim_list{0, 1}}},
      {extents{4, 8, 16}, {dim_list{}, dim_list{1}, dim_list{0, 2}, dim_list{-1, 0}}},
  };
  for (const shape_dims& sd : all) {
    const xt::xarray<float> gx = global_tensor(sd.shape, 1);
    const layout flat = layout::replicated(mesh{p}, sd.shape.ndim);
    for (const dim_list& dims : sd.dims)
      for (bool keep : {false, true}) {
        const std::vector<int> axes = to_vector(dims);
        const xt::xarray<float> sum_ref = k::reduce_sum(gx, axes, keep);
        const xt::xarray<float> mean_ref = k::reduce_mean(gx, axes, keep);
        const xt::xarray<float> max_ref = k::reduce_max(gx, axes, keep);
        extents out_shape;
        out_shape.ndim = int(sum_ref.dimension());
        for (int d = 0; d < out_shape.ndim; ++d) out_shape.v[d] = index_t(sum_ref.shape()[d]);
        const xt::xarray<float> gdy = global_tensor(out_shape, 2);
        const xt::xarray<float> dsum_ref = k::reduce_sum_grad(gdy, gx.shape(), axes, keep);
        const xt::xarray<float> dmean_ref = k::reduce_mean_grad(gdy, gx.shape(), axes, keep);
        const xt::xarray<float> dmax_ref = k::reduce_max_grad(gdy, gx, max_ref, axes, keep);
        const testing::test_tensor dy = shard_of(gdy, layout::replicated(mesh{p}, out_shape.ndim), me);
        for (const split_tuple& s : split_tuples(sd.shape, p)) {
          const strategy st{s};
          CAPTURE(to_string(st));
          CAPTURE(to_string(sd.shape));
          CAPTURE(axes.size());
          CAPTURE(keep);
          const ops::reduce_sum_op sum_op{st, dims, keep};
          const ops::reduce_mean_op mean_op{st, dims, keep};
          const ops::reduce_max_op max_op{st, dims, keep};
          const reduce_layouts r = sum_op.rule(p, sd.shape);
          for (bool in_rule_layout : {true, false}) {
            const testing::test_tensor x = shard_of(gx, in_rule_layout ? r.in : flat, me);
            const testing::test_tensor ys = ops::reduce_sum(sum_op, x, ctx);
            CHECK(ys.layout() == r.out);
            CHECK(gather(ys, ctx) == sum_ref);
            const testing::test_tensor ym = ops::reduce_mean(mean_op, x, ctx);
            CHECK(ym.layout() == r.out);
            CHECK(gather(ym, ctx) == mean_ref);
            const testing::test_tensor yx = ops::reduce_max(max_op, x, ctx);
            CHECK(yx.layout() == max_op.rule(p, sd.shape).out);
            CHECK(yx.layout().op == (yx.layout().has_partial() ? reduce_op::max : reduce_op::sum));
            CHECK(gather(yx, ctx) == max_ref);
            const testing::test_tensor dxs = ops::reduce_sum_backward(sum_op, dy, x, ctx);
            CHECK(dxs.layout() == r.in);
            CHECK(gather(dxs, ctx) == dsum_ref);
            const testing::test_tensor dxm = ops::reduce_mean_backward(mean_op, dy, x, ctx);
            CHECK(dxm.layout() == r.in);
            CHECK(gather(dxm, ctx) == dmean_ref);
            const testing::test_tensor dxx = ops::reduce_max_backward(max_op, dy, x, yx, ctx);
            CHECK(dxx.layout() == r.in);
            CHECK(gather(dxx, ctx) == dmax_ref);
            ++cases;
          }
        }
      }
  }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " reduction strategy cases checked");
  CHECK(cases > 0);
}

TEST_CASE("reduce: bad dims and strategies name the operator, the rule, the numbers and the strategy") {
  CHECK_THROWS_WITH_AS((ops::reduce_sum_op{strategy{{2, 4}}, dim_list{2}}.rule(8, extents{16, 32})),
                       "reduce_sum: reduce: each axis must name a dim of the input: axis 2, input "
                       "rank 2; strategy ((2, 4),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::reduce_mean_op{strategy{{2, 4}}, dim_list{1, -1}}.rule(8, extents{16, 32})),
                       "reduce_mean: reduce: an axis must not name a dim twice: dim 1 is named "
                       "twice; strategy ((2, 4),)",
                       error);
  CHECK_THROWS_WITH_AS((ops::reduce_max_op{strategy{{2, 4}, {2, 4}}, dim_list{0}}.rule(8, extents{16, 32})),
                       "reduce_max: operator: a strategy has one split tuple per operator input: 2 "
                       "split tuples for 1 inputs; strategy ((2, 4), (2, 4))",
                       error);
  CHECK_THROWS_WITH_AS((ops::reduce_sum_op{strategy{{3, 1}}, dim_list{0}}.rule(8, extents{16, 32})),
                       "reduce_sum: strategy: the product of an input's splits must divide the device "
                       "count: input 0: product of splits 3, device count 8; strategy ((3, 1),)",
                       error);
}

TEST_CASE("reduce: every strategy, dims and keep_dims of reduce_min; ties split across ranks") {
  testing::test_comm world = testing::test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  const extents shape{4, 8, 4};
  const xt::xarray<float> gx = global_tensor(shape, 5);
  const layout flat = layout::replicated(mesh{p}, shape.ndim);
  for (const dim_list& dims : {dim_list{}, dim_list{1}, dim_list{0, 2}, dim_list{-1}})
    for (bool keep : {false, true}) {
      const std::vector<int> axes = to_vector(dims);
      const xt::xarray<float> min_ref = k::reduce_min(gx, axes, keep);
      extents out_shape;
      out_shape.ndim = int(min_ref.dimension());
      for (int d = 0; d < out_shape.ndim; ++d) out_shape.v[d] = index_t(min_ref.shape()[d]);
      const xt::xarray<float> gdy = global_tensor(out_shape, 6);
      const xt::xarray<float> dmin_ref = k::reduce_min_grad(gdy, gx, min_ref, axes, keep);
      const testing::test_tensor dy = shard_of(gdy, layout::replicated(mesh{p}, out_shape.ndim), me);
      for (const split_tuple& s : split_tuples(shape, p)) {
        const ops::reduce_min_op op{strategy{s}, dims, keep};
        CAPTURE(to_string(op.st));
        CAPTURE(axes.size());
        CAPTURE(keep);
        const reduce_layouts r = op.rule(p, shape);
        const testing::test_tensor x = shard_of(gx, cases % 2 ? r.in : flat, me);
        const testing::test_tensor y = ops::reduce_min(op, x, ctx);
        CHECK(y.layout() == r.out);
        CHECK(y.layout().op == (y.layout().has_partial() ? reduce_op::min : reduce_op::sum));
        CHECK(gather(y, ctx) == min_ref);
        const testing::test_tensor dx = ops::reduce_min_backward(op, dy, x, y, ctx);
        CHECK(dx.layout() == r.in);
        CHECK(gather(dx, ctx) == dmin_ref);
        ++cases;
      }
    }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " reduce_min strategy cases checked");
  CHECK(cases > 0);
}
}  // namespace ops_test_reduce
