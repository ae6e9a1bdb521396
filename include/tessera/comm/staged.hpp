// staged_communicator<C>: device (GPU) buffers through a communicator of host memory.
// Each call copies its device input to pinned host memory, runs C's collective there,
// and copies the result back: how tensors on a GPU redistribute over an MPI that is not
// CUDA-aware, and how several ranks sharing one GPU communicate (NCCL refuses that).
// The non-blocking collectives (iall_reduce, ireduce_scatter, ibroadcast), when C has
// them, stage into pinned buffers of their own, start C's call and return: the copy
// back to the device happens when the request completes. The traffic counted is C's,
// so plans' byte counts hold unchanged.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/communicator.hpp>
#include <tessera/cuda/runtime.hpp>
#include <tessera/tensor/device.hpp>

namespace tessera {

namespace detail {

/// A staging copy's failure: when the buffer the caller passed is not GPU memory (host
/// values handed to a communicator that moves device buffers), an error that says so;
/// otherwise the CUDA error naming the copy.
[[noreturn, gnu::cold, gnu::noinline]] inline void staging_failed(cudaError_t rc, const void* buffer,
                                                                  const char* copy) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, buffer) == cudaSuccess && a.type != cudaMemoryTypeDevice &&
      a.type != cudaMemoryTypeManaged) {
    (void)cudaGetLastError();
    throw error(
        "staged communicator: a buffer in host memory where GPU memory was expected (it moves device "
        "buffers; host values go through its host communicator, any_communicator::host_communicator())");
  }
  (void)cudaGetLastError();
  cuda::fail(rc, copy);
}

/// A growable block of pinned (page-locked) host memory, so that device copies run at
/// full speed and asynchronously.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  pinned_buffer(pinned_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~pinned_buffer() { reset(); }

  /// At least `bytes` bytes (contents not kept when it grows).
  void* get(std::size_t bytes) {
    if (bytes > n_) {
      reset();
      TESSERA_CUDA_CHECK(cudaMallocHost(&p_, bytes));
      n_ = bytes;
    }
    return p_;
  }

 private:
  void reset() noexcept {
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
    n_ = 0;
  }
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Pinned host blocks reused across the non-blocking calls of one staged communicator
/// (cudaMallocHost is slow: a block is allocated once and handed from request to
/// request). A block comes back with an event recorded after the last copy that reads
/// it on tessera's stream; it is handed out again only once that event has completed.
/// Shared (std::shared_ptr) by the communicator and its requests, so a request may
/// outlive a moved-from communicator.
class pinned_pool : public std::enable_shared_from_this<pinned_pool> {
 public:
  struct block {
    void* p = nullptr;
    std::size_t n = 0;
    cudaEvent_t done = nullptr;  ///< recorded after the last copy that used the block
  };

  /// A block of pinned memory lent by the pool: returned to it when destroyed.
  class lease {
   public:
    lease() = default;
    lease(std::shared_ptr<pinned_pool> pool, block b) : pool_(std::move(pool)), b_(b) {}
    lease(lease&& o) noexcept : pool_(std::move(o.pool_)), b_(std::exchange(o.b_, block{})) {}
    lease& operator=(lease&& o) noexcept {
      if (this != &o) {
        reset();
        pool_ = std::move(o.pool_);
        b_ = std::exchange(o.b_, block{});
      }
      return *this;
    }
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() { reset(); }

    void* data() const noexcept { return b_.p; }
    /// Gives the block back after the copies queued so far on tessera's stream (an
    /// event recorded there); the next user waits for that event.
    void release_after_stream() noexcept {
      if (b_.p && b_.done && cudaEventRecord(b_.done, cuda::stream()) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaStreamSynchronize(cuda::stream());  // the event could not be recorded: wait instead
      }
      reset();
    }
    /// Drops the block without giving it back (after a failure that may leave a
    /// transfer into it running): it is never freed nor reused.
    void abandon() noexcept {
      b_ = block{};
      pool_.reset();
    }

   private:
    void reset() noexcept {
      if (pool_ && b_.p) pool_->give_back(b_);
      pool_.reset();
      b_ = block{};
    }
    std::shared_ptr<pinned_pool> pool_;
    block b_;
  };

