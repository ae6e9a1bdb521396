// Tests of the MPI communicator, run under mpiexec with 1, 2, 4 and 8 ranks. Every
// rank runs every test case in the same order (SPMD); values encode their source rank
// and block so that a wrong block order fails. Only CHECKs are used: a rank that
// stopped early would leave the others blocked in a collective.
#include <doctest/doctest.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/plan/cost.hpp>

namespace comm_test_mpi {  // the file's own scope in its test group's translation unit

using namespace tessera;

namespace {

template <class T>
T mean_of(T sum, int g) {
  std::vector<T> v{sum};
  detail::divide_by(std::span<T>(v), g);
  return v[0];
}

// Runs f() on c and checks the traffic it adds.
template <class F>
void check_traffic(mpi_communicator& c, index_t bytes, F&& f) {
  const traffic before = c.stats();
  f();
  CHECK(c.stats() - before == traffic{1, bytes});
}

// Meshes with exactly g ranks.
std::vector<mesh> meshes_for(int g) {
  switch (g) {
    case 1: return {mesh{1}, mesh{1, 1}};
    case 2: return {mesh{2}, mesh{1, 2}, mesh{2, 1}};
    case 4: return {mesh{4}, mesh{2, 2}, mesh{1, 4}, mesh{2, 1, 2}};
    case 8: return {mesh{8}, mesh{2, 4}, mesh{4, 2}, mesh{2, 2, 2}};
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

static_assert(communicator<mpi_communicator>);
static_assert(comm_request<mpi_communicator::request>);

TEST_CASE_TEMPLATE("mpi: all_reduce sum, max, min, mean", T, float, double, std::int64_t) {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  const int n = 5;
  std::vector<T> in(n);
  for (int i = 0; i < n; ++i) in[i] = T((r + 1) * 10 + i);
  const auto bytes = index_t(n * sizeof(T));
  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::mean}) {
    CAPTURE(to_string(op));
    std::vector<T> expect(n);
    for (int i = 0; i < n; ++i) {
      const T sum = T(10 * g * (g + 1) / 2 + g * i);
      switch (op) {
        case reduce_op::sum: expect[i] = sum; break;
        case reduce_op::max: expect[i] = T(10 * g + i); break;
        case reduce_op::min: expect[i] = T(10 + i); break;
        case reduce_op::mean: expect[i] = mean_of(sum, g); break;
      }
    }
    std::vector<T> out(n, T(-1));
    check_traffic(c, cost::all_reduce(bytes, g),
                  [&] { c.all_reduce(std::span<const T>(in), std::span<T>(out), op); });
    CHECK(out == expect);
    std::vector<T> inout = in;
    check_traffic(c, cost::all_reduce(bytes, g), [&] { c.all_reduce(std::span<T>(inout), op); });
    CHECK(inout == expect);
    std::vector<T> same = in;  // in and out the same span: in place
    c.all_reduce(std::span<const T>(same), std::span<T>(same), op);
    CHECK(same == expect);
  }
}

TEST_CASE("mpi: all_reduce keeps 64-bit integers and small types") {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  std::vector<std::int64_t> big{(std::int64_t(1) << 40) * (r + 1)};
  c.all_reduce(std::span<std::int64_t>(big), reduce_op::sum);
  CHECK(big[0] == (std::int64_t(1) << 40) * g * (g + 1) / 2);
  std::vector<std::uint8_t> u{std::uint8_t(200 + r), std::uint8_t(r)};
  c.all_reduce(std::span<std::uint8_t>(u), reduce_op::max);
  CHECK(u == std::vector<std::uint8_t>{std::uint8_t(200 + g - 1), std::uint8_t(g - 1)});
  std::vector<std::int32_t> s{-r, r};
  c.all_reduce(std::span<std::int32_t>(s), reduce_op::min);
  CHECK(s == std::vector<std::int32_t>{-(g - 1), 0});
}

TEST_CASE_TEMPLATE("mpi: all_gather in rank order", T, float, double, std::int64_t) {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  const int n = 3;
  std::vector<T> in(n), out(std::size_t(g * n), T(-1)), expect(std::size_t(g * n));
  for (int i = 0; i < n; ++i) in[i] = T(r * 100 + i);
  for (int j = 0; j < g; ++j)
    for (int i = 0; i < n; ++i) expect[j * n + i] = T(j * 100 + i);
  check_traffic(c, cost::all_gather(index_t(n * sizeof(T)), g),
                [&] { c.all_gather(std::span<const T>(in), std::span<T>(out)); });
  CHECK(out == expect);
}

TEST_CASE_TEMPLATE("mpi: reduce_scatter block r onto rank r", T, float, double, std::int64_t) {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  // Small blocks go through MPI_Reduce_scatter_block, large ones (>= 64 KiB) through
  // the wrapper's ring: both must give the same blocks.
  for (const int n : {3, 20011}) {
  CAPTURE(n);
  static_assert(20011 * sizeof(float) >= std::size_t(mpi_communicator::ring_min_block_bytes));
  std::vector<T> in(std::size_t(g * n));
  for (int j = 0; j < g; ++j)
    for (int i = 0; i < n; ++i) in[j * n + i] = T((r + 1) * 1000 + j * 10 + i);
  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::mean}) {
    CAPTURE(to_string(op));
    std::vector<T> out(n, T(-1)), expect(n);
    for (int i = 0; i < n; ++i) {
      const T sum = T(1000 * g * (g + 1) / 2 + g * (r * 10 + i));
      switch (op) {
        case reduce_op::sum: expect[i] = sum; break;
        case reduce_op::max: expect[i] = T(g * 1000 + r * 10 + i); break;
        case reduce_op::min: expect[i] = T(1000 + r * 10 + i); break;
        case reduce_op::mean: expect[i] = mean_of(sum, g); break;
      }
    }
    check_traffic(c, cost::reduce_scatter(index_t(in.size() * sizeof(T)), g), [&] {
      c.reduce_scatter(std::span<const T>(in), std::span<T>(out), op);
    });
    CHECK(out == expect);
  }
  }
}

