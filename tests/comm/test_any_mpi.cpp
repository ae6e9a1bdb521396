// Tests of any_communicator over mpi_communicator, run under mpiexec with 1, 2 and 4
// ranks: every call through the handle gives the values, the traffic (the planner's
// prices) and the error texts of the typed communicator, for several element types;
// splits, node_local, mesh_comm groups and redistribution plans through the handle;
// non-blocking calls; tessera::run picks the MPI world under mpiexec. Every rank runs
// every case in the same order; only CHECKs are used (a rank that stopped early would
// leave the others blocked in a collective).
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/format.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/plan/cost.hpp>

namespace comm_test_any_mpi {  // the file's own scope in its test group's translation unit

using namespace tessera;

static_assert(communicator<any_communicator>);
static_assert(nonblocking_communicator<any_communicator>);
static_assert(std::is_convertible_v<mpi_communicator, any_communicator>);
static_assert(!std::is_convertible_v<mpi_communicator&, any_communicator>);  // move-only: moved in
// iall_reduce's, ibroadcast's and isend's requests are kept inside any_request (no allocation).
static_assert(sizeof(mpi_communicator::request) <= any_request::inline_bytes &&
              std::is_nothrow_move_constructible_v<mpi_communicator::request>);

namespace {

/// What `f()` throws as a tessera::error ("" when it does not throw).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "";
}

// Small values (sums of 4 ranks fit in a signed char) that encode rank and index.
template <class T>
T value(int rank, std::size_t i) {
  return T(rank + 1 + int(i % 7) * 4);
}

/// The typed world and the handle over another world, side by side: `both(bytes, f)`
/// runs f on the typed communicator, then on the handle (f(comm, out) writes into out),
/// and checks the outputs are equal and each added one call of `bytes` bytes.
template <class T>
struct pair_of_worlds {
  mpi_communicator& typed;
  any_communicator& any;