  pinned_pool() = default;
  pinned_pool(const pinned_pool&) = delete;
  pinned_pool& operator=(const pinned_pool&) = delete;
  ~pinned_pool() {
    for (block& b : free_) destroy(b);
  }

  /// A block of at least `bytes` bytes (at least 1): the smallest free one that fits,
  /// once its last copy has completed, or a new one.
  lease take(std::size_t bytes) {
    bytes = std::max<std::size_t>(bytes, 1);
    block b;
    {
      std::lock_guard lock(mutex_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->n >= bytes && (best == free_.end() || it->n < best->n)) best = it;
      if (best != free_.end()) {
        b = *best;
        free_.erase(best);
      }
    }
    if (b.p) {
      if (const cudaError_t rc = cudaEventSynchronize(b.done); rc != cudaSuccess) {
        destroy(b);
        cuda::fail(rc, "cudaEventSynchronize(pinned block)");
      }
      return lease(shared_from_this(), b);
    }
    // New blocks are rounded up to a power of two (at least 4 KiB) so that they fit
    // the next calls of similar sizes.
    std::size_t n = 4096;
    while (n < bytes) n *= 2;
    TESSERA_CUDA_CHECK(cudaMallocHost(&b.p, n));
    b.n = n;
    if (const cudaError_t rc = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming); rc != cudaSuccess) {
      cudaFreeHost(b.p);
      cuda::fail(rc, "cudaEventCreateWithFlags");
    }
    return lease(shared_from_this(), b);
  }

  /// Free blocks kept; beyond that the smallest is freed.
  static constexpr std::size_t max_free = 8;

 private:
  void give_back(block b) noexcept {
    {
      std::lock_guard lock(mutex_);
      if (free_.size() >= max_free) {  // keep the larger blocks: they fit more calls
        auto smallest = std::min_element(free_.begin(), free_.end(),
                                         [](const block& x, const block& y) { return x.n < y.n; });
        if (smallest->n < b.n) std::swap(*smallest, b);
      } else {
        try {
          free_.push_back(b);
          return;
        } catch (...) {
        }
      }
    }
    destroy(b);
  }
  static void destroy(block& b) noexcept {
    if (b.done) {
      cudaEventSynchronize(b.done);
      cudaEventDestroy(b.done);
    }
    if (b.p) cudaFreeHost(b.p);
    b = block{};
  }

  mutable std::mutex mutex_;
  std::vector<block> free_;
};

}  // namespace detail

/// The communicator concept over device buffers, delegating to the host communicator
/// C (an mpi_communicator, or local_communicator). Every blocking call waits for
/// tessera's stream before reading device memory and returns once the result is back
/// on the device. Move-only when C is.
///
/// When C is a nonblocking_communicator, so is this: iall_reduce, ireduce_scatter and
/// ibroadcast copy their device input into a pinned host block of their own (from a
/// pool reused across calls; D2H on tessera's stream, which is synchronised, so every
/// kernel that wrote the input has finished), start C's non-blocking call on it and
/// return. The request's test() polls C's request; once C's operation is complete
/// (test() true, or wait()) the result is copied back to the device buffer on
/// tessera's stream, so every kernel queued afterwards sees it. Several may be in
/// flight, completed in any order; a request destroyed unfinished is waited for (and
/// its result copied back) without throwing. ibroadcast copies the root's buffer only
/// (the others' contents are replaced), and copies back on the others only. Otherwise
/// iall_reduce is the blocking all_reduce, returning a completed request.
///
///     staged_communicator<mpi_communicator> comm(mpi_communicator::world());
///     auto r1 = comm.iall_reduce(std::span<float>(grad1.data(), n1), reduce_op::sum);
///     auto r2 = comm.iall_reduce(std::span<float>(grad2.data(), n2), reduce_op::sum);
///     ... kernels that touch neither buffer ...
///     r2.wait();  // grad2 reduced, on the device, for the kernels queued from here on
///     r1.wait();
template <communicator C>
class staged_communicator {
 public:
  /// Spans passed to the collectives point into device memory.
  static constexpr bool device_buffers = true;

