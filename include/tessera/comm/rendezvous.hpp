// How a job started without MPI meets: the environment of each process (tessera-run's
// variables, or seed 001's dynamic networking: MS_ROLE, MS_WORKER_NUM, MS_SCHED_HOST,
// MS_SCHED_PORT), the store's keys of a job, and the rendezvous server that the
// scheduler (or tessera-run on node 0) keeps: it hands out ranks, sees every worker
// arrive and notices one that dies. Needs no Gloo; the world the workers form over it is
// in comm/gloo_world.hpp. With seed 001's enable_ssl (MS_ENABLE_SSL or
// TESSERA_ENABLE_SSL, with TESSERA_SSL_CERT, TESSERA_SSL_KEY and TESSERA_SSL_CA), the
// rendezvous runs under mutual TLS (comm/tls.hpp: needs tessera::tls); Gloo's
// collectives between the workers are not encrypted.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>
#include <tessera/comm/store.hpp>
#include <tessera/core/error.hpp>

namespace tessera {

/// What a process of a store-networked job learns from its environment.
struct rendezvous_environment {
  enum class role : std::uint8_t { worker, scheduler };
  role process_role = role::worker;
  int rank = -1;            ///< -1: the scheduler hands ranks out in arrival order
  int world_size = 0;
  std::string host;         ///< the store's host
  int port = 0;             ///< the store's port
  int attempt = 0;          ///< tessera-run's restart count: keys of each attempt are apart
  bool serves = false;      ///< this worker also serves the rendezvous (rank 0 of a rank table)
  std::string source;       ///< which variables gave it, for messages
  std::optional<tls_config> tls;  ///< the rendezvous's TLS, when enabled
};

namespace detail {

/// The value of an environment variable, or nullptr when it is unset or empty.
inline const char* env_value(const char* name) noexcept {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

/// The first of the names that is set: (name, value), or (nullptr, nullptr).
inline std::pair<const char*, const char*> env_first(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const char* v = env_value(n)) return {n, v};
  return {nullptr, nullptr};
}

/// An integer variable in [lo, hi]; anything else throws naming the variable.
inline int env_int(const char* name, const char* text, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi)
    throw error(std::string(name) + " is \"" + text + "\"; expected an integer in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  return int(v);
}

/// A variable that must be set; its absence throws naming the alternatives.
inline std::pair<const char*, const char*> env_required(std::initializer_list<const char*> names,
                                                        const std::string& why) {
  auto found = env_first(names);
  if (found.first == nullptr) {
    std::string all;
    for (const char* n : names) all += (all.empty() ? "" : " or ") + std::string(n);
    throw error(all + " is not set (" + why + ")");
  }
  return found;
}

}  // namespace detail

/// The rendezvous's TLS as the environment asks for it (seed 001's enable_ssl), or
/// nothing when it is not enabled:
///
/// - MS_ENABLE_SSL or TESSERA_ENABLE_SSL: "1" or "true" enables TLS; "0", "false" or
///   unset leaves it off; anything else throws naming the variable.
/// - TESSERA_SSL_CERT, TESSERA_SSL_KEY, TESSERA_SSL_CA: this process's certificate, its
///   private key, and the certificate of the CA that signed every certificate of the
///   job (PEM files); each is required when TLS is enabled. The files themselves are
///   read when the store's connections are made.
///
/// TLS covers the rendezvous (the store's traffic); Gloo's collectives are not
/// encrypted.
inline std::optional<tls_config> tls_from_environment() {
  auto [name, value] = detail::env_first({"MS_ENABLE_SSL", "TESSERA_ENABLE_SSL"});
  if (name == nullptr) return std::nullopt;
  const std::string_view v = value;
  if (v == "0" || v == "false") return std::nullopt;
  if (v != "1" && v != "true")
    throw error(std::string(name) + " is \"" + value + "\"; expected 1 or true (TLS on), 0 or false (off)");
  const std::string why = std::string(name) + "=" + value + " enables TLS";
  tls_config c;
  c.certificate = detail::env_required({"TESSERA_SSL_CERT"}, why + ": this process's certificate").second;
  c.private_key = detail::env_required({"TESSERA_SSL_KEY"}, why + ": the certificate's private key").second;
  c.ca = detail::env_required({"TESSERA_SSL_CA"}, why + ": the certificate of the job's CA").second;
  return c;
}

/// True when this process was started as part of a store-networked job: by tessera-run
/// (TESSERA_MASTER_ADDR or TESSERA_MASTER_PORT with TESSERA_RANK), by hand as a
/// scheduler or worker (MS_ROLE or TESSERA_ROLE), or by hand with a rank table
/// (RANK_TABLE_FILE with RANK_ID, seed 003's multi-process startup).
inline bool rendezvous_launched() noexcept {
  return detail::env_value("MS_ROLE") != nullptr || detail::env_value("TESSERA_ROLE") != nullptr ||
         (detail::env_value("RANK_TABLE_FILE") != nullptr && detail::env_value("RANK_ID") != nullptr) ||
         (detail::env_value("TESSERA_RANK") != nullptr &&
          (detail::env_value("TESSERA_MASTER_PORT") != nullptr || detail::env_value("TESSERA_MASTER_ADDR") != nullptr));
}

/// Reads the job from the environment; a missing or malformed variable throws naming it.
///
/// - tessera-run: TESSERA_RANK, TESSERA_WORLD_SIZE, TESSERA_MASTER_ADDR (default
///   127.0.0.1), TESSERA_MASTER_PORT, TESSERA_RESTART_COUNT.
/// - dynamic networking (seed 001), each name also as TESSERA_...: MS_ROLE (MS_SCHED or
///   MS_WORKER), MS_WORKER_NUM, MS_SCHED_HOST (default 127.0.0.1), MS_SCHED_PORT. A
///   worker's rank is its order of arrival at the scheduler.
/// - either way, the rendezvous's TLS (tls_from_environment()).
inline rendezvous_environment read_rendezvous_environment() {
  using detail::env_first;
  using detail::env_int;
  using detail::env_required;
  rendezvous_environment e;
  e.tls = tls_from_environment();
  constexpr int max_ranks = 1 << 20;
  if (auto [name, role] = env_first({"MS_ROLE", "TESSERA_ROLE"}); name != nullptr) {
    const std::string_view r = role;
    if (r == "MS_SCHED" || r == "scheduler") e.process_role = rendezvous_environment::role::scheduler;
    else if (r == "MS_WORKER" || r == "worker") e.process_role = rendezvous_environment::role::worker;
    else
      throw error(std::string(name) + " is \"" + role + "\"; expected MS_SCHED or MS_WORKER");
    e.source = std::string(name) + "=" + role;
    const std::string why = "a job networked by a scheduler needs it";
    auto [nn, n] = env_required({"MS_WORKER_NUM", "TESSERA_WORKER_NUM"}, why);
    e.world_size = env_int(nn, n, 1, max_ranks);
    auto [hn, h] = env_first({"MS_SCHED_HOST", "TESSERA_SCHED_HOST"});
    e.host = hn != nullptr ? h : "127.0.0.1";
    auto [pn, p] = env_required({"MS_SCHED_PORT", "TESSERA_SCHED_PORT"}, why);
    e.port = env_int(pn, p, 1, 65535);
    return e;
  }
  e.source = "tessera-run";
  const std::string why = "tessera-run sets it for each worker";
  auto [rn, r] = env_required({"TESSERA_RANK"}, why);
  auto [wn, w] = env_required({"TESSERA_WORLD_SIZE"}, why);
  e.world_size = env_int(wn, w, 1, max_ranks);
  e.rank = env_int(rn, r, 0, e.world_size - 1);
  auto [hn, h] = env_first({"TESSERA_MASTER_ADDR"});
  e.host = hn != nullptr ? h : "127.0.0.1";
  auto [pn, p] = env_required({"TESSERA_MASTER_PORT"}, why);
  e.port = env_int(pn, p, 1, 65535);
  if (auto [an, a] = env_first({"TESSERA_RESTART_COUNT"}); an != nullptr) e.attempt = env_int(an, a, 0, 1 << 30);
  return e;
}

/// How long a process waits for the others to arrive (TESSERA_RENDEZVOUS_TIMEOUT, in
/// seconds; default 120), and how long a collective may make no progress
/// (TESSERA_COMM_TIMEOUT; default 600).
inline std::chrono::seconds rendezvous_timeout() {
  const char* v = detail::env_value("TESSERA_RENDEZVOUS_TIMEOUT");
  return std::chrono::seconds(v != nullptr ? detail::env_int("TESSERA_RENDEZVOUS_TIMEOUT", v, 1, 86400) : 120);
}
inline std::chrono::seconds collective_timeout() {
  const char* v = detail::env_value("TESSERA_COMM_TIMEOUT");
  return std::chrono::seconds(v != nullptr ? detail::env_int("TESSERA_COMM_TIMEOUT", v, 1, 86400) : 600);
}

namespace detail {

/// The store's keys of one job attempt.
struct job_keys {
  std::string prefix;  // "a<attempt>/"
  std::string next_rank() const { return prefix + "next_rank"; }
  std::string arrived(int r) const { return prefix + "arrived/" + std::to_string(r); }
  std::string failed() const { return prefix + "failed"; }
  std::string failures() const { return prefix + "failures"; }
  std::string done() const { return prefix + "done"; }
  std::string world() const { return prefix + "world"; }
};

inline job_keys keys_of(int attempt) {
  std::string prefix = std::to_string(attempt);
  prefix.insert(prefix.begin(), 'a');
  prefix.push_back('/');
  return {std::move(prefix)};
}

}  // namespace detail

/// The rendezvous server of a job: the store, which also watches the workers. When a
/// worker reports a failure, or its connection closes without its goodbye (it died),
/// the reason is set under the attempt's "failed" key, which every worker's monitor
/// waits for. Kept by the scheduler process, and by tessera-run on node 0.
///
/// With `tls`, a connection without a certificate of the job's CA is refused: the
/// server prints "<name>: refused a connection from <address>: <reason>" to stderr,
/// and a verdict on workers that never arrived mentions the last refusal.
class rendezvous_server {
 public:
  rendezvous_server(const std::string& host, int port, int attempt = 0,
                    const std::optional<tls_config>& tls = std::nullopt, std::string name = "tessera: scheduler")
      : attempt_(attempt),
        name_(std::move(name)),
        server_(
            host, port, [this](const std::string& label) { lost(label); }, tls,
            [this](const std::string& peer, const std::string& why) { refused(peer, why); }) {}

