// The pipelined sharded MatMuls under mpiexec: matmul_overlapped for every strategy,
// transpose flags, resolution of the partial sums and chunk count, and matmul_summa for
// every strategy that does not split the contraction dim, equal the single-process
// product and ops::matmul's result (small integers: every sum is exact, the comparison
// is equality), move the bytes of the plain plan, and reject bad options with their
// text.
#include <doctest/doctest.h>

#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/ops/matmul_pipelined.hpp>

#include "sharded_testing.hpp"

namespace ops_test_matmul_pipelined {  // the file's own scope in its test group's translation unit

using namespace tessera;
using testing::integer_tensor;
using testing::shard_of;

namespace {

constexpr index_t M = 16, K = 8, N = 24;

const char* name_of(ops::partial_resolution how) {
  switch (how) {
    case ops::partial_resolution::scatter_rows: return "scatter_rows";
    case ops::partial_resolution::scatter_cols: return "scatter_cols";
    default: return "all_reduce";
  }
}

}  // namespace

TEST_CASE("matmul_overlapped: every strategy, transpose, resolution and chunk count") {
  mpi_communicator world = mpi_communicator::world();
  device_context<mpi_communicator> ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const xt::xarray<float> ga = integer_tensor(ta ? extents{K, M} : extents{M, K}, 1);
      const xt::xarray<float> gb = integer_tensor(tb ? extents{N, K} : extents{K, N}, 2);
      const xt::xarray<float> c_ref = kernels::cpu::matmul(ga, gb, ta, tb);
      for (const strategy& st : testing::matmul_strategies(p, ta, tb)) {
        const ops::matmul_op op{st, ta, tb};
        const matmul_layouts r = op.rule(p);
        CAPTURE(to_string(st));
        CAPTURE(ta);
        CAPTURE(tb);
        const dist_tensor<float> a = shard_of(ga, r.a, me), b = shard_of(gb, r.b, me);
        for (auto how : {ops::partial_resolution::scatter_rows, ops::partial_resolution::scatter_cols,
                         ops::partial_resolution::all_reduce}) {
          CAPTURE(std::string(name_of(how)));
          const layout out_l = ops::resolved_layout(r, how);
          // ops::matmul, then the cheapest plan to the same layout: the plain variant.
          const dist_tensor<float> c_plain = ops::matmul(op, a, b, ctx);
          const plan pl = plan_redistribution(r.c, out_l, extents{M, N}, 4);
          const xt::xarray<float> plain = execute(pl, c_plain.local(), ctx.on(r.dev));
          for (int chunks : {1, 3, 64}) {
            CAPTURE(chunks);
            ctx.reset_stats();
            ops::pipeline_stats stats;
            const dist_tensor<float> c = ops::matmul_overlapped(op, a, b, ctx, how, {chunks, 0}, &stats);
            CHECK(c.layout() == out_l);
            CHECK(c.local() == shard_of(c_ref, out_l, me).local());  // the single-process product
            CHECK(c.local() == plain);                                 // ops::matmul's
            // The bytes of one ReduceScatter or AllReduce of the local product over the
            // contraction axis: the plan's, unless a replica axis lets the plan share the
            // resolution among the replicas (matmul_overlapped resolves on each).
            const index_t local_bytes = index_t(c_plain.local().size() * sizeof(float));
            const int g = r.c.has_partial() ? op.st.in[0].v[ta ? 0 : 1] : 1;
            const index_t direct = !r.c.has_partial() ? 0
                                   : how == ops::partial_resolution::all_reduce ? cost::all_reduce(local_bytes, g)
                                                                                : cost::reduce_scatter(local_bytes, g);
            CHECK(ctx.total_stats().bytes == direct);
            if (r.dev.ndim == 3) CHECK(direct == pl.bytes_for_rank(me));
            else CHECK(direct >= pl.bytes_for_rank(me));
            CHECK(stats.pieces >= 1);
            CHECK(stats.pieces <= chunks);
            CHECK(stats.compute_s <= stats.total_s);
            ++cases;
          }
        }
      }
    }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " overlapped cases checked");
  CHECK(cases > 0);
}

