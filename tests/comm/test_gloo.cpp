// Tests of the Gloo communicator, run as a job of 1, 2 and 4 workers networked by a
// scheduler (tests/comm/job_by_hand.sh; tests/gloo_main.cpp makes the world). Values encode
// their source rank and block, so a wrong block order fails; traffic equals the
// planner's prices; splits, node_local, every redistribution plan between the layouts
// of 8x8 on the job's meshes and the non-blocking calls run over it. Every rank runs every case in the same order; only CHECKs are used
// (a rank that stopped early would leave the others blocked in a collective).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/gloo.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/format.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/plan/cost.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::testing {
any_communicator*& gloo_world_slot();
}

using namespace tessera;

static_assert(communicator<gloo_communicator>);
static_assert(nonblocking_communicator<gloo_communicator>);

namespace {

gloo_communicator& world() {
  gloo_communicator* c = testing::gloo_world_slot()->target<gloo_communicator>();
  REQUIRE(c != nullptr);
  return *c;
}

template <class F>
void check_traffic(gloo_communicator& c, index_t bytes, F&& f) {
  const traffic before = c.stats();
  f();
  CHECK(c.stats() - before == traffic{1, bytes});
}

template <class T>
T value(int rank, std::size_t i) {
  return T(rank * 100 + int(i));
}

}  // namespace

TEST_CASE("gloo: the world is the gloo backend's, in the handle") {
  any_communicator& w = *testing::gloo_world_slot();
  CHECK(w.backend() == "gloo");
  CHECK(w.size() == world().size());
  CHECK(w.rank() == world().rank());
}

TEST_CASE_TEMPLATE("gloo: all_reduce sum, max, min, mean", T, float, double, std::int64_t, std::int8_t) {
  gloo_communicator& c = world();
  const int g = c.size(), r = c.rank();
  const std::size_t n = 7;
  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::mean}) {
    CAPTURE(to_string(op));
    std::vector<T> in(n), out(n, T(-1)), expect(n);
    for (std::size_t i = 0; i < n; ++i) in[i] = T((r + 1) + int(i));
    for (std::size_t i = 0; i < n; ++i) {
      const int sum = g * (g + 1) / 2 + g * int(i);
      switch (op) {
        case reduce_op::sum: expect[i] = T(sum); break;
        case reduce_op::max: expect[i] = T(g + int(i)); break;
        case reduce_op::min: expect[i] = T(1 + int(i)); break;
        case reduce_op::mean: {
          std::vector<T> s{T(sum)};
          detail::divide_by(std::span<T>(s), g);
          expect[i] = s[0];
          break;
        }
      }
    }
    check_traffic(c, cost::all_reduce(index_t(n * sizeof(T)), g),
                  [&] { c.all_reduce(std::span<const T>(in), std::span<T>(out), op); });
    CHECK(out == expect);
    check_traffic(c, cost::all_reduce(index_t(n * sizeof(T)), g), [&] { c.all_reduce(std::span<T>(in), op); });
    CHECK(in == expect);
  }
}

TEST_CASE_TEMPLATE("gloo: all_gather, reduce_scatter and all_to_all place block r on rank r", T, float,
                   std::int64_t) {
  gloo_communicator& c = world();
  const int g = c.size(), r = c.rank();
  const std::size_t b = 5;
  std::vector<T> mine(b), gathered(b * std::size_t(g));
  for (std::size_t i = 0; i < b; ++i) mine[i] = value<T>(r, i);
  check_traffic(c, cost::all_gather(index_t(b * sizeof(T)), g),
                [&] { c.all_gather(std::span<const T>(mine), std::span<T>(gathered)); });
  for (int p = 0; p < g; ++p)
    for (std::size_t i = 0; i < b; ++i) CHECK(gathered[std::size_t(p) * b + i] == value<T>(p, i));

  // reduce_scatter: block q of rank p's input is value(p, q*b + i); rank r gets the sum over p.
  std::vector<T> in(b * std::size_t(g)), out(b);
  for (std::size_t k = 0; k < in.size(); ++k) in[k] = value<T>(r, k);
  check_traffic(c, cost::reduce_scatter(index_t(in.size() * sizeof(T)), g),
                [&] { c.reduce_scatter(std::span<const T>(in), std::span<T>(out), reduce_op::sum); });
  for (std::size_t i = 0; i < b; ++i) {
    T expect = 0;
    for (int p = 0; p < g; ++p) expect += value<T>(p, std::size_t(r) * b + i);
    CHECK(out[i] == expect);
  }

  // all_to_all: rank r sends block q to rank q; receives block r of every rank p.
  std::vector<T> a2a(b * std::size_t(g));
  check_traffic(c, cost::all_to_all(index_t(in.size() * sizeof(T)), g),
                [&] { c.all_to_all(std::span<const T>(in), std::span<T>(a2a)); });
  for (int p = 0; p < g; ++p)
    for (std::size_t i = 0; i < b; ++i) CHECK(a2a[std::size_t(p) * b + i] == value<T>(p, std::size_t(r) * b + i));
}

