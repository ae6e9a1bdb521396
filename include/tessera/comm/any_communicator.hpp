// any_communicator: one move-only handle over any communicator, so that user code names
// no backend type and the backend (MPI, one rank, NCCL, staged device buffers, ...) is
// chosen when the job starts. The typed wrappers do the work underneath. Needs no MPI,
// CUDA or NCCL header: each backend's own header brings what it needs.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <tessera/comm/communicator.hpp>

namespace tessera {

namespace detail {

// ---- element types ------------------------------------------------------------------

/// The element type of one call through any_communicator: one enumerator per arithmetic
/// type that is a comm_element (char, signed char and unsigned char are three, as are
/// long and long long), so the wrapped communicator is called on exactly the caller's
/// type. The handle dispatches on it once per call, never per element.
enum class element_kind : std::uint8_t {
  float_,
  double_,
  long_double,
  char_,
  signed_char,
  unsigned_char,
  wchar,
  char8,
  char16,
  char32,
  short_,
  unsigned_short,
  int_,
  unsigned_int,
  long_,
  unsigned_long,
  long_long,
  unsigned_long_long,
};

/// Instantiated only for a comm_element that any_communicator cannot carry (an extended
/// integer type such as __int128); the compiler's note names the type.
template <class T>
struct no_element_kind_for {
  static_assert(sizeof(T) == 0,
                "any_communicator: no element kind for this element type (see the template argument of "
                "no_element_kind_for); use a standard arithmetic type");
};

template <class T>
consteval element_kind element_kind_of() {
  if constexpr (std::is_same_v<T, float>) return element_kind::float_;
  else if constexpr (std::is_same_v<T, double>) return element_kind::double_;
  else if constexpr (std::is_same_v<T, long double>) return element_kind::long_double;
  else if constexpr (std::is_same_v<T, char>) return element_kind::char_;
  else if constexpr (std::is_same_v<T, signed char>) return element_kind::signed_char;
  else if constexpr (std::is_same_v<T, unsigned char>) return element_kind::unsigned_char;
  else if constexpr (std::is_same_v<T, wchar_t>) return element_kind::wchar;
  else if constexpr (std::is_same_v<T, char8_t>) return element_kind::char8;
  else if constexpr (std::is_same_v<T, char16_t>) return element_kind::char16;
  else if constexpr (std::is_same_v<T, char32_t>) return element_kind::char32;
  else if constexpr (std::is_same_v<T, short>) return element_kind::short_;
  else if constexpr (std::is_same_v<T, unsigned short>) return element_kind::unsigned_short;
  else if constexpr (std::is_same_v<T, int>) return element_kind::int_;
  else if constexpr (std::is_same_v<T, unsigned int>) return element_kind::unsigned_int;
  else if constexpr (std::is_same_v<T, long>) return element_kind::long_;
  else if constexpr (std::is_same_v<T, unsigned long>) return element_kind::unsigned_long;
  else if constexpr (std::is_same_v<T, long long>) return element_kind::long_long;
  else if constexpr (std::is_same_v<T, unsigned long long>) return element_kind::unsigned_long_long;
  else {
    (void)no_element_kind_for<T>{};
    return element_kind::float_;
  }
}

/// The kind of T, a compile-time constant: element_kind_v<std::int64_t> == element_kind::long_
/// (on LP64 systems).
template <class T>
inline constexpr element_kind element_kind_v = element_kind_of<T>();

/// The C++ name of a kind, for error messages: "long double", "unsigned short".
constexpr std::string_view element_name(element_kind k) noexcept {
  switch (k) {
    case element_kind::float_: return "float";
    case element_kind::double_: return "double";
    case element_kind::long_double: return "long double";
    case element_kind::char_: return "char";
    case element_kind::signed_char: return "signed char";
    case element_kind::unsigned_char: return "unsigned char";
    case element_kind::wchar: return "wchar_t";
    case element_kind::char8: return "char8_t";
    case element_kind::char16: return "char16_t";
    case element_kind::char32: return "char32_t";
    case element_kind::short_: return "short";
    case element_kind::unsigned_short: return "unsigned short";
    case element_kind::int_: return "int";
    case element_kind::unsigned_int: return "unsigned int";
    case element_kind::long_: return "long";
    case element_kind::unsigned_long: return "unsigned long";
    case element_kind::long_long: return "long long";
    case element_kind::unsigned_long_long: return "unsigned long long";
  }
  return "unknown";
}

[[noreturn, gnu::cold, gnu::noinline]] inline void fail_element_kind(const char* fn, int k) {
  comm_fail(std::string(fn) + ": invalid element kind " + std::to_string(k));
}

/// Calls `f.template operator()<T>()` for the type T of kind k and returns its result (R):
/// one switch, compiled to a jump table.
template <class R, class F>
R visit_element(const char* fn, element_kind k, F&& f) {
  switch (k) {
    case element_kind::float_: return f.template operator()<float>();
    case element_kind::double_: return f.template operator()<double>();
    case element_kind::long_double: return f.template operator()<long double>();
    case element_kind::char_: return f.template operator()<char>();
    case element_kind::signed_char: return f.template operator()<signed char>();
    case element_kind::unsigned_char: return f.template operator()<unsigned char>();
    case element_kind::wchar: return f.template operator()<wchar_t>();
    case element_kind::char8: return f.template operator()<char8_t>();
    case element_kind::char16: return f.template operator()<char16_t>();
    case element_kind::char32: return f.template operator()<char32_t>();
    case element_kind::short_: return f.template operator()<short>();
    case element_kind::unsigned_short: return f.template operator()<unsigned short>();
    case element_kind::int_: return f.template operator()<int>();
    case element_kind::unsigned_int: return f.template operator()<unsigned int>();
    case element_kind::long_: return f.template operator()<long>();
    case element_kind::unsigned_long: return f.template operator()<unsigned long>();
    case element_kind::long_long: return f.template operator()<long long>();
    case element_kind::unsigned_long_long: return f.template operator()<unsigned long long>();
  }
  fail_element_kind(fn, int(k));
}

/// A span with its element type erased: its address and its element count.
struct erased_span {
  void* data;
  std::size_t size;
};
struct erased_cspan {
  const void* data;
  std::size_t size;
};

template <class T>
erased_span erase_type(std::span<T> s) noexcept {
  return {static_cast<void*>(s.data()), s.size()};
}
template <class T>
erased_cspan erase_type(std::span<const T> s) noexcept {
  return {static_cast<const void*>(s.data()), s.size()};
}
template <class T>
std::span<T> as_typed(erased_span s) noexcept {
  return {static_cast<T*>(s.data), s.size};
}
template <class T>
std::span<const T> as_typed(erased_cspan s) noexcept {
  return {static_cast<const T*>(s.data), s.size};
}

/// One address per type: target<C>() compares them, so the handle needs no RTTI.
template <class C>
inline constexpr char type_tag = 0;

}  // namespace detail

/// A pending operation of any communicator, its type erased: move-only, `wait()`
/// completes it, `test()` polls it (a pollable_request). A default-constructed request is
/// complete. Requests of up to 48 bytes (those of mpi_communicator's iall_reduce,
/// ibroadcast and isend, of NCCL and of local_communicator) are kept inside the object;
/// larger ones (mpi_communicator's ireduce_scatter, staged_communicator's) in one
/// allocation. Once complete, the wrapped request is released. Destroying a pending
/// request does what the wrapped one's destructor does (mpi_communicator's waits).
///
/// test() on a wrapped request that cannot be polled (a comm_request without test())
/// waits for it and returns true.
class any_request {
 public:
  any_request() noexcept = default;

