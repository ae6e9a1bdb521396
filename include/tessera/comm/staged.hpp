// staged_communicator<C>: device (GPU) buffers through a communicator of host memory.
// Each call copies its device input to pinned host memory, runs C's collective there,
// and copies the result back: how tensors on a GPU redistribute over an MPI that is not
// CUDA-aware, and how several ranks sharing one GPU communicate (NCCL refuses that).
// The traffic counted is C's, so plans' byte counts hold unchanged.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <tessera/comm/communicator.hpp>
#include <tessera/cuda/runtime.hpp>

namespace tessera {

namespace detail {

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

}  // namespace detail

/// The communicator concept over device buffers, delegating to the host communicator
/// C (an mpi_communicator, or local_communicator). Every call waits for tessera's
/// stream before reading device memory and returns once the result is back on the
/// device. Move-only when C is.
template <communicator C>
class staged_communicator {
 public:
  /// Spans passed to the collectives point into device memory.
  static constexpr bool device_buffers = true;

  /// Completed at once (the staged collective is synchronous).
  class request {
   public:
    request() = default;
    request(request&&) noexcept = default;
    request& operator=(request&&) noexcept = default;
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    void wait() {}
  };

  explicit staged_communicator(C host) : host_(std::move(host)) {}

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
  template <comm_element T>
  [[nodiscard]] request iall_reduce(std::span<T> inout, reduce_op op) {
    all_reduce(inout, op);
    return request{};
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
    if (n > 0)
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(h, d, n * sizeof(T), cudaMemcpyDeviceToHost, cuda::stream()));
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
    if (!d.empty())
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(d.data(), h, d.size() * sizeof(T), cudaMemcpyHostToDevice, cuda::stream()));
    cuda::synchronize();  // the pinned buffer is reused by the next call
  }

  C host_;
  detail::pinned_buffer a_, b_;
};

}  // namespace tessera