TEST_CASE("gloo: all_to_all_v with uneven counts and displacements") {
  gloo_communicator& c = world();
  const int g = c.size(), r = c.rank();
  // rank r sends (r + q) % 3 elements to rank q, at displacement 4*q (gaps between blocks).
  const auto gs = static_cast<std::size_t>(g);
  std::vector<int> sc(gs), sd(gs), rc(gs), rd(gs);
  for (int q = 0; q < g; ++q) {
    sc[std::size_t(q)] = (r + q) % 3;
    sd[std::size_t(q)] = 4 * q;
    rc[std::size_t(q)] = (q + r) % 3;
    rd[std::size_t(q)] = 4 * q + 1;
  }
  std::vector<float> in(std::size_t(4 * g)), out(std::size_t(4 * g + 1), -1.0f);
  for (std::size_t k = 0; k < in.size(); ++k) in[k] = value<float>(r, k);
  std::int64_t received = 0;
  for (int q = 0; q < g; ++q)
    if (q != r) received += rc[std::size_t(q)];
  check_traffic(c, index_t(received * 4), [&] {
    c.all_to_all_v(std::span<const float>(in), std::span<const int>(sc), std::span<const int>(sd),
                   std::span<float>(out), std::span<const int>(rc), std::span<const int>(rd));
  });
  for (int p = 0; p < g; ++p)
    for (int i = 0; i < rc[std::size_t(p)]; ++i)
      CHECK(out[std::size_t(4 * p + 1 + i)] == value<float>(p, std::size_t(4 * r + i)));
}

TEST_CASE("gloo: broadcast from every root, send and recv around a ring, barrier") {
  gloo_communicator& c = world();
  const int g = c.size(), r = c.rank();
  for (int root = 0; root < g; ++root) {
    std::vector<double> buf(6);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = r == root ? value<double>(root, i) : -1.0;
    check_traffic(c, r == root ? 0 : cost::broadcast(index_t(buf.size() * 8), g),
                  [&] { c.broadcast(std::span<double>(buf), root); });
    for (std::size_t i = 0; i < buf.size(); ++i) CHECK(buf[i] == value<double>(root, i));
  }
  if (g > 1) {
    std::vector<std::int32_t> out(3), in(3, -1);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = value<std::int32_t>(r, i);
    const int next = (r + 1) % g, prev = (r + g - 1) % g;
    if (r % 2 == 0) {
      c.send(std::span<const std::int32_t>(out), next, 7);
      c.recv(std::span<std::int32_t>(in), prev, 7);
    } else {
      c.recv(std::span<std::int32_t>(in), prev, 7);
      c.send(std::span<const std::int32_t>(out), next, 7);
    }
    for (std::size_t i = 0; i < in.size(); ++i) CHECK(in[i] == value<std::int32_t>(prev, i));
  }
  check_traffic(c, 0, [&] { c.barrier(); });
}