  /// Takes over `r`, a request of a communicator.
  template <class R>
    requires(!std::same_as<R, any_request> && comm_request<R>)
  explicit any_request(R r) {
    if constexpr (fits<R>) {
      ::new (static_cast<void*>(buf_)) R(std::move(r));
    } else {
      R* p = new R(std::move(r));
      ::new (static_cast<void*>(buf_)) R*(p);
    }
    ops_ = &ops_for<R>;
  }

  any_request(any_request&& o) noexcept { take(o); }
  any_request& operator=(any_request&& o) noexcept {
    if (this != &o) {
      reset();
      take(o);
    }
    return *this;
  }
  any_request(const any_request&) = delete;
  any_request& operator=(const any_request&) = delete;
  ~any_request() { reset(); }

  /// Blocks until the operation is complete (as the wrapped request's wait()).
  void wait() {
    if (!ops_) return;
    ops_->wait(buf_);
    reset();
  }

  /// True once the operation is complete (then the result is ready, as after wait()).
  bool test() {
    if (!ops_) return true;
    if (!ops_->test(buf_)) return false;
    reset();
    return true;
  }

  /// True until wait() or a successful test().
  bool pending() const noexcept { return ops_ != nullptr; }

  /// The bytes a request may have to be kept inside the object.
  static constexpr std::size_t inline_bytes = 48;