TEST_CASE_TEMPLATE("mpi: all_to_all block j to rank j", T, float, double, std::int64_t) {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  const int n = 2;  // elements per block
  std::vector<T> in(std::size_t(g * n)), out(std::size_t(g * n), T(-1)), expect(std::size_t(g * n));
  for (int j = 0; j < g; ++j)
    for (int k = 0; k < n; ++k) {
      in[j * n + k] = T(r * 100 + j * 10 + k);      // from r, for j
      expect[j * n + k] = T(j * 100 + r * 10 + k);  // from j, for r
    }
  check_traffic(c, cost::all_to_all(index_t(in.size() * sizeof(T)), g),
                [&] { c.all_to_all(std::span<const T>(in), std::span<T>(out)); });
  CHECK(out == expect);
}

TEST_CASE_TEMPLATE("mpi: all_to_all_v with uneven counts", T, float, double, std::int64_t) {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  auto count = [](int from, int to) { return (from + 2 * to) % 3; };  // 0, 1 or 2 elements
  auto value = [](int from, int to, int k) { return T(from * 10000 + to * 100 + k); };
  // send blocks in rank order with a one-element gap before each; receive blocks in
  // reverse rank order, packed.
  std::vector<int> sc(g), sd(g), rc(g), rd(g);
  int pos = 0;
  for (int j = 0; j < g; ++j) {
    sc[j] = count(r, j);
    sd[j] = pos + 1;
    pos += 1 + sc[j];
  }
  std::vector<T> in(std::size_t(pos), T(-7));
  for (int j = 0; j < g; ++j)
    for (int k = 0; k < sc[j]; ++k) in[sd[j] + k] = value(r, j, k);
  int rpos = 0;
  index_t from_others = 0;
  for (int i = g - 1; i >= 0; --i) {
    rc[i] = count(i, r);
    rd[i] = rpos;
    rpos += rc[i];
    if (i != r) from_others += rc[i];
  }
  std::vector<T> out(std::size_t(rpos), T(-1));
  std::vector<T> expect(std::size_t{std::size_t(rpos)});
  for (int i = 0; i < g; ++i)
    for (int k = 0; k < rc[i]; ++k) expect[rd[i] + k] = value(i, r, k);
  check_traffic(c, from_others * index_t(sizeof(T)), [&] {
    c.all_to_all_v(std::span<const T>(in), std::span<const int>(sc), std::span<const int>(sd),
                   std::span<T>(out), std::span<const int>(rc), std::span<const int>(rd));
  });
  CHECK(out == expect);
}

