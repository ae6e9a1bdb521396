// nccl_communicator: a thin, move-only owner of an NCCL communicator, modelling the
// communicator concept over device buffers. Collectives are queued on tessera's stream
// (cuda/runtime.hpp), after the kernels that produced their inputs and before those
// that consume their outputs; all_to_all and all_to_all_v are grouped point-to-point
// launches. Made from a host communicator that shares the unique id (MPI), split per
// mesh-axis group with ncclCommSplit. When a rank ends the job on an error (run_mpi),
// every live NCCL communicator is aborted first, so no kernel waits for a dead peer.
// The non-blocking calls (iall_reduce, ireduce_scatter, ibroadcast) run on the device's
// communication stream, after the work queued on tessera's stream so far and alongside
// the kernels queued after them.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <tessera/comm/communicator.hpp>
#include <tessera/cuda/runtime.hpp>

namespace tessera {

namespace detail {

/// "ncclAllReduce failed: invalid usage (ncclInvalidUsage, 5): <NCCL's last error>"
[[noreturn, gnu::cold, gnu::noinline]] inline void nccl_fail(ncclResult_t rc, const char* call, ncclComm_t comm) {
  std::string last = comm ? ncclGetLastError(comm) : "";
  comm_fail(std::string(call) + " failed: " + ncclGetErrorString(rc) + " (" + std::to_string(int(rc)) + ")" +
            (last.empty() ? "" : ": " + last));
}
inline void nccl_call(ncclResult_t rc, const char* call, ncclComm_t comm = nullptr) {
  if (rc != ncclSuccess) [[unlikely]]
    nccl_fail(rc, call, comm);
}

template <class T>
struct no_nccl_datatype_for {
  static_assert(sizeof(T) == 0,
                "nccl_communicator: no NCCL datatype for this element type (see the template argument); use "
                "float, double, std::int8_t, std::uint8_t, std::int32_t, std::uint32_t, std::int64_t or "
                "std::uint64_t");
};

/// Whether NCCL has a datatype for T: float, double and integers of 1, 4 or 8 bytes.
template <class T>
inline constexpr bool has_nccl_datatype =
    std::is_same_v<std::remove_cv_t<T>, float> || std::is_same_v<std::remove_cv_t<T>, double> ||
    (std::is_integral_v<T> && !std::is_same_v<std::remove_cv_t<T>, bool> &&
     (sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8));

template <class T>
constexpr ncclDataType_t nccl_datatype() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<U, double>) return ncclFloat64;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 1) return ncclInt8;
  else if constexpr (std::is_integral_v<U> && !std::is_signed_v<U> && sizeof(U) == 1) return ncclUint8;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 4) return ncclInt32;
  else if constexpr (std::is_integral_v<U> && !std::is_signed_v<U> && sizeof(U) == 4) return ncclUint32;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 8) return ncclInt64;
  else if constexpr (std::is_integral_v<U> && !std::is_signed_v<U> && sizeof(U) == 8) return ncclUint64;
  else {
    (void)no_nccl_datatype_for<U>{};
    return ncclFloat32;
  }
}

/// sum -> ncclSum, max -> ncclMax, min -> ncclMin, mean -> ncclAvg (floating point only).
template <class T>
ncclRedOp_t nccl_op(reduce_op op, const char* fn) {
  switch (op) {
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
    case reduce_op::mean:
      if constexpr (!std::is_floating_point_v<T>)
        comm_fail(std::string(fn) + ": reduce_op::mean needs a floating-point element type on NCCL");
      return ncclAvg;
    default: return ncclSum;
  }
}

/// The NCCL communicators alive in this process, aborted when the job ends on an error.
struct nccl_registry {
  std::mutex mutex;
  std::set<ncclComm_t> live;
  static nccl_registry& get() {
    static nccl_registry* r = [] {
      auto* reg = new nccl_registry();  // outlives every communicator
      add_abort_hook(+[] {
        nccl_registry& g = get();
        for (ncclComm_t c : g.live) ncclCommAbort(c);
        g.live.clear();
      });
      return reg;
    }();
    return *r;
  }
  void add(ncclComm_t c) {
    std::lock_guard lock(mutex);
    live.insert(c);
  }
  void remove(ncclComm_t c) {
    std::lock_guard lock(mutex);
    live.erase(c);
  }
};