 private:
  struct ops {
    void (*wait)(void*);
    bool (*test)(void*);
    void (*move)(void* from, void* to) noexcept;  // constructs at `to`, destroys `from`
    void (*destroy)(void*) noexcept;
  };

  template <class R>
  static constexpr bool fits = sizeof(R) <= inline_bytes && alignof(R) <= alignof(std::max_align_t) &&
                               std::is_nothrow_move_constructible_v<R>;

  template <class R>
  static R& get(void* p) noexcept {
    if constexpr (fits<R>) return *std::launder(static_cast<R*>(p));
    else return **std::launder(static_cast<R**>(p));
  }

  template <class R>
  static void wait_of(void* p) {
    get<R>(p).wait();
  }
  template <class R>
  static bool test_of(void* p) {
    if constexpr (pollable_request<R>) {
      return get<R>(p).test();
    } else {
      get<R>(p).wait();
      return true;
    }
  }
  template <class R>
  static void move_of(void* from, void* to) noexcept {
    if constexpr (fits<R>) {
      R& r = get<R>(from);
      ::new (to) R(std::move(r));
      r.~R();
    } else {
      ::new (to) R*(*std::launder(static_cast<R**>(from)));
    }
  }
  template <class R>
  static void destroy_of(void* p) noexcept {
    if constexpr (fits<R>) get<R>(p).~R();
    else delete &get<R>(p);
  }

  template <class R>
  static constexpr ops ops_for{&wait_of<R>, &test_of<R>, &move_of<R>, &destroy_of<R>};

  void take(any_request& o) noexcept {
    if (!o.ops_) return;
    o.ops_->move(o.buf_, buf_);
    ops_ = std::exchange(o.ops_, nullptr);
  }
  void reset() noexcept {
    if (ops_) std::exchange(ops_, nullptr)->destroy(buf_);
  }

  alignas(std::max_align_t) unsigned char buf_[inline_bytes];
  const ops* ops_ = nullptr;
};

static_assert(pollable_request<any_request>);

class any_communicator;

namespace detail {

// ---- the erased communicator ----------------------------------------------------------

/// What any_communicator calls: one virtual function per call of the communicator
/// concept, its spans erased to (address, count) and an element_kind.
class comm_interface {
 public:
  virtual ~comm_interface() = default;

  virtual void all_reduce(erased_cspan in, erased_span out, element_kind k, reduce_op op) = 0;
  virtual void all_reduce(erased_span inout, element_kind k, reduce_op op) = 0;
  virtual void all_gather(erased_cspan in, erased_span out, element_kind k) = 0;
  virtual void reduce_scatter(erased_cspan in, erased_span out, element_kind k, reduce_op op) = 0;
  virtual void all_to_all(erased_cspan in, erased_span out, element_kind k) = 0;
  virtual void all_to_all_v(erased_cspan in, std::span<const int> send_counts, std::span<const int> send_displs,
                            erased_span out, std::span<const int> recv_counts, std::span<const int> recv_displs,
                            element_kind k) = 0;
  virtual void broadcast(erased_span buf, int root, element_kind k) = 0;
  virtual void send(erased_cspan buf, int dest, int tag, element_kind k) = 0;
  virtual void recv(erased_span buf, int source, int tag, element_kind k) = 0;
  virtual void barrier() = 0;