TEST_CASE_TEMPLATE("mpi: broadcast from every root", T, float, double, std::int64_t) {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  for (int root = 0; root < g; ++root) {
    std::vector<T> buf(4, T(-1)), expect(4);
    for (int i = 0; i < 4; ++i) expect[i] = T(root * 10 + i);
    if (r == root) buf = expect;
    check_traffic(c, r == root ? 0 : cost::broadcast(index_t(4 * sizeof(T)), g),
                  [&] { c.broadcast(std::span<T>(buf), root); });
    CHECK(buf == expect);
  }
}

TEST_CASE_TEMPLATE("mpi: send and recv around a ring", T, float, double, std::int64_t) {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  if (g == 1) return;
  const int next = (r + 1) % g, prev = (r + g - 1) % g;
  std::vector<T> out{T(r), T(r * 2), T(r * 3)};
  std::vector<T> in(5, T(-1));  // larger than the message: 3 elements arrive
  auto do_send = [&] { check_traffic(c, 0, [&] { c.send(std::span<const T>(out), next, 7); }); };
  auto do_recv = [&] {
    check_traffic(c, index_t(3 * sizeof(T)), [&] { c.recv(std::span<T>(in), prev, 7); });
  };
  if (r % 2 == 0) {
    do_send();
    do_recv();
  } else {
    do_recv();
    do_send();
  }
  CHECK(in == std::vector<T>{T(prev), T(prev * 2), T(prev * 3), T(-1), T(-1)});
  // send also takes a span of non-const elements
  if (r == 0) c.send(std::span<T>(out), 1, 8);
  if (r == 1) {
    c.recv(std::span<T>(in), 0, 8);
    CHECK(in[1] == T(0));
  }
}

TEST_CASE("mpi: isend crosses a receive both ways: every rank sends first, then receives") {
  // Large messages (4 MiB: past eager delivery), every rank sending to both neighbours
  // before receiving: blocking sends would wait for each other; isend completes once
  // the receives are posted.
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  if (g == 1) return;
  const int next = (r + 1) % g, prev = (r + g - 1) % g;
  const std::size_t n = std::size_t(1) << 20;
  std::vector<float> to_next(n, float(r)), to_prev(n, float(-r)), from_prev(n), from_next(n);
  auto a = c.isend(std::span<const float>(to_next), next, 3);
  auto b = c.isend(std::span<const float>(to_prev), prev, 4);
  c.recv(std::span<float>(from_prev), prev, 3);
  c.recv(std::span<float>(from_next), next, 4);
  a.wait();
  b.wait();
  CHECK(!a.pending());
  CHECK(from_prev.front() == float(prev));
  CHECK(from_prev.back() == float(prev));
  CHECK(from_next[n / 2] == float(-next));
  CHECK_THROWS_WITH((void)c.isend(std::span<const float>(to_next), g, 0),
                    ("isend: dest " + std::to_string(g) + " is out of range for " + std::to_string(g) + " ranks").c_str());
}

TEST_CASE("mpi: iall_reduce buckets") {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  std::vector<double> a(1000), b(10);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = double(r + 1) * double(i);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = double(r) + double(i);
  const traffic before = c.stats();
  auto ra = c.iall_reduce(std::span<double>(a), reduce_op::sum);
  auto rb = c.iall_reduce(std::span<double>(b), reduce_op::mean);
  CHECK(c.stats() - before ==
        traffic{2, cost::all_reduce(8000, g) + cost::all_reduce(80, g)});
  CHECK(ra.pending());
  mpi_communicator::request moved = std::move(rb);  // move-only
  CHECK(!rb.pending());
  ra.wait();
  moved.wait();
  CHECK(!ra.pending());
  CHECK(!moved.pending());
  const double ranks_sum = double(g) * double(g + 1) / 2;
  bool ok_a = true, ok_b = true;
  for (std::size_t i = 0; i < a.size(); ++i) ok_a = ok_a && a[i] == ranks_sum * double(i);
  for (std::size_t i = 0; i < b.size(); ++i)
    ok_b = ok_b && b[i] == (double(g) * double(g - 1) / 2 + double(g) * double(i)) / double(g);
  CHECK(ok_a);
  CHECK(ok_b);
  // the destructor of a pending request waits (and finishes the mean)
  std::vector<float> m{float(r)};
  {
    auto rm = c.iall_reduce(std::span<float>(m), reduce_op::mean);
  }
  CHECK(m[0] == float(g - 1) / 2.f);
  // test() polls until complete
  std::vector<std::int64_t> t{r};
  auto rt = c.iall_reduce(std::span<std::int64_t>(t), reduce_op::max);
  while (!rt.test()) {
  }
  CHECK(t[0] == g - 1);
}

