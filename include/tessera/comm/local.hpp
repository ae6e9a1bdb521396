// A one-rank communicator: every collective is a local copy, so a tessera program
// runs with no launcher and no MPI.
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <tessera/comm/communicator.hpp>

namespace tessera {

/// The communicator of a single rank (rank 0, size 1). Collectives copy their input
/// to their output (mean divides by 1); they check their arguments and count their
/// traffic exactly as the other backends do (every formula gives 0 bytes for one
/// rank). send and recv throw: a single rank has no peer.
///
///     tessera::local_communicator c;
///     std::vector<float> g = grads();
///     c.all_reduce(std::span<float>(g), tessera::reduce_op::mean);  // g unchanged
class local_communicator {
 public:
  /// A completed operation (local collectives finish at once).
  class request {
   public:
    request() = default;
    request(request&&) noexcept = default;
    request& operator=(request&&) noexcept = default;
    request(const request&) = delete;
    request& operator=(const request&) = delete;

    void wait() {}
    bool test() { return true; }
    bool pending() const { return false; }
  };

  local_communicator() = default;

  /// The name of the backend, "local" (any_communicator::backend() reports it).
  static constexpr std::string_view backend() noexcept { return "local"; }

  int rank() const { return 0; }
  int size() const { return 1; }

  template <comm_element T>
  void all_reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op) {
    detail::check_all_reduce<T>(in, out);
    detail::count(stats_, cost::all_reduce(detail::byte_size(in), 1));
    copy(in, out);
  }

  template <comm_element T>
  void all_reduce(std::span<T> inout, reduce_op) {
    detail::count(stats_, cost::all_reduce(detail::byte_size(inout), 1));
  }

  template <comm_element T>
  void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    detail::check_all_gather<T>(in, out, 1);
    detail::count(stats_, cost::all_gather(detail::byte_size(in), 1));
    copy(in, out);
  }

  template <comm_element T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op) {
    detail::check_reduce_scatter<T>(in, out, 1);
    detail::count(stats_, cost::reduce_scatter(detail::byte_size(in), 1));
    copy(in, out);
  }

  template <comm_element T>
  void all_to_all(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    detail::check_all_to_all<T>(in, out, 1);
    detail::count(stats_, cost::all_to_all(detail::byte_size(in), 1));
    copy(in, out);
  }

  template <comm_element T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> in, std::span<const int> send_counts,
                    std::span<const int> send_displs, std::span<T> out,
                    std::span<const int> recv_counts, std::span<const int> recv_displs) {
    detail::check_all_to_all_v<T>(in, send_counts, send_displs, out, recv_counts, recv_displs, 0,
                                  1);
    if (send_counts[0] != recv_counts[0]) [[unlikely]]
      detail::comm_fail("all_to_all_v: rank 0 sends " + std::to_string(send_counts[0]) +
                        " elements to itself and expects to receive " +
                        std::to_string(recv_counts[0]));
    detail::count(stats_, 0);
    std::copy_n(in.data() + send_displs[0], send_counts[0], out.data() + recv_displs[0]);
  }

  template <comm_element T>
  void broadcast(std::span<T> buf, int root) {
    detail::check_rank("broadcast", "root", root, 1);
    detail::count(stats_, cost::broadcast(detail::byte_size(buf), 1));
  }

  /// Always throws: there is no other rank (dest 0 is this rank itself).
  template <class T>
    requires comm_element<std::remove_const_t<T>>
  void send(std::span<T>, int dest, int tag = 0) {
    no_peer("send", "dest", dest, tag);
  }

  /// Always throws: there is no other rank (source 0 is this rank itself).
  template <comm_element T>
  void recv(std::span<T>, int source, int tag = 0) {
    no_peer("recv", "source", source, tag);
  }

  void barrier() { detail::count(stats_, 0); }

  /// Completes at once; wait() is a no-op.
  template <comm_element T>
  [[nodiscard]] request iall_reduce(std::span<T> inout, reduce_op) {
    detail::count(stats_, cost::all_reduce(detail::byte_size(inout), 1));
    return request{};
  }

  /// Copies in to out at once (as reduce_scatter); the request is complete.
  template <comm_element T>
  [[nodiscard]] request ireduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out,
                                        reduce_op) {
    detail::check_reduce_scatter<T>(in, out, 1, "ireduce_scatter");
    detail::count(stats_, cost::reduce_scatter(detail::byte_size(in), 1));
    copy(in, out);
    return request{};
  }

  /// Checks the root; the request is complete (one rank holds the data already).
  template <comm_element T>
  [[nodiscard]] request ibroadcast(std::span<T> buf, int root) {
    detail::check_rank("ibroadcast", "root", root, 1);
    detail::count(stats_, cost::broadcast(detail::byte_size(buf), 1));
    return request{};
  }

  /// Another one-rank communicator with its own counters.
  local_communicator split(int color, int /*key*/) const {
    detail::check_color(color);
    return local_communicator{};
  }

  traffic& stats() { return stats_; }
  const traffic& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  template <class T>
  static void copy(std::span<const T> in, std::span<T> out) {
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
  }

  static void no_peer(const char* fn, const char* name, int peer, int tag) {
    detail::check_tag(fn, tag);
    detail::check_rank(fn, name, peer, 1);
    detail::comm_fail(std::string(fn) + ": " + name + " 0 is this rank; a one-rank communicator " +
                      "has no peer to " + (fn[0] == 's' ? "send to" : "receive from"));
  }

  traffic stats_{};
};

static_assert(communicator<local_communicator>);
static_assert(nonblocking_communicator<local_communicator>);

}  // namespace tessera
