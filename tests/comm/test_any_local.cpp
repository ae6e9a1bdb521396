// Tests of any_communicator with no MPI (this file compiles without MPI's headers): over
// local_communicator every call gives the typed communicator's values, traffic and error
// texts, for every element type; requests of every size; calls a backend lacks
// (emulated or refused); element types a backend cannot move; mesh_comm and
// device_context over the handle.
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mesh_comm.hpp>

#ifdef MPI_VERSION
#error "test_any_local must compile without MPI"
#endif

using namespace tessera;

static_assert(communicator<any_communicator>);
static_assert(nonblocking_communicator<any_communicator>);
static_assert(pollable_request<any_communicator::request>);
static_assert(!takes_device_buffers<any_communicator>);
static_assert(!std::is_copy_constructible_v<any_communicator>);
static_assert(std::is_nothrow_move_constructible_v<any_communicator>);
static_assert(std::is_convertible_v<local_communicator, any_communicator>);
static_assert(sizeof(any_request) <= 64);
static_assert(detail::element_kind_v<long> != detail::element_kind_v<long long>);
static_assert(detail::element_kind_v<char> != detail::element_kind_v<signed char>);

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

template <class T>
std::vector<T> values(std::size_t n, int start) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(start + int(i) % 50);
  return v;
}

/// local_communicator without ireduce_scatter, ibroadcast or a pollable iall_reduce:
/// the handle emulates the first two and waits in test() for the third. Names no backend.
class blocking_only {
 public:
  struct request {
    request() = default;
    request(request&&) noexcept = default;
    request& operator=(request&&) noexcept = default;
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    void wait() { ++*waits; }
    int* waits = nullptr;
  };

  int rank() const { return 0; }
  int size() const { return 1; }
  template <comm_element T>
  void all_reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    c_.all_reduce(in, out, op);
  }
  template <comm_element T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    c_.all_reduce(inout, op);
  }
  template <comm_element T>
  void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    c_.all_gather(in, out);
  }
  template <comm_element T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    c_.reduce_scatter(in, out, op);
  }
  template <comm_element T>
  void all_to_all(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    c_.all_to_all(in, out);
  }
  template <comm_element T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> in, std::span<const int> sc, std::span<const int> sd,
                    std::span<T> out, std::span<const int> rc, std::span<const int> rd) {
    c_.all_to_all_v(in, sc, sd, out, rc, rd);
  }
  template <comm_element T>
  void broadcast(std::span<T> buf, int root) {
    c_.broadcast(buf, root);
  }
  template <class T>
    requires comm_element<std::remove_const_t<T>>
  void send(std::span<T> buf, int dest, int tag = 0) {
    c_.send(buf, dest, tag);
  }
  template <comm_element T>
  void recv(std::span<T> buf, int source, int tag = 0) {
    c_.recv(buf, source, tag);
  }
  void barrier() { c_.barrier(); }
  template <comm_element T>
  request iall_reduce(std::span<T> inout, reduce_op op) {
    c_.all_reduce(inout, op);
    request r;
    r.waits = &waits;
    return r;
  }
  blocking_only split(int color, int key) {
    blocking_only s;
    s.c_ = c_.split(color, key);
    return s;
  }
  traffic& stats() { return c_.stats(); }
  const traffic& stats() const { return c_.stats(); }
  void reset_stats() { c_.reset_stats(); }

  int waits = 0;

 private:
  local_communicator c_;
};

static_assert(communicator<blocking_only>);
static_assert(!nonblocking_communicator<blocking_only>);

/// A backend that moves floats only (supports_element): its calls fail to compile for
/// any other type, so the handle must never instantiate them.
class floats_only : public local_communicator {
 public:
  template <class T>
  static constexpr bool supports_element = std::is_same_v<T, float>;
  static constexpr std::string_view backend() noexcept { return "floats"; }

  template <class T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    static_assert(std::is_same_v<T, float>);
    local_communicator::all_reduce(inout, op);
  }
  template <class T>
  void all_reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    static_assert(std::is_same_v<T, float>);
    local_communicator::all_reduce(in, out, op);
  }
  floats_only split(int color, int key) {
    (void)local_communicator::split(color, key);
    return {};
  }
};

static_assert(communicator<floats_only>);
static_assert(comm_supports<floats_only, float> && !comm_supports<floats_only, double>);
static_assert(comm_supports<local_communicator, long double> && comm_supports<local_communicator, char16_t>);

}  // namespace