TEST_CASE("matmul_overlapped: inputs in other layouts, and the seed's ((2, 4), (4, 1))") {
  mpi_communicator world = mpi_communicator::world();
  device_context<mpi_communicator> ctx(world);
  const int p = world.size(), me = world.rank();
  const xt::xarray<float> ga = integer_tensor(extents{16, 32}, 3), gb = integer_tensor(extents{32, 16}, 4);
  const xt::xarray<float> c_ref = kernels::cpu::matmul(ga, gb);
  const strategy st = p == 8 ? strategy{{2, 4}, {4, 1}} : strategy{{1, p}, {p, 1}};
  const ops::matmul_op op{st};
  // Replicated on the flat mesh: the operator redistributes them to its device matrix.
  const layout rep = layout::replicated(mesh{p}, 2);
  const dist_tensor<float> a = shard_of(ga, rep, me), b = shard_of(gb, rep, me);
  const dist_tensor<float> c = ops::matmul_overlapped(op, a, b, ctx, ops::partial_resolution::scatter_rows, {2});
  CHECK(c.layout() == ops::resolved_layout(op.rule(p), ops::partial_resolution::scatter_rows));
  CHECK(c.local() == shard_of(c_ref, c.layout(), me).local());
  if (p == 8) CHECK(to_string(c.layout()) == "[0.1, 2]");  // rows by the m axis, then the k axis
}

TEST_CASE("matmul_summa: every strategy without a contraction split, transposes, panels") {
  mpi_communicator world = mpi_communicator::world();
  device_context<mpi_communicator> ctx(world);
  const int p = world.size(), me = world.rank();
  int cases = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const xt::xarray<float> ga = integer_tensor(ta ? extents{K, M} : extents{M, K}, 5);
      const xt::xarray<float> gb = integer_tensor(tb ? extents{N, K} : extents{K, N}, 6);
      const xt::xarray<float> c_ref = kernels::cpu::matmul(ga, gb, ta, tb);
      for (const strategy& st : testing::matmul_strategies(p, ta, tb, true)) {
        const ops::matmul_op op{st, ta, tb};
        const matmul_layouts r = op.rule(p);
        const ops::summa_layouts sl = ops::summa_rule(op, p);
        CAPTURE(to_string(st));
        CAPTURE(ta);
        CAPTURE(tb);
        CHECK(sl.c == r.c);
        const dist_tensor<float> a = shard_of(ga, sl.a, me), b = shard_of(gb, sl.b, me);
        const dist_tensor<float> c_plain = ops::matmul(op, a, b, ctx);  // all-gathers A and B first
        // The broadcasts move what the plain variant's all-gathers move.
        const index_t gather_bytes = plan_redistribution(sl.a, r.a, a.global_shape(), 4).bytes_for_rank(me) +
                                     plan_redistribution(sl.b, r.b, b.global_shape(), 4).bytes_for_rank(me);
        for (int chunks : {1, 2, 5}) {
          CAPTURE(chunks);
          ctx.reset_stats();
          ops::pipeline_stats stats;
          const dist_tensor<float> c = ops::matmul_summa(op, a, b, ctx, {chunks, 0}, &stats);
          CHECK(ctx.total_stats().bytes == gather_bytes);
          CHECK(c.layout() == r.c);
          CHECK(c.local() == shard_of(c_ref, r.c, me).local());
          CHECK(c.local() == c_plain.local());
          CHECK(stats.pieces >= chunks);  // at least chunks panels, one more for the first's cut
          ++cases;
        }
        // Inputs replicated on the flat mesh are redistributed to the SUMMA layouts.
        const layout rep = layout::replicated(mesh{p}, 2);
        const dist_tensor<float> c2 = ops::matmul_summa(op, shard_of(ga, rep, me), shard_of(gb, rep, me), ctx);
        CHECK(c2.local() == shard_of(c_ref, r.c, me).local());
      }
    }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " SUMMA cases checked");
  CHECK(cases > 0);
}

TEST_CASE("matmul_summa: panels cut at every block boundary of A and B") {
  const auto panels = ops::detail::summa_panels(12, 2, 3, 1);  // boundaries 0 4 6 8 12
  REQUIRE(panels.size() == 4);
  const index_t k0[] = {0, 4, 6, 8}, w[] = {4, 2, 2, 4};
  const int a_owner[] = {0, 0, 1, 1}, b_owner[] = {0, 1, 1, 2};
  const index_t a_off[] = {0, 4, 0, 2}, b_off[] = {0, 0, 2, 0};
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(panels[i].k0 == k0[i]);
    CHECK(panels[i].w == w[i]);
    CHECK(panels[i].a_owner == a_owner[i]);
    CHECK(panels[i].b_owner == b_owner[i]);
    CHECK(panels[i].a_off == a_off[i]);
    CHECK(panels[i].b_off == b_off[i]);
  }
  CHECK(ops::detail::summa_panels(12, 2, 3, 3).size() == 10);  // 3, 2, 2, 3 panels per segment (capped by width)
  // The first panel cut into a quarter and the rest: [0, 1) [1, 4) [4, 6) ...
  std::vector<ops::detail::summa_panel> split = panels;
  ops::detail::split_first_panel(split);
  REQUIRE(split.size() == 5);
  CHECK(split[0].k0 == 0);
  CHECK(split[0].w == 1);
  CHECK(split[1].k0 == 1);
  CHECK(split[1].w == 3);
  CHECK(split[1].a_off == 1);
  CHECK(split[1].b_off == 1);
  CHECK(split[2].k0 == 4);
}