  template <class F>
  std::vector<T> both(index_t bytes, F&& f) {
    std::vector<T> out_t, out_a;
    const traffic t0 = typed.stats(), a0 = any.stats();
    f(typed, out_t);
    f(any, out_a);
    CHECK(out_a == out_t);
    CHECK(typed.stats() - t0 == traffic{1, bytes});
    CHECK(any.stats() - a0 == traffic{1, bytes});
    return out_a;
  }
};

// Meshes with exactly g ranks.
std::vector<mesh> meshes_for(int g) {
  switch (g) {
    case 1: return {mesh{1}, mesh{1, 1}};
    case 2: return {mesh{2}, mesh{1, 2}, mesh{2, 1}};
    case 4: return {mesh{4}, mesh{2, 2}, mesh{1, 4}, mesh{2, 1, 2}};
    default: return {mesh{g}};
  }
}

// Every ordered list of distinct axes of an n-axis mesh, the empty list included.
void ordered_axis_lists(int n, axis_list cur, std::vector<axis_list>& out) {
  out.push_back(cur);
  for (int a = 0; a < n; ++a) {
    if (cur.contains(a)) continue;
    axis_list next = cur;
    next.push_back(a);
    ordered_axis_lists(n, next, out);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("any_communicator over mpi: every collective equals mpi_communicator's, values and traffic", T,
                   float, double, long double, std::int64_t, std::uint8_t, short, char, unsigned int) {
  mpi_communicator typed = mpi_communicator::world();
  any_communicator any = mpi_communicator::world();
  const int g = typed.size(), r = typed.rank();
  CHECK(any.size() == g);
  CHECK(any.rank() == r);
  pair_of_worlds<T> w{typed, any};
  const index_t t = index_t(sizeof(T));

  // Blocks below and above mpi_communicator's ring threshold for reduce_scatter.
  for (const std::size_t n : {std::size_t(3), std::size_t(70000) / sizeof(T) + 1}) {
    CAPTURE(n);
    std::vector<T> in(n * std::size_t(g));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value<T>(r, i);
    const std::span<const T> block(in.data(), n);
    const index_t nb = index_t(n) * t, gb = nb * g;

    for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::mean}) {
      CAPTURE(to_string(op));
      w.both(cost::all_reduce(nb, g), [&](auto& c, std::vector<T>& out) {
        out.assign(n, T(0));
        c.all_reduce(block, std::span<T>(out), op);
      });
      w.both(cost::all_reduce(nb, g), [&](auto& c, std::vector<T>& out) {
        out.assign(block.begin(), block.end());
        c.all_reduce(std::span<T>(out), op);
      });
      w.both(cost::all_reduce(nb, g), [&](auto& c, std::vector<T>& out) {  // in == out: in place
        out.assign(block.begin(), block.end());
        c.all_reduce(std::span<const T>(out), std::span<T>(out), op);
      });
      w.both(cost::reduce_scatter(gb, g), [&](auto& c, std::vector<T>& out) {
        out.assign(n, T(0));
        c.reduce_scatter(std::span<const T>(in), std::span<T>(out), op);
      });
    }
    const std::vector<T> gathered = w.both(cost::all_gather(nb, g), [&](auto& c, std::vector<T>& out) {
      out.assign(n * std::size_t(g), T(0));
      c.all_gather(block, std::span<T>(out));
    });
    bool ok = true;  // block j of the result is rank j's
    for (int j = 0; j < g; ++j)
      for (std::size_t i = 0; i < n; ++i) ok = ok && gathered[std::size_t(j) * n + i] == value<T>(j, i);
    CHECK(ok);
    w.both(cost::all_to_all(gb, g), [&](auto& c, std::vector<T>& out) {
      out.assign(in.size(), T(0));
      c.all_to_all(std::span<const T>(in), std::span<T>(out));
    });
    for (int root = 0; root < g; ++root)
      w.both(r == root ? 0 : cost::broadcast(nb, g), [&](auto& c, std::vector<T>& out) {
        out.assign(block.begin(), block.end());
        c.broadcast(std::span<T>(out), root);
      });
  }

  // all_to_all_v: rank `from` sends (from + 2 to) % 3 elements to rank `to`; bytes exact.
  {
    auto count = [](int from, int to) { return (from + 2 * to) % 3; };
    const auto gs = static_cast<std::size_t>(g);
    std::vector<int> sc(gs), sd(gs), rc(gs), rd(gs);
    int spos = 0, rpos = 0;
    index_t from_others = 0;
    for (int j = 0; j < g; ++j) {
      sc[std::size_t(j)] = count(r, j), sd[std::size_t(j)] = spos, spos += sc[std::size_t(j)];
      rc[std::size_t(j)] = count(j, r), rd[std::size_t(j)] = rpos, rpos += rc[std::size_t(j)];
      if (j != r) from_others += rc[std::size_t(j)];
    }
    std::vector<T> in(static_cast<std::size_t>(spos));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value<T>(r, i);
    w.both(from_others * t, [&](auto& c, std::vector<T>& out) {
      out.assign(std::size_t(rpos), T(0));
      c.all_to_all_v(std::span<const T>(in), std::span<const int>(sc), std::span<const int>(sd), std::span<T>(out),
                     std::span<const int>(rc), std::span<const int>(rd));
    });
  }

  // send and recv around a ring (even ranks send first)
  if (g > 1) {
    const int next = (r + 1) % g, prev = (r + g - 1) % g;
    const std::vector<T> mine{value<T>(r, 0), value<T>(r, 1), value<T>(r, 2)};
    for (int side = 0; side < 2; ++side) {
      std::vector<T> got(5, T(0));  // larger than the message: 3 elements arrive
      const traffic t0 = typed.stats(), a0 = any.stats();
      auto ring = [&](auto& c) {
        if (r % 2 == 0) c.send(std::span<const T>(mine), next, 7);
        c.recv(std::span<T>(got), prev, 7);
        if (r % 2 == 1) c.send(std::span<const T>(mine), next, 7);
      };
      if (side == 0) ring(typed);
      else ring(any);
      CHECK(got == std::vector<T>{value<T>(prev, 0), value<T>(prev, 1), value<T>(prev, 2), T(0), T(0)});
      const traffic added = side == 0 ? typed.stats() - t0 : any.stats() - a0;
      CHECK(added == traffic{2, 3 * t});
    }
  }

  const traffic a0 = any.stats();
  any.barrier();
  CHECK(any.stats() - a0 == traffic{1, 0});
}

TEST_CASE_TEMPLATE("any_communicator over mpi: non-blocking calls equal the blocking ones, several in flight", T,
                   float, double, std::int32_t) {
  mpi_communicator typed = mpi_communicator::world();
  any_communicator any = mpi_communicator::world();
  const int g = any.size(), r = any.rank();
  for (const std::size_t n : {std::size_t(3), std::size_t(20011)}) {
    CAPTURE(n);
    std::vector<T> in(n * std::size_t(g));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value<T>(r, i);
    const index_t gb = index_t(in.size() * sizeof(T)), nb = index_t(n * sizeof(T));

    // The blocking results, from the typed communicator.
    std::vector<T> sum(in.begin(), in.begin() + std::ptrdiff_t(n)), mean = sum, rs(n), bc(n);
    typed.all_reduce(std::span<T>(sum), reduce_op::sum);
    typed.all_reduce(std::span<T>(mean), reduce_op::mean);
    typed.reduce_scatter(std::span<const T>(in), std::span<T>(rs), reduce_op::max);
    for (std::size_t i = 0; i < n; ++i) bc[i] = value<T>(g - 1, i + 5);
    const std::vector<T> bc_expect = bc;
    if (r != g - 1) bc.assign(n, T(0));

    // The same four through the handle, in flight together, completed in another order.
    std::vector<T> a_sum(in.begin(), in.begin() + std::ptrdiff_t(n)), a_mean = a_sum, a_rs(n, T(0)), a_bc = bc;
    any.reset_stats();
    any_request q1 = any.iall_reduce(std::span<T>(a_sum), reduce_op::sum);
    any_request q2 = any.ireduce_scatter(std::span<const T>(in), std::span<T>(a_rs), reduce_op::max);
    any_request q3 = any.ibroadcast(std::span<T>(a_bc), g - 1);
    any_request q4 = any.iall_reduce(std::span<T>(a_mean), reduce_op::mean);
    CHECK(any.stats() == traffic{4, 2 * cost::all_reduce(nb, g) + cost::reduce_scatter(gb, g) +
                                        (r == g - 1 ? 0 : cost::broadcast(nb, g))});
    q4.wait();
    while (!q2.test()) {
    }
    any_request moved = std::move(q3);  // move-only, in flight
    CHECK(!q3.pending());
    moved.wait();
    { any_request dropped = std::move(q1); }  // a pending request's destructor waits (mpi_communicator's)
    CHECK(!moved.pending());
    CHECK(a_sum == sum);
    CHECK(a_mean == mean);
    CHECK(a_rs == rs);
    CHECK(a_bc == bc_expect);
  }

  // isend crosses a receive both ways: every rank sends first, then receives (4 MiB).
  if (g > 1) {
    const int next = (r + 1) % g, prev = (r + g - 1) % g;
    const std::size_t n = std::size_t(1) << 20;
    std::vector<float> to_next(n, float(r)), to_prev(n, float(-r)), from_prev(n), from_next(n);
    any_request a = any.isend(std::span<const float>(to_next), next, 3);
    any_request b = any.isend(std::span<const float>(to_prev), prev, 4);
    any.recv(std::span<float>(from_prev), prev, 3);
    any.recv(std::span<float>(from_next), next, 4);
    a.wait();
    b.wait();
    CHECK(from_prev.back() == float(prev));
    CHECK(from_next.front() == float(-next));
  }
}

TEST_CASE("any_communicator over mpi: split, node_local and target") {
  mpi_communicator typed = mpi_communicator::world();
  any_communicator any = mpi_communicator::world();
  const int g = any.size(), r = any.rank();
  CHECK(any.backend() == "mpi");
  CHECK(!any.device_buffers());
  CHECK(!uses_device_buffers(any));
  REQUIRE(any.target<mpi_communicator>() != nullptr);
  CHECK(any.target<mpi_communicator>()->native() != MPI_COMM_NULL);
  CHECK(any.target<local_communicator>() == nullptr);

  const int color = r % 2;
  mpi_communicator ts = typed.split(color, -r);  // reverse rank order within each color
  any_communicator as = any.split(color, -r);
  CHECK(as.backend() == "mpi");
  CHECK(as.size() == ts.size());
  CHECK(as.rank() == ts.rank());
  any.reset_stats();
  std::vector<std::int64_t> mine{r}, all_t(std::size_t(ts.size())), all_a(std::size_t(as.size()));
  ts.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all_t));
  as.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all_a));
  CHECK(all_a == all_t);
  CHECK(as.stats() == traffic{1, cost::all_gather(8, as.size())});
  CHECK(any.stats() == traffic{});  // the split's own counters

  // node_local, with no MPI type named: the ranks on this rank's node.
  any_communicator node = any.node_local();
  mpi_communicator tnode = typed.node_local();
  CHECK(node.backend() == "mpi");
  CHECK(node.rank() == tnode.rank());
  CHECK(node.size() == tnode.size());
  CHECK(node.size() <= g);
}