/// The communication stream of the current device, shared by its NCCL communicators:
/// their non-blocking calls run on it in the order they are issued, and the blocking
/// ones (on tessera's stream) after those issued before them. So every NCCL operation of
/// a device runs in issue order, the same on every rank: NCCL kernels wait for their
/// peers, and operations of different communicators running at once may deadlock (NCCL's
/// "using multiple communicators concurrently"). Made on first use, never destroyed.
struct nccl_lane {
  cuda::stream_handle stream;
  cudaEvent_t after_compute = nullptr;  ///< recorded on tessera's stream before each call
  cudaEvent_t after_comm = nullptr;     ///< recorded on the stream after each call
  bool comm_ahead = false;              ///< one may still run: blocking calls wait for it

  nccl_lane() {
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&after_compute, cudaEventDisableTiming));
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&after_comm, cudaEventDisableTiming));
  }
  static nccl_lane& current() {
    constexpr int max_devices = 64;
    static nccl_lane* lanes[max_devices] = {};
    const int d = cuda::current_device();
    if (d >= max_devices) comm_fail("nccl_communicator: device index " + std::to_string(d) + " exceeds 64");
    if (!lanes[d]) lanes[d] = new nccl_lane();  // never destroyed: outlives every communicator
    return *lanes[d];
  }
};

}  // namespace detail

/// One rank's NCCL communicator. Buffers are device memory; every call returns once its
/// work is queued. The blocking collectives run on tessera's stream, ordered with the
/// kernels before and after them (barrier waits for them). The non-blocking ones run on
/// the device's communication stream (detail::nccl_lane, shared by the device's NCCL
/// communicators, made on first use): each waits (an event) for the work queued on
/// tessera's stream before it, then runs alongside the kernels queued after it; its
/// request's wait() orders tessera's stream after it, test() polls it. Blocking calls
/// queued after a non-blocking one run after it: every NCCL operation of a device runs
/// in the order it was issued.
///
///     auto r = nc.ireduce_scatter(std::span<const float>(send.data(), g * n),
///                                 std::span<float>(recv.data(), n), reduce_op::sum);
///     ... kernels reading neither buffer run alongside ...
///     r.wait();  // kernels queued from here on see recv
class nccl_communicator {
 public:
  static constexpr bool device_buffers = true;

  /// The element types NCCL moves (detail::has_nccl_datatype): float, double and
  /// integers of 1, 4 or 8 bytes; not 16-bit integers nor long double.
  template <class T>
  static constexpr bool supports_element = detail::has_nccl_datatype<T>;

  /// The name of the backend, "nccl" (any_communicator::backend() reports it).
  static constexpr std::string_view backend() noexcept { return "nccl"; }

