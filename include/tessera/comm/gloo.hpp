// The Gloo communicator: tessera's communicator concept over Gloo's TCP transport (the
// collective library PyTorch uses on CPUs), for jobs started without MPI. Its processes
// meet through a rendezvous store (comm/store.hpp); comm/rendezvous.hpp makes the world
// from the environment. Needs Gloo (CMake: tessera::gloo, Debian libgloo-dev).
#pragma once

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/comm/communicator.hpp>
#include <tessera/comm/store.hpp>

namespace tessera {

namespace detail {

/// Gloo's view of a tessera store: the keys of one context, under its prefix.
class gloo_store final : public ::gloo::rendezvous::Store {
 public:
  gloo_store(store_client& store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::string_view(data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_.get(prefix_ + key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(prefixed(keys)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    store_.wait(prefixed(keys));
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  store_client& store_;
  std::string prefix_;
};

/// What every communicator of one job shares: the store, Gloo's TCP device (one
/// listening socket and event loop) and the timeout of each operation.
struct gloo_job {
  std::shared_ptr<store_client> store;
  std::shared_ptr<::gloo::transport::Device> device;
  std::chrono::milliseconds timeout;
};

/// A Gloo context of `size` ranks, connected through the store's keys under `prefix`.
inline std::shared_ptr<::gloo::Context> gloo_connect(const gloo_job& job, const std::string& prefix,
                                                                 int rank, int size) {
  auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(job.timeout);
  gloo_store store(*job.store, prefix + "/");
  std::shared_ptr<::gloo::transport::Device> device = job.device;
  try {
    ctx->connectFullMesh(store, device);
    // A rank's side of the mesh can be complete before its peers' are: a barrier makes
    // the connection collective, so that a context destroyed at once (a temporary)
    // never closes a pair a peer is still setting up.
    if (size > 1) {
      ::gloo::BarrierOptions o(ctx);
      ::gloo::barrier(o);
    }
  } catch (const tessera::error&) {
    throw;
  } catch (const std::exception& e) {
    throw comm_error("gloo: connecting rank " + std::to_string(rank) + " of " + std::to_string(size) + " (" +
                     prefix + "): " + e.what());
  }
  return ctx;
}

/// Runs one Gloo call; Gloo's exceptions (a peer gone, a timeout) become
/// tessera::comm_error naming the call.
template <class F>
void gloo_call(const char* fn, F&& f) {
  try {
    f();
  } catch (const tessera::error&) {
    throw;
  } catch (const std::exception& e) {
    throw comm_error(std::string("gloo ") + fn + ": " + e.what());
  }
}

/// Slot prefixes of the messages this wrapper sends itself (Gloo's own algorithms use
/// 0x01 .. 0x08).
inline constexpr std::uint8_t gloo_send_recv_prefix = 0x40;
inline constexpr std::uint8_t gloo_exchange_prefix = 0x41;

/// tessera's ring all-reduce and reduce-scatter over a Gloo context whose pairs are in
/// synchronous mode: the calling thread writes and reads the sockets itself, where Gloo's
/// asynchronous pairs hand every message through the device's event-loop thread (about
/// twice the time of a 2.7 MB all-reduce on two ranks, and more on oversubscribed cores),
/// and Gloo has no reduce-scatter of its own. A ring pass sends a chunk to the right and
/// reads the left's, in pieces of at most piece_bytes: each piece is written, then the
/// left's read, so a write never waits on a peer that is itself writing (every socket's
/// send buffer holds a piece: Gloo sizes it to the message, which Linux's default limit
/// doubled, 416 KiB, exceeds). Reduce-scatter: P - 1 steps, each rank's chunk summed on
/// its way round; all-reduce: that, then P - 1 steps passing the reduced chunks on.
/// One ring per thread: a pair in synchronous mode is read by whoever waits on it.
class gloo_ring {
 public:
  static constexpr std::size_t piece_bytes = std::size_t(192) << 10;

  explicit gloo_ring(std::shared_ptr<::gloo::Context> ctx) : ctx_(std::move(ctx)) {
    gloo_call("synchronous pairs", [&] {
      for (int i = 0; i < ctx_->size; ++i)
        if (i != ctx_->rank) ctx_->getPair(i)->setSync(true, false);
    });
  }

  /// data reduced over the ranks in place.
  template <class T>
  void all_reduce(T* data, std::size_t n, reduce_op op) {
    const int P = ctx_->size;
    if (n == 0 || P == 1) {
      if (op == reduce_op::mean) divide_by(std::span<T>(data, n), P);
      return;
    }
    const std::size_t bytes = n * sizeof(T);
    T* piece = scratch<T>();
    gloo_call("all_reduce", [&] {
      const int reduce = ctx_->nextSlot(), gather = ctx_->nextSlot();
      auto& right = ctx_->getPair((ctx_->rank + 1) % P);
      auto& left = ctx_->getPair((ctx_->rank + P - 1) % P);
      auto send = right->createSendBuffer(reduce, data, bytes);
      auto recv = left->createRecvBuffer(reduce, piece, piece_bytes);
      auto send_reduced = right->createSendBuffer(gather, data, bytes);
      auto recv_reduced = left->createRecvBuffer(gather, data, bytes);
      const auto lo = [&](int c) { return n * std::size_t(c) / std::size_t(P); };
      for (int s = 0; s < P - 1; ++s) {  // reduce-scatter: rank r ends with chunk r summed
        const int out = chunk(-s - 1), in = chunk(-s - 2);
        pass<T>(*send, lo(out), lo(out + 1) - lo(out), *recv, lo(in + 1) - lo(in), false,
                [&](std::size_t off, std::size_t k) { combine(data + lo(in) + off, data + lo(in) + off, piece, k, op); });
      }
      for (int s = 0; s < P - 1; ++s) {  // all-gather of the reduced chunks, into data
        const int out = chunk(-s), in = chunk(-s - 1);
        pass<T>(*send_reduced, lo(out), lo(out + 1) - lo(out), *recv_reduced, lo(in + 1) - lo(in), true,
                [](std::size_t, std::size_t) {});
      }
    });
    if (op == reduce_op::mean) divide_by(std::span<T>(data, n), P);
  }

  /// out (block elements) = block `rank` of in (block x size elements) reduced over
  /// the ranks.
  template <class T>
  void reduce_scatter(const T* in, T* out, std::size_t block, reduce_op op) {
    const int P = ctx_->size;
    if (P == 1 || block == 0) {
      std::copy_n(in, block, out);
      if (op == reduce_op::mean) divide_by(std::span<T>(out, block), P);
      return;
    }
    const std::size_t bytes = block * sizeof(T);
    if (acc_.size() < bytes) acc_.resize(bytes);
    T* acc = reinterpret_cast<T*>(acc_.data());
    T* piece = scratch<T>();
    gloo_call("reduce_scatter", [&] {
      const int slot = ctx_->nextSlot();
      auto& right = ctx_->getPair((ctx_->rank + 1) % P);
      auto& left = ctx_->getPair((ctx_->rank + P - 1) % P);
      auto send_in = right->createSendBuffer(slot, const_cast<T*>(in), bytes * std::size_t(P));
      auto send_acc = right->createSendBuffer(slot, acc, bytes);
      auto recv = left->createRecvBuffer(slot, piece, piece_bytes);
      // Step s sends the sum so far of block r - s - 1 (at s = 0 this rank's own) and adds
      // this rank's part of block r - s - 2 to the left's sum of it: block r at the end.
      for (int s = 0; s < P - 1; ++s) {
        const int next = chunk(-s - 2);
        const T* mine = in + std::size_t(next) * block;
        const auto add = [&](std::size_t off, std::size_t k) { combine(acc + off, mine + off, piece, k, op); };
        if (s == 0)
          pass<T>(*send_in, std::size_t(chunk(-1)) * block, block, *recv, block, false, add);
        else
          pass<T>(*send_acc, 0, block, *recv, block, false, add);
      }
    });
    std::copy_n(acc, block, out);
    if (op == reduce_op::mean) divide_by(std::span<T>(out, block), P);
  }

 private:
  int chunk(int shift) const { return ((ctx_->rank + shift) % ctx_->size + ctx_->size) % ctx_->size; }

  template <class T>
  T* scratch() {
    if (piece_.size() < piece_bytes) piece_.resize(piece_bytes);
    return reinterpret_cast<T*>(piece_.data());
  }

  /// One step of the ring: elements [first, first + count) of `send`'s memory go right,
  /// `recv_count` elements come from the left, piece by piece; `arrived(off, k)` is
  /// called on each piece received (elements off .. off + k of the left's chunk). With
  /// `in_place`, the left writes at the same element offsets (into `recv`'s memory,
  /// which is the whole buffer); else each piece lands at the start of `recv`'s.
  template <class T, class F>
  void pass(::gloo::transport::Buffer& send, std::size_t first, std::size_t count, ::gloo::transport::Buffer& recv,
            std::size_t recv_count, bool in_place, F&& arrived) {
    const std::size_t per = piece_bytes / sizeof(T);
    for (std::size_t off = 0; off < std::max(count, recv_count); off += per) {
      if (off < count) {
        const std::size_t k = std::min(per, count - off), at = (first + off) * sizeof(T);
        send.send(at, k * sizeof(T), in_place ? at : 0);
        send.waitSend();
      }
      if (off < recv_count) {
        recv.waitRecv();
        arrived(off, std::min(per, recv_count - off));
      }
    }
  }

  std::shared_ptr<::gloo::Context> ctx_;
  std::vector<std::byte> piece_;  // one piece from the left
  std::vector<std::byte> acc_;    // reduce_scatter's running sum
};

/// One thread that runs a communicator's non-blocking operations in the order they
/// were started, on a Gloo context of its own (so that they never share a slot with
/// the blocking calls made meanwhile), and a ring of its own for the reductions. Both
/// contexts are connected by the thread that makes the worker: the store's client is
/// not shared between threads.
class gloo_worker {
 public:
  gloo_worker(std::shared_ptr<::gloo::Context> ctx, std::shared_ptr<::gloo::Context> ring_ctx)
      : ctx_(std::move(ctx)), ring_(std::move(ring_ctx)), thread_([this] { loop(); }) {}
  gloo_worker(const gloo_worker&) = delete;
  gloo_worker& operator=(const gloo_worker&) = delete;
  ~gloo_worker() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  const std::shared_ptr<::gloo::Context>& context() const { return ctx_; }
  /// The worker thread's ring (its operations only).
  gloo_ring& ring() { return ring_; }

  std::future<void> post(std::function<void()> job) {
    std::packaged_task<void()> task(std::move(job));
    std::future<void> f = task.get_future();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return f;
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::shared_ptr<::gloo::Context> ctx_;
  gloo_ring ring_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

template <class T>
void gloo_broadcast(const std::shared_ptr<::gloo::Context>& ctx, T* data, std::size_t n, int root) {
  if (n == 0 || ctx->size == 1) return;
  ::gloo::BroadcastOptions o(ctx);
  o.setOutput(data, n);
  o.setRoot(root);
  gloo_call("broadcast", [&] { ::gloo::broadcast(o); });
}

}  // namespace detail

/// The communicator of a job whose processes meet through a rendezvous store and talk
/// over Gloo's TCP transport. Models nonblocking_communicator: the non-blocking calls
/// run in start order on a thread of the communicator's own (with a Gloo context of its
/// own, connected at the first such call, which every member makes). Traffic is counted
/// with the formulas of communicator.hpp, as every backend does.
///
/// Made by gloo_communicator::connect (one call per process, every rank of the job) or
/// by split(); comm/rendezvous.hpp makes the world of a process from its environment.
///
/// The reductions (all_reduce, reduce_scatter and their non-blocking forms) run
/// tessera's ring over contexts of their own whose pairs are synchronous (detail::
/// gloo_ring), one for the blocking calls and one for the worker thread, each connected
/// at its first call; the other collectives are Gloo's.
class gloo_communicator {
 public:
  /// A pending non-blocking operation. Move-only; wait() completes it and rethrows its
  /// error; the destructor waits if it is still pending.
  class request {
   public:
    request() = default;
    request(request&&) noexcept = default;
    request& operator=(request&& o) noexcept {
      if (this != &o) {
        complete_quietly();
        f_ = std::move(o.f_);
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { complete_quietly(); }

    void wait() {
      if (f_.valid()) f_.get();
    }
    bool test() {
      if (!f_.valid()) return true;
      if (f_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
      f_.get();
      return true;
    }
    bool pending() const noexcept { return f_.valid(); }

   private:
    friend class gloo_communicator;
    explicit request(std::future<void> f) : f_(std::move(f)) {}
    void complete_quietly() noexcept {
      if (!f_.valid()) return;
      try {
        f_.get();
      } catch (...) {  // an error nobody waited for: the job ends through the peers' errors
      }
    }
    std::future<void> f_;
  };

  /// Joins the job: rank `rank` of `size`, meeting the others through `store` under
  /// the key prefix `name`. Every rank calls it with the same size and name. Each
  /// operation fails after `timeout` without progress (a peer gone or hung).
  static gloo_communicator connect(std::shared_ptr<store_client> store, int rank, int size,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(300),
                                   std::string name = "world") {
    if (size < 1 || rank < 0 || rank >= size)
      throw error("gloo: rank " + std::to_string(rank) + " is out of range for " + std::to_string(size) + " ranks");
    // Gloo writes to its sockets with writev, which raises SIGPIPE once a peer is gone:
    // with SIGPIPE's default action the process would die silently instead of getting
    // the error (and reporting the failure). Ignored here unless the program handles it.
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
    ::gloo::transport::tcp::attr attr;
    attr.hostname = store->local_address();
    auto job = std::make_shared<detail::gloo_job>();
    job->store = std::move(store);
    job->timeout = timeout;
    detail::gloo_call("creating the TCP device", [&] { job->device = ::gloo::transport::tcp::CreateDevice(attr); });
    return gloo_communicator(job, name, detail::gloo_connect(*job, name, rank, size));
  }

  gloo_communicator(gloo_communicator&&) noexcept = default;
  gloo_communicator& operator=(gloo_communicator&&) noexcept = default;
  gloo_communicator(const gloo_communicator&) = delete;
  gloo_communicator& operator=(const gloo_communicator&) = delete;
  ~gloo_communicator() = default;

  /// The name of the backend, "gloo" (any_communicator::backend() reports it).
  static constexpr std::string_view backend() noexcept { return "gloo"; }

  int rank() const { return ctx_->rank; }
  int size() const { return ctx_->size; }

  /// The store the job met at (the rendezvous of split() and of the caller's own keys).
  store_client& store() const { return *job_->store; }

  /// The Gloo context of the blocking calls, for Gloo's own algorithms on the same
  /// connections (as mpi_communicator::native() gives the MPI_Comm).
  const std::shared_ptr<::gloo::Context>& native() const noexcept { return ctx_; }

  template <comm_element T>
  void all_reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    detail::check_all_reduce<T>(in, out);
    detail::count(stats_, cost::all_reduce(detail::byte_size(in), size()));
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
    reduce_in_place(out, op);
  }

  template <comm_element T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    detail::count(stats_, cost::all_reduce(detail::byte_size(inout), size()));
    reduce_in_place(inout, op);
  }

  template <comm_element T>
  void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    detail::check_all_gather<T>(in, out, size());
    detail::count(stats_, cost::all_gather(detail::byte_size(in), size()));
    if (in.empty()) return;
    if (size() == 1) {
      std::copy(in.begin(), in.end(), out.begin());
      return;
    }
    ::gloo::AllgatherOptions o(context());
    o.setInput(const_cast<T*>(in.data()), in.size());
    o.setOutput(out.data(), out.size());
    detail::gloo_call("all_gather", [&] { ::gloo::allgather(o); });
  }

  template <comm_element T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op) {
    detail::check_reduce_scatter<T>(in, out, size());
    detail::count(stats_, cost::reduce_scatter(detail::byte_size(in), size()));
    if (size() == 1) {
      std::copy(in.begin(), in.end(), out.begin());
      return;
    }
    ring().reduce_scatter(in.data(), out.data(), out.size(), op);
  }

  template <comm_element T>
  void all_to_all(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    detail::check_all_to_all<T>(in, out, size());
    detail::count(stats_, cost::all_to_all(detail::byte_size(in), size()));
    if (in.empty()) return;
    if (size() == 1) {
      std::copy(in.begin(), in.end(), out.begin());
      return;
    }
    ::gloo::AlltoallOptions o(context());
    o.setInput(const_cast<T*>(in.data()), in.size());
    o.setOutput(out.data(), out.size());
    detail::gloo_call("all_to_all", [&] { ::gloo::alltoall(o); });
  }

  /// Each block travels as one message (Gloo's alltoallv has no displacements).
  template <comm_element T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> in, std::span<const int> send_counts,
                    std::span<const int> send_displs, std::span<T> out, std::span<const int> recv_counts,
                    std::span<const int> recv_displs) {
    const int g = size(), r = rank();
    const std::int64_t received =
        detail::check_all_to_all_v<T>(in, send_counts, send_displs, out, recv_counts, recv_displs, r, g);
    if (send_counts[std::size_t(r)] != recv_counts[std::size_t(r)]) [[unlikely]]
      detail::comm_fail("all_to_all_v: rank " + std::to_string(r) + " sends " +
                        std::to_string(send_counts[std::size_t(r)]) + " elements to itself and expects to receive " +
                        std::to_string(recv_counts[std::size_t(r)]));
    detail::count(stats_, received * std::int64_t(sizeof(T)));
    std::copy_n(in.data() + send_displs[std::size_t(r)], send_counts[std::size_t(r)],
                out.data() + recv_displs[std::size_t(r)]);
    if (g == 1) return;
    const std::uint64_t slot = ::gloo::Slot::build(detail::gloo_exchange_prefix, exchange_seq_++);
    const auto& ctx = context();
    std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> recvs, sends;
    detail::gloo_call("all_to_all_v", [&] {
      for (int p = 0; p < g; ++p) {
        if (p == r || recv_counts[std::size_t(p)] == 0) continue;
        recvs.push_back(ctx->createUnboundBuffer(out.data() + recv_displs[std::size_t(p)],
                                                 std::size_t(recv_counts[std::size_t(p)]) * sizeof(T)));
        recvs.back()->recv(p, slot);
      }
      for (int k = 1; k < g; ++k) {  // to r+1 first, so that no rank is everyone's first peer
        const int p = (r + k) % g;
        if (send_counts[std::size_t(p)] == 0) continue;
        sends.push_back(ctx->createUnboundBuffer(const_cast<T*>(in.data()) + send_displs[std::size_t(p)],
                                                 std::size_t(send_counts[std::size_t(p)]) * sizeof(T)));
        sends.back()->send(p, slot);
      }
      for (auto& b : recvs) b->waitRecv(ctx->getTimeout());
      for (auto& b : sends) b->waitSend(ctx->getTimeout());
    });
  }

  template <comm_element T>
  void broadcast(std::span<T> buf, int root) {
    detail::check_rank("broadcast", "root", root, size());
    detail::count(stats_, rank() == root ? 0 : cost::broadcast(detail::byte_size(buf), size()));
    detail::gloo_broadcast(context(), buf.data(), buf.size(), root);
  }

  template <class T>
    requires comm_element<std::remove_const_t<T>>
  void send(std::span<T> buf, int dest, int tag = 0) {
    detail::check_rank("send", "dest", dest, size());
    detail::check_tag("send", tag);
    detail::count(stats_, 0);
    using U = std::remove_const_t<T>;
    const auto& ctx = context();
    detail::gloo_call("send", [&] {
      auto b = ctx->createUnboundBuffer(const_cast<U*>(buf.data()), buf.size() * sizeof(U));
      b->send(dest, ::gloo::Slot::build(detail::gloo_send_recv_prefix, std::uint32_t(tag)));
      b->waitSend(ctx->getTimeout());
    });
  }

  /// A non-blocking send: the buffer is handed to Gloo's transport at once (matched by
  /// the peer's recv of the same tag, as send's); the request completes once it is
  /// sent. `buf` must stay unchanged until then. The pipeline stages' activations and
  /// gradients cross so, while each stage waits for its own inputs.
  template <class T>
    requires comm_element<std::remove_const_t<T>>
  [[nodiscard]] request isend(std::span<T> buf, int dest, int tag = 0) {
    detail::check_rank("isend", "dest", dest, size());
    detail::check_tag("isend", tag);
    detail::count(stats_, 0);
    using U = std::remove_const_t<T>;
    const auto& ctx = context();
    std::shared_ptr<::gloo::transport::UnboundBuffer> b;
    detail::gloo_call("isend", [&] {
      b = ctx->createUnboundBuffer(const_cast<U*>(buf.data()), buf.size() * sizeof(U));
      b->send(dest, ::gloo::Slot::build(detail::gloo_send_recv_prefix, std::uint32_t(tag)));
    });
    return request(std::async(std::launch::async, [b, timeout = ctx->getTimeout()] {
      detail::gloo_call("isend", [&] { b->waitSend(timeout); });
    }));
  }

  template <comm_element T>
  void recv(std::span<T> buf, int source, int tag = 0) {
    detail::check_rank("recv", "source", source, size());
    detail::check_tag("recv", tag);
    detail::count(stats_, detail::byte_size(buf));
    const auto& ctx = context();
    detail::gloo_call("recv", [&] {
      auto b = ctx->createUnboundBuffer(buf.data(), buf.size() * sizeof(T));
      b->recv(source, ::gloo::Slot::build(detail::gloo_send_recv_prefix, std::uint32_t(tag)));
      b->waitRecv(ctx->getTimeout());
    });
  }

  void barrier() {
    detail::count(stats_, 0);
    if (size() == 1) return;
    ::gloo::BarrierOptions o(context());
    detail::gloo_call("barrier", [&] { ::gloo::barrier(o); });
  }

  template <comm_element T>
  [[nodiscard]] request iall_reduce(std::span<T> inout, reduce_op op) {
    detail::count(stats_, cost::all_reduce(detail::byte_size(inout), size()));
    auto& w = worker();
    return request(w.post([&w, p = inout.data(), n = inout.size(), op] { w.ring().all_reduce<T>(p, n, op); }));
  }

  template <comm_element T>
  [[nodiscard]] request ireduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out,
                                        reduce_op op) {
    detail::check_reduce_scatter<T>(in, out, size(), "ireduce_scatter");
    detail::count(stats_, cost::reduce_scatter(detail::byte_size(in), size()));
    auto& w = worker();
    return request(
        w.post([&w, i = in.data(), o = out.data(), n = out.size(), op] { w.ring().reduce_scatter<T>(i, o, n, op); }));
  }

  template <comm_element T>
  [[nodiscard]] request ibroadcast(std::span<T> buf, int root) {
    detail::check_rank("ibroadcast", "root", root, size());
    detail::count(stats_, rank() == root ? 0 : cost::broadcast(detail::byte_size(buf), size()));
    auto& w = worker();
    return request(
        w.post([ctx = w.context(), p = buf.data(), n = buf.size(), root] { detail::gloo_broadcast<T>(ctx, p, n, root); }));
  }

  /// The ranks with equal `color` form a new communicator, ordered by (key, rank).
  /// Collective over this communicator; color must not be negative.
  gloo_communicator split(int color, int key) {
    detail::check_color(color);
    const int g = size();
    std::vector<std::int64_t> mine{color, key}, all(2 * std::size_t(g));
    if (g == 1) {
      all = mine;
    } else {
      ::gloo::AllgatherOptions o(context());
      o.setInput(mine.data(), mine.size());
      o.setOutput(all.data(), all.size());
      detail::gloo_call("split", [&] { ::gloo::allgather(o); });
    }
    std::vector<std::tuple<std::int64_t, int>> members;  // (key, rank) of my color
    for (int p = 0; p < g; ++p)
      if (all[2 * std::size_t(p)] == color) members.emplace_back(all[2 * std::size_t(p) + 1], p);
    std::sort(members.begin(), members.end());
    const int new_rank = int(std::find(members.begin(), members.end(), std::tuple<std::int64_t, int>(key, rank())) -
                             members.begin());
    const std::string name = name_ + "/split" + std::to_string(split_seq_++) + "." + std::to_string(color);
    return gloo_communicator(job_, name, detail::gloo_connect(*job_, name, new_rank, int(members.size())));
  }

  /// The ranks of this communicator on this rank's host (equal host names), in rank
  /// order. Collective.
  gloo_communicator node_local() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::uint64_t mine = std::hash<std::string_view>{}(host);
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size()));
    all_gather(std::span<const std::uint64_t>(&mine, 1), std::span<std::uint64_t>(all));
    stats_.calls -= 1;  // the gather is part of split, which does not count
    const int first = int(std::find(all.begin(), all.end(), mine) - all.begin());
    return split(first, rank());
  }

