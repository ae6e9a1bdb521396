// The pipelined sharded MatMuls on device tensors under mpiexec, over device buffers
// staged through MPI (several ranks share one GPU): matmul_overlapped for every
// strategy, transpose flag, resolution and chunk count, and matmul_summa for every
// strategy that does not split the contraction dim, give the host pipeline's shards
// (small integers: every sum is exact, the comparison is equality), the single-process
// product, and ops::matmul's on the device, with the host pipeline's traffic.
#include <doctest/doctest.h>

#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/cuda.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/ops/matmul_pipelined.hpp>

#include "ops/sharded_testing.hpp"

using namespace tessera;
using testing::integer_tensor;
using testing::shard_of;

namespace {

using dcomm = staged_communicator<mpi_communicator>;
using dtensor = tensor_on<float, cuda_device>;
constexpr index_t M = 16, K = 8, N = 24;

}  // namespace

static_assert(nonblocking_communicator<dcomm>);

TEST_CASE("matmul_overlapped on device tensors equals the host pipeline and ops::matmul") {
  mpi_communicator world = mpi_communicator::world();
  device_context<mpi_communicator> hctx(world);
  dcomm dworld(mpi_communicator::world());
  device_context<dcomm> dctx(dworld);
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
        const dtensor da = to_device(a), db = to_device(b);
        const dtensor plain = ops::matmul(op, da, db, dctx);
        for (auto how : {ops::partial_resolution::scatter_rows, ops::partial_resolution::scatter_cols,
                         ops::partial_resolution::all_reduce}) {
          CAPTURE(int(how));
          const layout out_l = ops::resolved_layout(r, how);
          const xt::xarray<float> plain_resolved = to_host(redistribute(plain, out_l, dctx)).local();
          for (int chunks : {1, 3, 64}) {
            CAPTURE(chunks);
            hctx.reset_stats();
            const dist_tensor<float> hc = ops::matmul_overlapped(op, a, b, hctx, how, {chunks, 0});
            dctx.reset_stats();
            ops::pipeline_stats stats;
            const dtensor dc = ops::matmul_overlapped(op, da, db, dctx, how, {chunks, 0}, &stats);
            CHECK(dctx.total_stats() == hctx.total_stats());
            CHECK(dc.layout() == out_l);
            const xt::xarray<float> got = to_host(dc).local();
            CHECK(got == hc.local());
            CHECK(got == shard_of(c_ref, out_l, me).local());
            CHECK(got == plain_resolved);
            CHECK(stats.pieces >= 1);
            CHECK(stats.pieces <= chunks);
            ++cases;
          }
        }
      }
    }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " overlapped cases on the device checked");
  CHECK(cases > 0);
}

TEST_CASE("matmul_summa on device tensors equals the host pipeline and ops::matmul") {
  mpi_communicator world = mpi_communicator::world();
  device_context<mpi_communicator> hctx(world);
  dcomm dworld(mpi_communicator::world());
  device_context<dcomm> dctx(dworld);
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
        const dist_tensor<float> a = shard_of(ga, sl.a, me), b = shard_of(gb, sl.b, me);
        const dtensor da = to_device(a), db = to_device(b);
        const xt::xarray<float> plain = to_host(ops::matmul(op, da, db, dctx)).local();
        for (int chunks : {1, 2, 5}) {
          CAPTURE(chunks);
          hctx.reset_stats();
          const dist_tensor<float> hc = ops::matmul_summa(op, a, b, hctx, {chunks, 0});
          dctx.reset_stats();
          ops::pipeline_stats stats;
          const dtensor dc = ops::matmul_summa(op, da, db, dctx, {chunks, 0}, &stats);
          CHECK(dctx.total_stats() == hctx.total_stats());
          CHECK(dc.layout() == r.c);
          const xt::xarray<float> got = to_host(dc).local();
          CHECK(got == hc.local());
          CHECK(got == shard_of(c_ref, r.c, me).local());
          CHECK(got == plain);
          CHECK(stats.pieces >= chunks);
          ++cases;
        }
        // The operands packed on the device (A's strided columns, B transposed's).
        const layout rep = layout::replicated(mesh{p}, 2);
        const dtensor c2 = ops::matmul_summa(op, to_device(shard_of(ga, rep, me)), to_device(shard_of(gb, rep, me)),
                                             dctx);
        CHECK(to_host(c2).local() == shard_of(c_ref, r.c, me).local());
      }
    }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " SUMMA cases on the device checked");
  CHECK(cases > 0);
}

TEST_CASE("matmul_overlapped and matmul_summa on device tensors: bad options name the numbers") {
  dcomm dworld(mpi_communicator::world());
  device_context<dcomm> dctx(dworld);
  const int p = dworld.size(), me = dworld.rank();
  const dtensor a = to_device(shard_of(integer_tensor(extents{8, 8}, 1), layout::replicated(mesh{p}, 2), me));
  const ops::matmul_op op{strategy{{1, 1}, {1, p}}};
  CHECK_THROWS_WITH_AS(ops::matmul_overlapped(op, a, a, dctx, ops::partial_resolution::scatter_rows, {0, 0}),
                       "matmul_overlapped: chunks must be at least 1: chunks 0", error);
  CHECK_THROWS_WITH_AS(ops::matmul_summa(op, a, a, dctx, {2, -1}),
                       "matmul_summa: poll_us must not be negative: poll_us -1", error);
}
