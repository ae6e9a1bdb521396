// Sharded BatchMatMul under mpiexec: for every strategy that fits the ranks (batch,
// row, contraction and column splits, replicas), both transpose flags, both inputs
// batched or one of them a shared matrix, one or two batch dims, the product and both
// gradients equal the single-process kernels. Values are small integers, so every sum
// is exact and the comparison is equality.
#include <doctest/doctest.h>

#include <string>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/batch_matmul.hpp>
#include "sharded_testing.hpp"

namespace ops_test_batch_matmul {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::testing;
namespace k = tessera::kernels::cpu;

namespace {

using ctx_t = device_context<test_comm>;

// A product of batch dims `batch` (empty: none), (m, k) x (k, n), with A or B shared.
struct case_shape {
  std::vector<index_t> batch;
  bool a_batched = true, b_batched = true;
  index_t m = 8, k = 6, n = 4;
};

extents stored(const case_shape& c, bool is_a, bool trans) {
  extents e;
  const bool batched = is_a ? c.a_batched : c.b_batched;
  if (batched)
    for (index_t b : c.batch) e.v[e.ndim++] = b;
  const index_t rows = is_a ? c.m : c.k, cols = is_a ? c.k : c.n;
  e.v[e.ndim++] = trans ? cols : rows;
  e.v[e.ndim++] = trans ? rows : cols;
  return e;
}

// The reference on the global arrays: folds two batch dims into one for the kernels.
xt::xarray<float> fold(const xt::xarray<float>& x) {
  if (x.dimension() <= 3) return x;
  xt::xarray<float> y = x;
  y.reshape({x.shape()[0] * x.shape()[1], x.shape()[2], x.shape()[3]});
  return y;
}
xt::xarray<float> unfold(xt::xarray<float> y, const extents& shape) {
  y.reshape(dims_of(shape));
  return y;
}

// The input split tuples for the splits (batch..., m, k, n) of the product.
strategy strategy_for(const case_shape& c, const split_tuple& s, bool ta, bool tb) {
  const int nb = int(c.batch.size());
  split_tuple a, b;
  if (c.a_batched)
    for (int d = 0; d < nb; ++d) a.v[a.n++] = s.v[d];
  if (c.b_batched)
    for (int d = 0; d < nb; ++d) b.v[b.n++] = s.v[d];
  const int m = s.v[nb], kk = s.v[nb + 1], n = s.v[nb + 2];
  a.v[a.n++] = ta ? kk : m;
  a.v[a.n++] = ta ? m : kk;
  b.v[b.n++] = tb ? n : kk;
  b.v[b.n++] = tb ? kk : n;
  return strategy{a, b};
}

}  // namespace

TEST_CASE("batch_matmul rule: batch axes, MatMul's (m, k, n), shared inputs") {
  constexpr batch_matmul_layouts r =
      static_batch_matmul_rule<strategy{{2, 2, 2}, {2, 2, 1}}, 8, extents{4, 8, 16}, extents{4, 16, 8}>;
  static_assert(r.dev == mesh{2, 2, 2, 1});
  static_assert(r.a == layout(mesh{2, 2, 2, 1}, {{0}, {1}, {2}}));
  static_assert(r.b == layout(mesh{2, 2, 2, 1}, {{0}, {2}, {3}}));
  static_assert(r.c == layout(mesh{2, 2, 2, 1}, {{0}, {1}, {3}}).with_partial(2));
  static_assert(r.grad_a == r.a);  // n is not split
  static_assert(r.grad_b == r.b.with_partial(1));
  static_assert(r.shape == extents{4, 8, 8});
  // B shared by the batch (a weight), batch split 4 ways on 8 devices: dB sums over the
  // batch, so it is partial over the batch axis too.
  constexpr batch_matmul_layouts w =
      static_batch_matmul_rule<strategy{{4, 1, 1}, {1, 1}}, 8, extents{4, 8, 16}, extents{16, 8}>;
  static_assert(w.dev == mesh{2, 4, 1, 1, 1});
  static_assert(w.b == layout(mesh{2, 4, 1, 1, 1}, {{3}, {4}}));
  static_assert(w.grad_b == w.b.with_partial(1));
  // Transposed operands swap the matrix dims' axes.
  constexpr batch_matmul_layouts t =
      static_batch_matmul_rule<strategy{{1, 2, 4}, {1, 1, 2}}, 8, extents{2, 16, 8}, extents{2, 4, 16}, true, true>;
  static_assert(t.a == layout(mesh{1, 4, 2, 1}, {{0}, {2}, {1}}));
  static_assert(t.b == layout(mesh{1, 4, 2, 1}, {{0}, {3}, {2}}));
  CHECK(t.shape == extents{2, 8, 4});
}

TEST_CASE("batch_matmul: every strategy, transpose and shared input gives the single-process results") {
  test_comm world = test_world();
  ctx_t ctx(world);
  const int p = world.size(), me = world.rank();
  const std::vector<case_shape> cases = {
      {{4}, true, true},
      {{4}, true, false},
      {{4}, false, true},
      {{2, 2}, true, true, 4, 6, 4},
  };
  int count = 0;
  for (const case_shape& c : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        // All four flags on the first shapes; both or neither on the shared inputs; none
        // on two batch dims.
        if (&c != &cases[0] && (ta != tb || (c.batch.size() > 1 && ta))) continue;
        const extents as = stored(c, true, ta), bs = stored(c, false, tb);
        const xt::xarray<float> ga = integer_tensor(as, 1), gb = integer_tensor(bs, 2);
        extents cs;
        for (index_t b : c.batch) cs.v[cs.ndim++] = b;
        cs.v[cs.ndim++] = c.m;
        cs.v[cs.ndim++] = c.n;
        const xt::xarray<float> gdc = integer_tensor(cs, 3);
        const xt::xarray<float> c_ref = unfold(k::batch_matmul(fold(ga), fold(gb), ta, tb), cs);
        const xt::xarray<float> da_ref = unfold(k::batch_matmul_grad_a(fold(gdc), fold(ga), fold(gb), ta, tb), as);
        const xt::xarray<float> db_ref = unfold(k::batch_matmul_grad_b(fold(gdc), fold(ga), fold(gb), ta, tb), bs);
        // Every split of the product's (batch..., m, k, n).
        extents all;
        for (index_t b : c.batch) all.v[all.ndim++] = b;
        all.v[all.ndim++] = c.m;
        all.v[all.ndim++] = c.k;
        all.v[all.ndim++] = c.n;
        for (const split_tuple& s : split_tuples(all, p)) {
          const ops::batch_matmul_op op{strategy_for(c, s, ta, tb), ta, tb};
          CAPTURE(to_string(op.st));
          CAPTURE(to_string(as));
          CAPTURE(to_string(bs));
          CAPTURE(ta);
          CAPTURE(tb);
          const batch_matmul_layouts r = op.rule(p, as, bs);
          // Inputs in the rule's layouts; for the first shapes also replicated on the flat
          // mesh (the operator redistributes them across device matrices).
          for (bool in_rule_layout : {true, false}) {
            if (!in_rule_layout && &c != &cases[0]) continue;
            const dev_tensor<float> a = shard_of(ga, in_rule_layout ? r.a : flat(p, as.ndim), me);
            const dev_tensor<float> b = shard_of(gb, in_rule_layout ? r.b : flat(p, bs.ndim), me);
            const dev_tensor<float> y = ops::batch_matmul(op, a, b, ctx);
            CHECK(y.layout() == r.c);
            CHECK(gather(y, ctx) == c_ref);
            const dev_tensor<float> dc = shard_of(gdc, flat(p, cs.ndim), me);
            const auto [da, db] = ops::batch_matmul_backward(op, dc, a, b, ctx);
            CHECK(da.layout() == r.grad_a);
            CHECK(db.layout() == r.grad_b);
            CHECK(gather(da, ctx) == da_ref);
            CHECK(gather(db, ctx) == db_ref);
            ++count;
          }
        }
      }
  if (me == 0) MESSAGE(p << " ranks: " << count << " batch_matmul strategy cases checked");
  CHECK(count > 0);
}

TEST_CASE("batch_matmul: bad strategies and shapes name the rule, the numbers and the strategy") {
  constexpr extents a{4, 8, 16}, b{4, 16, 8};
  auto text = [](const strategy& st, const extents& x, const extents& y, bool ta = false, bool tb = false) {
    std::string out;
    try {
      ops::batch_matmul_op{st, ta, tb}.rule(8, x, y);
    } catch (const error& e) {
      out = e.what();
    }
    return out;
  };
  CHECK(text(strategy{{2, 2, 2}, {1, 2, 1}}, a, b) ==
        "batch_matmul: both inputs must split each batch dim alike: dim 0: input 1 splits it 1 ways, "
        "input 0 2 ways; shapes (4, 8, 16) and (4, 16, 8), strategy ((2, 2, 2), (1, 2, 1))");
  CHECK(text(strategy{{2, 2, 2}, {2, 4, 1}}, a, b) ==
        "batch_matmul: both inputs must split the contraction dim into the same number of pieces: "
        "input 0 splits it 2 ways, input 1 4 ways; shapes (4, 8, 16) and (4, 16, 8), strategy ((2, 2, "
        "2), (2, 4, 1))");
  CHECK(text(strategy{{1, 1, 1}, {1, 1, 1}}, a, extents{2, 16, 8}) ==
        "batch_matmul: both inputs must have the same batch dims: dim 0: input 1 has extent 2, input "
        "0 4; shapes (4, 8, 16) and (2, 16, 8), strategy ((1, 1, 1), (1, 1, 1))");
  CHECK(text(strategy{{1, 1, 1}, {1, 1, 1}}, a, extents{4, 8, 8}) ==
        "batch_matmul: the contraction dims of both inputs must have the same extent: input 0 has 16, "
        "input 1 8; shapes (4, 8, 16) and (4, 8, 8), strategy ((1, 1, 1), (1, 1, 1))");
  CHECK(text(strategy{{1, 1}, {1, 1}}, extents{8, 16}, extents{16, 8}) ==
        "batch_matmul: at least one input must have batch dims (rank 3 or more): inputs have ranks 2 "
        "and 2; shapes (8, 16) and (16, 8), strategy ((1, 1), (1, 1))");
  CHECK(text(strategy{{1, 1, 1, 1}, {1, 1, 1}}, extents{2, 4, 8, 16}, b) ==
        "batch_matmul: an input has rank 2 (shared by every batch entry) or the output's rank: input 1 "
        "has rank 3, the output 4; shapes (2, 4, 8, 16) and (4, 16, 8), strategy ((1, 1, 1, 1), (1, 1, "
        "1))");
  CHECK(text(strategy{{2, 2, 2}, {2, 2, 2}}, a, b) ==
        "batch_matmul: operator: the device matrix of a strategy must divide the device count: device "
        "matrix size 16, device count 8; shapes (4, 8, 16) and (4, 16, 8), strategy ((2, 2, 2), (2, 2, "
        "2))");
  CHECK(text(strategy{{2, 2}, {2, 2, 1}}, a, b) ==
        "batch_matmul: operator: each split tuple has one entry per dim of its input: input 0 has 2 "
        "entries, the input has rank 3; shapes (4, 8, 16) and (4, 16, 8), strategy ((2, 2), (2, 2, 1))");
  CHECK(text(strategy{{2, 4, 1}, {2, 1, 1}}, extents{4, 6, 16}, b) ==
        "batch_matmul: layout: a tensor dim must be divisible by the product of its splits: dim 1 has "
        "extent 6, split into 4 pieces; shapes (4, 6, 16) and (4, 16, 8), strategy ((2, 4, 1), (2, 1, 1))");
  static_assert(check_batch_matmul(strategy{{2, 2, 2}, {2, 2, 1}}, 8, a, b).ok());
  static_assert(check_batch_matmul(strategy{{2, 2, 2}, {1, 2, 1}}, 8, a, b) ==
                fail(errc::batch_matmul_batch_split, 0, -1, 1, 2));
}
}  // namespace ops_test_batch_matmul