TEST_CASE("matmul_overlapped: chunks shrink linearly, each at least one row or column") {
  CHECK(ops::detail::shrinking_cuts(100, 4) == std::vector<index_t>{0, 40, 70, 90, 100});
  CHECK(ops::detail::shrinking_cuts(4096, 4) == std::vector<index_t>{0, 1639, 2868, 3687, 4096});
  for (index_t total : {1, 2, 5, 24, 1000})
    for (int n = 1; n <= total && n <= 40; ++n) {
      const std::vector<index_t> c = ops::detail::shrinking_cuts(total, n);
      CAPTURE(total);
      CAPTURE(n);
      REQUIRE(c.size() == std::size_t(n) + 1);
      CHECK(c.front() == 0);
      CHECK(c.back() == total);
      for (int i = 0; i < n; ++i) CHECK(c[std::size_t(i) + 1] > c[std::size_t(i)]);
    }
}

TEST_CASE("matmul_overlapped and matmul_summa on a one-rank communicator") {
  local_communicator one;
  device_context<local_communicator> ctx(one);
  const xt::xarray<float> ga = integer_tensor(extents{6, 4}, 7), gb = integer_tensor(extents{4, 5}, 8);
  const layout l = layout::replicated(mesh{1}, 2);
  const dist_tensor<float> a = shard_of(ga, l, 0), b = shard_of(gb, l, 0);
  const ops::matmul_op op{strategy{{1, 1}, {1, 1}}};
  CHECK(ops::matmul_overlapped(op, a, b, ctx).local() == kernels::cpu::matmul(ga, gb));
  CHECK(ops::matmul_summa(op, a, b, ctx, {3, 0}).local() == kernels::cpu::matmul(ga, gb));
}

TEST_CASE("matmul_overlapped and matmul_summa: bad options, strategies and shapes name the numbers") {
  mpi_communicator world = mpi_communicator::world();
  device_context<mpi_communicator> ctx(world);
  const int p = world.size(), me = world.rank();
  const layout rep = layout::replicated(mesh{p}, 2);
  const dist_tensor<float> a = shard_of(integer_tensor(extents{8, 8}, 1), rep, me);
  const ops::matmul_op op{strategy{{1, 1}, {1, p}}};
  CHECK_THROWS_WITH_AS(ops::matmul_overlapped(op, a, a, ctx, ops::partial_resolution::scatter_rows, {0, 0}),
                       "matmul_overlapped: chunks must be at least 1: chunks 0", error);
  CHECK_THROWS_WITH_AS(ops::matmul_summa(op, a, a, ctx, {2, -1}),
                       "matmul_summa: poll_us must not be negative: poll_us -1", error);
  const ops::matmul_op split_k{strategy{{1, p}, {p, 1}}};
  if (p > 1) {
    CHECK_THROWS_WITH_AS(ops::matmul_summa(split_k, a, a, ctx),
                         ("matmul_summa: the strategy must not split the contraction dim (SUMMA cuts it "
                          "into panels instead): it is split " + std::to_string(p) + " ways; strategy ((1, " +
                          std::to_string(p) + "), (" + std::to_string(p) + ", 1))")
                             .c_str(),
                         error);
    // 3 rows of C cannot be cut among the ranks of the contraction axis.
    const dist_tensor<float> a3 = shard_of(integer_tensor(extents{3, 8}, 1), rep, me);
    CHECK_THROWS_WITH_AS(ops::matmul_overlapped(split_k, a3, a, ctx, ops::partial_resolution::scatter_rows),
                         ("matmul_overlapped: C (3, 8) in the output layout [0.1, 2]: layout: a tensor dim "
                          "must be divisible by the product of its splits: dim 0 has extent 3, split into " +
                          std::to_string(p) + " pieces; strategy ((1, " + std::to_string(p) + "), (" +
                          std::to_string(p) + ", 1))")
                             .c_str(),
                         error);
  }
  const dist_tensor<float> a5 = shard_of(integer_tensor(extents{5, 8}, 1), rep, me);
  CHECK_THROWS_WITH_AS(ops::matmul_overlapped(op, a, a5, ctx),
                       ("matmul: shapes (8, 8) and (5, 8) do not multiply (transpose_a false, transpose_b "
                        "false); strategy ((1, 1), (1, " + std::to_string(p) + "))")
                           .c_str(),
                       error);
}
}  // namespace ops_test_matmul_pipelined