  /// The element types C moves.
  template <class T>
  static constexpr bool supports_element = comm_supports<C, T>;

  /// The name of the backend, "staged"; any_communicator reports "staged(<C's name>)",
  /// e.g. "staged(mpi)".
  static constexpr std::string_view backend() noexcept { return "staged"; }

  /// The request of iall_reduce when C has no non-blocking calls: completed at once
  /// (the staged collective is synchronous).
  class request {
   public:
    request() = default;
    request(request&&) noexcept = default;
    request& operator=(request&&) noexcept = default;
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    void wait() {}
    bool test() { return true; }
  };

  /// A pending non-blocking call staged through pinned memory: C's request R on a
  /// pinned block, and where its result goes on the device. Move-only; wait() and a
  /// true test() copy the result back (queued on tessera's stream); the destructor
  /// waits if still pending, never throwing.
  template <class R>
  class staged_request {
   public:
    staged_request() = default;
    staged_request(staged_request&& o) noexcept
        : inner_(std::move(o.inner_)),
          block_(std::move(o.block_)),
          host_(o.host_),
          dev_(o.dev_),
          bytes_(o.bytes_) {
      o.inner_.reset();
    }
    staged_request& operator=(staged_request&& o) noexcept {
      if (this != &o) {
        complete_quietly();
        inner_ = std::move(o.inner_);
        o.inner_.reset();
        block_ = std::move(o.block_);
        host_ = o.host_;
        dev_ = o.dev_;
        bytes_ = o.bytes_;
      }
      return *this;
    }
    staged_request(const staged_request&) = delete;
    staged_request& operator=(const staged_request&) = delete;
    ~staged_request() { complete_quietly(); }

    /// Blocks until C's operation is complete, then queues the copy of the result to the
    /// device on tessera's stream (kernels queued after wait() see it).
    void wait() {
      if (!inner_) return;
      inner_->wait();
      finish();
    }

    /// Polls C's operation; once it is complete, queues the copy back (as wait()) and
    /// returns true.
    bool test() {
      if (!inner_) return true;
      if (!inner_->test()) return false;
      finish();
      return true;
    }

    /// True until wait() or a successful test().
    bool pending() const noexcept { return inner_.has_value(); }

   private:
    friend class staged_communicator;
    staged_request(R inner, detail::pinned_pool::lease block, const void* host, void* dev, std::size_t bytes)
        : inner_(std::move(inner)), block_(std::move(block)), host_(host), dev_(dev), bytes_(bytes) {}

    void finish() {
      inner_.reset();
      if (bytes_ > 0) {
        const cudaError_t rc = cudaMemcpyAsync(dev_, host_, bytes_, cudaMemcpyHostToDevice, cuda::stream());
        if (rc != cudaSuccess) {
          block_.release_after_stream();
          cuda::fail(rc, "cudaMemcpyAsync(device, pinned, bytes, cudaMemcpyHostToDevice, stream)");
        }
      }
      block_.release_after_stream();  // reused once the copy has read it
    }

    void complete_quietly() noexcept {
      if (!inner_) return;
      try {
        inner_->wait();
        finish();
      } catch (...) {
        inner_.reset();
        block_.abandon();  // C's transfer may still write into it
      }
    }

    std::optional<R> inner_;
    detail::pinned_pool::lease block_;
    const void* host_ = nullptr;  // the result in the pinned block
    void* dev_ = nullptr;         // where it goes
    std::size_t bytes_ = 0;       // 0: nothing to copy back
  };

  /// Takes over `host` (moved in). A template taking a C only, so that moving a staged
  /// communicator never tries to convert it to C (a C that converts from every
  /// communicator, any_communicator, would make that question depend on itself).
  template <class H>
    requires std::same_as<std::remove_cvref_t<H>, C>
  explicit staged_communicator(H&& host) : host_(std::forward<H>(host)) {}

  int rank() const { return host_.rank(); }
  int size() const { return host_.size(); }
  C& host() { return host_; }

