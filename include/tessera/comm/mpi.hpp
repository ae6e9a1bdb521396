// The MPI backend: an RAII environment, a move-only owner of an MPI_Comm whose
// collectives are thin checked calls, and run_mpi, the recommended main.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/comm/communicator.hpp>

namespace tessera {

namespace detail {

// ---- MPI return codes -------------------------------------------------------------

/// "MPI_Allreduce failed: MPI_ERR_TRUNCATE: message truncated (MPI error 15)"
[[noreturn, gnu::cold, gnu::noinline]] inline void mpi_fail(int rc, const char* call) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  comm_fail(std::string(call) + " failed: " +
            (len > 0 ? std::string(text, std::size_t(len)) : std::string("unknown MPI error")) +
            " (MPI error " + std::to_string(rc) + ")");
}

/// Turns a non-success MPI return code into a tessera::error naming the call.
inline void mpi_call(int rc, const char* call) {
  if (rc != MPI_SUCCESS) [[unlikely]]
    mpi_fail(rc, call);
}

/// "all_reduce: in has 3000000000 elements, more than MPI's count limit 2147483647"
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_count(const char* fn, const char* name,
                                                               std::size_t n) {
  comm_fail(std::string(fn) + ": " + name + " has " + std::to_string(n) +
            " elements, more than MPI's count limit " + std::to_string(INT_MAX) +
            " (split the buffer into smaller calls)");
}

/// An element count as MPI's int, or an error: never a silent truncation.
inline int mpi_count(const char* fn, const char* name, std::size_t n) {
  if (n > std::size_t(INT_MAX)) [[unlikely]]
    fail_count(fn, name, n);
  return static_cast<int>(n);
}

// ---- element types ----------------------------------------------------------------

/// Instantiated only for an element type with no MPI datatype; the compiler's note
/// names the type as the template argument.
template <class T>
struct no_mpi_datatype_for {
  static_assert(sizeof(T) == 0,
                "mpi_communicator: no MPI datatype for this element type (see the template "
                "argument of no_mpi_datatype_for); use float, double, long double or an integer "
                "type of 1, 2, 4 or 8 bytes");
};

/// The MPI datatype of T, selected at compile time: float -> MPI_FLOAT, double ->
/// MPI_DOUBLE, long double -> MPI_LONG_DOUBLE, integers by size and signedness
/// (std::int32_t -> MPI_INT32_T, std::uint8_t -> MPI_UINT8_T, long long -> MPI_INT64_T,
/// plain char -> MPI_INT8_T or MPI_UINT8_T, ...). MPI's handles are addresses rather
/// than constants, so this is an inline function whose body is one return.
template <class T>
inline MPI_Datatype mpi_datatype() noexcept {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return MPI_FLOAT;
  } else if constexpr (std::is_same_v<U, double>) {
    return MPI_DOUBLE;
  } else if constexpr (std::is_same_v<U, long double>) {
    return MPI_LONG_DOUBLE;
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && std::is_signed_v<U> &&
                       sizeof(U) == 1) {
    return MPI_INT8_T;
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && std::is_signed_v<U> &&
                       sizeof(U) == 2) {
    return MPI_INT16_T;
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && std::is_signed_v<U> &&
                       sizeof(U) == 4) {
    return MPI_INT32_T;
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && std::is_signed_v<U> &&
                       sizeof(U) == 8) {
    return MPI_INT64_T;
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && sizeof(U) == 1) {
    return MPI_UINT8_T;
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && sizeof(U) == 2) {
    return MPI_UINT16_T;
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && sizeof(U) == 4) {
    return MPI_UINT32_T;
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && sizeof(U) == 8) {
    return MPI_UINT64_T;
  } else {
    (void)no_mpi_datatype_for<U>{};
    return MPI_DATATYPE_NULL;
  }
}