TEST_CASE_TEMPLATE("mpi: ireduce_scatter equals reduce_scatter, several in flight", T, float, double,
                   std::int64_t) {
  static_assert(nonblocking_communicator<mpi_communicator>);
  static_assert(pollable_request<mpi_communicator::reduce_scatter_request>);
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  // Blocks below and above the blocking call's ring threshold; four requests in flight
  // at once (sum, max, min, mean), completed in reverse order, by wait() and by test().
  for (const int n : {3, 20011}) {
    CAPTURE(n);
    std::vector<T> in(std::size_t(g * n));
    for (int j = 0; j < g; ++j)
      for (int i = 0; i < n; ++i) in[std::size_t(j * n + i)] = T((r + 1) * 1000 + j * 10 + i % 97);
    const reduce_op ops[] = {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::mean};
    std::vector<std::vector<T>> got(4, std::vector<T>(std::size_t(n), T(-1)));
    std::vector<mpi_communicator::reduce_scatter_request> reqs;
    const traffic before = c.stats();
    for (int k = 0; k < 4; ++k)
      reqs.push_back(c.ireduce_scatter(std::span<const T>(in), std::span<T>(got[std::size_t(k)]), ops[k]));
    CHECK(c.stats() - before == traffic{4, 4 * cost::reduce_scatter(index_t(in.size() * sizeof(T)), g)});
    CHECK(reqs[0].pending() == (g > 1));
    reqs[3].wait();
    while (!reqs[2].test()) {
    }
    mpi_communicator::reduce_scatter_request moved = std::move(reqs[1]);  // move-only, in flight
    CHECK(!reqs[1].pending());
    moved.wait();
    reqs[0].wait();
    for (int k = 0; k < 4; ++k) {
      CAPTURE(to_string(ops[k]));
      std::vector<T> want(static_cast<std::size_t>(n));
      c.reduce_scatter(std::span<const T>(in), std::span<T>(want), ops[k]);
      CHECK(got[std::size_t(k)] == want);
    }
  }
  // the destructor of a pending request waits
  std::vector<T> in(std::size_t(g), T(r + 1)), out(1, T(0));
  { auto q = c.ireduce_scatter(std::span<const T>(in), std::span<T>(out), reduce_op::sum); }
  CHECK(out[0] == T(g * (g + 1) / 2));
  std::vector<T> wrong(2);
  CHECK_THROWS_WITH_AS((void)c.ireduce_scatter(std::span<const T>(in), std::span<T>(wrong), reduce_op::sum),
                       ("ireduce_scatter: in has " + std::to_string(g) + " elements, expected " +
                        std::to_string(g) + " ranks x 2 = " + std::to_string(2 * g))
                           .c_str(),
                       error);
}

TEST_CASE("mpi: ibroadcast from every root, overlapping requests") {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  std::vector<std::vector<float>> bufs(std::size_t(g), std::vector<float>(5000));
  std::vector<mpi_communicator::request> reqs;
  const traffic before = c.stats();
  index_t bytes = 0;
  for (int root = 0; root < g; ++root) {
    auto& b = bufs[std::size_t(root)];
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = r == root ? float(root * 10000 + int(i)) : -1.f;
    reqs.push_back(c.ibroadcast(std::span<float>(b), root));
    bytes += r == root ? 0 : cost::broadcast(index_t(b.size() * sizeof(float)), g);
  }
  CHECK(c.stats() - before == traffic{g, bytes});
  for (auto& q : reqs)
    while (!q.test()) {
    }
  bool ok = true;
  for (int root = 0; root < g; ++root)
    for (std::size_t i = 0; i < 5000; ++i) ok = ok && bufs[std::size_t(root)][i] == float(root * 10000 + int(i));
  CHECK(ok);
  CHECK_THROWS_WITH_AS((void)c.ibroadcast(std::span<float>(bufs[0]), g),
                       ("ibroadcast: root " + std::to_string(g) + " is out of range for " + std::to_string(g) +
                        " ranks")
                           .c_str(),
                       error);
}