  virtual any_request iall_reduce(erased_span inout, element_kind k, reduce_op op) = 0;
  virtual any_request ireduce_scatter(erased_cspan in, erased_span out, element_kind k, reduce_op op) = 0;
  virtual any_request ibroadcast(erased_span buf, int root, element_kind k) = 0;
  virtual any_request isend(erased_cspan buf, int dest, int tag, element_kind k) = 0;

  virtual std::unique_ptr<comm_interface> split(int color, int key) = 0;
  virtual std::unique_ptr<comm_interface> node_local() = 0;

  virtual traffic& stats() noexcept = 0;
  virtual const traffic& stats() const noexcept = 0;
  virtual void reset_stats() = 0;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  virtual std::string_view backend() const noexcept = 0;
  virtual bool device_buffers() const noexcept = 0;
  virtual const void* type() const noexcept = 0;  // &type_tag<C>
  virtual void* target() noexcept = 0;            // the C inside
  virtual any_communicator* host_communicator() noexcept = 0;  // C's host(), when a handle
};

/// "all_reduce: the nccl backend has no element type short"
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_unsupported_element(const char* fn, std::string_view backend,
                                                                             element_kind k) {
  comm_fail(std::string(fn) + ": the " + std::string(backend) + " backend has no element type " +
            std::string(element_name(k)));
}

/// "isend: the local backend has no non-blocking send"
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_missing_call(const char* fn, std::string_view backend,
                                                                      const char* what) {
  comm_fail(std::string(fn) + ": the " + std::string(backend) + " backend has no " + what);
}

/// The name any_communicator reports for C: C's backend() ("mpi"), or "custom" when C
/// has none; a communicator over a host communicator (host(): staged_communicator) adds
/// the host's name in parentheses: "staged(mpi)".
template <class C>
std::string backend_name_of(C& c) {
  std::string name = "custom";
  if constexpr (requires { { c.backend() } -> std::convertible_to<std::string_view>; })
    name = std::string(std::string_view(c.backend()));
  if constexpr (requires { c.host(); }) {
    const std::string host = backend_name_of(c.host());
    name.push_back('(');
    name.append(host);
    name.push_back(')');
  }
  return name;
}

// The optional calls of a communicator C on element type T.
template <class C, class T>
concept has_ireduce_scatter = requires(C& c, std::span<const T> in, std::span<T> out, reduce_op op) {
  c.ireduce_scatter(in, out, op);
};
template <class C, class T>
concept has_ibroadcast = requires(C& c, std::span<T> buf, int root) { c.ibroadcast(buf, root); };
template <class C, class T>
concept has_isend = requires(C& c, std::span<const T> buf, int peer) { c.isend(buf, peer, peer); };
template <class C>
concept has_node_local = requires(C& c) {
  { c.node_local() } -> communicator;
};

// The non-blocking calls a communicator may lack, as function templates (so that a call
// C lacks is never looked up): ireduce_scatter and ibroadcast are emulated by the
// blocking call (arguments checked under the non-blocking name), returning a completed
// request; isend is an error, since a blocking send in its place could deadlock (two
// ranks sending to each other before receiving).
template <class T, class C>
any_request start_reduce_scatter(C& c, std::span<const T> in, std::span<T> out, reduce_op op) {
  if constexpr (has_ireduce_scatter<C, T>) {
    return any_request(c.ireduce_scatter(in, out, op));
  } else {
    check_reduce_scatter<T>(in, out, c.size(), "ireduce_scatter");
    c.reduce_scatter(in, out, op);
    return any_request{};
  }
}
template <class T, class C>
any_request start_broadcast(C& c, std::span<T> buf, int root) {
  if constexpr (has_ibroadcast<C, T>) {
    return any_request(c.ibroadcast(buf, root));
  } else {
    check_rank("ibroadcast", "root", root, c.size());
    c.broadcast(buf, root);
    return any_request{};
  }
}
template <class T, class C>
any_request start_send(C& c, std::span<const T> buf, int dest, int tag, std::string_view backend) {
  if constexpr (has_isend<C, T>) return any_request(c.isend(buf, dest, tag));
  else fail_missing_call("isend", backend, "non-blocking send");
}

template <class C>
class comm_model;

template <class C>
std::unique_ptr<comm_interface> make_model(C&& c) {
  return std::make_unique<comm_model<std::remove_cvref_t<C>>>(std::forward<C>(c));
}

/// The erased communicator over a C, kept by value: each call dispatches on the element
/// kind to C's call on that type, which checks the arguments, communicates and counts
/// the traffic exactly as when C is called directly.
template <class C>
class comm_model final : public comm_interface {
 public:
  template <class... A>
  explicit comm_model(A&&... a) : c_(std::forward<A>(a)...), name_(backend_name_of(c_)) {}