  int port() const noexcept { return server_.port(); }

  /// Starts watching a new attempt of the job (tessera-run's restarts): its keys are
  /// apart from the earlier attempts', whose workers' hang-ups no longer count.
  void begin_attempt(int attempt) noexcept { attempt_ = attempt; }

  /// The failure that ended the job, when one did.
  std::optional<std::string> failure() const {
    std::string v;
    if (server_.find(keys().failed(), v)) return v;
    return std::nullopt;
  }

  /// Records `reason` as the job's failure unless one was recorded first (the owner's
  /// own verdict: tessera-run names a worker it saw die). True when it was the first.
  bool report(const std::string& reason) {
    if (server_.add(keys().failures(), 1) != 1) return false;
    server_.set(keys().failed(), reason);
    return true;
  }

  /// How many workers have finished normally.
  int finished() const {
    std::string v;
    return server_.find(keys().done(), v) ? std::stoi(v) : 0;
  }

  /// Waits until `world_size` workers have finished (0) or one failed (1), printing the
  /// failure; a worker that does not arrive within `arrival` is a failure naming the
  /// missing ranks.
  int serve_until_done(int world_size, std::chrono::seconds arrival) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      if (auto f = failure()) {
        std::fprintf(stderr, "%s: the job failed: %s\n", name_.c_str(), f->c_str());
        linger();
        return 1;
      }
      if (finished() >= world_size) return 0;
      if (std::chrono::steady_clock::now() - start > arrival && !all_arrived(world_size)) {
        if (server_.add(keys().failures(), 1) == 1) server_.set(keys().failed(), missing_ranks(world_size, arrival));
        continue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  bool all_arrived(int world_size) const {
    std::string v;
    for (int r = 0; r < world_size; ++r)
      if (!server_.find(keys().arrived(r), v)) return false;
    return true;
  }

  /// "ranks 2, 5 of 8 did not arrive within 120 s" (empty when all have arrived).
  std::string missing_ranks(int world_size, std::chrono::seconds waited) const {
    std::string out, v;
    for (int r = 0; r < world_size; ++r)
      if (!server_.find(keys().arrived(r), v)) out += (out.empty() ? "" : ", ") + std::to_string(r);
    if (out.empty()) return out;
    out = "ranks " + out + " of " + std::to_string(world_size) + " did not arrive within " +
          std::to_string(waited.count()) + " s";
    std::lock_guard lock(refusal_mutex_);
    if (!last_refusal_.empty()) out += " (the rendezvous refused a connection from " + last_refusal_ + ")";
    return out;
  }

 private:
  // After a failure the workers still ask the store for its reason (a worker whose peer
  // died looks for the failure it follows from): the store stays up until every worker
  // has left, or 3 s.
  void linger() const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (std::chrono::steady_clock::now() < until) {
      const auto open = server_.connected();
      if (std::none_of(open.begin(), open.end(), [](const std::string& l) { return !l.empty(); })) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // A worker's connection is labelled "<attempt prefix>rank R" ("a0/rank 3"). A
  // monitor's connection closes with its worker's, and the worker's own connection
  // tells whether it said goodbye; connections of earlier attempts no longer count.
  void lost(const std::string& label) {
    const detail::job_keys k = keys();
    if (label.ends_with(" monitor") || !label.starts_with(k.prefix)) return;
    if (server_.add(k.failures(), 1) == 1)
      server_.set(k.failed(),
                  label.substr(k.prefix.size()) + " ended without finishing (its connection to the rendezvous closed)");
  }

  void refused(const std::string& peer, const std::string& why) {
    std::fprintf(stderr, "%s: refused a connection from %s: %s\n", name_.c_str(), peer.c_str(), why.c_str());
    std::lock_guard lock(refusal_mutex_);
    last_refusal_ = peer + ": " + why;
  }

  detail::job_keys keys() const { return detail::keys_of(attempt_); }

  std::atomic<int> attempt_;
  std::string name_;  // what its messages start with
  mutable std::mutex refusal_mutex_;
  std::string last_refusal_;
  store_server server_;
};

}  // namespace tessera