TEST_CASE("gloo: isend around a ring, both ways at once, several in flight") {
  gloo_communicator& c = world();
  const int g = c.size(), r = c.rank();
  if (g == 1) return;  // a ring of one rank sends nothing
  const int next = (r + 1) % g, prev = (r + g - 1) % g;
  std::vector<std::vector<float>> out(3, std::vector<float>(5000)), from_prev = out, from_next = out;
  for (std::size_t k = 0; k < out.size(); ++k)
    for (std::size_t i = 0; i < out[k].size(); ++i) out[k][i] = value<float>(r, i + 10 * k);
  std::vector<gloo_communicator::request> reqs;
  for (std::size_t k = 0; k < out.size(); ++k) {  // every rank sends first: blocking sends could not
    reqs.push_back(c.isend(std::span<const float>(out[k]), next, int(2 * k)));
    reqs.push_back(c.isend(std::span<const float>(out[k]), prev, int(2 * k + 1)));
  }
  for (std::size_t k = out.size(); k-- > 0;) {  // received in the other order
    c.recv(std::span<float>(from_next[k]), next, int(2 * k + 1));
    c.recv(std::span<float>(from_prev[k]), prev, int(2 * k));
  }
  for (auto& q : reqs) q.wait();
  for (std::size_t k = 0; k < out.size(); ++k)
    for (std::size_t i = 0; i < out[k].size(); i += 499) {
      CHECK(from_prev[k][i] == value<float>(prev, i + 10 * k));
      CHECK(from_next[k][i] == value<float>(next, i + 10 * k));
    }
  // Through the run-time handle, as the pipeline's executor sends.
  any_communicator& w = *testing::gloo_world_slot();
  std::vector<double> d{double(r)}, got{-1.0};
  any_request q = w.isend(std::span<const double>(d), next, 99);
  w.recv(std::span<double>(got), prev, 99);
  q.wait();
  CHECK(got[0] == double(prev));
}

TEST_CASE("gloo: non-blocking calls, several in flight, equal the blocking ones") {
  gloo_communicator& c = world();
  const int g = c.size(), r = c.rank();
  const std::size_t b = 1000;
  std::vector<std::vector<float>> sums(3, std::vector<float>(b));
  std::vector<float> rs_in(b * std::size_t(g)), rs_out(b), rs_expect(b), bc(b);
  for (std::size_t k = 0; k < rs_in.size(); ++k) rs_in[k] = value<float>(r, k % 997);
  c.reduce_scatter(std::span<const float>(rs_in), std::span<float>(rs_expect), reduce_op::sum);
  std::vector<gloo_communicator::request> reqs;
  for (std::size_t j = 0; j < sums.size(); ++j) {
    for (std::size_t i = 0; i < b; ++i) sums[j][i] = float(r + 1) * float(j + 1);
    reqs.push_back(c.iall_reduce(std::span<float>(sums[j]), j == 2 ? reduce_op::mean : reduce_op::sum));
  }
  auto rs = c.ireduce_scatter(std::span<const float>(rs_in), std::span<float>(rs_out), reduce_op::sum);
  for (std::size_t i = 0; i < b; ++i) bc[i] = r == g - 1 ? float(i) : -1.0f;
  auto bq = c.ibroadcast(std::span<float>(bc), g - 1);
  gloo_communicator::request moved = std::move(reqs[1]);  // move-only, in flight
  for (auto& q : reqs) q.wait();
  moved.wait();
  while (!rs.test()) {
  }
  bq.wait();
  const float total = float(g * (g + 1) / 2);
  CHECK(sums[0][b - 1] == total);
  CHECK(sums[1][0] == 2 * total);
  CHECK(sums[2][7] == 3 * total / float(g));
  CHECK(rs_out == rs_expect);
  CHECK(bc[b - 1] == float(b - 1));
}