TEST_CASE_TEMPLATE("any_communicator over local: every call equals local_communicator's, values and traffic", T,
                   float, double, long double, char, signed char, unsigned char, wchar_t, char8_t, char16_t,
                   char32_t, short, unsigned short, int, unsigned int, long, unsigned long, long long,
                   unsigned long long) {
  local_communicator typed;
  any_communicator any = local_communicator{};
  CHECK(any.rank() == 0);
  CHECK(any.size() == 1);
  const std::vector<T> in = values<T>(6, 3);

  // Runs f on both, which must add the same traffic (and exactly one call).
  auto both = [&](auto&& f) {
    const traffic t0 = typed.stats(), a0 = any.stats();
    f(typed);
    f(any);
    CHECK(typed.stats() - t0 == any.stats() - a0);
    CHECK((any.stats() - a0).calls == 1);
  };

  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::mean}) {
    std::vector<T> out_t(6), out_a(6);
    both([&](auto& c) {
      auto& out = std::is_same_v<std::decay_t<decltype(c)>, any_communicator> ? out_a : out_t;
      c.all_reduce(std::span<const T>(in), std::span<T>(out), op);
    });
    CHECK(out_a == out_t);
    CHECK(out_a == in);
    std::vector<T> io_t = in, io_a = in;
    typed.all_reduce(std::span<T>(io_t), op);
    any.all_reduce(std::span<T>(io_a), op);
    CHECK(io_a == io_t);
    std::vector<T> rs_t(6), rs_a(6);
    typed.reduce_scatter(std::span<const T>(in), std::span<T>(rs_t), op);
    any.reduce_scatter(std::span<const T>(in), std::span<T>(rs_a), op);
    CHECK(rs_a == rs_t);
    std::vector<T> nb = in;
    auto r = any.iall_reduce(std::span<T>(nb), op);
    r.wait();
    CHECK(!r.pending());
    CHECK(nb == in);
  }
  std::vector<T> ag(6), aa(6), bc = in;
  any.all_gather(std::span<const T>(in), std::span<T>(ag));
  any.all_to_all(std::span<const T>(in), std::span<T>(aa));
  any.broadcast(std::span<T>(bc), 0);
  CHECK(ag == in);
  CHECK(aa == in);
  CHECK(bc == in);
  const int count[] = {4}, sdispl[] = {1}, rdispl[] = {2};
  std::vector<T> v(6, T(0));
  any.all_to_all_v(std::span<const T>(in), count, sdispl, std::span<T>(v), count, rdispl);
  CHECK(v == std::vector<T>{T(0), T(0), in[1], in[2], in[3], in[4]});
  std::vector<T> rsi(6, T(0));
  auto q = any.ireduce_scatter(std::span<const T>(in), std::span<T>(rsi), reduce_op::sum);
  CHECK(q.test());
  CHECK(rsi == in);
  auto b = any.ibroadcast(std::span<T>(rsi), 0);
  b.wait();
  any.barrier();
  // 4 ops x (all_reduce, in-place all_reduce, reduce_scatter, iall_reduce) + 7 more calls
  CHECK(any.stats() == traffic{4 * 4 + 7, 0});
  any.reset_stats();
  CHECK(any.stats() == traffic{});
}

TEST_CASE("any_communicator: run-time queries, split, node_local, target") {
  any_communicator c = local_communicator{};
  CHECK(c.valid());
  CHECK(c.backend() == "local");
  CHECK(!c.device_buffers());
  CHECK(!uses_device_buffers(c));
  CHECK(!uses_device_buffers(local_communicator{}));
  REQUIRE(c.target<local_communicator>() != nullptr);
  CHECK(c.target<blocking_only>() == nullptr);
  CHECK(std::as_const(c).target<local_communicator>() == c.target<local_communicator>());

  // The typed communicator underneath and the handle share one set of counters.
  c.target<local_communicator>()->barrier();
  CHECK(c.stats() == traffic{1, 0});

  any_communicator s = c.split(0, 0);
  CHECK(s.backend() == "local");
  CHECK(s.size() == 1);
  CHECK(s.stats() == traffic{});
  s.barrier();
  CHECK(c.stats() == traffic{1, 0});  // separate counters

  any_communicator node = c.node_local();  // one rank: its own node
  CHECK(node.rank() == 0);
  CHECK(node.size() == 1);
  CHECK(node.backend() == "local");

  any_communicator made(std::in_place_type<local_communicator>);
  CHECK(made.backend() == "local");

  any_communicator moved = std::move(c);
  CHECK(moved.valid());
  CHECK(moved.stats() == traffic{1, 0});
  CHECK(!c.valid());  // NOLINT: the moved-from state is specified
  CHECK(c.rank() == -1);
  CHECK(c.size() == 0);
  CHECK_THROWS_WITH_AS(c.barrier(), "any_communicator: the handle is empty (moved from)", error);
  CHECK_THROWS_WITH_AS((void)c.backend(), "any_communicator: the handle is empty (moved from)", error);
  CHECK(c.target<local_communicator>() == nullptr);
  c = std::move(moved);
  CHECK(c.valid());
  CHECK(c.rank() == 0);
}