  /// A pending non-blocking call: an event recorded after it on the device's
  /// communication stream. Move-only. test() returns true once the event has completed;
  /// wait() does not block the host: it makes tessera's stream wait for the event, so
  /// every kernel queued afterwards sees the result (cuda::synchronize() then waits for
  /// it too). Both first check NCCL's asynchronous error of the communicator, naming the
  /// call ("iall_reduce: ncclAllReduce failed: ..."). The destructor of a pending
  /// request orders tessera's stream after it, as wait() does, never throwing. A request
  /// must not outlive its communicator.
  class request {
   public:
    request() = default;
    request(request&& o) noexcept
        : e_(std::exchange(o.e_, nullptr)), comm_(o.comm_), fn_(o.fn_), call_(o.call_) {}
    request& operator=(request&& o) noexcept {
      if (this != &o) {
        complete_quietly();
        e_ = std::exchange(o.e_, nullptr);
        comm_ = o.comm_;
        fn_ = o.fn_;
        call_ = o.call_;
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { complete_quietly(); }

    /// Orders tessera's stream after the operation (cudaStreamWaitEvent); the host does
    /// not wait.
    void wait() {
      if (!e_) return;
      check_async();
      finish();
    }

    /// True once the operation has completed on the device (cudaEventQuery).
    bool test() {
      if (!e_) return true;
      const cudaError_t rc = cudaEventQuery(e_);
      if (rc == cudaErrorNotReady) {
        check_async();  // a failed peer shows here while the event never completes
        return false;
      }
      if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        cuda::fail(rc, (std::string(fn_) + ": cudaEventQuery").c_str());
      }
      check_async();
      finish();
      return true;
    }

    /// True until wait() or a successful test().
    bool pending() const noexcept { return e_ != nullptr; }

   private:
    friend class nccl_communicator;
    request(cudaEvent_t e, ncclComm_t comm, const char* fn, const char* call)
        : e_(e), comm_(comm), fn_(fn), call_(call) {}

    void check_async() {
      ncclResult_t async = ncclSuccess;
      detail::nccl_call(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", comm_);
      if (async != ncclSuccess && async != ncclInProgress) [[unlikely]]
        detail::nccl_fail(async, (std::string(fn_) + ": " + call_).c_str(), comm_);
    }
    void finish() {
      const cudaError_t rc = cudaStreamWaitEvent(cuda::stream(), e_, 0);
      cudaEventDestroy(e_);  // released once the wait has been satisfied
      e_ = nullptr;
      if (rc != cudaSuccess) cuda::fail(rc, (std::string(fn_) + ": cudaStreamWaitEvent").c_str());
    }
    void complete_quietly() noexcept {
      if (!e_) return;
      if (cudaStreamWaitEvent(cuda::stream(), e_, 0) != cudaSuccess) (void)cudaGetLastError();
      cudaEventDestroy(e_);
      e_ = nullptr;
    }

    cudaEvent_t e_ = nullptr;
    ncclComm_t comm_ = nullptr;
    const char* fn_ = "";    // the tessera call: "iall_reduce"
    const char* call_ = "";  // NCCL's: "ncclAllReduce"
  };

  /// The NCCL communicator of every rank of `host` (collective over host, e.g. the MPI
  /// world): rank 0 makes the unique id and host broadcasts it. Each rank must already
  /// have selected its own GPU (cuda::set_device): NCCL rejects two ranks on one GPU.
  template <communicator H>
  static nccl_communicator create(H& host) {
    ncclUniqueId id{};
    if (host.rank() == 0) detail::nccl_call(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::uint8_t bytes[sizeof(id)];
    std::memcpy(bytes, &id, sizeof(id));
    host.broadcast(std::span<std::uint8_t>(bytes, sizeof(bytes)), 0);
    std::memcpy(&id, bytes, sizeof(id));
    ncclComm_t c = nullptr;
    detail::nccl_call(ncclCommInitRank(&c, host.size(), id, host.rank()), "ncclCommInitRank");
    return nccl_communicator(c);
  }

  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  nccl_communicator(nccl_communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)),
        rank_(o.rank_),
        size_(o.size_),
        stats_(o.stats_),
        barrier_buf_(std::exchange(o.barrier_buf_, nullptr)) {}
  nccl_communicator& operator=(nccl_communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, nullptr);
      rank_ = o.rank_;
      size_ = o.size_;
      stats_ = o.stats_;
      barrier_buf_ = std::exchange(o.barrier_buf_, nullptr);
    }
    return *this;
  }
  ~nccl_communicator() { release(); }

  int rank() const { return rank_; }
  int size() const { return size_; }
  ncclComm_t handle() const { return comm_; }

