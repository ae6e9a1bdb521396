// Sharded MatMul under mpiexec: for every strategy that fits the ranks (row, contraction
// and column splits, replicas, both transpose flags), the product and both gradients
// equal the single-process ones. Values are small integers, so every sum is exact and
// the comparison is equality.
#include <doctest/doctest.h>

#include "device_under_test.hpp"
#include "ops/sharded_testing.hpp"

#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/matmul.hpp>

namespace ops_test_matmul {  // the file's own scope in its test group's translation unit

using namespace tessera;

namespace {

constexpr index_t M = 16, K = 8, N = 24;

xt::xarray<float> global_matrix(index_t rows, index_t cols, int seed) {
  xt::xarray<float> x = xt::xarray<float>::from_shape({std::size_t(rows), std::size_t(cols)});
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) x(i, j) = float((i * 7 + j * 3 + seed) % 11 - 5);
  return x;
}

// This rank's shard of a global matrix under layout l (non-partial).
testing::test_tensor shard_of(const xt::xarray<float>& g, const layout& l, int rank) {
  dist_tensor<float> t(l, extents{index_t(g.shape()[0]), index_t(g.shape()[1])}, rank);
  t.fill_global([&](const auto& i) { return g(i[0], i[1]); });
  return testing::to_test_device(t);
}

// The whole matrix on every rank, through a redistribution to the replicated layout
// of the world mesh (which also resolves partial sums).
xt::xarray<float> gather(const testing::test_tensor& x, device_context<testing::test_comm>& ctx) {
  return testing::host_shard(redistribute(x, layout::replicated(mesh{ctx.size()}, 2), ctx));
}

}  // namespace

TEST_CASE("matmul: every strategy and transpose gives the single-process product and gradients") {
  testing::test_comm world = testing::test_world();
  device_context<testing::test_comm> ctx(world);
  const int p = world.size(), me = world.rank();
  const mesh flat{p};
  int cases = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const xt::xarray<float> ga = ta ? global_matrix(K, M, 1) : global_matrix(M, K, 1);
      const xt::xarray<float> gb = tb ? global_matrix(N, K, 2) : global_matrix(K, N, 2);
      const xt::xarray<float> gdc = global_matrix(M, N, 3);
      const xt::xarray<float> c_ref = kernels::cpu::matmul(ga, gb, ta, tb);
      const xt::xarray<float> da_ref = kernels::cpu::matmul_grad_a(gdc, ga, gb, ta, tb);
      const xt::xarray<float> db_ref = kernels::cpu::matmul_grad_b(gdc, ga, gb, ta, tb);
      for (const strategy& st : testing::matmul_strategies(p, ta, tb)) {
        const ops::matmul_op op{st, ta, tb};
        const matmul_layouts r = op.rule(p);
        CAPTURE(to_string(st));
        CAPTURE(ta);
        CAPTURE(tb);
        // Inputs already in the rule's layouts, and inputs replicated on the flat mesh
        // (the operator redistributes them across device matrices).
        for (bool given_in_rule_layout : {true, false}) {
          const layout la = given_in_rule_layout ? r.a : layout::replicated(flat, 2);
          const layout lb = given_in_rule_layout ? r.b : layout::replicated(flat, 2);
          const testing::test_tensor a = shard_of(ga, la, me), b = shard_of(gb, lb, me);
          const testing::test_tensor c = ops::matmul(op, a, b, ctx);
          CHECK(c.layout() == r.c);
          CHECK(c.local_shape() == local_shape(r.c, extents{M, N}));
          CHECK(gather(c, ctx) == c_ref);
          const testing::test_tensor dc = shard_of(gdc, layout::replicated(flat, 2), me);
          const auto [da, db] = ops::matmul_backward(op, dc, a, b, ctx);
          CHECK(da.layout() == r.grad_a);
          CHECK(db.layout() == r.grad_b);
          CHECK(gather(da, ctx) == da_ref);
          CHECK(gather(db, ctx) == db_ref);
          ++cases;
        }
      }
    }
  if (me == 0) MESSAGE(p << " ranks: " << cases << " strategy cases checked");
  CHECK(cases > 0);
}

TEST_CASE("matmul: the seed's strategy ((2, 4), (4, 1)) on 8 ranks") {
  testing::test_comm world = testing::test_world();
  if (world.size() != 8) return;
  device_context<testing::test_comm> ctx(world);
  const ops::matmul_op op{strategy{{2, 4}, {4, 1}}};
  const matmul_layouts r = op.rule(8);
  CHECK(r.dev == mesh{2, 4, 1});
  const xt::xarray<float> ga = global_matrix(16, 32, 1), gb = global_matrix(32, 16, 2);
  const testing::test_tensor a = shard_of(ga, r.a, world.rank()), b = shard_of(gb, r.b, world.rank());
  CHECK(a.local_shape() == extents{8, 8});  // the seed's local MatMul: (8, 8) x (8, 16)
  CHECK(b.local_shape() == extents{8, 16});
  const testing::test_tensor c = ops::matmul(op, a, b, ctx);
  CHECK(c.local_shape() == extents{8, 16});
  CHECK(c.layout().is_partial(1));  // partial sums over ranks {0,1,2,3} and {4,5,6,7}
  CHECK(gather(c, ctx) == kernels::cpu::matmul(ga, gb));
}

TEST_CASE("matmul: a bad strategy names the rule, the numbers and the strategy") {
  const ops::matmul_op op{strategy{{2, 4}, {2, 1}}};
  CHECK_THROWS_WITH_AS(op.rule(8),
                       "matmul: both inputs must split the contraction dim into the same number of "
                       "pieces: input 0 splits it 4 ways, input 1 2 ways; strategy ((2, 4), (2, 1))",
                       error);
  const ops::matmul_op too_big{strategy{{2, 4}, {4, 2}}};
  CHECK_THROWS_WITH_AS(too_big.rule(8),
                       "operator: the device matrix of a strategy must divide the device count: "
                       "device matrix size 16, device count 8; strategy ((2, 4), (4, 2))",
                       error);
  const ops::matmul_op one_input{strategy{{2, 4}}};
  CHECK_THROWS_WITH_AS(one_input.rule(8),
                       "operator: a strategy has one split tuple per operator input: 1 split tuples "
                       "for 2 inputs; strategy ((2, 4),)",
                       error);
}
}  // namespace ops_test_matmul