TEST_CASE("any_communicator: errors keep the typed communicator's texts") {
  local_communicator typed;
  any_communicator any = local_communicator{};
  std::vector<float> a(3), b(4), big(12);
  std::vector<double> d(3);
  auto same = [&](auto&& f, const char* expect) {
    const std::string t = error_of([&] { f(typed); }), h = error_of([&] { f(any); });
    CHECK(t == expect);
    CHECK(h == expect);
  };
  same([&](auto& c) { c.all_reduce(std::span<const float>(a), std::span<float>(b), reduce_op::sum); },
       "all_reduce: out has 4 elements, expected 3 (the size of in)");
  same([&](auto& c) { c.all_gather(std::span<const float>(a), std::span<float>(b)); },
       "all_gather: out has 4 elements, expected 1 ranks x 3 = 3");
  same([&](auto& c) { c.reduce_scatter(std::span<const float>(a), std::span<float>(b), reduce_op::sum); },
       "reduce_scatter: in has 3 elements, expected 1 ranks x 4 = 4");
  same([&](auto& c) { c.all_to_all(std::span<const double>(d), std::span<double>(d)); },
       "all_to_all: in and out overlap; the buffers of a collective must be distinct");
  same([&](auto& c) { c.broadcast(std::span<float>(a), 1); }, "broadcast: root 1 is out of range for 1 ranks");
  same([&](auto& c) { (void)c.ibroadcast(std::span<float>(a), -1); },
       "ibroadcast: root -1 is out of range for 1 ranks");
  same([&](auto& c) { (void)c.ireduce_scatter(std::span<const float>(a), std::span<float>(b), reduce_op::sum); },
       "ireduce_scatter: in has 3 elements, expected 1 ranks x 4 = 4");
  same([&](auto& c) { c.all_gather(std::span<const float>(big.data(), 3), std::span<float>(big.data() + 2, 3)); },
       "all_gather: in and out overlap; the buffers of a collective must be distinct");
  {
    const int two[] = {1, 1}, one[] = {0};
    same([&](auto& c) { c.all_to_all_v(std::span<const float>(a), two, one, std::span<float>(b), one, one); },
         "all_to_all_v: send_counts has 2 entries, expected 1 (one per rank)");
  }
  same([&](auto& c) { c.send(std::span<const float>(a), 0); },
       "send: dest 0 is this rank; a one-rank communicator has no peer to send to");
  same([&](auto& c) { c.send(std::span<float>(a), 0, -2); }, "send: tag -2 must not be negative");
  same([&](auto& c) { c.recv(std::span<float>(a), 0); },
       "recv: source 0 is this rank; a one-rank communicator has no peer to receive from");
  same([&](auto& c) { (void)c.split(-1, 0); }, "split: color -1 must not be negative (every rank joins a group)");
  CHECK(typed.stats() == traffic{});
  CHECK(any.stats() == traffic{});  // a failed call is not counted

  // local_communicator has no isend: a blocking send in its place could deadlock.
  CHECK_THROWS_WITH_AS((void)any.isend(std::span<const float>(a), 0),
                       "isend: the local backend has no non-blocking send", error);
}

TEST_CASE("any_communicator: a backend without ireduce_scatter and ibroadcast is emulated by the blocking calls") {
  any_communicator c = blocking_only{};
  CHECK(c.backend() == "custom");
  std::vector<float> in{1.f, 2.f, 3.f}, out(3, 0.f);
  auto r = c.ireduce_scatter(std::span<const float>(in), std::span<float>(out), reduce_op::sum);
  CHECK(!r.pending());  // completed by the blocking reduce_scatter
  CHECK(out == in);
  auto b = c.ibroadcast(std::span<float>(out), 0);
  CHECK(b.test());
  CHECK(c.stats() == traffic{2, 0});  // as the blocking calls count
  std::vector<float> four(4);
  CHECK_THROWS_WITH_AS((void)c.ireduce_scatter(std::span<const float>(in), std::span<float>(four), reduce_op::sum),
                       "ireduce_scatter: in has 3 elements, expected 1 ranks x 4 = 4", error);
  CHECK_THROWS_WITH_AS((void)c.ibroadcast(std::span<float>(in), 3), "ibroadcast: root 3 is out of range for 1 ranks",
                       error);
  CHECK_THROWS_WITH_AS((void)c.isend(std::span<const float>(in), 0),
                       "isend: the custom backend has no non-blocking send", error);

  // Its iall_reduce's request cannot be polled: test() waits for it.
  auto q = c.iall_reduce(std::span<float>(in), reduce_op::sum);
  CHECK(q.pending());
  CHECK(c.target<blocking_only>()->waits == 0);
  CHECK(q.test());
  CHECK(!q.pending());
  CHECK(c.target<blocking_only>()->waits == 1);
  q.wait();  // complete: no second wait
  CHECK(c.target<blocking_only>()->waits == 1);
}

