// The communicator concept every backend models, its traffic counters, and the
// argument checks the backends share (one text per mistake, whatever the backend).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/plan/cost.hpp>

namespace tessera {

/// What one communicator object has moved since it was made or last reset.
///
/// `calls` counts the calls that communicate (collectives, iall_reduce, send, recv,
/// barrier; split does not count). `bytes` counts the bytes this rank receives from
/// other ranks:
///
/// | call            | bytes added (g = size(), sizes of the buffers passed)            |
/// |-----------------|-------------------------------------------------------------------|
/// | all_reduce      | cost::all_reduce(bytes of inout, g)                               |
/// | iall_reduce     | cost::all_reduce(bytes of inout, g), when it is started           |
/// | ireduce_scatter | cost::reduce_scatter(bytes of in, g), when it is started          |
/// | ibroadcast      | as broadcast, when it is started                                  |
/// | all_gather      | cost::all_gather(bytes of in, g)                                  |
/// | reduce_scatter  | cost::reduce_scatter(bytes of in, g)                              |
/// | all_to_all      | cost::all_to_all(bytes of in, g)                                  |
/// | all_to_all_v    | sum of recv_counts[i] * sizeof(T) over i != rank() (exact)        |
/// | broadcast       | cost::broadcast(bytes of buf, g) on a non-root, 0 on the root     |
/// | recv            | the size of the message received                                 |
/// | send, barrier   | 0                                                                 |
///
/// These are the formulas the planner prices plans with (plan/cost.hpp), so the
/// bytes a plan promises and the bytes its execution counts agree exactly.
struct traffic {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;