  void all_reduce(erased_cspan in, erased_span out, element_kind k, reduce_op op) override {
    dispatch<void>("all_reduce", k, [&]<class T>() { c_.all_reduce(as_typed<T>(in), as_typed<T>(out), op); });
  }
  void all_reduce(erased_span inout, element_kind k, reduce_op op) override {
    dispatch<void>("all_reduce", k, [&]<class T>() { c_.all_reduce(as_typed<T>(inout), op); });
  }
  void all_gather(erased_cspan in, erased_span out, element_kind k) override {
    dispatch<void>("all_gather", k, [&]<class T>() { c_.all_gather(as_typed<T>(in), as_typed<T>(out)); });
  }
  void reduce_scatter(erased_cspan in, erased_span out, element_kind k, reduce_op op) override {
    dispatch<void>("reduce_scatter", k, [&]<class T>() { c_.reduce_scatter(as_typed<T>(in), as_typed<T>(out), op); });
  }
  void all_to_all(erased_cspan in, erased_span out, element_kind k) override {
    dispatch<void>("all_to_all", k, [&]<class T>() { c_.all_to_all(as_typed<T>(in), as_typed<T>(out)); });
  }
  void all_to_all_v(erased_cspan in, std::span<const int> send_counts, std::span<const int> send_displs,
                    erased_span out, std::span<const int> recv_counts, std::span<const int> recv_displs,
                    element_kind k) override {
    dispatch<void>("all_to_all_v", k, [&]<class T>() {
      c_.all_to_all_v(as_typed<T>(in), send_counts, send_displs, as_typed<T>(out), recv_counts, recv_displs);
    });
  }
  void broadcast(erased_span buf, int root, element_kind k) override {
    dispatch<void>("broadcast", k, [&]<class T>() { c_.broadcast(as_typed<T>(buf), root); });
  }
  void send(erased_cspan buf, int dest, int tag, element_kind k) override {
    dispatch<void>("send", k, [&]<class T>() { c_.send(as_typed<T>(buf), dest, tag); });
  }
  void recv(erased_span buf, int source, int tag, element_kind k) override {
    dispatch<void>("recv", k, [&]<class T>() { c_.recv(as_typed<T>(buf), source, tag); });
  }
  void barrier() override { c_.barrier(); }

  any_request iall_reduce(erased_span inout, element_kind k, reduce_op op) override {
    return dispatch<any_request>("iall_reduce", k,
                                 [&]<class T>() -> any_request { return any_request(c_.iall_reduce(as_typed<T>(inout), op)); });
  }

