// A worker of a job started without MPI: it meets the others at the rendezvous store
// (comm/rendezvous.hpp), forms the Gloo world with them (comm/gloo.hpp), and keeps a
// monitor that ends this process at once, with the reason, when another worker fails or
// dies. Needs Gloo (CMake: tessera::gloo). Every connection to the rendezvous (the
// worker's own, its monitor's, a probe's) runs under TLS when the environment enables
// it (rendezvous_environment::tls); Gloo's own connections, which carry the
// collectives, are plain TCP: Gloo as Debian packages it has no TLS.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <tessera/comm/communicator.hpp>
#include <tessera/comm/gloo.hpp>
#include <tessera/comm/rendezvous.hpp>
#include <tessera/comm/store.hpp>
#include <tessera/core/error.hpp>

namespace tessera {

/// A worker's membership of a store-networked job: its world communicator, and a
/// monitor that ends this process when another worker fails. finish() says goodbye
/// (the job ends normally for this rank); fail() tells the others why this rank ends.
class rendezvous_member {
 public:
  explicit rendezvous_member(const rendezvous_environment& e)
      : keys_(detail::keys_of(e.attempt)), timeout_(rendezvous_timeout()) {
    // The scheduler gives its verdict on missing workers after timeout_; this
    // process's own wait lasts a little longer.
    store_ = std::make_shared<store_client>(e.host, e.port, timeout_ + std::chrono::seconds(5), e.tls);
    int rank = e.rank;
    if (rank < 0) {
      rank = int(store_->add(keys_.next_rank(), 1) - 1);
      if (rank >= e.world_size)
        throw error("rendezvous at " + store_->where() + ": more workers arrived than the " +
                    std::to_string(e.world_size) + " of " + e.source + "'s worker number");
    }
    rank_ = rank;
    store_->hello(keys_.prefix + "rank " + std::to_string(rank));
    // The monitor first: the scheduler's verdict on workers that never arrive reaches
    // this process through it.
    start_monitor(e);
    store_->set(keys_.arrived(rank), "1");
    std::vector<std::string> all;
    for (int r = 0; r < e.world_size; ++r) all.push_back(keys_.arrived(r));
    try {
      store_->wait(all);
    } catch (const error&) {  // no verdict came (a store kept by no scheduler): name the missing
      store_client probe(e.host, e.port, std::chrono::seconds(5), e.tls);
      std::string missing;
      for (int r = 0; r < e.world_size; ++r)
        if (!probe.check({keys_.arrived(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      throw error("rendezvous at " + store_->where() + ": ranks " + missing + " of " + std::to_string(e.world_size) +
                  " did not arrive within " + std::to_string(timeout_.count()) + " s");
    }
    try {
      world_.emplace(gloo_communicator::connect(store_, rank, e.world_size, collective_timeout(), keys_.world()));
    } catch (const std::exception& x) {
      fail(x.what());
      throw;
    }
  }

  rendezvous_member(const rendezvous_member&) = delete;
  rendezvous_member& operator=(const rendezvous_member&) = delete;

  ~rendezvous_member() = default;

  int rank() const noexcept { return rank_; }
  gloo_communicator& world() { return *world_; }

  /// This rank has finished normally. (Its monitor is quiet from here on: once every
  /// rank has finished, the scheduler may close the store.)
  void finish() {
    world_.reset();
    monitor_.quiet = true;
    store_->add(keys_.done(), 1);
  }

  /// Tells every other worker (through the store) that this rank fails with `what`.
  /// Returns "" when this is the job's first failure; otherwise the first one's reason
  /// ("rank 1: ..."), which is kept. With `consequence` (a transport failure: a peer's
  /// connection closed), a failure reported within half a second counts as earlier: a
  /// peer killed outright closes its connections to the other workers and to the
  /// rendezvous at once, and the rendezvous may learn of it a moment after they do.
  std::string fail(const std::string& what, bool consequence = false) noexcept {
    monitor_.quiet = true;
    try {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(consequence ? 500 : 0);
      do {
        if (store_->check({keys_.failed()})) return store_->get(keys_.failed());
        if (consequence) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      } while (std::chrono::steady_clock::now() < until);
      if (store_->add(keys_.failures(), 1) == 1) {
        store_->set(keys_.failed(), "rank " + std::to_string(rank_) + ": " + what);
        return "";
      }
      return store_->get(keys_.failed());
    } catch (...) {  // the store is gone too: the peers notice the closed connections
      return "";
    }
  }

 private:
  void start_monitor(const rendezvous_environment& e) {
    auto watcher = std::make_shared<store_client>(e.host, e.port, std::chrono::hours(24 * 365), e.tls);
    watcher->hello(keys_.prefix + "rank " + std::to_string(rank_) + " monitor");
    monitor_.fd = watcher->native_handle();
    monitor_.thread = std::thread([this, watcher, key = keys_.failed()] {
      std::string why;
      try {
        why = watcher->get(key);
      } catch (const std::exception& x) {
        why = std::string("the rendezvous is gone (") + x.what() + ")";
      }
      if (monitor_.quiet) return;
      std::fflush(stdout);
      std::fprintf(stderr, "tessera: rank %d: the job ended: %s\n", rank_, why.c_str());
      std::fflush(stderr);
      detail::run_abort_hooks();
      std::_Exit(1);
    });
  }

  detail::job_keys keys_;
  std::chrono::seconds timeout_;
  std::shared_ptr<store_client> store_;
  int rank_ = -1;
  std::optional<gloo_communicator> world_;
  // The monitor's thread, blocked on its own connection until a failure is reported;
  // quiet once this rank finishes or fails itself. Stopped (and joined) first on
  // destruction, also when the constructor throws.
  struct monitor_thread {
    std::atomic<bool> quiet{false};
    int fd = -1;
    std::thread thread;
    ~monitor_thread() {
      quiet = true;
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
      if (thread.joinable()) thread.join();
    }
  };
  monitor_thread monitor_;
};

}  // namespace tessera