  traffic& stats() noexcept { return stats_; }
  const traffic& stats() const noexcept { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  gloo_communicator(std::shared_ptr<detail::gloo_job> job, std::string name, std::shared_ptr<::gloo::Context> ctx)
      : job_(std::move(job)), name_(std::move(name)), ctx_(std::move(ctx)) {}

  const std::shared_ptr<::gloo::Context>& context() const { return ctx_; }

  detail::gloo_worker& worker() {
    if (!worker_)
      worker_ = std::make_unique<detail::gloo_worker>(detail::gloo_connect(*job_, name_ + "/async", rank(), size()),
                                                      detail::gloo_connect(*job_, name_ + "/async/ring", rank(), size()));
    return *worker_;
  }

  template <comm_element T>
  void reduce_in_place(std::span<T> data, reduce_op op) {
    if (size() == 1) return;  // mean over one rank is the value
    ring().all_reduce(data.data(), data.size(), op);
  }

  /// The ring of the blocking reductions, connected at the first (a collective call).
  detail::gloo_ring& ring() {
    if (!ring_) ring_ = std::make_unique<detail::gloo_ring>(detail::gloo_connect(*job_, name_ + "/ring", rank(), size()));
    return *ring_;
  }

  std::shared_ptr<detail::gloo_job> job_;
  std::string name_;
  std::shared_ptr<::gloo::Context> ctx_;
  std::unique_ptr<detail::gloo_ring> ring_;
  std::unique_ptr<detail::gloo_worker> worker_;
  std::uint32_t exchange_seq_ = 0;
  int split_seq_ = 0;
  traffic stats_;
};

}  // namespace tessera
