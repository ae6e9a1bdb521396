// Exhaustive redistribution test, run by several ranks: for every mesh that spans the
// ranks, every tensor rank 0-3 (and 4 on meshes of up to 4 ranks) and every pair of
// layouts (partial states included),
// redistributing a tensor leaves on every rank exactly the shard that the slice
// geometry names, and the communicators count exactly the bytes the plan priced.
// Built three times: shards on the host over MPI, over Gloo (a job of a scheduler and
// workers, or of tessera-run), and shards on the GPU (tests/cuda/).
#include <doctest/doctest.h>

#include "device_under_test.hpp"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/format.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/plan/format.hpp>

using namespace tessera;

namespace {

// The meshes a world of `p` ranks is tested on.
std::vector<mesh> meshes_for(int p) {
  switch (p) {
    case 1: return {mesh{1}};
    case 2: return {mesh{2}};
    case 4: return {mesh{4}, mesh{2, 2}};
    case 8: return {mesh{8}, mesh{2, 4}, mesh{4, 2}, mesh{2, 2, 2}};
    default: return {mesh{p}};
  }
}

// Global shapes per tensor rank: one every layout divides, one that some do not
// (so steps that would split unevenly must be avoided).
std::vector<extents> shapes_for(int ndim) {
  switch (ndim) {
    case 0: return {extents{}};  // a scalar, such as a loss: replicated or partial only
    case 1: return {extents{8}, extents{16}};
    case 2: return {extents{8, 8}, extents{4, 16}};
    case 3: return {extents{8, 8, 8}, extents{2, 8, 4}};
    default: return {extents{4, 2, 4, 4}};
  }
}

// The true value of the global tensor at a linear index: small integers, exact in
// every element type, so that sums of partial values are exact.
template <class T>
T truth(index_t lin) {
  return T(lin % 97 + 1);
}

index_t linear(const extents& g, const std::array<index_t, max_tensor_ndim>& idx) {
  index_t lin = 0;
  for (int d = 0; d < g.ndim; ++d) lin = lin * g.v[d] + idx[d];
  return lin;
}

// This rank's share of the truth under `l`: for a partial layout, member j of the
// partial group holds a value such that reducing over the group gives the truth.
template <class T>
xt::xarray<T> make_input(const layout& l, const extents& g, int rank) {
  axis_list pax;
  for (int a = 0; a < l.dev.ndim; ++a)
    if (l.is_partial(a)) pax.push_back(a);
  const int q = group_size(l.dev, pax);
  const int j = group_index(l.dev, pax, rank);
  dist_tensor<T> t(l.without_partial(), g, rank);
  t.fill_global([&](const auto& idx) {
    const index_t lin = linear(g, idx);
    const T v = truth<T>(lin);
    if (q == 1) return v;
    const T other = T(lin % 3 + 1);
    switch (l.op) {
      case reduce_op::max: return j == 0 ? v : T(v - other);
      case reduce_op::min: return j == 0 ? v : T(v + other);
      default: return j == 0 ? T(v - T(q - 1) * other) : other;
    }
  });
  return t.local();
}

struct outcome {
  bool values_ok = true;
  bool bytes_ok = true;
  std::string detail;
};

// Runs one redistribution and checks this rank's result and traffic.
template <class T, class C>
outcome run_case(const layout& from, const layout& to, const extents& g, mesh_comm<C>& mc) {
  const int me = mc.rank();
  const plan p = plan_redistribution(from, to, g, index_t(sizeof(T)));
  const testing::test_array<T> in = testing::to_test_array(make_input<T>(from, g, me));
  mc.reset_stats();
  testing::test_array<T> out_dev = execute(p, in, mc);
  outcome o;
  const index_t moved = mc.total_stats().bytes;
  if (moved != p.bytes_for_rank(me)) {
    o.bytes_ok = false;
    o.detail = "rank " + std::to_string(me) + " moved " + std::to_string(moved) + " bytes, plan says " +
               std::to_string(p.bytes_for_rank(me)) + "\n" + to_string(p);
  }
  // A partial result is checked after reducing it over its partial group directly.
  if (to.has_partial()) {
    axis_list pax;
    for (int a = 0; a < to.dev.ndim; ++a)
      if (to.is_partial(a)) pax.push_back(a);
    mc.group(pax).all_reduce(std::span<T>(out_dev.data(), out_dev.size()), to.op);
  }
  const xt::xarray<T> out = testing::to_host_array<T>(out_dev);
  dist_tensor<T> expect(to.without_partial(), g, me);
  expect.fill_global([&](const auto& idx) { return truth<T>(linear(g, idx)); });
  if (out.size() != expect.local().size()) {
    o.values_ok = false;
  } else {
    for (std::size_t i = 0; i < out.size(); ++i)
      if (out.data()[i] != expect.local().data()[i]) {
        o.values_ok = false;
        break;
      }
  }
  if (!o.values_ok && o.detail.empty()) o.detail = "rank " + std::to_string(me) + " wrong values\n" + to_string(p);
  return o;
}

template <class T>
void exhaustive(bool with_partial, reduce_op op, int max_ndim) {
  auto&& world = testing::test_world();
  int pairs = 0;
  for (const mesh& m : meshes_for(world.size())) {
    mesh_comm<testing::test_comm> mc(m, world);
    // Rank-4 tensors on the meshes of up to 4 ranks (on 8 ranks the pairs number 10^5).
    int top = max_ndim == 3 && m.size() <= 4 ? 4 : max_ndim;
#if TESSERA_TEST_CUDA || TESSERA_TEST_GLOO
    // On the GPU every collective is staged through host memory and waits for the
    // device, and ranks sharing one GPU take turns on it; over Gloo every collective is a
    // round of loopback TCP messages, 8 processes on the build machine's 2 cores taking
    // about 3 ms a redistribution. On 8 ranks: tensors of rank 0 and 1 only (every pair
    // of their layouts still, on every mesh of 8).
    if (m.size() > 4) top = std::min(top, 1);
#endif
    for (int nd = 0; nd <= top; ++nd)
      for (const extents& g : shapes_for(nd)) {
        std::vector<layout> all;
        for_each_layout(m, nd, with_partial, [&](const layout& l) {
          if (check(l, g).ok()) all.push_back(l);
        }, op);
        for (const layout& from : all)
          for (const layout& to : all) {
            if (from.has_partial() && to.has_partial() && from.op != to.op) continue;
            const outcome o = run_case<T>(from, to, g, mc);
            ++pairs;
            if (!o.values_ok || !o.bytes_ok) {
              INFO("mesh " << to_string(m) << " shape " << to_string(g) << ": " << to_string(from)
                           << " -> " << to_string(to) << "\n" << o.detail);
              CHECK(o.values_ok);
              CHECK(o.bytes_ok);
            }
          }
      }
  }
  if (world.rank() == 0) MESSAGE(world.size() << " ranks: " << pairs << " redistributions checked on each");
  CHECK(pairs > 0);
}

}  // namespace