TEST_CASE("mpi: split orders members by key and counts separately") {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  const int color = r % 2;
  mpi_communicator s = c.split(color, -r);  // reverse rank order within each color
  std::vector<int> members;
  for (int q = g - 1; q >= 0; --q)
    if (q % 2 == color) members.push_back(q);
  CHECK(s.size() == int(members.size()));
  CHECK(members[s.rank()] == r);
  c.reset_stats();
  std::vector<std::int64_t> mine{r}, all(members.size(), -1);
  s.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  CHECK(all == std::vector<std::int64_t>(members.begin(), members.end()));
  CHECK(s.stats() == traffic{1, cost::all_gather(8, s.size())});
  CHECK(c.stats() == traffic{});
  // moving transfers the handle and the counters
  const MPI_Comm h = s.native();
  mpi_communicator t = std::move(s);
  CHECK(t.native() == h);
  CHECK(!s.valid());
  CHECK(t.stats().calls == 1);
  mpi_communicator d = t.dup();
  CHECK(d.size() == t.size());
  CHECK(d.rank() == t.rank());
  CHECK(d.native() != t.native());
}

TEST_CASE("mpi: mesh_comm groups follow core/mesh.hpp") {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  for (const mesh& m : meshes_for(g)) {
    CAPTURE(m.ndim);
    mesh_comm<mpi_communicator> mc(m, c);
    CHECK(mc.rank() == r);
    CHECK(mc.mesh() == m);
    CHECK(&mc.world() == &c);
    std::vector<axis_list> lists;
    ordered_axis_lists(m.ndim, axis_list{}, lists);
    c.reset_stats();
    index_t group_bytes = 0;
    for (const axis_list& axes : lists) {
      CAPTURE(axes.n);
      CAPTURE(axes.n > 0 ? axes[0] : -1);
      CAPTURE(axes.n > 1 ? axes[1] : -1);
      mpi_communicator& gc = mc.group(axes);
      const int gs = group_size(m, axes);
      CHECK(gc.size() == gs);
      CHECK(gc.rank() == group_index(m, axes, r));
      CHECK(&mc.group(axes) == &gc);  // cached
      std::vector<std::int64_t> mine{r}, all(std::size_t(gs), -1);
      std::vector<std::int64_t> expect(std::size_t{std::size_t(gs)});
      for (int i = 0; i < gs; ++i) expect[i] = group_member(m, axes, r, i);
      gc.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
      CHECK(all == expect);
      CHECK(gc.stats() == traffic{1, cost::all_gather(8, gs)});
      group_bytes += cost::all_gather(8, gs);
    }
    c.barrier();
    CHECK(mc.total_stats() == traffic{std::int64_t(lists.size()) + 1, group_bytes});
    mc.reset_stats();
    CHECK(mc.total_stats() == traffic{});
  }
}

TEST_CASE("mpi: mesh_comm rejects a mesh of the wrong size") {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size();
  CHECK_THROWS_WITH_AS((mesh_comm<mpi_communicator>(mesh{2, g}, c)),
                       ("mesh: the mesh size must equal the number of ranks: mesh size " +
                        std::to_string(2 * g) + ", communicator size " + std::to_string(g))
                           .c_str(),
                       error);
  mesh_comm<mpi_communicator> mc(mesh{g}, c);
  CHECK_THROWS_WITH_AS(mc.group({0, 0}), "mesh_comm::group: axis 0 is listed twice", error);
  CHECK_THROWS_WITH_AS(mc.group({1}), "mesh_comm::group: axis 1 is out of range for a mesh with 1 axes",
                       error);
}