TEST_CASE("device_communicator for host shards: a duplicate of the world, its own traffic") {
  any_communicator world = mpi_communicator::world();
  any_communicator dup = device_communicator(world, cpu_device{});
  CHECK(dup.backend() == "mpi");
  CHECK(!dup.device_buffers());
  CHECK(dup.size() == world.size());
  CHECK(dup.rank() == world.rank());
  REQUIRE(dup.target<mpi_communicator>() != nullptr);
  CHECK(dup.target<mpi_communicator>()->native() != world.target<mpi_communicator>()->native());
  world.reset_stats();
  std::vector<float> v{float(world.rank() + 1)};
  dup.all_reduce(std::span<float>(v), reduce_op::sum);
  CHECK(v[0] == float(world.size() * (world.size() + 1) / 2));
  CHECK(world.stats() == traffic{});
}

TEST_CASE("any_communicator over mpi: mesh_comm groups equal the typed ones") {
  mpi_communicator typed = mpi_communicator::world();
  any_communicator any = mpi_communicator::world();
  const int g = any.size(), r = any.rank();
  for (const mesh& m : meshes_for(g)) {
    CAPTURE(m.ndim);
    mesh_comm<mpi_communicator> mt(m, typed);
    mesh_comm<any_communicator> ma(m, any);
    std::vector<axis_list> lists;
    ordered_axis_lists(m.ndim, axis_list{}, lists);
    ma.reset_stats();
    index_t bytes = 0;
    for (const axis_list& axes : lists) {
      CAPTURE(axes.n);
      CAPTURE(axes.n > 0 ? axes[0] : -1);
      CAPTURE(axes.n > 1 ? axes[1] : -1);
      mpi_communicator& gt = mt.group(axes);
      any_communicator& ga = ma.group(axes);
      const int gs = group_size(m, axes);
      CHECK(ga.size() == gs);
      CHECK(ga.rank() == group_index(m, axes, r));
      CHECK(ga.rank() == gt.rank());
      CHECK(ga.backend() == "mpi");
      const auto members = static_cast<std::size_t>(gs);
      std::vector<std::int64_t> mine{r}, all_t(members), all_a(members);
      gt.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all_t));
      ga.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all_a));
      CHECK(all_a == all_t);
      CHECK(ga.stats() == gt.stats());
      bytes += cost::all_gather(8, gs);
    }
    any.barrier();
    CHECK(ma.total_stats() == traffic{std::int64_t(lists.size()) + 1, bytes});
  }
}