  template <comm_element T>
  void all_reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    detail::check_all_reduce<T>(in, out);
    after_nonblocking();
    call(ncclAllReduce(in.data(), out.data(), in.size(), detail::nccl_datatype<T>(),
                       detail::nccl_op<T>(op, "all_reduce"), comm_, cuda::stream()),
         "ncclAllReduce");
    detail::count(stats_, cost::all_reduce(detail::byte_size(in), size_));
  }
  template <comm_element T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    all_reduce<T>(std::span<const T>(inout), inout, op);
  }
  template <comm_element T>
  void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    detail::check_all_gather<T>(in, out, size_);
    after_nonblocking();
    call(ncclAllGather(in.data(), out.data(), in.size(), detail::nccl_datatype<T>(), comm_, cuda::stream()),
         "ncclAllGather");
    detail::count(stats_, cost::all_gather(detail::byte_size(in), size_));
  }
  template <comm_element T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    detail::check_reduce_scatter<T>(in, out, size_);
    after_nonblocking();
    call(ncclReduceScatter(in.data(), out.data(), out.size(), detail::nccl_datatype<T>(),
                           detail::nccl_op<T>(op, "reduce_scatter"), comm_, cuda::stream()),
         "ncclReduceScatter");
    detail::count(stats_, cost::reduce_scatter(detail::byte_size(in), size_));
  }
  /// Equal blocks, block j to rank j: one grouped launch of sends and receives.
  template <comm_element T>
  void all_to_all(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    detail::check_all_to_all<T>(in, out, size_);
    const std::size_t b = in.size() / std::size_t(size_);
    grouped_exchange<T>(in.data(), out.data(), [&](int) { return b; }, [&](int r) { return std::size_t(r) * b; },
                        [&](int) { return b; }, [&](int r) { return std::size_t(r) * b; });
    detail::count(stats_, cost::all_to_all(detail::byte_size(in), size_));
  }
  template <comm_element T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> in, std::span<const int> send_counts,
                    std::span<const int> send_displs, std::span<T> out, std::span<const int> recv_counts,
                    std::span<const int> recv_displs) {
    const std::int64_t received = detail::check_all_to_all_v<T>(in, send_counts, send_displs, out, recv_counts,
                                                                 recv_displs, rank_, size_);
    if (send_counts[std::size_t(rank_)] != recv_counts[std::size_t(rank_)]) [[unlikely]]
      detail::comm_fail("all_to_all_v: rank " + std::to_string(rank_) + " sends " +
                        std::to_string(send_counts[std::size_t(rank_)]) + " elements to itself and expects to receive " +
                        std::to_string(recv_counts[std::size_t(rank_)]));
    auto at = [](std::span<const int> v) { return [v](int r) { return std::size_t(v[std::size_t(r)]); }; };
    grouped_exchange<T>(in.data(), out.data(), at(send_counts), at(send_displs), at(recv_counts), at(recv_displs));
    detail::count(stats_, received * index_t(sizeof(T)));
  }
  template <comm_element T>
  void broadcast(std::span<T> buf, int root) {
    detail::check_rank("broadcast", "root", root, size_);
    after_nonblocking();
    call(ncclBroadcast(buf.data(), buf.data(), buf.size(), detail::nccl_datatype<T>(), root, comm_, cuda::stream()),
         "ncclBroadcast");
    detail::count(stats_, rank_ == root ? 0 : cost::broadcast(detail::byte_size(buf), size_));
  }
  /// NCCL has no tags: messages between two ranks are matched in order (tag is checked
  /// to be non-negative and otherwise ignored).
  template <class T>
    requires comm_element<std::remove_const_t<T>>
  void send(std::span<T> buf, int dest, int tag = 0) {
    using U = std::remove_const_t<T>;
    detail::check_rank("send", "dest", dest, size_);
    detail::check_tag("send", tag);
    after_nonblocking();
    call(ncclSend(buf.data(), buf.size(), detail::nccl_datatype<U>(), dest, comm_, cuda::stream()), "ncclSend");
    detail::count(stats_, 0);
  }
  template <comm_element T>
  void recv(std::span<T> buf, int source, int tag = 0) {
    detail::check_rank("recv", "source", source, size_);
    detail::check_tag("recv", tag);
    after_nonblocking();
    call(ncclRecv(buf.data(), buf.size(), detail::nccl_datatype<T>(), source, comm_, cuda::stream()), "ncclRecv");
    detail::count(stats_, detail::byte_size(buf));
  }
  /// Every rank reaches this point, and everything queued before it has finished.
  void barrier() {
    if (!barrier_buf_) TESSERA_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
    after_nonblocking();
    call(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, cuda::stream()), "ncclAllReduce");
    cuda::synchronize();
    check_async("barrier");
    detail::count(stats_, 0);
  }
  /// all_reduce of `inout` in place, queued on the communication stream after the work
  /// queued so far on tessera's stream; returns at once. `inout` must stay alive, and
  /// untouched by later kernels, until the request is waited for (or tested true).
  template <comm_element T>
  [[nodiscard]] request iall_reduce(std::span<T> inout, reduce_op op) {
    const ncclRedOp_t nop = detail::nccl_op<T>(op, "iall_reduce");
    cudaStream_t s = begin_nonblocking();
    call(ncclAllReduce(inout.data(), inout.data(), inout.size(), detail::nccl_datatype<T>(), nop, comm_, s),
         "iall_reduce: ncclAllReduce");
    detail::count(stats_, cost::all_reduce(detail::byte_size(inout), size_));
    return end_nonblocking(s, "iall_reduce", "ncclAllReduce");
  }
  /// reduce_scatter on the communication stream (as iall_reduce); sizes are checked as
  /// reduce_scatter's ("ireduce_scatter: in has 10 elements, expected 4 ranks x 3 = 12").
  template <comm_element T>
  [[nodiscard]] request ireduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out,
                                        reduce_op op) {
    detail::check_reduce_scatter<T>(in, out, size_, "ireduce_scatter");
    const ncclRedOp_t nop = detail::nccl_op<T>(op, "ireduce_scatter");
    cudaStream_t s = begin_nonblocking();
    call(ncclReduceScatter(in.data(), out.data(), out.size(), detail::nccl_datatype<T>(), nop, comm_, s),
         "ireduce_scatter: ncclReduceScatter");
    detail::count(stats_, cost::reduce_scatter(detail::byte_size(in), size_));
    return end_nonblocking(s, "ireduce_scatter", "ncclReduceScatter");
  }
  /// broadcast on the communication stream (as iall_reduce); the root is checked as
  /// broadcast's ("ibroadcast: root 5 is out of range for 4 ranks").
  template <comm_element T>
  [[nodiscard]] request ibroadcast(std::span<T> buf, int root) {
    detail::check_rank("ibroadcast", "root", root, size_);
    cudaStream_t s = begin_nonblocking();
    call(ncclBroadcast(buf.data(), buf.data(), buf.size(), detail::nccl_datatype<T>(), root, comm_, s),
         "ibroadcast: ncclBroadcast");
    detail::count(stats_, rank_ == root ? 0 : cost::broadcast(detail::byte_size(buf), size_));
    return end_nonblocking(s, "ibroadcast", "ncclBroadcast");
  }
  /// The communicator of the ranks with the same color, ordered by key (collective).
  nccl_communicator split(int color, int key) {
    detail::check_color(color);
    ncclComm_t c = nullptr;
    call(ncclCommSplit(comm_, color, key, &c, nullptr), "ncclCommSplit");
    return nccl_communicator(c);
  }

  traffic& stats() { return stats_; }
  const traffic& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  explicit nccl_communicator(ncclComm_t c) : comm_(c) {
    detail::nccl_registry::get().add(c);
    call(ncclCommCount(c, &size_), "ncclCommCount");
    call(ncclCommUserRank(c, &rank_), "ncclCommUserRank");
  }
  void call(ncclResult_t rc, const char* what) { detail::nccl_call(rc, what, comm_); }

  // The communication stream after the work queued so far on tessera's stream (an
  // event recorded there, waited for on the communication stream).
  static cudaStream_t begin_nonblocking() {
    detail::nccl_lane& l = detail::nccl_lane::current();
    TESSERA_CUDA_CHECK(cudaEventRecord(l.after_compute, cuda::stream()));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(l.stream.get(), l.after_compute, 0));
    return l.stream.get();
  }
  // The request of the call just queued on s; blocking calls queued on tessera's stream
  // from now on come after it.
  request end_nonblocking(cudaStream_t s, const char* fn, const char* nccl_call_name) {
    detail::nccl_lane& l = detail::nccl_lane::current();
    TESSERA_CUDA_CHECK(cudaEventRecord(l.after_comm, s));
    l.comm_ahead = true;
    cudaEvent_t e = nullptr;
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (const cudaError_t rc = cudaEventRecord(e, s); rc != cudaSuccess) {
      cudaEventDestroy(e);
      cuda::fail(rc, "cudaEventRecord(e, communication stream)");
    }
    return request(e, comm_, fn, nccl_call_name);
  }
  // Before a blocking call on tessera's stream: after the non-blocking ones queued on
  // the communication stream (of any communicator of this device).
  static void after_nonblocking() {
    detail::nccl_lane& l = detail::nccl_lane::current();
    if (!l.comm_ahead) return;
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(), l.after_comm, 0));
    l.comm_ahead = false;
  }

  void check_async(const char* fn) {
    ncclResult_t async = ncclSuccess;
    call(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess) detail::nccl_fail(async, fn, comm_);
  }

  template <class T, class SC, class SD, class RC, class RD>
  void grouped_exchange(const T* in, T* out, SC scount, SD sdispl, RC rcount, RD rdispl) {
    const ncclDataType_t t = detail::nccl_datatype<T>();
    after_nonblocking();
    // This rank's own block is a device copy; the rest one group of sends and receives.
    if (const std::size_t n = scount(rank_); n > 0)
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(out + rdispl(rank_), in + sdispl(rank_), n * sizeof(T),
                                         cudaMemcpyDeviceToDevice, cuda::stream()));
    call(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      if (scount(r) > 0) call(ncclSend(in + sdispl(r), scount(r), t, r, comm_, cuda::stream()), "ncclSend");
      if (rcount(r) > 0) call(ncclRecv(out + rdispl(r), rcount(r), t, r, comm_, cuda::stream()), "ncclRecv");
    }
    call(ncclGroupEnd(), "ncclGroupEnd");
  }

  void release() noexcept {
    if (barrier_buf_) cudaFree(barrier_buf_);
    barrier_buf_ = nullptr;
    if (comm_) {
      detail::nccl_registry::get().remove(comm_);
      ncclCommDestroy(comm_);
    }
    comm_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  traffic stats_{};
  float* barrier_buf_ = nullptr;
};

static_assert(communicator<nccl_communicator>);
static_assert(nonblocking_communicator<nccl_communicator>);

}  // namespace tessera