/// sum and mean -> MPI_SUM (mean divides afterwards), max -> MPI_MAX, min -> MPI_MIN.
inline MPI_Op mpi_op(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::max: return MPI_MAX;
    case reduce_op::min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

inline bool mpi_active() noexcept {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

inline int mpi_world_rank() noexcept {
  int r = -1;
  if (mpi_active()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/// Prints "tessera: rank R: <prefix><what>" to stderr and ends the whole job: every
/// rank, including those blocked in a collective.
[[noreturn]] inline void abort_job(const char* prefix, const char* what) noexcept {
  std::fflush(stdout);
  std::fprintf(stderr, "tessera: rank %d: %s%s\n", mpi_world_rank(), prefix, what);
  std::fflush(stderr);
  run_abort_hooks();
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

[[noreturn]] inline void mpi_terminate_handler() noexcept {
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      abort_job("terminate: ", x.what());
    } catch (...) {
      abort_job("terminate: ", "unknown exception (not derived from std::exception)");
    }
  }
  abort_job("terminate: ", "std::terminate called without an active exception");
}

}  // namespace detail

/// Owns MPI for the lifetime of the object: initialises it (MPI_Init_thread with
/// MPI_THREAD_FUNNELED: only the thread that created the environment calls MPI, other
/// threads may exist, e.g. BLAS workers) unless it is already initialised, and
/// finalises it in the destructor if this object initialised it and it is not yet
/// finalised. While it lives, std::terminate prints "tessera: rank R: terminate:
/// <what>" and calls MPI_Abort, so an uncaught error on one rank ends the job instead
/// of leaving the others blocked in a collective.
///
/// Not copyable or movable. Prefer run_mpi, which also creates the world communicator.
class mpi_environment {
 public:
  mpi_environment(int& argc, char**& argv, int required = MPI_THREAD_FUNNELED) {
    init(&argc, &argv, required);
  }
  /// Initialises MPI without the command line.
  explicit mpi_environment(int required = MPI_THREAD_FUNNELED) { init(nullptr, nullptr, required); }

  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;

  ~mpi_environment() {
    std::set_terminate(previous_);
    if (owns_ && detail::mpi_active()) MPI_Finalize();
  }

  /// The thread level MPI provides (MPI_THREAD_SINGLE .. MPI_THREAD_MULTIPLE).
  int thread_level() const noexcept { return provided_; }
  /// True when this object initialised MPI (and will finalise it).
  bool owns_mpi() const noexcept { return owns_; }

 private:
  void init(int* argc, char*** argv, int required) {
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
      int fin = 0;
      MPI_Finalized(&fin);
      if (fin) detail::comm_fail("mpi_environment: MPI was already finalised and cannot restart");
      detail::mpi_call(MPI_Init_thread(argc, argv, required, &provided_), "MPI_Init_thread");
      owns_ = true;
    } else {
      MPI_Query_thread(&provided_);
    }
    previous_ = std::set_terminate(&detail::mpi_terminate_handler);
  }

  bool owns_ = false;
  int provided_ = MPI_THREAD_SINGLE;
  std::terminate_handler previous_ = nullptr;
};

/// A move-only owner of an MPI communicator. Collectives are the raw MPI call plus
/// argument checks and two integer adds of traffic counting: no allocation, no copy
/// (in-place all_reduce uses MPI_IN_PLACE). The communicator's error handler is
/// MPI_ERRORS_RETURN; a failing call throws tessera::error naming the MPI call and
/// MPI's error text. Element counts above INT_MAX throw (MPI counts are int).
///
///     tessera::run_mpi(argc, argv, [](tessera::mpi_communicator& world) {
///       std::vector<float> g = grads();
///       world.all_reduce(std::span<float>(g), tessera::reduce_op::mean);
///     });
class mpi_communicator {
 public:
  /// A pending iall_reduce. Move-only; wait() completes it (and divides by the
  /// communicator size for reduce_op::mean); the destructor waits if still pending.
  class request {
   public:
    request() noexcept = default;
    request(request&& o) noexcept
        : req_(std::exchange(o.req_, MPI_REQUEST_NULL)),
          data_(o.data_),
          n_(o.n_),
          g_(o.g_),
          finish_(std::exchange(o.finish_, nullptr)) {}
    request& operator=(request&& o) noexcept {
      if (this != &o) {
        complete_quietly();
        req_ = std::exchange(o.req_, MPI_REQUEST_NULL);
        data_ = o.data_;
        n_ = o.n_;
        g_ = o.g_;
        finish_ = std::exchange(o.finish_, nullptr);
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { complete_quietly(); }

    /// Blocks until the reduction is complete; throws tessera::error if MPI fails.
    void wait() {
      if (req_ == MPI_REQUEST_NULL) return;
      const int rc = MPI_Wait(&req_, MPI_STATUS_IGNORE);
      req_ = MPI_REQUEST_NULL;
      detail::mpi_call(rc, "MPI_Wait");
      finish();
    }

    /// True when complete (then the result is ready, mean included).
    bool test() {
      if (req_ == MPI_REQUEST_NULL) return true;
      int done = 0;
      detail::mpi_call(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) return false;
      req_ = MPI_REQUEST_NULL;
      finish();
      return true;
    }

    /// True until wait() or a successful test().
    bool pending() const noexcept { return req_ != MPI_REQUEST_NULL; }

   private:
    friend class mpi_communicator;
    using finish_fn = void (*)(void*, std::size_t, int);

    template <class T>
    static void finish_mean(void* p, std::size_t n, int g) {
      detail::divide_by(std::span<T>(static_cast<T*>(p), n), g);
    }

    void finish() {
      if (finish_) std::exchange(finish_, nullptr)(data_, n_, g_);
    }

    void complete_quietly() noexcept {
      if (req_ == MPI_REQUEST_NULL) return;
      if (detail::mpi_active() && MPI_Wait(&req_, MPI_STATUS_IGNORE) == MPI_SUCCESS) finish();
      req_ = MPI_REQUEST_NULL;
      finish_ = nullptr;
    }

    MPI_Request req_ = MPI_REQUEST_NULL;
    void* data_ = nullptr;
    std::size_t n_ = 0;
    int g_ = 1;
    finish_fn finish_ = nullptr;
  };

  /// A pending ireduce_scatter. Every rank sends block j of its input to member j and
  /// receives its own block from every other member at once (one round of messages, the
  /// volume of a ring: (g - 1) blocks in and out), and adds the blocks in member order,
  /// ((x_0 + x_1) + x_2) + ..., as they arrive, inside test() and wait(). Move-only; the
  /// destructor waits if it is still pending. Its messages carry a tag of their own (one
  /// per request, from nonblocking_tag_base on), so several may be in flight on one
  /// communicator.
  class reduce_scatter_request {
   public:
    reduce_scatter_request() noexcept = default;
    reduce_scatter_request(reduce_scatter_request&& o) noexcept { take(o); }
    reduce_scatter_request& operator=(reduce_scatter_request&& o) noexcept {
      if (this != &o) {
        complete_quietly();
        take(o);
      }
      return *this;
    }
    reduce_scatter_request(const reduce_scatter_request&) = delete;
    reduce_scatter_request& operator=(const reduce_scatter_request&) = delete;
    ~reduce_scatter_request() { complete_quietly(); }

    /// Blocks until this rank's block is reduced; throws tessera::error if MPI fails.
    void wait() {
      while (next_ < g_) {
        if (next_ != r_)
          detail::mpi_call(MPI_Wait(&recv_[std::size_t(next_)], MPI_STATUS_IGNORE), "MPI_Wait");
        add_next();
      }
      if (!sends_done_) {
        detail::mpi_call(MPI_Waitall(int(send_.size()), send_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
        sends_done_ = true;
      }
      finish();
    }

    /// Adds the blocks that have arrived (in member order); true when this rank's block
    /// is reduced and its own blocks are sent (mean included).
    bool test() {
      while (next_ < g_) {
        if (next_ != r_) {
          int done = 0;
          detail::mpi_call(MPI_Test(&recv_[std::size_t(next_)], &done, MPI_STATUS_IGNORE), "MPI_Test");
          if (!done) break;
        }
        add_next();
      }
      if (!sends_done_) {
        int done = 0;
        detail::mpi_call(MPI_Testall(int(send_.size()), send_.data(), &done, MPI_STATUSES_IGNORE),
                         "MPI_Testall");
        sends_done_ = done != 0;
      }
      if (next_ < g_ || !sends_done_) return false;
      finish();
      return true;
    }

    /// True until wait() or a successful test().
    bool pending() const noexcept { return active_; }

   private:
    friend class mpi_communicator;
    using combine_fn = void (*)(void*, const void*, std::size_t, reduce_op);
    using divide_fn = void (*)(void*, std::size_t, int);

    template <class T>
    static void combine_into(void* acc, const void* x, std::size_t n, reduce_op op) {
      T* a = static_cast<T*>(acc);
      detail::combine(a, a, static_cast<const T*>(x), n, op);
    }
    template <class T>
    static void divide(void* p, std::size_t n, int g) {
      detail::divide_by(std::span<T>(static_cast<T*>(p), n), g);
    }

    // Where member m's block lands: out for the first member other than this rank when
    // this rank is not member 0 (it starts the sum), else a scratch slot.
    unsigned char* landing(int m) {
      if (r_ != 0 && m == 0) return out_;
      const int slot = m - (m > r_ ? 1 : 0) - (r_ != 0 ? 1 : 0);
      return scratch_.get() + std::size_t(slot) * bytes_;
    }

    // Adds member next_'s block (own block or arrived) to the sum.
    void add_next() {
      const int m = next_++;
      const unsigned char* x = m == r_ ? in_ + std::size_t(r_) * bytes_ : landing(m);
      if (m == 0) {
        if (x != out_) std::memcpy(out_, x, bytes_);
      } else {
        combine_(out_, x, std::size_t(n_), op_);
      }
    }

    void finish() {
      if (!active_) return;
      active_ = false;
      if (divide_) divide_(out_, std::size_t(n_), g_);
    }

    void take(reduce_scatter_request& o) noexcept {
      r_ = o.r_;
      g_ = o.g_;
      n_ = o.n_;
      next_ = o.next_;
      bytes_ = o.bytes_;
      in_ = o.in_;
      out_ = o.out_;
      scratch_ = std::move(o.scratch_);
      recv_ = std::move(o.recv_);
      send_ = std::move(o.send_);
      sends_done_ = o.sends_done_;
      active_ = std::exchange(o.active_, false);
      op_ = o.op_;
      combine_ = o.combine_;
      divide_ = o.divide_;
    }

    void complete_quietly() noexcept {
      if (active_ && detail::mpi_active()) {
        try {
          wait();
        } catch (...) {
        }
      }
      active_ = false;
    }

    int r_ = 0, g_ = 1, n_ = 0, next_ = 0;
    std::size_t bytes_ = 0;  // of one block
    const unsigned char* in_ = nullptr;
    unsigned char* out_ = nullptr;
    std::unique_ptr<unsigned char[]> scratch_;  // the blocks that do not land in out (uninitialised)
    std::vector<MPI_Request> recv_;       // one per member (this rank's entry unused)
    std::vector<MPI_Request> send_;       // one per other member
    bool sends_done_ = true, active_ = false;
    reduce_op op_ = reduce_op::sum;
    combine_fn combine_ = nullptr;
    divide_fn divide_ = nullptr;
  };

  /// A duplicate of MPI_COMM_WORLD, owned: the library's messages never match the
  /// user's own MPI_COMM_WORLD traffic. Collective over MPI_COMM_WORLD.
  static mpi_communicator world() { return duplicate_of(MPI_COMM_WORLD, "world"); }

  /// Takes ownership of `comm` (freed by the destructor unless it is
  /// MPI_COMM_WORLD or MPI_COMM_SELF) and sets MPI_ERRORS_RETURN on it.
  static mpi_communicator adopt(MPI_Comm comm) {
    const bool predefined = comm == MPI_COMM_WORLD || comm == MPI_COMM_SELF;
    return mpi_communicator(comm, !predefined);
  }

  /// Uses `comm` without owning it. Sets MPI_ERRORS_RETURN on it (so its errors
  /// become exceptions, also for the caller's own calls on it).
  static mpi_communicator borrow(MPI_Comm comm) { return mpi_communicator(comm, false); }

  mpi_communicator(mpi_communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
        owned_(std::exchange(o.owned_, false)),
        rank_(std::exchange(o.rank_, -1)),
        size_(std::exchange(o.size_, 0)),
        stats_(std::exchange(o.stats_, traffic{})),
        scratch_(std::move(o.scratch_)),
        nonblocking_seq_(std::exchange(o.nonblocking_seq_, 0)) {}
  mpi_communicator& operator=(mpi_communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      owned_ = std::exchange(o.owned_, false);
      rank_ = std::exchange(o.rank_, -1);
      size_ = std::exchange(o.size_, 0);
      stats_ = std::exchange(o.stats_, traffic{});
      scratch_ = std::move(o.scratch_);
      nonblocking_seq_ = std::exchange(o.nonblocking_seq_, 0);
    }
    return *this;
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  ~mpi_communicator() { release(); }

  /// The name of the backend, "mpi" (any_communicator::backend() reports it).
  static constexpr std::string_view backend() noexcept { return "mpi"; }

  /// The MPI handle (MPI_COMM_NULL after a move).
  MPI_Comm native() const noexcept { return comm_; }
  bool valid() const noexcept { return comm_ != MPI_COMM_NULL; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  // ---- collectives ------------------------------------------------------------------

  /// out = op over ranks of in. in == out (same span) runs in place.
  template <comm_element T>
  void all_reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    detail::check_all_reduce<T>(in, out);
    const int n = detail::mpi_count("all_reduce", "in", in.size());
    const void* src = in.data() == out.data() ? MPI_IN_PLACE : in.data();
    detail::mpi_call(
        MPI_Allreduce(src, out.data(), n, detail::mpi_datatype<T>(), detail::mpi_op(op), comm_),
        "MPI_Allreduce");
    detail::count(stats_, cost::all_reduce(detail::byte_size(in), size_));
    if (op == reduce_op::mean) detail::divide_by(out, size_);
  }

  /// inout = op over ranks of inout (MPI_IN_PLACE).
  template <comm_element T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    const int n = detail::mpi_count("all_reduce", "inout", inout.size());
    detail::mpi_call(MPI_Allreduce(MPI_IN_PLACE, inout.data(), n, detail::mpi_datatype<T>(),
                                   detail::mpi_op(op), comm_),
                     "MPI_Allreduce");
    detail::count(stats_, cost::all_reduce(detail::byte_size(inout), size_));
    if (op == reduce_op::mean) detail::divide_by(inout, size_);
  }

  /// out = the in of every rank, in rank order (out.size() == size() * in.size()).
  template <comm_element T>
  void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    detail::check_all_gather<T>(in, out, size_);
    const int n = detail::mpi_count("all_gather", "in", in.size());
    const MPI_Datatype t = detail::mpi_datatype<T>();
    detail::mpi_call(MPI_Allgather(in.data(), n, t, out.data(), n, t, comm_), "MPI_Allgather");
    detail::count(stats_, cost::all_gather(detail::byte_size(in), size_));
  }

  /// out = op over ranks of block rank() of in (in.size() == size() * out.size()).
  template <comm_element T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out,
                      reduce_op op) {
    detail::check_reduce_scatter<T>(in, out, size_);
    const int n = detail::mpi_count("reduce_scatter", "out", out.size());
    if (size_ > 1 && detail::byte_size(out) >= ring_min_block_bytes) {
      ring_reduce_scatter(in.data(), out.data(), n, op);
    } else {
      detail::mpi_call(MPI_Reduce_scatter_block(in.data(), out.data(), n, detail::mpi_datatype<T>(),
                                                detail::mpi_op(op), comm_),
                       "MPI_Reduce_scatter_block");
    }
    detail::count(stats_, cost::reduce_scatter(detail::byte_size(in), size_));
    if (op == reduce_op::mean) detail::divide_by(out, size_);
  }

  /// Block j of in goes to rank j; block i of out comes from rank i (equal blocks).
  template <comm_element T>
  void all_to_all(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    detail::check_all_to_all<T>(in, out, size_);
    const int n = detail::mpi_count("all_to_all", "a block of in", in.size() / std::size_t(size_));
    const MPI_Datatype t = detail::mpi_datatype<T>();
    detail::mpi_call(MPI_Alltoall(in.data(), n, t, out.data(), n, t, comm_), "MPI_Alltoall");
    detail::count(stats_, cost::all_to_all(detail::byte_size(in), size_));
  }

  /// MPI_Alltoallv: send_counts[j] elements at in[send_displs[j]] go to rank j;
  /// recv_counts[i] elements from rank i land at out[recv_displs[i]].
  template <comm_element T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> in, std::span<const int> send_counts,
                    std::span<const int> send_displs, std::span<T> out,
                    std::span<const int> recv_counts, std::span<const int> recv_displs) {
    const std::int64_t received = detail::check_all_to_all_v<T>(
        in, send_counts, send_displs, out, recv_counts, recv_displs, rank_, size_);
    const MPI_Datatype t = detail::mpi_datatype<T>();
    detail::mpi_call(MPI_Alltoallv(in.data(), send_counts.data(), send_displs.data(), t,
                                   out.data(), recv_counts.data(), recv_displs.data(), t, comm_),
                     "MPI_Alltoallv");
    detail::count(stats_, received * index_t(sizeof(T)));
  }

  /// buf of `root` is copied to every rank.
  template <comm_element T>
  void broadcast(std::span<T> buf, int root) {
    detail::check_rank("broadcast", "root", root, size_);
    const int n = detail::mpi_count("broadcast", "buf", buf.size());
    detail::mpi_call(MPI_Bcast(buf.data(), n, detail::mpi_datatype<T>(), root, comm_), "MPI_Bcast");
    detail::count(stats_, rank_ == root ? 0 : cost::broadcast(detail::byte_size(buf), size_));
  }

  /// Blocking send of buf to rank `dest` (accepts std::span<T> or std::span<const T>).
  template <class T>
    requires comm_element<std::remove_const_t<T>>
  void send(std::span<T> buf, int dest, int tag = 0) {
    using U = std::remove_const_t<T>;
    detail::check_rank("send", "dest", dest, size_);
    detail::check_tag("send", tag);
    const int n = detail::mpi_count("send", "buf", buf.size());
    detail::mpi_call(MPI_Send(buf.data(), n, detail::mpi_datatype<U>(), dest, tag, comm_),
                     "MPI_Send");
    detail::count(stats_, 0);
  }

  /// Starts a send of buf to rank `dest` (MPI_Isend): buf must stay alive and unchanged
  /// until the request completes. Sends that cross between two ranks cannot deadlock,
  /// as two blocking ones can (a pipeline's activations one way, gradients the other).
  template <comm_element T>
  [[nodiscard]] request isend(std::span<const T> buf, int dest, int tag = 0) {
    detail::check_rank("isend", "dest", dest, size_);
    detail::check_tag("isend", tag);
    const int n = detail::mpi_count("isend", "buf", buf.size());
    request r;
    detail::mpi_call(MPI_Isend(buf.data(), n, detail::mpi_datatype<T>(), dest, tag, comm_, &r.req_), "MPI_Isend");
    detail::count(stats_, 0);
    return r;
  }

  /// Blocking receive from rank `source` into buf; the message may be shorter than
  /// buf (the bytes counted are the message's), a longer one is an error.
  template <comm_element T>
  void recv(std::span<T> buf, int source, int tag = 0) {
    detail::check_rank("recv", "source", source, size_);
    detail::check_tag("recv", tag);
    const int n = detail::mpi_count("recv", "buf", buf.size());
    const MPI_Datatype t = detail::mpi_datatype<T>();
    MPI_Status st;
    detail::mpi_call(MPI_Recv(buf.data(), n, t, source, tag, comm_, &st), "MPI_Recv");
    int got = 0;
    detail::mpi_call(MPI_Get_count(&st, t, &got), "MPI_Get_count");
    detail::count(stats_, index_t(got) * index_t(sizeof(T)));
  }

  void barrier() {
    detail::mpi_call(MPI_Barrier(comm_), "MPI_Barrier");
    detail::count(stats_, 0);
  }

  /// Starts an in-place all_reduce (MPI_Iallreduce); inout must stay alive and
  /// untouched until the request completes. Counted when started.
  template <comm_element T>
  [[nodiscard]] request iall_reduce(std::span<T> inout, reduce_op op) {
    const int n = detail::mpi_count("iall_reduce", "inout", inout.size());
    request r;
    detail::mpi_call(MPI_Iallreduce(MPI_IN_PLACE, inout.data(), n, detail::mpi_datatype<T>(),
                                    detail::mpi_op(op), comm_, &r.req_),
                     "MPI_Iallreduce");
    detail::count(stats_, cost::all_reduce(detail::byte_size(inout), size_));
    if (op == reduce_op::mean && size_ > 1) {
      r.data_ = inout.data();
      r.n_ = inout.size();
      r.g_ = size_;
      r.finish_ = &request::finish_mean<T>;
    }
    return r;
  }

  /// Starts a reduce_scatter: the result of reduce_scatter(in, out, op) (to float
  /// rounding: the blocks are added in member order), computed as the messages arrive,
  /// inside test() or wait() of the request. `in` and `out` must stay alive, and out
  /// untouched, until it completes. Counted when started, as reduce_scatter. Sizes are
  /// checked as reduce_scatter's: "ireduce_scatter: in has 10 elements, expected 4 ranks
  /// x 3 = 12".
  template <comm_element T>
  [[nodiscard]] reduce_scatter_request ireduce_scatter(std::span<const std::type_identity_t<T>> in,
                                                       std::span<T> out, reduce_op op) {
    detail::check_reduce_scatter<T>(in, out, size_, "ireduce_scatter");
    const int n = detail::mpi_count("ireduce_scatter", "out", out.size());
    detail::count(stats_, cost::reduce_scatter(detail::byte_size(in), size_));
    reduce_scatter_request q;
    if (size_ == 1) {
      std::copy(in.begin(), in.end(), out.begin());
      return q;
    }
    const MPI_Datatype type = detail::mpi_datatype<T>();
    const int tag = nonblocking_tag_base + int(nonblocking_seq_++ % nonblocking_tags);
    q.r_ = rank_;
    q.g_ = size_;
    q.n_ = n;
    q.bytes_ = out.size() * sizeof(T);
    q.in_ = reinterpret_cast<const unsigned char*>(in.data());
    q.out_ = reinterpret_cast<unsigned char*>(out.data());
    q.scratch_.reset(new unsigned char[std::size_t(size_ - (rank_ != 0 ? 2 : 1)) * q.bytes_]);
    q.recv_.assign(std::size_t(size_), MPI_REQUEST_NULL);
    q.send_.reserve(std::size_t(size_ - 1));
    q.op_ = op;
    q.combine_ = &reduce_scatter_request::combine_into<T>;
    if (op == reduce_op::mean) q.divide_ = &reduce_scatter_request::divide<T>;
    q.active_ = true;
    q.sends_done_ = false;
    for (int k = 1; k < size_; ++k) {  // receives first, from the next ranks on
      const int m = (rank_ + k) % size_;
      detail::mpi_call(MPI_Irecv(q.landing(m), n, type, m, tag, comm_, &q.recv_[std::size_t(m)]), "MPI_Irecv");
    }
    for (int k = 1; k < size_; ++k) {  // rank r sends to r - 1 first, r - 2 next, ...
      const int m = (rank_ - k + size_) % size_;
      q.send_.push_back(MPI_REQUEST_NULL);
      detail::mpi_call(MPI_Isend(in.data() + std::size_t(m) * out.size(), n, type, m, tag, comm_, &q.send_.back()),
                       "MPI_Isend");
    }
    return q;
  }

  /// Starts a broadcast of root's buf (MPI_Ibcast); buf must stay alive (and, off the
  /// root, untouched) until the request completes. Counted when started, as broadcast.
  template <comm_element T>
  [[nodiscard]] request ibroadcast(std::span<T> buf, int root) {
    detail::check_rank("ibroadcast", "root", root, size_);
    const int n = detail::mpi_count("ibroadcast", "buf", buf.size());
    request r;
    detail::mpi_call(MPI_Ibcast(buf.data(), n, detail::mpi_datatype<T>(), root, comm_, &r.req_),
                     "MPI_Ibcast");
    detail::count(stats_, rank_ == root ? 0 : cost::broadcast(detail::byte_size(buf), size_));
    return r;
  }

  /// MPI_Comm_split: the ranks with equal `color` form a new communicator, ordered
  /// by `key` (ties by rank). Collective; color must be non-negative.
  mpi_communicator split(int color, int key) const {
    detail::check_color(color);
    MPI_Comm out = MPI_COMM_NULL;
    detail::mpi_call(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
    return mpi_communicator(out, true);
  }

  /// MPI_Comm_dup: same ranks, separate message space and counters. Collective.
  mpi_communicator dup() const { return duplicate_of(comm_, "dup"); }

  /// The ranks of this communicator on this rank's node (MPI_Comm_split_type with
  /// MPI_COMM_TYPE_SHARED), ordered by rank: its rank() is the node-local rank, which
  /// picks a GPU on machines with several. Collective.
  mpi_communicator node_local() const {
    MPI_Comm out = MPI_COMM_NULL;
    detail::mpi_call(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out),
                     "MPI_Comm_split_type");
    return mpi_communicator(out, true);
  }

  traffic& stats() noexcept { return stats_; }
  const traffic& stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = {}; }

  /// Blocks of at least this many bytes are reduce-scattered by the ring below.
  static constexpr std::int64_t ring_min_block_bytes = std::int64_t(64) << 10;

  /// The tags of ireduce_scatter's messages: nonblocking_tag_base + (the request's
  /// sequence number on this communicator mod nonblocking_tags). Point-to-point
  /// messages of the caller on the same communicator should avoid these tags.
  static constexpr int nonblocking_tag_base = 0x4000;
  static constexpr int nonblocking_tags = 0x2000;

 private:
  // Ring reduce-scatter: g - 1 steps; at step s rank r sends its partial sum of block
  // (r - s) mod g to rank r + 1 and receives block (r - s - 1) mod g from rank r - 1,
  // adding its own contribution. After g - 1 steps it holds block r, complete. Each
  // rank receives (g - 1) blocks, the cost model's (g - 1) / g of the buffer. Open MPI's
  // MPI_Reduce_scatter_block is slower than MPI_Allreduce on large buffers (it moves
  // more data than this), so the wrapper uses the ring there.
  template <class T>
  void ring_reduce_scatter(const T* in, T* out, int n, reduce_op op) {
    const int g = size_, r = rank_;
    const int right = (r + 1) % g, left = (r - 1 + g) % g;
    const std::size_t b = std::size_t(n);
    if (scratch_.size() < b * sizeof(T)) scratch_.resize(b * sizeof(T));
    T* recv = reinterpret_cast<T*>(scratch_.data());
    const MPI_Datatype t = detail::mpi_datatype<T>();
    auto block = [&](int j) { return in + std::size_t((j % g + g) % g) * b; };
    for (int s = 1; s < g; ++s) {
      const T* send = s == 1 ? block(r - 1) : out;
      detail::mpi_call(MPI_Sendrecv(send, n, t, right, ring_tag, recv, n, t, left, ring_tag, comm_,
                                    MPI_STATUS_IGNORE),
                       "MPI_Sendrecv");
      detail::combine(out, recv, block(r - s - 1), b, op);
    }
  }

  static constexpr int ring_tag = 0x7e55;
  mpi_communicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    // Own the handle first so that a failure below still frees it.
    try {
      detail::mpi_call(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      detail::mpi_call(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
      detail::mpi_call(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    } catch (...) {
      release();
      throw;
    }
  }

  static mpi_communicator duplicate_of(MPI_Comm comm, const char* fn) {
    if (!detail::mpi_active()) [[unlikely]]
      detail::comm_fail(std::string("mpi_communicator::") + fn +
                        ": MPI is not initialised; create a tessera::mpi_environment first "
                        "(or use tessera::run_mpi)");
    MPI_Comm out = MPI_COMM_NULL;
    detail::mpi_call(MPI_Comm_dup(comm, &out), "MPI_Comm_dup");
    return mpi_communicator(out, true);
  }

  void release() noexcept {
    if (owned_ && comm_ != MPI_COMM_NULL && detail::mpi_active()) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
    owned_ = false;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = -1;
  int size_ = 0;
  traffic stats_{};
  std::vector<unsigned char> scratch_;  // ring_reduce_scatter's receive block, reused
  std::uint64_t nonblocking_seq_ = 0;  // ireduce_scatter calls so far: their tags
};

static_assert(communicator<mpi_communicator>);
static_assert(nonblocking_communicator<mpi_communicator>);

/// The recommended main of a tessera MPI program:
///
///     int main(int argc, char** argv) {
///       return tessera::run_mpi(argc, argv, [](tessera::mpi_communicator& world) {
///         ...  // SPMD body; may return void or int
///       });
///     }
///
/// Creates the mpi_environment and the world communicator (a duplicate of
/// MPI_COMM_WORLD), then calls body(world). If body throws on any rank, that rank
/// prints "tessera: rank R: <what>" to stderr and calls MPI_Abort(MPI_COMM_WORLD, 1),
/// which ends every rank of the job within seconds, also those waiting in a
/// collective for the failed one. Returns body's int result, or 0 when body returns
/// void.
template <class F>
int run_mpi(int argc, char** argv, F&& body) {
  mpi_environment env(argc, argv);
  int result = 0;
  try {
    mpi_communicator world = mpi_communicator::world();
    using R = std::invoke_result_t<F&, mpi_communicator&>;
    if constexpr (std::is_void_v<R>) {
      std::invoke(body, world);
    } else {
      result = static_cast<int>(std::invoke(body, world));
    }
  } catch (const std::exception& e) {
    detail::abort_job("", e.what());
  } catch (...) {
    detail::abort_job("", "unknown exception (not derived from std::exception)");
  }
  return result;
}

}  // namespace tessera