TEST_CASE("any_communicator over mpi: redistribution plans run unchanged and move the bytes they price") {
  mpi_communicator typed = mpi_communicator::world();
  any_communicator any = mpi_communicator::world();
  const int g = any.size(), me = any.rank();
  device_context<mpi_communicator> ct(typed);
  device_context<any_communicator> ca(any);
  const extents shape{8, 8};
  int pairs = 0;
  for (const mesh& m : meshes_for(g)) {
    if (m.ndim > 2) continue;
    std::vector<layout> all;
    for_each_layout(m, 2, true, [&](const layout& l) {
      if (check(l, shape).ok()) all.push_back(l);
    });
    for (const layout& from : all)
      for (const layout& to : all) {
        if (from.has_partial() && to.has_partial() && from.op != to.op) continue;
        const plan p = plan_redistribution(from, to, shape, index_t(sizeof(float)));
        dist_tensor<float> x(from.without_partial(), shape, me);
        x.fill_global([&](const auto& idx) { return float(idx[0] * 8 + idx[1] + (from.has_partial() ? me : 0)); });
        ca.reset_stats();
        ct.reset_stats();
        const xt::xarray<float> yt = execute(p, x.local(), ct.on(m));
        const xt::xarray<float> ya = execute(p, x.local(), ca.on(m));
        ++pairs;
        if (!(ya == yt) || ca.total_stats() != ct.total_stats() || ca.total_stats().bytes != p.bytes_for_rank(me)) {
          INFO(to_string(from) << " -> " << to_string(to));
          CHECK(ya == yt);
          CHECK(ca.total_stats() == ct.total_stats());
          CHECK(ca.total_stats().bytes == p.bytes_for_rank(me));
        }
      }
  }
  CHECK(pairs > 0);
}

