// Tests of the one-rank communicator: every collective copies, checks its arguments
// with the shared messages, and counts calls with zero bytes.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <span>
#include <type_traits>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mesh_comm.hpp>

using namespace tessera;

namespace {

template <class T>
std::vector<T> iota_vec(std::size_t n, T start) {
  std::vector<T> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

}  // namespace

static_assert(communicator<local_communicator>);
static_assert(comm_request<local_communicator::request>);
static_assert(!comm_element<bool>);
static_assert(comm_element<float> && comm_element<double> && comm_element<std::int32_t> &&
              comm_element<std::int64_t> && comm_element<std::uint8_t>);

TEST_CASE_TEMPLATE("local_communicator: collectives copy", T, float, double, std::int32_t,
                   std::int64_t, std::uint8_t) {
  local_communicator c;
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  const std::vector<T> in = iota_vec<T>(6, T(3));

  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::mean}) {
    std::vector<T> out(6, T(0));
    c.all_reduce(std::span<const T>(in), std::span<T>(out), op);
    CHECK(out == in);
    std::vector<T> inout = in;
    c.all_reduce(std::span<T>(inout), op);
    CHECK(inout == in);
    std::vector<T> rs(6, T(0));
    c.reduce_scatter(std::span<const T>(in), std::span<T>(rs), op);
    CHECK(rs == in);
    std::vector<T> nb = in;
    auto req = c.iall_reduce(std::span<T>(nb), op);
    req.wait();
    CHECK(!req.pending());
    CHECK(nb == in);
  }
  {
    std::vector<T> out(6, T(0));
    c.all_gather(std::span<const T>(in), std::span<T>(out));
    CHECK(out == in);
  }
  {
    std::vector<T> out(6, T(0));
    c.all_to_all(std::span<const T>(in), std::span<T>(out));
    CHECK(out == in);
  }
  {
    // 4 elements from in[1..5) to out[2..6)
    std::vector<T> out(7, T(0));
    const int sc[] = {4}, sd[] = {1}, rc[] = {4}, rd[] = {2};
    c.all_to_all_v(std::span<const T>(in), sc, sd, std::span<T>(out), rc, rd);
    CHECK(out == std::vector<T>{T(0), T(0), T(4), T(5), T(6), T(7), T(0)});
  }
  {
    std::vector<T> buf = in;
    c.broadcast(std::span<T>(buf), 0);
    CHECK(buf == in);
  }
  // in-place all_reduce through the two-span form (same span)
  {
    std::vector<T> buf = in;
    c.all_reduce(std::span<const T>(buf), std::span<T>(buf), reduce_op::sum);
    CHECK(buf == in);
  }
}

TEST_CASE("local_communicator: traffic counts calls, zero bytes") {
  local_communicator c;
  std::vector<float> a(8, 1.f), b(8, 0.f);
  c.all_reduce(std::span<float>(a), reduce_op::sum);
  c.all_reduce(std::span<const float>(a), std::span<float>(b), reduce_op::mean);
  c.all_gather(std::span<const float>(a), std::span<float>(b));
  c.reduce_scatter(std::span<const float>(a), std::span<float>(b), reduce_op::max);
  c.all_to_all(std::span<const float>(a), std::span<float>(b));
  const int n[] = {8}, z[] = {0};
  c.all_to_all_v(std::span<const float>(a), n, z, std::span<float>(b), n, z);
  c.broadcast(std::span<float>(a), 0);
  c.barrier();
  auto r = c.iall_reduce(std::span<float>(a), reduce_op::sum);
  r.wait();
  CHECK(c.stats() == traffic{9, 0});
  c.reset_stats();
  CHECK(c.stats() == traffic{});

  // split gives an independent one-rank communicator with its own counters
  local_communicator s = c.split(0, 0);
  s.barrier();
  CHECK(s.size() == 1);
  CHECK(s.stats().calls == 1);
  CHECK(c.stats().calls == 0);
}