TEST_CASE("mpi: size mismatches name the collective and the numbers") {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size();
  const std::string G = std::to_string(g);
  std::vector<float> three(3), ten(10), buf(3 * std::size_t(g) + 1);
  CHECK_THROWS_WITH_AS(c.all_gather(std::span<const float>(three), std::span<float>(ten)),
                       ("all_gather: out has 10 elements, expected " + G + " ranks x 3 = " +
                        std::to_string(3 * g)).c_str(),
                       error);
  CHECK_THROWS_WITH_AS(c.reduce_scatter(std::span<const float>(ten), std::span<float>(three), reduce_op::sum),
                       ("reduce_scatter: in has 10 elements, expected " + G + " ranks x 3 = " +
                        std::to_string(3 * g)).c_str(),
                       error);
  CHECK_THROWS_WITH_AS(c.all_reduce(std::span<const float>(three), std::span<float>(ten), reduce_op::sum),
                       "all_reduce: out has 10 elements, expected 3 (the size of in)", error);
  if (g > 1)  // 3 g + 1 elements
    CHECK_THROWS_WITH_AS(c.all_to_all(std::span<const float>(buf), std::span<float>(ten)),
                         ("all_to_all: in has " + std::to_string(buf.size()) +
                          " elements, not divisible into " + G + " equal blocks (one per rank)")
                             .c_str(),
                         error);
  CHECK_THROWS_WITH_AS(c.all_to_all(std::span<const float>(buf.data(), 3 * std::size_t(g)),
                                    std::span<float>(ten)),
                       ("all_to_all: out has 10 elements, expected " + std::to_string(3 * g) +
                        " (the size of in)").c_str(),
                       error);
  CHECK_THROWS_WITH_AS(c.broadcast(std::span<float>(three), g),
                       ("broadcast: root " + G + " is out of range for " + G + " ranks").c_str(), error);
  CHECK_THROWS_WITH_AS(c.send(std::span<const float>(three), -1),
                       ("send: dest -1 is out of range for " + G + " ranks").c_str(), error);
  CHECK_THROWS_WITH_AS(c.recv(std::span<float>(three), 0, -2), "recv: tag -2 must not be negative",
                       error);
  {
    std::vector<int> counts(std::size_t(g) + 1, 0), displs(std::size_t(g), 0);
    CHECK_THROWS_WITH_AS(c.all_to_all_v(std::span<const float>(three), std::span<const int>(displs),
                                        std::span<const int>(displs), std::span<float>(ten),
                                        std::span<const int>(counts), std::span<const int>(displs)),
                         ("all_to_all_v: recv_counts has " + std::to_string(g + 1) +
                          " entries, expected " + G + " (one per rank)").c_str(),
                         error);
    std::vector<int> sc(std::size_t(g), 0);
    sc[g - 1] = 2;
    std::vector<int> sd(std::size_t(g), 0);
    sd[g - 1] = 2;
    CHECK_THROWS_WITH_AS(c.all_to_all_v(std::span<const float>(three), std::span<const int>(sc),
                                        std::span<const int>(sd), std::span<float>(ten),
                                        std::span<const int>(displs), std::span<const int>(displs)),
                         ("all_to_all_v: the block for rank " + std::to_string(g - 1) +
                          " covers elements [2, 4) of in, which has 3 elements").c_str(),
                         error);
  }
  CHECK_THROWS_WITH_AS(c.split(-3, 0), "split: color -3 must not be negative (every rank joins a group)",
                       error);
  // counts above INT_MAX are refused before MPI sees them (the buffer is never read)
  const std::size_t huge = std::size_t(INT_MAX) + 1;
  CHECK_THROWS_WITH_AS(c.all_reduce(std::span<float>(three.data(), huge), reduce_op::sum),
                       "all_reduce: inout has 2147483648 elements, more than MPI's count limit "
                       "2147483647 (split the buffer into smaller calls)",
                       error);
  CHECK_THROWS_WITH_AS(c.broadcast(std::span<float>(three.data(), huge), 0),
                       "broadcast: buf has 2147483648 elements, more than MPI's count limit "
                       "2147483647 (split the buffer into smaller calls)",
                       error);
  // failed calls are not counted
  CHECK(c.stats() == traffic{});
}

TEST_CASE("mpi: an MPI failure becomes a tessera::error naming the call") {
  mpi_communicator c = mpi_communicator::world();
  const int g = c.size(), r = c.rank();
  if (g < 2) return;
  std::vector<double> four{1, 2, 3, 4}, two(2);
  if (r == 0) c.send(std::span<const double>(four), 1, 3);
  if (r == 1) {
    bool thrown = false;
    try {
      c.recv(std::span<double>(two), 0, 3);  // a 4-element message into 2 elements
    } catch (const error& e) {
      thrown = true;
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.rfind("MPI_Recv failed: MPI_ERR_TRUNCATE", 0) == 0);
    }
    CHECK(thrown);
  }
  c.barrier();
}
}  // namespace comm_test_mpi