  constexpr traffic& operator+=(const traffic& o) {
    calls += o.calls;
    bytes += o.bytes;
    return *this;
  }
  friend constexpr traffic operator+(traffic a, const traffic& b) { return a += b; }
  friend constexpr traffic operator-(traffic a, const traffic& b) {
    return traffic{a.calls - b.calls, a.bytes - b.bytes};
  }
  friend constexpr bool operator==(const traffic&, const traffic&) = default;
};

/// A transport failure: a peer's connection closed, or an operation made no progress
/// within its timeout. Thrown by the backends that see their transport (gloo); the
/// message names the call. A rank that gets one has most likely lost a peer that failed
/// first, which tessera::run's failure report takes into account.
class comm_error : public error {
 public:
  using error::error;
};

/// Element types the collectives move: arithmetic types except bool (float, double,
/// std::int8_t .. std::int64_t, std::uint8_t .. std::uint64_t, ...).
template <class T>
concept comm_element = std::is_arithmetic_v<T> && !std::is_same_v<std::remove_cv_t<T>, bool> &&
                       std::is_trivially_copyable_v<T> && !std::is_const_v<T>;

/// A pending non-blocking operation: move-only, `wait()` completes it.
template <class R>
concept comm_request = std::movable<R> && !std::copyable<R> && requires(R& r) { r.wait(); };

/// A group of ranks that runs collectives (SPMD: every member calls the same
/// collectives in the same order). Models: local_communicator (one rank, no
/// launcher), mpi_communicator.
///
/// The full contract (templates over every comm_element T; counts are element counts
/// taken from the span sizes):
///
///     int rank() const;  int size() const;
///     void all_reduce(std::span<const T> in, std::span<T> out, reduce_op op);
///     void all_reduce(std::span<T> inout, reduce_op op);
///     void all_gather(std::span<const T> in, std::span<T> out);          // out = size() x in
///     void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op);  // in = size() x out
///     void all_to_all(std::span<const T> in, std::span<T> out);          // size() equal blocks
///     void all_to_all_v(std::span<const T> in, std::span<const int> send_counts,
///                       std::span<const int> send_displs, std::span<T> out,
///                       std::span<const int> recv_counts, std::span<const int> recv_displs);
///     void broadcast(std::span<T> buf, int root);
///     void send(std::span<const T> buf, int dest, int tag = 0);        // also std::span<T>
///     void recv(std::span<T> buf, int source, int tag = 0);
///     void barrier();
///     request iall_reduce(std::span<T> inout, reduce_op op);            // comm_request
///     C split(int color, int key);                                       // collective
///     traffic& stats();  const traffic& stats() const;  void reset_stats();
///
/// `reduce_op::mean` is a sum divided by size() (integer division for integer types).
/// Buffers of a collective must not overlap, except all_reduce with in and out the
/// same span, which runs in place. Wrong sizes throw tessera::error naming the
/// collective and the numbers, before anything is sent.
template <class C>
concept communicator =
    std::movable<C> &&
    requires(C& c, const C& cc, std::span<float> buf, std::span<const float> cbuf,
             std::span<const int> ints, reduce_op op, int i) {
      { cc.rank() } -> std::convertible_to<int>;
      { cc.size() } -> std::convertible_to<int>;
      c.all_reduce(cbuf, buf, op);
      c.all_reduce(buf, op);
      c.all_gather(cbuf, buf);
      c.reduce_scatter(cbuf, buf, op);
      c.all_to_all(cbuf, buf);
      c.all_to_all_v(cbuf, ints, ints, buf, ints, ints);
      c.broadcast(buf, i);
      c.send(cbuf, i, i);
      c.send(cbuf, i);
      c.recv(buf, i, i);
      c.recv(buf, i);
      c.barrier();
      { c.iall_reduce(buf, op) } -> comm_request;
      { c.split(i, i) } -> std::same_as<C>;
      { c.stats() } -> std::same_as<traffic&>;
      { cc.stats() } -> std::same_as<const traffic&>;
      c.reset_stats();
    };

/// A pending operation that can also be polled: `test()` makes progress and returns
/// true once it is complete (then `wait()` returns at once).
template <class R>
concept pollable_request = comm_request<R> && requires(R& r) {
  { r.test() } -> std::convertible_to<bool>;
};

/// A communicator that also starts a reduce_scatter and a broadcast without waiting
/// for them, as the pipelined matmuls (ops/matmul_pipelined.hpp) need. An optional
/// extension of `communicator`: mpi_communicator and local_communicator model it.
///
///     request ireduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op);
///     request ibroadcast(std::span<T> buf, int root);
///     request iall_reduce(std::span<T> inout, reduce_op op);   // from communicator
///
/// Each returns a pollable_request; the buffers must stay alive, and those it writes
/// untouched, until the request completes. Sizes and roots are checked as for the
/// blocking calls (the error text names the non-blocking call), traffic is counted when
/// the operation starts, and the result equals the blocking call's. Several may be in
/// flight on one communicator; every rank starts them in the same order.
template <class C>
concept nonblocking_communicator =
    communicator<C> && requires(C& c, std::span<float> buf, std::span<const float> cbuf, reduce_op op,
                                int i) {
      { c.ireduce_scatter(cbuf, buf, op) } -> pollable_request;
      { c.ibroadcast(buf, i) } -> pollable_request;
      { c.iall_reduce(buf, op) } -> pollable_request;
    };

/// Whether communicator C moves device (GPU) buffers rather than host memory: true for
/// a type that declares `static constexpr bool device_buffers = true` (nccl_communicator,
/// staged_communicator). The spans a collective takes then point into device memory.
template <class C>
inline constexpr bool takes_device_buffers = [] {
  if constexpr (requires { C::device_buffers; }) return bool(C::device_buffers);
  else return false;
}();

/// Whether communicator C moves elements of type T: true for every comm_element unless C
/// declares `template <class T> static constexpr bool supports_element` (nccl_communicator:
/// no 16-bit integers, no long double; staged_communicator<H>: H's). Typed code gets a
/// compile-time error for an unsupported type; any_communicator asks this trait and
/// throws, naming the call, the backend and the type.
template <class C, class T>
inline constexpr bool comm_supports = [] {
  if constexpr (!comm_element<T>) return false;
  else if constexpr (requires { C::template supports_element<T>; }) return bool(C::template supports_element<T>);
  else return true;
}();

/// Whether communicator `c` moves device buffers, at run time: `c.device_buffers()`
/// where C answers at run time (any_communicator, whose backend is chosen when the job
/// starts), else takes_device_buffers<C>. Generic code that branches on
/// takes_device_buffers<C> at compile time must ask this for any_communicator, whose
/// takes_device_buffers is false whatever it holds.
template <class C>
bool uses_device_buffers(const C& c) {
  if constexpr (requires { { c.device_buffers() } -> std::convertible_to<bool>; }) return c.device_buffers();
  else return takes_device_buffers<C>;
}

namespace detail {

// ---- argument checks shared by the backends -------------------------------------
// The checks are inline comparisons; the messages are built only on failure, in cold
// out-of-line functions, so the hot path stays a few compares.

[[noreturn, gnu::cold, gnu::noinline]] inline void comm_fail(const std::string& message) {
  throw error(message);
}

inline std::string comm_num(std::size_t n) { return std::to_string(n); }

/// "all_reduce: out has 5 elements, expected 6 (the size of in)"
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_same_size(const char* fn, const char* a,
                                                                   std::size_t na, const char* b,
                                                                   std::size_t nb) {
  comm_fail(std::string(fn) + ": " + b + " has " + comm_num(nb) + " elements, expected " +
            comm_num(na) + " (the size of " + a + ")");
}

/// "all_gather: out has 10 elements, expected 4 ranks x 3 = 12"
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_blocks(const char* fn, const char* name,
                                                                std::size_t have, int g,
                                                                std::size_t block) {
  comm_fail(std::string(fn) + ": " + name + " has " + comm_num(have) + " elements, expected " +
            std::to_string(g) + " ranks x " + comm_num(block) + " = " +
            comm_num(std::size_t(g) * block));
}

[[noreturn, gnu::cold, gnu::noinline]] inline void fail_overlap(const char* fn) {
  comm_fail(std::string(fn) + ": in and out overlap; the buffers of a collective must be distinct");
}

/// True when the byte ranges of two spans share a byte.
template <class T>
bool spans_overlap(std::span<const T> a, std::span<const T> b) {
  if (a.empty() || b.empty()) return false;
  std::less<const T*> lt;
  return lt(a.data(), b.data() + b.size()) && lt(b.data(), a.data() + a.size());
}

template <class T>
inline void check_disjoint(const char* fn, std::span<const T> in, std::span<const T> out) {
  if (spans_overlap(in, out)) [[unlikely]]
    fail_overlap(fn);
}

/// all_reduce: out.size() == in.size(); in == out (in place) or disjoint.
template <class T>
inline void check_all_reduce(std::span<const T> in, std::span<const T> out) {
  if (in.size() != out.size()) [[unlikely]]
    fail_same_size("all_reduce", "in", in.size(), "out", out.size());
  if (in.data() != out.data()) check_disjoint("all_reduce", in, out);
}

/// all_gather: out.size() == g * in.size().
template <class T>
inline void check_all_gather(std::span<const T> in, std::span<const T> out, int g) {
  if (out.size() != std::size_t(g) * in.size()) [[unlikely]]
    fail_blocks("all_gather", "out", out.size(), g, in.size());
  check_disjoint("all_gather", in, out);
}

/// reduce_scatter: in.size() == g * out.size().
/// `fn` names the call in the error ("ireduce_scatter" for the non-blocking one).
template <class T>
inline void check_reduce_scatter(std::span<const T> in, std::span<const T> out, int g,
                                 const char* fn = "reduce_scatter") {
  if (in.size() != std::size_t(g) * out.size()) [[unlikely]]
    fail_blocks(fn, "in", in.size(), g, out.size());
  check_disjoint(fn, in, out);
}

/// "all_to_all: in has 10 elements, not divisible into 4 equal blocks (one per rank)"
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_not_divisible(const char* fn,
                                                                       std::size_t n, int g) {
  comm_fail(std::string(fn) + ": in has " + comm_num(n) + " elements, not divisible into " +
            std::to_string(g) + " equal blocks (one per rank)");
}

/// all_to_all: in.size() divisible by g, out.size() == in.size().
template <class T>
inline void check_all_to_all(std::span<const T> in, std::span<const T> out, int g) {
  if (in.size() % std::size_t(g) != 0) [[unlikely]]
    fail_not_divisible("all_to_all", in.size(), g);
  if (out.size() != in.size()) [[unlikely]]
    fail_same_size("all_to_all", "in", in.size(), "out", out.size());
  check_disjoint("all_to_all", in, out);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void fail_entries(const char* fn, const char* name,
                                                                 std::size_t have, int g) {
  comm_fail(std::string(fn) + ": " + name + " has " + comm_num(have) + " entries, expected " +
            std::to_string(g) + " (one per rank)");
}

[[noreturn, gnu::cold, gnu::noinline]] inline void fail_negative(const char* fn, const char* name,
                                                                  int index, int value) {
  comm_fail(std::string(fn) + ": " + name + "[" + std::to_string(index) + "] is " +
            std::to_string(value) + ", must not be negative");
}

/// "all_to_all_v: the block for rank 2 covers elements [8, 14) of in, which has 12 elements"
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_block_range(const char* fn, const char* dir,
                                                                     int peer, const char* buf,
                                                                     std::int64_t begin,
                                                                     std::int64_t end,
                                                                     std::size_t n) {
  comm_fail(std::string(fn) + ": the block " + dir + " rank " + std::to_string(peer) +
            " covers elements [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " +
            buf + ", which has " + comm_num(n) + " elements");
}

inline void check_v_side(const char* fn, const char* dir, const char* buf, std::size_t n,
                         const char* counts_name, std::span<const int> counts,
                         const char* displs_name, std::span<const int> displs, int g) {
  if (counts.size() != std::size_t(g)) [[unlikely]]
    fail_entries(fn, counts_name, counts.size(), g);
  if (displs.size() != std::size_t(g)) [[unlikely]]
    fail_entries(fn, displs_name, displs.size(), g);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const int c = counts[i], d = displs[i];
    if (c < 0) [[unlikely]]
      fail_negative(fn, counts_name, int(i), c);
    if (d < 0) [[unlikely]]
      fail_negative(fn, displs_name, int(i), d);
    const std::int64_t end = std::int64_t(d) + c;
    if (c > 0 && end > std::int64_t(n)) [[unlikely]]
      fail_block_range(fn, dir, int(i), buf, d, end, n);
  }
}

/// all_to_all_v: one count and one displacement per rank on each side, non-negative,
/// every block inside its buffer; in and out distinct. Returns the number of elements
/// this rank receives from other ranks (its own block excluded).
template <class T>
inline std::int64_t check_all_to_all_v(std::span<const T> in, std::span<const int> send_counts,
                                       std::span<const int> send_displs, std::span<const T> out,
                                       std::span<const int> recv_counts,
                                       std::span<const int> recv_displs, int rank, int g) {
  constexpr const char* fn = "all_to_all_v";
  check_v_side(fn, "for", "in", in.size(), "send_counts", send_counts, "send_displs", send_displs,
               g);
  check_v_side(fn, "from", "out", out.size(), "recv_counts", recv_counts, "recv_displs",
               recv_displs, g);
  check_disjoint(fn, in, out);
  std::int64_t received = 0;
  for (std::size_t i = 0; i < recv_counts.size(); ++i)
    if (int(i) != rank) received += recv_counts[i];
  return received;
}

/// "broadcast: root 5 is out of range for 4 ranks"
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_rank(const char* fn, const char* name,
                                                              int r, int g) {
  comm_fail(std::string(fn) + ": " + name + " " + std::to_string(r) + " is out of range for " +
            std::to_string(g) + " ranks");
}

inline void check_rank(const char* fn, const char* name, int r, int g) {
  if (r < 0 || r >= g) [[unlikely]]
    fail_rank(fn, name, r, g);
}

/// "send: tag -1 must not be negative"
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_tag(const char* fn, int tag) {
  comm_fail(std::string(fn) + ": tag " + std::to_string(tag) + " must not be negative");
}

inline void check_tag(const char* fn, int tag) {
  if (tag < 0) [[unlikely]]
    fail_tag(fn, tag);
}

/// "split: color -1 must not be negative (every rank joins a group)"
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_color(int color) {
  comm_fail("split: color " + std::to_string(color) +
            " must not be negative (every rank joins a group)");
}

inline void check_color(int color) {
  if (color < 0) [[unlikely]]
    fail_color(color);
}

// ---- the abort path ----------------------------------------------------------------

/// Functions run when a rank ends the whole job on an error (run_mpi's abort path),
/// before MPI_Abort: a backend with work in flight on a device registers one so that
/// its kernels stop instead of waiting for peers that are gone (NCCL's ncclCommAbort).
inline std::vector<void (*)()>& abort_hooks() {
  static std::vector<void (*)()> hooks;
  return hooks;
}
inline void add_abort_hook(void (*f)()) { abort_hooks().push_back(f); }
inline void run_abort_hooks() noexcept {
  for (void (*f)() : abort_hooks()) f();
}

// ---- helpers --------------------------------------------------------------------

/// Finishes reduce_op::mean: divides every element by g (integer division for
/// integer types).
/// out[i] = a[i] op b[i] for sum, max and min (mean sums; the caller divides).
template <class T>
void combine(T* out, const T* a, const T* b, std::size_t n, reduce_op op) {
  switch (op) {
    case reduce_op::max:
      for (std::size_t i = 0; i < n; ++i) out[i] = a[i] < b[i] ? b[i] : a[i];
      break;
    case reduce_op::min:
      for (std::size_t i = 0; i < n; ++i) out[i] = b[i] < a[i] ? b[i] : a[i];
      break;
    default:
      for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
      break;
  }
}

template <class T>
void divide_by(std::span<T> v, int g) {
  if (g == 1) return;
  if constexpr (std::is_floating_point_v<T>) {
    const T d = T(g);
    for (T& x : v) x /= d;
  } else {
    using wide = std::common_type_t<T, int>;
    for (T& x : v) x = static_cast<T>(static_cast<wide>(x) / static_cast<wide>(g));
  }
}

/// Adds one call and `bytes` to `t`: the whole cost of counting.
inline void count(traffic& t, std::int64_t bytes) {
  t.calls += 1;
  t.bytes += bytes;
}

template <class T>
constexpr index_t byte_size(std::span<T> s) {
  return index_t(s.size() * sizeof(T));
}

}  // namespace detail

}  // namespace tessera