  template <comm_element T>
  void all_reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    detail::check_all_reduce<T>(in, out);
    T* h = stage_in(in, a_);
    host_.all_reduce(std::span<T>(h, in.size()), op);
    stage_out(h, out);
  }
  template <comm_element T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    all_reduce<T>(std::span<const T>(inout), inout, op);
  }
  template <comm_element T>
  void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    detail::check_all_gather<T>(in, out, size());
    T* hi = stage_in(in, a_);
    T* ho = host_buffer<T>(out.size(), b_);
    host_.all_gather(std::span<const T>(hi, in.size()), std::span<T>(ho, out.size()));
    stage_out(ho, out);
  }
  template <comm_element T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    detail::check_reduce_scatter<T>(in, out, size());
    T* hi = stage_in(in, a_);
    T* ho = host_buffer<T>(out.size(), b_);
    host_.reduce_scatter(std::span<const T>(hi, in.size()), std::span<T>(ho, out.size()), op);
    stage_out(ho, out);
  }
  template <comm_element T>
  void all_to_all(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    detail::check_all_to_all<T>(in, out, size());
    T* hi = stage_in(in, a_);
    T* ho = host_buffer<T>(out.size(), b_);
    host_.all_to_all(std::span<const T>(hi, in.size()), std::span<T>(ho, out.size()));
    stage_out(ho, out);
  }
  template <comm_element T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> in, std::span<const int> send_counts,
                    std::span<const int> send_displs, std::span<T> out, std::span<const int> recv_counts,
                    std::span<const int> recv_displs) {
    T* hi = stage_in(in, a_);
    T* ho = host_buffer<T>(out.size(), b_);
    // Blocks not received keep their device contents: start from them.
    copy_to_host(ho, out.data(), out.size());
    host_.all_to_all_v(std::span<const T>(hi, in.size()), send_counts, send_displs, std::span<T>(ho, out.size()),
                       recv_counts, recv_displs);
    stage_out(ho, out);
  }
  template <comm_element T>
  void broadcast(std::span<T> buf, int root) {
    T* h = stage_in(std::span<const T>(buf), a_);
    host_.broadcast(std::span<T>(h, buf.size()), root);
    stage_out(h, buf);
  }
  template <class T>
    requires comm_element<std::remove_const_t<T>>
  void send(std::span<T> buf, int dest, int tag = 0) {
    using U = std::remove_const_t<T>;
    U* h = stage_in(std::span<const U>(buf.data(), buf.size()), a_);
    host_.send(std::span<const U>(h, buf.size()), dest, tag);
  }
  template <comm_element T>
  void recv(std::span<T> buf, int source, int tag = 0) {
    T* h = host_buffer<T>(buf.size(), a_);
    host_.recv(std::span<T>(h, buf.size()), source, tag);
    stage_out(h, buf);
  }
  void barrier() {
    cuda::synchronize();
    host_.barrier();
  }
  /// The blocking all_reduce, returning a completed request (C has no non-blocking
  /// calls).
  template <comm_element T>
    requires(!nonblocking_communicator<C>)
  [[nodiscard]] request iall_reduce(std::span<T> inout, reduce_op op) {
    all_reduce(inout, op);
    return request{};
  }

  /// Stages `inout` to a pinned block (waiting for tessera's stream), starts C's
  /// iall_reduce there and returns; the reduced values are copied back to `inout` when
  /// the request completes. `inout` must stay alive, and untouched, until then.
  template <comm_element T>
    requires nonblocking_communicator<C>
  [[nodiscard]] auto iall_reduce(std::span<T> inout, reduce_op op) {
    detail::pinned_pool::lease blk = pool_->take(inout.size() * sizeof(T));
    T* h = static_cast<T*>(blk.data());
    copy_to_host(h, inout.data(), inout.size());
    auto inner = host_.iall_reduce(std::span<T>(h, inout.size()), op);
    return staged_request<decltype(inner)>(std::move(inner), std::move(blk), h, inout.data(),
                                           inout.size() * sizeof(T));
  }

  /// Stages `in` to a pinned block (waiting for tessera's stream), starts C's
  /// ireduce_scatter into a second part of the block and returns; this rank's block of
  /// the result is copied to `out` when the request completes. Sizes are checked as
  /// reduce_scatter's ("ireduce_scatter: in has 10 elements, expected 4 ranks x 3 = 12").
  template <comm_element T>
    requires nonblocking_communicator<C>
  [[nodiscard]] auto ireduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    detail::check_reduce_scatter<T>(in, out, size(), "ireduce_scatter");
    // in, then out at the next multiple of 256 bytes.
    const std::size_t in_bytes = in.size() * sizeof(T), out_at = (in_bytes + 255) / 256 * 256;
    detail::pinned_pool::lease blk = pool_->take(out_at + out.size() * sizeof(T));
    T* hi = static_cast<T*>(blk.data());
    T* ho = reinterpret_cast<T*>(static_cast<char*>(blk.data()) + out_at);
    copy_to_host(hi, in.data(), in.size());
    auto inner = host_.ireduce_scatter(std::span<const T>(hi, in.size()), std::span<T>(ho, out.size()), op);
    return staged_request<decltype(inner)>(std::move(inner), std::move(blk), ho, out.data(),
                                           out.size() * sizeof(T));
  }

  /// Starts C's ibroadcast on a pinned block and returns. The root stages its buffer
  /// first (waiting for tessera's stream) and leaves it as it is; the other ranks start
  /// at once, and their buffer receives the root's values when the request completes.
  /// The root is checked as broadcast's ("ibroadcast: root 5 is out of range for 4 ranks").
  template <comm_element T>
    requires nonblocking_communicator<C>
  [[nodiscard]] auto ibroadcast(std::span<T> buf, int root) {
    detail::check_rank("ibroadcast", "root", root, size());
    const bool is_root = rank() == root;
    detail::pinned_pool::lease blk = pool_->take(buf.size() * sizeof(T));
    T* h = static_cast<T*>(blk.data());
    if (is_root) copy_to_host(h, buf.data(), buf.size());
    auto inner = host_.ibroadcast(std::span<T>(h, buf.size()), root);
    return staged_request<decltype(inner)>(std::move(inner), std::move(blk), h, buf.data(),
                                           is_root ? 0 : buf.size() * sizeof(T));
  }
  staged_communicator split(int color, int key) { return staged_communicator(host_.split(color, key)); }

  traffic& stats() { return host_.stats(); }
  const traffic& stats() const { return host_.stats(); }
  void reset_stats() { host_.reset_stats(); }

 private:
  template <class T>
  static T* host_buffer(std::size_t n, detail::pinned_buffer& b) {
    return static_cast<T*>(b.get(n * sizeof(T) + 1));
  }
  template <class T>
  static void copy_to_host(T* h, const T* d, std::size_t n) {
    if (n > 0) {
      if (const cudaError_t rc = cudaMemcpyAsync(h, d, n * sizeof(T), cudaMemcpyDeviceToHost, cuda::stream()))
        detail::staging_failed(rc, d, "cudaMemcpyAsync(host, device, ..., cudaMemcpyDeviceToHost)");
    }
    cuda::synchronize();  // also orders every earlier kernel that wrote d
  }
  template <class T>
  static T* stage_in(std::span<const T> d, detail::pinned_buffer& b) {
    T* h = host_buffer<T>(d.size(), b);
    copy_to_host(h, d.data(), d.size());
    return h;
  }
  template <class T>
  static void stage_out(const T* h, std::span<T> d) {
    if (!d.empty()) {
      if (const cudaError_t rc =
              cudaMemcpyAsync(d.data(), h, d.size() * sizeof(T), cudaMemcpyHostToDevice, cuda::stream()))
        detail::staging_failed(rc, d.data(), "cudaMemcpyAsync(device, host, ..., cudaMemcpyHostToDevice)");
    }
    cuda::synchronize();  // the pinned buffer is reused by the next call
  }

  C host_;
  detail::pinned_buffer a_, b_;
  std::shared_ptr<detail::pinned_pool> pool_ = std::make_shared<detail::pinned_pool>();
};

template <class C>
staged_communicator(C) -> staged_communicator<C>;

/// The communicator for GPU shards over the ranks of `host`: a staging communicator over
/// a duplicate of it (the host overload is in comm/mesh_comm.hpp).
inline any_communicator device_communicator(any_communicator& host, cuda_device) {
  return any_communicator(staged_communicator(host.split(0, host.rank())));
}

}  // namespace tessera