TEST_CASE_TEMPLATE("gloo: reductions of many ring pieces, uneven chunks, blocking and not", T, float, double,
                   std::int8_t) {
  // Larger than a piece of the ring (detail::gloo_ring::piece_bytes) several times over,
  // in sizes no rank count divides: every piece and chunk boundary is crossed.
  gloo_communicator& c = world();
  const int g = c.size(), r = c.rank();
  const std::size_t per_piece = detail::gloo_ring::piece_bytes / sizeof(T), n = 3 * per_piece + 11;
  const auto at = [](int p, std::size_t i) { return T(int((i * 7 + std::size_t(p) * 3) % 5)); };
  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::mean}) {
    CAPTURE(to_string(op));
    std::vector<T> in(n), out(n), expect(n);
    for (std::size_t i = 0; i < n; ++i) {
      in[i] = at(r, i);
      std::vector<T> v{at(0, i)};
      for (int p = 1; p < g; ++p) {
        const T x = at(p, i);
        v[0] = op == reduce_op::max ? std::max(v[0], x) : op == reduce_op::min ? std::min(v[0], x) : T(v[0] + x);
      }
      if (op == reduce_op::mean) detail::divide_by(std::span<T>(v), g);
      expect[i] = v[0];
    }
    c.all_reduce(std::span<const T>(in), std::span<T>(out), op);
    CHECK(out == expect);
    std::vector<T> inout = in;
    auto q = c.iall_reduce(std::span<T>(inout), op);
    q.wait();
    CHECK(inout == expect);
  }
  // reduce_scatter with blocks of two pieces and a bit: rank r gets block r summed.
  const std::size_t b = 2 * per_piece + 3;
  std::vector<T> in(b * std::size_t(g)), out(b), out2(b), expect(b);
  for (std::size_t k = 0; k < in.size(); ++k) in[k] = at(r, k);
  for (std::size_t i = 0; i < b; ++i) {
    T sum = 0;
    for (int p = 0; p < g; ++p) sum = T(sum + at(p, std::size_t(r) * b + i));
    expect[i] = sum;
  }
  check_traffic(c, cost::reduce_scatter(index_t(in.size() * sizeof(T)), g),
                [&] { c.reduce_scatter(std::span<const T>(in), std::span<T>(out), reduce_op::sum); });
  CHECK(out == expect);
  auto q = c.ireduce_scatter(std::span<const T>(in), std::span<T>(out2), reduce_op::sum);
  q.wait();
  CHECK(out2 == expect);
}

TEST_CASE("gloo: split orders members by key; node_local is the whole job on one host") {
  gloo_communicator& c = world();
  const int g = c.size(), r = c.rank();
  const int color = r % 2;
  gloo_communicator s = c.split(color, -r);  // reverse rank order within each color
  std::vector<int> members;
  for (int p = g - 1; p >= 0; --p)
    if (p % 2 == color) members.push_back(p);
  CHECK(s.size() == int(members.size()));
  CHECK(members[std::size_t(s.rank())] == r);
  int mine = r, sum = -1;
  s.all_reduce(std::span<const int>(&mine, 1), std::span<int>(&sum, 1), reduce_op::sum);
  int expect = 0;
  for (int p : members) expect += p;
  CHECK(sum == expect);
  CHECK(c.node_local().size() == g);  // one host
}

TEST_CASE("gloo: redistribution plans between every pair of layouts move the bytes they price") {
  any_communicator& w = *testing::gloo_world_slot();
  const int g = w.size(), me = w.rank();
  device_context<any_communicator> ctx(w);
  const extents shape{8, 8};
  std::vector<mesh> meshes{mesh{g}};
  if (g == 4) meshes.push_back(mesh{2, 2});
  int pairs = 0;
  for (const mesh& m : meshes) {
    std::vector<layout> all;
    for_each_layout(m, 2, false, [&](const layout& l) {
      if (check(l, shape).ok()) all.push_back(l);
    });
    for (const layout& from : all)
      for (const layout& to : all) {
        const plan p = plan_redistribution(from, to, shape, index_t(sizeof(float)));
        auto global = [](const auto& idx) { return float(idx[0] * 8 + idx[1]); };
        dist_tensor<float> x(from, shape, me), y(to, shape, me);
        x.fill_global(global);
        y.fill_global(global);
        ctx.reset_stats();
        const xt::xarray<float> got = execute(p, x.local(), ctx.on(m));
        ++pairs;
        if (!(got == y.local()) || ctx.total_stats().bytes != p.bytes_for_rank(me)) {
          INFO(to_string(from) << " -> " << to_string(to));
          CHECK(got == y.local());
          CHECK(ctx.total_stats().bytes == p.bytes_for_rank(me));
        }
      }
  }
  CHECK(pairs > 0);
}