TEST_CASE("local_communicator: size mismatches name the collective and the numbers") {
  local_communicator c;
  std::vector<float> a(3), b(4), big(12);
  CHECK_THROWS_WITH_AS(c.all_reduce(std::span<const float>(a), std::span<float>(b), reduce_op::sum),
                       "all_reduce: out has 4 elements, expected 3 (the size of in)", error);
  CHECK_THROWS_WITH_AS(c.all_gather(std::span<const float>(a), std::span<float>(b)),
                       "all_gather: out has 4 elements, expected 1 ranks x 3 = 3", error);
  CHECK_THROWS_WITH_AS(c.reduce_scatter(std::span<const float>(a), std::span<float>(b), reduce_op::sum),
                       "reduce_scatter: in has 3 elements, expected 1 ranks x 4 = 4", error);
  CHECK_THROWS_WITH_AS(c.all_to_all(std::span<const float>(a), std::span<float>(b)),
                       "all_to_all: out has 4 elements, expected 3 (the size of in)", error);
  CHECK_THROWS_WITH_AS(c.broadcast(std::span<float>(a), 1),
                       "broadcast: root 1 is out of range for 1 ranks", error);
  CHECK_THROWS_WITH_AS(c.all_gather(std::span<const float>(big.data(), 3), std::span<float>(big.data() + 2, 3)),
                       "all_gather: in and out overlap; the buffers of a collective must be distinct",
                       error);
  {
    const int two[] = {1, 1}, one[] = {0}, three[] = {3}, neg[] = {-1};
    CHECK_THROWS_WITH_AS(c.all_to_all_v(std::span<const float>(a), two, one, std::span<float>(b), one, one),
                         "all_to_all_v: send_counts has 2 entries, expected 1 (one per rank)", error);
    CHECK_THROWS_WITH_AS(c.all_to_all_v(std::span<const float>(a), neg, one, std::span<float>(b), one, one),
                         "all_to_all_v: send_counts[0] is -1, must not be negative", error);
    const int four[] = {4};
    CHECK_THROWS_WITH_AS(c.all_to_all_v(std::span<const float>(a), four, one, std::span<float>(b), four, one),
                         "all_to_all_v: the block for rank 0 covers elements [0, 4) of in, which has 3 elements",
                         error);
    CHECK_THROWS_WITH_AS(c.all_to_all_v(std::span<const float>(a), three, one, std::span<float>(b), one, one),
                         "all_to_all_v: rank 0 sends 3 elements to itself and expects to receive 0",
                         error);
  }
  CHECK_THROWS_WITH_AS(c.send(std::span<const float>(a), 0),
                       "send: dest 0 is this rank; a one-rank communicator has no peer to send to",
                       error);
  CHECK_THROWS_WITH_AS(c.recv(std::span<float>(a), 0),
                       "recv: source 0 is this rank; a one-rank communicator has no peer to receive from",
                       error);
  CHECK_THROWS_WITH_AS(c.send(std::span<float>(a), 2), "send: dest 2 is out of range for 1 ranks",
                       error);
  CHECK_THROWS_WITH_AS(c.split(-1, 0), "split: color -1 must not be negative (every rank joins a group)",
                       error);
  // a failed call is not counted
  CHECK(c.stats() == traffic{});
}

TEST_CASE("mesh_comm over local_communicator") {
  local_communicator c;
  mesh_comm<local_communicator> mc(mesh{1}, c);
  CHECK(mc.rank() == 0);
  CHECK(mc.mesh() == mesh{1});
  CHECK(&mc.world() == &c);
  local_communicator& g0 = mc.group({0});
  local_communicator& ge = mc.group({});
  CHECK(&mc.group({0}) == &g0);  // cached
  CHECK(&ge != &g0);
  CHECK(g0.size() == 1);
  g0.barrier();
  ge.barrier();
  c.barrier();
  CHECK(mc.total_stats() == traffic{3, 0});
  mc.reset_stats();
  CHECK(mc.total_stats() == traffic{});
  CHECK(g0.stats() == traffic{});

  mesh_comm deduced(mesh{1, 1}, c);  // C deduced from the communicator
  static_assert(std::is_same_v<decltype(deduced), mesh_comm<local_communicator>>);
  CHECK(deduced.group({1, 0}).size() == 1);

  CHECK_THROWS_WITH_AS(mc.group({1}), "mesh_comm::group: axis 1 is out of range for a mesh with 1 axes",
                       error);
  CHECK_THROWS_WITH_AS((mesh_comm<local_communicator>(mesh{2, 2}, c)),
                       "mesh: the mesh size must equal the number of ranks: mesh size 4, communicator size 1",
                       error);
  CHECK_THROWS_WITH_AS((mesh_comm<local_communicator>(mesh{1, 0}, c)),
                       "mesh: every mesh axis size must be positive: mesh axis 1 has size 0", error);
}

TEST_CASE("local_communicator: ireduce_scatter and ibroadcast complete at once") {
  static_assert(nonblocking_communicator<local_communicator>);
  local_communicator c;
  std::vector<float> a{1.f, 2.f, 3.f}, b(3, 0.f);
  auto r = c.ireduce_scatter(std::span<const float>(a), std::span<float>(b), reduce_op::sum);
  CHECK(!r.pending());
  CHECK(r.test());
  CHECK(b == a);
  auto q = c.ibroadcast(std::span<float>(a), 0);
  q.wait();
  CHECK(a == std::vector<float>{1.f, 2.f, 3.f});
  CHECK(c.stats() == traffic{2, 0});
  std::vector<float> four(4);
  CHECK_THROWS_WITH_AS((void)c.ireduce_scatter(std::span<const float>(a), std::span<float>(four), reduce_op::sum),
                       "ireduce_scatter: in has 3 elements, expected 1 ranks x 4 = 4", error);
  CHECK_THROWS_WITH_AS((void)c.ibroadcast(std::span<float>(a), 1), "ibroadcast: root 1 is out of range for 1 ranks",
                       error);
  CHECK(c.stats() == traffic{2, 0});
}