  any_request ireduce_scatter(erased_cspan in, erased_span out, element_kind k, reduce_op op) override {
    return dispatch<any_request>("ireduce_scatter", k, [&]<class T>() -> any_request {
      return start_reduce_scatter<T>(c_, as_typed<T>(in), as_typed<T>(out), op);
    });
  }
  any_request ibroadcast(erased_span buf, int root, element_kind k) override {
    return dispatch<any_request>("ibroadcast", k,
                                 [&]<class T>() -> any_request { return start_broadcast<T>(c_, as_typed<T>(buf), root); });
  }
  any_request isend(erased_cspan buf, int dest, int tag, element_kind k) override {
    return dispatch<any_request>("isend", k,
                                 [&]<class T>() -> any_request { return start_send<T>(c_, as_typed<T>(buf), dest, tag, name_); });
  }

  std::unique_ptr<comm_interface> split(int color, int key) override { return make_model(c_.split(color, key)); }

  // C's node_local() when it has one; a one-rank communicator is its own node (a split).
  std::unique_ptr<comm_interface> node_local() override {
    if constexpr (has_node_local<C>) {
      return make_model(c_.node_local());
    } else {
      if (c_.size() != 1)
        comm_fail("node_local: the " + name_ +
                  " backend cannot tell which ranks share a node; ask the host communicator (the MPI world)");
      return make_model(c_.split(0, 0));
    }
  }

  traffic& stats() noexcept override { return c_.stats(); }
  const traffic& stats() const noexcept override { return c_.stats(); }
  void reset_stats() override { c_.reset_stats(); }

  int rank() const noexcept override { return c_.rank(); }
  int size() const noexcept override { return c_.size(); }
  std::string_view backend() const noexcept override { return name_; }
  bool device_buffers() const noexcept override { return takes_device_buffers<C>; }
  const void* type() const noexcept override { return &type_tag<C>; }
  void* target() noexcept override { return &c_; }
  any_communicator* host_communicator() noexcept override {
    if constexpr (requires { { c_.host() } -> std::same_as<any_communicator&>; }) return &c_.host();
    else return nullptr;
  }

 private:
  // f.operator()<T>() for the T of kind k when C moves T, else the error naming the call,
  // the backend and the type.
  template <class R, class F>
  R dispatch(const char* fn, element_kind k, F&& f) {
    return visit_element<R>(fn, k, [&]<class T>() -> R {
      if constexpr (comm_supports<C, T>) return f.template operator()<T>();
      else fail_unsupported_element(fn, name_, k);
    });
  }

  C c_;
  std::string name_;
};

[[noreturn, gnu::cold, gnu::noinline]] inline void fail_empty_handle() {
  comm_fail("any_communicator: the handle is empty (moved from)");
}

}  // namespace detail

/// One communicator handle whose backend is chosen at run time: a move-only owner of any
/// type modelling `communicator` (mpi_communicator, local_communicator; with CUDA
/// staged_communicator<H> and nccl_communicator), which itself models `communicator` and
/// `nonblocking_communicator`, so mesh_comm<any_communicator>,
/// device_context<any_communicator> and every algorithm templated on a communicator take
/// it unchanged.
///
///     int main(int argc, char** argv) {
///       return tessera::run(argc, argv, [](tessera::any_communicator& world) {
///         std::vector<float> g = grads();                     // mpiexec: the MPI world;
///         world.all_reduce(std::span<float>(g), tessera::reduce_op::mean);  // alone: one rank
///       });
///     }
///
/// Each call dispatches once, on a small enum of the element type, to the wrapped
/// communicator's call on that type (one virtual call and one switch; no per-element
/// work): every comm_element is accepted. That call checks the arguments (same error
/// texts), communicates and counts the traffic: stats() is the wrapped communicator's
/// counters, so the bytes equal the typed wrapper's, and the planner's prices. An element
/// type the backend cannot move (comm_supports: NCCL has no 16-bit integers) throws
/// tessera::error naming the call, the backend and the type: "all_reduce: the nccl
/// backend has no element type short".
///
/// Non-blocking calls return an any_request. iall_reduce is the wrapped one's (every
/// communicator has it); ireduce_scatter and ibroadcast are the wrapped one's when it has
/// them, else emulated by the blocking call (the arguments checked under the non-blocking
/// call's name), returning a completed request: the same result and traffic, without the
/// overlap. isend (a non-blocking point-to-point send, which train::pipeline needs) is
/// the wrapped one's; a backend without one throws ("isend: the local backend has no
/// non-blocking send"), since a blocking send in its place could deadlock.
///
/// Run-time queries replace what typed code knows at compile time: backend() ("mpi",
/// "local", "nccl", "staged(mpi)"), device_buffers() (true when the spans passed must
/// point to device memory: nccl, staged; takes_device_buffers<any_communicator> is false,
/// so generic code asks uses_device_buffers(c)), target<C>() (the typed communicator
/// underneath, or nullptr). node_local() gives the ranks sharing this rank's node (its
/// rank() picks a GPU) without naming MPI.
///
/// A moved-from handle is empty: valid() is false, rank() is -1 and size() 0, and every
/// other call throws tessera::error.
namespace detail {
/// A quick test made before `communicator<C>` in any_communicator's constructors: a type
/// that cannot split or count traffic (a device_context, which holds an
/// any_communicator) is ruled out without asking whether it is movable, which would
/// ask again whether it converts to an any_communicator.
template <class C>
concept splits_and_counts = requires(C& c) {
  c.split(0, 0);
  c.stats();
};
}  // namespace detail

class any_communicator {
 public:
  using request = any_request;