TEST_CASE("any_communicator over mpi: size mismatches keep mpi_communicator's texts") {
  mpi_communicator typed = mpi_communicator::world();
  any_communicator any = mpi_communicator::world();
  const int g = any.size();
  std::vector<float> a(3), b(3 * std::size_t(g) + 1);
  auto same = [&](auto&& f) {
    const std::string t = error_of([&] { f(typed); }), h = error_of([&] { f(any); });
    CHECK(!t.empty());
    CHECK(h == t);
    return h;
  };
  CHECK(same([&](auto& c) { c.all_reduce(std::span<const float>(a), std::span<float>(b), reduce_op::sum); }) ==
        "all_reduce: out has " + std::to_string(b.size()) + " elements, expected 3 (the size of in)");
  CHECK(same([&](auto& c) { c.all_gather(std::span<const float>(a), std::span<float>(b)); }) ==
        "all_gather: out has " + std::to_string(b.size()) + " elements, expected " + std::to_string(g) +
            " ranks x 3 = " + std::to_string(3 * g));
  same([&](auto& c) { c.reduce_scatter(std::span<const float>(b), std::span<float>(a), reduce_op::sum); });
  same([&](auto& c) { (void)c.ireduce_scatter(std::span<const float>(b), std::span<float>(a), reduce_op::sum); });
  same([&](auto& c) { c.all_to_all(std::span<const float>(a), std::span<float>(b)); });
  same([&](auto& c) { c.broadcast(std::span<float>(a), g); });
  same([&](auto& c) { (void)c.ibroadcast(std::span<float>(a), -1); });
  same([&](auto& c) { c.send(std::span<const float>(a), g, 0); });
  same([&](auto& c) { c.recv(std::span<float>(a), 0, -1); });
  same([&](auto& c) { (void)c.isend(std::span<const float>(a), -1, 0); });
  same([&](auto& c) { (void)c.split(-2, 0); });
  {
    const std::vector<int> too_many(static_cast<std::size_t>(g + 1), 0);  // one entry per rank expected
    const std::span<const int> v(too_many);
    CHECK(same([&](auto& c) { c.all_to_all_v(std::span<const float>(a), v, v, std::span<float>(b), v, v); }) ==
          "all_to_all_v: send_counts has " + std::to_string(g + 1) + " entries, expected " + std::to_string(g) +
              " (one per rank)");
  }
  CHECK(any.stats() == traffic{});  // a failed call is not counted
}

TEST_CASE("tessera::run under mpiexec: the MPI world in the handle") {
  CHECK(launched_backend() == world_backend::mpi);
  mpi_communicator typed = mpi_communicator::world();
  int seen_size = 0;
  std::string seen_backend;
  const int result = run(0, nullptr, [&](any_communicator& world) {
    seen_size = world.size();
    seen_backend = std::string(world.backend());
    std::vector<int> one{1};
    world.all_reduce(std::span<int>(one), reduce_op::sum);
    return one[0] == world.size() ? 7 : 1;
  });
  CHECK(result == 7);
  CHECK(seen_backend == "mpi");
  CHECK(seen_size == typed.size());
  int init = 0;
  MPI_Initialized(&init);
  CHECK(init == 1);  // MPI was already running: run left it as it was
  int fin = 0;
  MPI_Finalized(&fin);
  CHECK(fin == 0);
}
}  // namespace comm_test_any_mpi