TEST_CASE("any_communicator: an element type the backend cannot move names the call, the backend and the type") {
  any_communicator c = floats_only{};
  CHECK(c.backend() == "floats");
  std::vector<float> f{1.f, 2.f};
  c.all_reduce(std::span<float>(f), reduce_op::sum);
  CHECK(c.stats() == traffic{1, 0});
  std::vector<double> d{1.0};
  std::vector<short> s{1};
  CHECK_THROWS_WITH_AS(c.all_reduce(std::span<double>(d), reduce_op::sum),
                       "all_reduce: the floats backend has no element type double", error);
  CHECK_THROWS_WITH_AS(c.broadcast(std::span<short>(s), 0), "broadcast: the floats backend has no element type short",
                       error);
  CHECK_THROWS_WITH_AS((void)c.iall_reduce(std::span<double>(d), reduce_op::sum),
                       "iall_reduce: the floats backend has no element type double", error);
  CHECK(c.stats() == traffic{1, 0});
}

namespace {

// Requests that count their waits and destructions; `big` is kept out of line.
struct probe {
  int waits = 0, tests = 0, destroyed_pending = 0;
};
template <std::size_t Pad>
class probe_request {
 public:
  explicit probe_request(probe* p, int polls) : p_(p), polls_(polls) {}
  probe_request(probe_request&& o) noexcept : p_(std::exchange(o.p_, nullptr)), polls_(o.polls_) {}
  probe_request& operator=(probe_request&& o) noexcept {
    p_ = std::exchange(o.p_, nullptr);
    polls_ = o.polls_;
    return *this;
  }
  probe_request(const probe_request&) = delete;
  probe_request& operator=(const probe_request&) = delete;
  ~probe_request() {
    if (p_ && polls_ > 0) ++p_->destroyed_pending;
  }
  void wait() {
    ++p_->waits;
    polls_ = 0;
  }
  bool test() {
    ++p_->tests;
    return --polls_ <= 0;
  }

 private:
  probe* p_;
  int polls_;
  [[maybe_unused]] char pad_[Pad] = {};
};

}  // namespace

TEST_CASE_TEMPLATE("any_request: kept inside or out of line, moved, polled, waited, dropped", R, probe_request<1>,
                   probe_request<200>) {
  probe p;
  any_request a(R(&p, 3));
  CHECK(a.pending());
  CHECK(!a.test());
  CHECK(!a.test());
  any_request b = std::move(a);
  CHECK(!a.pending());  // NOLINT: moved from is complete
  CHECK(a.test());
  CHECK(b.pending());
  CHECK(b.test());  // third poll completes
  CHECK(!b.pending());
  CHECK(p.tests == 3);
  b.wait();  // no-op once complete
  CHECK(p.waits == 0);

  any_request w(R(&p, 5));
  any_request moved_to;
  moved_to = std::move(w);
  moved_to.wait();
  CHECK(p.waits == 1);
  CHECK(!moved_to.pending());

  {
    any_request dropped(R(&p, 5));
  }
  CHECK(p.destroyed_pending == 1);  // the wrapped request's destructor ran, pending
  any_request none;
  CHECK(!none.pending());
  CHECK(none.test());
}

TEST_CASE("mesh_comm and device_context over any_communicator") {
  any_communicator c = local_communicator{};
  mesh_comm<any_communicator> mc(mesh{1, 1}, c);
  any_communicator& g = mc.group({1, 0});
  CHECK(&mc.group({1, 0}) == &g);  // cached
  CHECK(g.backend() == "local");
  CHECK(g.size() == 1);
  std::vector<float> v{2.f};
  g.all_reduce(std::span<float>(v), reduce_op::sum);
  c.barrier();
  CHECK(mc.total_stats() == traffic{2, 0});
  CHECK_THROWS_WITH_AS((mesh_comm<any_communicator>(mesh{2}, c)),
                       "mesh: the mesh size must equal the number of ranks: mesh size 2, communicator size 1", error);

  device_context<any_communicator> ctx(c);
  CHECK(ctx.size() == 1);
  ctx.on(mesh{1}).group({0}).barrier();
  CHECK(ctx.total_stats().calls == 2);  // the world's barrier and the group's
  ctx.reset_stats();
  CHECK(ctx.total_stats() == traffic{});
}