  /// Takes over `c`, a communicator of any backend (moved in).
  template <class C>
    requires(!std::same_as<C, any_communicator> && detail::splits_and_counts<C> && communicator<C>)
  any_communicator(C c) : any_communicator(detail::make_model(std::move(c))) {}

  /// Makes a C in place from `args`.
  template <class C, class... Args>
    requires(!std::same_as<C, any_communicator> && communicator<C>)
  explicit any_communicator(std::in_place_type_t<C>, Args&&... args)
      : any_communicator(std::make_unique<detail::comm_model<C>>(std::forward<Args>(args)...)) {}

  any_communicator(any_communicator&& o) noexcept
      : impl_(std::move(o.impl_)), rank_(std::exchange(o.rank_, -1)), size_(std::exchange(o.size_, 0)) {}
  any_communicator& operator=(any_communicator&& o) noexcept {
    if (this != &o) {
      impl_ = std::move(o.impl_);
      rank_ = std::exchange(o.rank_, -1);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  any_communicator(const any_communicator&) = delete;
  any_communicator& operator=(const any_communicator&) = delete;
  ~any_communicator() = default;

  /// False once moved from.
  bool valid() const noexcept { return impl_ != nullptr; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  // ---- run-time queries -------------------------------------------------------------

  /// The backend's name: "mpi", "local", "nccl", "staged(mpi)", or "custom" for a
  /// communicator that does not name itself (a static backend() returning its name).
  std::string_view backend() const { return impl().backend(); }
  /// True when the spans passed to the calls must point to device (GPU) memory.
  bool device_buffers() const { return impl().device_buffers(); }

  /// The host communicator under a communicator of device buffers, when that is itself
  /// a handle (staged_communicator<any_communicator>: device buffers staged through the
  /// host world), else nullptr: what host-memory collectives next to device ones use.
  any_communicator* host_communicator() noexcept { return impl().host_communicator(); }

  /// The communicator underneath when it is a C, else nullptr (as std::function::target).
  template <class C>
  C* target() noexcept {
    return impl_ && impl_->type() == &detail::type_tag<C> ? static_cast<C*>(impl_->target()) : nullptr;
  }
  template <class C>
  const C* target() const noexcept {
    return impl_ && impl_->type() == &detail::type_tag<C> ? static_cast<const C*>(impl_->target()) : nullptr;
  }

  /// The ranks of this communicator on this rank's node, ordered by rank, as a handle
  /// of the same backend: its rank() is the node-local rank, which picks a GPU. The
  /// wrapped communicator's node_local() (mpi_communicator: MPI_Comm_split_type); a
  /// one-rank communicator is its own node. Collective. Throws for a backend that
  /// cannot tell (nccl: ask the host communicator instead).
  any_communicator node_local() const { return any_communicator(impl().node_local()); }

  // ---- the communicator concept -------------------------------------------------------

  template <comm_element T>
  void all_reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    impl().all_reduce(detail::erase_type(in), detail::erase_type(out), detail::element_kind_v<T>, op);
  }
  template <comm_element T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    impl().all_reduce(detail::erase_type(inout), detail::element_kind_v<T>, op);
  }
  template <comm_element T>
  void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    impl().all_gather(detail::erase_type(in), detail::erase_type(out), detail::element_kind_v<T>);
  }
  template <comm_element T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    impl().reduce_scatter(detail::erase_type(in), detail::erase_type(out), detail::element_kind_v<T>, op);
  }
  template <comm_element T>
  void all_to_all(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    impl().all_to_all(detail::erase_type(in), detail::erase_type(out), detail::element_kind_v<T>);
  }
  template <comm_element T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> in, std::span<const int> send_counts,
                    std::span<const int> send_displs, std::span<T> out, std::span<const int> recv_counts,
                    std::span<const int> recv_displs) {
    impl().all_to_all_v(detail::erase_type(in), send_counts, send_displs, detail::erase_type(out), recv_counts, recv_displs,
                        detail::element_kind_v<T>);
  }
  template <comm_element T>
  void broadcast(std::span<T> buf, int root) {
    impl().broadcast(detail::erase_type(buf), root, detail::element_kind_v<T>);
  }
  /// Accepts std::span<T> or std::span<const T>.
  template <class T>
    requires comm_element<std::remove_const_t<T>>
  void send(std::span<T> buf, int dest, int tag = 0) {
    using U = std::remove_const_t<T>;
    impl().send(detail::erase_type(std::span<const U>(buf)), dest, tag, detail::element_kind_v<U>);
  }
  template <comm_element T>
  void recv(std::span<T> buf, int source, int tag = 0) {
    impl().recv(detail::erase_type(buf), source, tag, detail::element_kind_v<T>);
  }
  void barrier() { impl().barrier(); }

  template <comm_element T>
  [[nodiscard]] request iall_reduce(std::span<T> inout, reduce_op op) {
    return impl().iall_reduce(detail::erase_type(inout), detail::element_kind_v<T>, op);
  }
  template <comm_element T>
  [[nodiscard]] request ireduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out,
                                        reduce_op op) {
    return impl().ireduce_scatter(detail::erase_type(in), detail::erase_type(out), detail::element_kind_v<T>, op);
  }
  template <comm_element T>
  [[nodiscard]] request ibroadcast(std::span<T> buf, int root) {
    return impl().ibroadcast(detail::erase_type(buf), root, detail::element_kind_v<T>);
  }
  /// Starts a send of buf to rank `dest` (the wrapped communicator's isend: buf must
  /// stay alive and unchanged until the request completes).
  template <comm_element T>
  [[nodiscard]] request isend(std::span<const T> buf, int dest, int tag = 0) {
    return impl().isend(detail::erase_type(buf), dest, tag, detail::element_kind_v<T>);
  }

  /// The ranks with equal `color`, ordered by `key`: a handle of the same backend
  /// (the wrapped communicator's split). Collective.
  any_communicator split(int color, int key) { return any_communicator(impl().split(color, key)); }

  /// The wrapped communicator's counters.
  traffic& stats() { return impl().stats(); }
  const traffic& stats() const { return impl().stats(); }
  void reset_stats() { impl().reset_stats(); }

 private:
  explicit any_communicator(std::unique_ptr<detail::comm_interface> impl)
      : impl_(std::move(impl)), rank_(impl_->rank()), size_(impl_->size()) {}

  detail::comm_interface& impl() const {
    if (!impl_) [[unlikely]]
      detail::fail_empty_handle();
    return *impl_;
  }

  std::unique_ptr<detail::comm_interface> impl_;
  int rank_ = -1;
  int size_ = 0;
};

static_assert(communicator<any_communicator>);
static_assert(nonblocking_communicator<any_communicator>);
static_assert(!takes_device_buffers<any_communicator>);

}  // namespace tessera