TEST_CASE("every pair of layouts, sum partials, float") { exhaustive<float>(true, reduce_op::sum, 3); }

TEST_CASE("every pair of layouts, max and min partials, up to rank 2") {
  exhaustive<float>(true, reduce_op::max, 2);
  exhaustive<float>(true, reduce_op::min, 2);
}

TEST_CASE("every pair of layouts without partial states, double and int64") {
  exhaustive<double>(false, reduce_op::sum, 2);
  exhaustive<std::int64_t>(true, reduce_op::sum, 2);
}

#if !TESSERA_TEST_GLOO  // over MPI (8 ranks)
TEST_CASE("dist_tensor redistribution: static plans and run-time plans agree") {
  mpi_communicator world = mpi_communicator::world();
  if (world.size() != 8) return;
  constexpr mesh m{2, 4};
  constexpr layout a(m, {{0}, {1}});
  constexpr layout b(m, {{1, 0}, {}});
  mesh_comm<mpi_communicator> mc(m, world);
  dist_tensor<float, a, extents{16, 32}> x(world.rank());
  static_assert(decltype(x)::static_local_shape() == extents{8, 8});
  x.fill_global([](const auto& i) { return float(i[0] * 32 + i[1]); });
  const plan_cache_stats before = process_plan_cache().stats();
  auto y = redistribute<b>(x, mc);  // plan computed by the compiler
  static_assert(decltype(y)::static_local_shape() == extents{2, 32});
  // A static plan never reaches the run-time cache.
  CHECK(process_plan_cache().stats().planned == before.planned);
  CHECK(process_plan_cache().stats().hits == before.hits);
  const dist_tensor<float> z = redistribute(x, b, mc);  // plan computed at run time
  CHECK(y.local() == z.local());
  const extents off = y.local_offset();
  CHECK(y.local()(0, 0) == float(off[0] * 32));
}
#endif

TEST_CASE("run-time plans: the second redistribution of a pair is not planned again") {
  auto&& world = testing::test_world();
  const int p = world.size();
  device_context<testing::test_comm> ctx(world);
  // A shape no other test of this process uses, so the first call plans.
  const extents g{8 * index_t(p), 24};
  const layout rows(mesh{p}, {{0}, {}});
  const layout rep = layout::replicated(mesh{p}, 2);
  // The same rows on another device matrix of the same ranks: (p, 1).
  const layout rows_p1(mesh{p, 1}, {{0}, {1}});
  dist_tensor<float> h(rows, g, world.rank());
  h.fill_global([&](const auto& i) { return float(i[0] * 24 + i[1]); });
  const testing::test_tensor x = testing::to_test_device(h);

  const plan_cache_stats s0 = process_plan_cache().stats();
  const testing::test_tensor y1 = redistribute(x, rep, ctx);
  const plan_cache_stats s1 = process_plan_cache().stats();
  CHECK(s1.planned == s0.planned + 1);
  const testing::test_tensor y2 = redistribute(x, rep, ctx);
  const plan_cache_stats s2 = process_plan_cache().stats();
  CHECK(s2.planned == s1.planned);
  CHECK(s2.hits == s1.hits + 1);
  CHECK(testing::host_shard(y1) == testing::host_shard(y2));
  dist_tensor<float> whole(rep, g, world.rank());
  whole.fill_global([&](const auto& i) { return float(i[0] * 24 + i[1]); });
  CHECK(testing::host_shard(y2) == whole.local());

  // Across device matrices: planned once on their common refinement, then reused;
  // the communicator counts the cached plan's bytes both times.
  const testing::test_tensor z1 = redistribute(x, layout::replicated(mesh{p, 1}, 2), ctx);
  const plan_cache_stats s3 = process_plan_cache().stats();
  CHECK(s3.planned == s2.planned + 1);
  ctx.reset_stats();
  const testing::test_tensor z2 = redistribute(x, layout::replicated(mesh{p, 1}, 2), ctx);
  CHECK(process_plan_cache().stats().planned == s3.planned);
  const auto rp = cached_plan(rows, layout::replicated(mesh{p, 1}, 2), g, 4);
  CHECK(rp->fine == mesh{p});
  CHECK(ctx.total_stats().bytes == rp->p.bytes_for_rank(world.rank()));
  CHECK(testing::host_shard(z2) == whole.local());

  // A tensor already placed as wanted (same shards, another device matrix) is taken
  // as it is: no plan, no copy.
  const plan_cache_stats s4 = process_plan_cache().stats();
  const laid_out<float, testing::test_device> same = in_layout(x, rows_p1, ctx);
  CHECK(&*same == &x);
  CHECK(process_plan_cache().stats().planned == s4.planned);
  CHECK(process_plan_cache().stats().hits == s4.hits);
}
