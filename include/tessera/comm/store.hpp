// The rendezvous store: a key-value server on TCP that a job's processes meet at
// (the scheduler of seed 001's dynamic networking, or tessera-run on node 0), and the
// client each process keeps. Gloo's connection set-up (comm/gloo.hpp) exchanges its
// addresses through it; ranks are handed out with add(); a process that leaves without
// saying goodbye is reported to the server's owner. POSIX sockets only; with a
// tls_config (comm/tls.hpp; built with tessera::tls) the server and its clients
// authenticate each other with certificates and the store's traffic is encrypted.
#pragma once

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>
#include <tessera/comm/tls.hpp>
#include <tessera/core/error.hpp>

namespace tessera {

namespace detail {

// ---- sockets ------------------------------------------------------------------------

/// An owned file descriptor.
class socket_fd {
 public:
  socket_fd() = default;
  explicit socket_fd(int fd) : fd_(fd) {}
  socket_fd(socket_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  socket_fd& operator=(socket_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  socket_fd(const socket_fd&) = delete;
  socket_fd& operator=(const socket_fd&) = delete;
  ~socket_fd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

inline std::string endpoint_text(const std::string& host, int port) {
  return host + ":" + std::to_string(port);
}

/// "127.0.0.1:43122": a socket address, numeric.
inline std::string address_text(const sockaddr_storage& a, socklen_t len) {
  char host[NI_MAXHOST] = {}, service[NI_MAXSERV] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, service, sizeof service,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  return std::string(host) + ":" + service;
}

/// Makes a socket non-blocking.
inline void set_non_blocking(int fd) noexcept { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

/// The addresses of host:port (numeric or a name), for connect (passive = false) or
/// bind (passive = true; an empty host binds every interface).
inline std::unique_ptr<addrinfo, void (*)(addrinfo*)> resolve(const std::string& host, int port,
                                                              bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0)
    throw error("store: cannot resolve " + endpoint_text(host, port) + ": " + ::gai_strerror(rc));
  return {res, &::freeaddrinfo};
}

/// Writes all of `data`; false when the peer is gone.
inline bool send_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, data, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    data += k;
    n -= std::size_t(k);
  }
  return true;
}

// ---- messages: u32 length, then the payload; strings as u32 length + bytes -------------

inline void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}
inline void put_i64(std::string& out, std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(char((u >> (8 * i)) & 0xff));
}
inline void put_str(std::string& out, std::string_view s) {
  put_u32(out, std::uint32_t(s.size()));
  out.append(s);
}

/// Reads the fields of one message payload; a short or malformed payload throws.
class message_reader {
 public:
  explicit message_reader(std::string_view p) : p_(p) {}
  std::uint32_t u32() {
    need(4);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t(std::uint8_t(p_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return v;
  }
  std::int64_t i64() {
    need(8);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t(std::uint8_t(p_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return static_cast<std::int64_t>(v);
  }
  std::string str() {
    const std::uint32_t n = u32();
    need(n);
    std::string s(p_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  std::uint8_t u8() {
    need(1);
    return std::uint8_t(p_[pos_++]);
  }
  bool done() const { return pos_ == p_.size(); }

 private:
  void need(std::size_t n) const {
    if (p_.size() - pos_ < n) throw error("store: malformed message (" + std::to_string(p_.size()) + " bytes)");
  }
  std::string_view p_;
  std::size_t pos_ = 0;
};

inline std::string framed(const std::string& payload) {
  std::string out;
  out.reserve(payload.size() + 4);
  put_u32(out, std::uint32_t(payload.size()));
  out += payload;
  return out;
}

/// The store's requests.
enum class store_op : std::uint8_t {
  set = 1,      ///< key, value -> ack
  get = 2,      ///< key -> value, once the key exists
  add = 3,      ///< key, delta -> the new value (a missing key counts as 0)
  check = 4,    ///< keys -> 1 when every key exists, else 0
  wait = 5,     ///< keys -> ack, once every key exists
  hello = 6,    ///< label -> ack: names this connection in the server's reports
  goodbye = 7,  ///< -> ack: this connection closes normally
};

/// The largest message the store accepts (a gloo address list is a few KiB).
inline constexpr std::uint32_t store_max_message = 64u << 20;

}  // namespace detail

/// The server of a rendezvous store: listens on host:port (port 0 picks a free one,
/// port() tells which) and serves every client on a thread of its own until destroyed.
///
///     tessera::store_server server("", 29500);        // every interface
///     // clients: tessera::store_client c("10.0.0.1", 29500);
///
/// A client that closes its connection without a goodbye (its process died) is
/// reported to `on_lost` with the label it gave in hello() (empty when none), on the
/// server's thread.
///
/// With `tls`, every client must present a certificate that the CA of `tls` signed, and
/// the traffic is encrypted (comm/tls.hpp). A connection whose handshake fails (no
/// certificate, another CA's, not speaking TLS) is dropped and reported to
/// `on_refused` with the peer's address and OpenSSL's reason (by default, printed to
/// stderr); it is not a lost client. The handshakes run a step at a time on
/// non-blocking sockets, so a slow or silent peer holds up no other client.
class store_server {
 public:
  using lost_handler = std::function<void(const std::string& label)>;
  using refused_handler = std::function<void(const std::string& peer, const std::string& why)>;

  explicit store_server(const std::string& host = "", int port = 0, lost_handler on_lost = {},
                        const std::optional<tls_config>& tls = std::nullopt, refused_handler on_refused = {})
      : on_lost_(std::move(on_lost)), on_refused_(std::move(on_refused)) {
    detail::require_tls_built(tls);
#if TESSERA_WITH_TLS
    if (tls) tls_.emplace(*tls, detail::tls_context::side::server);
#endif
    auto addrs = detail::resolve(host, port, /*passive=*/true);
    std::string last_error = "no address";
    for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
      detail::socket_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!fd) continue;
      const int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), 1024) == 0) {
        listen_ = std::move(fd);
        break;
      }
      last_error = std::strerror(errno);
    }
    if (!listen_)
      throw error("store: cannot listen on " + detail::endpoint_text(host.empty() ? "*" : host, port) + ": " +
                  last_error);
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw error("store: pipe failed: " + std::string(std::strerror(errno)));
    wake_read_ = detail::socket_fd(pipe_fds[0]);
    wake_write_ = detail::socket_fd(pipe_fds[1]);
    thread_ = std::thread([this] { serve(); });
  }

  store_server(const store_server&) = delete;
  store_server& operator=(const store_server&) = delete;

  ~store_server() {
    stopping_ = true;
    const char c = 0;
    [[maybe_unused]] const ssize_t k = ::write(wake_write_.get(), &c, 1);
    if (thread_.joinable()) thread_.join();
  }

  /// The TCP port the server listens on.
  int port() const noexcept { return port_; }

  /// Sets a key from the owner's side (as a client's set would).
  void set(const std::string& key, std::string value) {
    std::lock_guard lock(mutex_);
    data_[key] = std::move(value);
    answer_waiters();
  }

  /// Adds delta to the integer under key (a missing key counts as 0) from the owner's
  /// side, as a client's add would; returns the new value.
  std::int64_t add(const std::string& key, std::int64_t delta) {
    std::lock_guard lock(mutex_);
    const std::int64_t value = add_locked(key, delta);
    answer_waiters();
    return value;
  }

  /// The value of key, when it is set.
  bool find(const std::string& key, std::string& value) const {
    std::lock_guard lock(mutex_);
    auto it = data_.find(key);
    if (it == data_.end()) return false;
    value = it->second;
    return true;
  }

  /// The labels of the connections open now.
  std::vector<std::string> connected() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const auto& [fd, c] : clients_) out.push_back(c.label);
    return out;
  }

 private:
  struct client {
    detail::socket_fd fd;
#if TESSERA_WITH_TLS
    std::unique_ptr<detail::tls_session> tls;  // under TLS (freed before fd closes)
    bool handshaking = false;
#endif
    short events = POLLIN;           // what its next step waits for
    std::string peer;                // its address, under TLS
    std::string refusal;             // why its TLS handshake failed
    std::string in;                  // bytes received, not yet a whole message
    std::string label;
    bool said_goodbye = false;
    detail::store_op waiting{};      // get or wait, when a reply is pending
    std::vector<std::string> keys;   // the keys it waits for
  };

  void serve() {
    std::vector<pollfd> fds;
    while (!stopping_) {
      fds.clear();
      fds.push_back({listen_.get(), POLLIN, 0});
      fds.push_back({wake_read_.get(), POLLIN, 0});
      {
        std::lock_guard lock(mutex_);
        for (const auto& [fd, c] : clients_) fds.push_back({fd, c.events, 0});
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents & POLLIN) accept_one();
      for (std::size_t i = 2; i < fds.size(); ++i)
        if (fds[i].revents & (POLLIN | POLLOUT | POLLHUP | POLLERR)) read_from(fds[i].fd);
    }
  }

  void accept_one() {
    sockaddr_storage from{};
    socklen_t from_len = sizeof from;
    const int fd = ::accept4(listen_.get(), reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC);
    if (fd < 0) return;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard lock(mutex_);
    client& c = clients_[fd];
    c.fd = detail::socket_fd(fd);
#if TESSERA_WITH_TLS
    if (tls_) {
      detail::set_non_blocking(fd);
      c.peer = detail::address_text(from, from_len);
      try {
        c.tls = std::make_unique<detail::tls_session>(*tls_, fd);
        c.handshaking = true;
      } catch (const std::exception& e) {
        report_refused(c.peer, e.what());
        clients_.erase(fd);
      }
    }
#endif
  }

  void report_refused(const std::string& peer, const std::string& why) const {
    if (stopping_) return;
    if (on_refused_) on_refused_(peer, why);
    else std::fprintf(stderr, "tessera: store: refused a connection from %s: %s\n", peer.c_str(), why.c_str());
  }

  enum class received : std::uint8_t { data, nothing, closed, refused };

  // Reads what client c sent into c.in: data, nothing yet, or the connection ends
  // (closed; refused when its TLS handshake failed, c.refusal saying why).
  received receive(client& c) {
    char buf[65536];
#if TESSERA_WITH_TLS
    if (c.tls) {
      using detail::tls_io;
      const auto wait_for = [&c](tls_io r) {
        c.events = r == tls_io::want_write ? POLLOUT : POLLIN;
        return r == tls_io::want_read || r == tls_io::want_write;
      };
      if (c.handshaking) {
        const tls_io r = c.tls->handshake();
        if (wait_for(r)) return received::nothing;
        if (r != tls_io::ok) {
          c.refusal = c.tls->failure();
          return received::refused;
        }
        c.handshaking = false;
        // The server speaks first under TLS: its welcome tells the client that its
        // certificate passed. The client waits for it before its first request, so a
        // refusal never leaves a request unread here, whose close would reset the
        // connection and lose the alert that names the reason.
        if (!reply_to(c, std::string(1, 1))) return received::closed;
      }
      // poll(2) cannot see the bytes OpenSSL holds: read until it needs the socket.
      bool any = false;
      for (;;) {
        std::size_t got = 0;
        const tls_io r = c.tls->read(buf, sizeof buf, got);
        if (r == tls_io::ok) {
          c.in.append(buf, got);
          any = true;
        } else if (wait_for(r)) {
          return any ? received::data : received::nothing;
        } else {
          return received::closed;
        }
      }
    }
#endif
    const ssize_t k = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (k < 0 && errno == EINTR) return received::nothing;
    if (k <= 0) return received::closed;
    c.in.append(buf, std::size_t(k));
    return received::data;
  }

  void read_from(int fd) {
    std::string lost_label, refused_peer, refusal;
    bool lost = false;
    {
      std::lock_guard lock(mutex_);
      auto it = clients_.find(fd);
      if (it == clients_.end()) return;
      client& c = it->second;
      const received got = receive(c);
      if (got == received::nothing) return;
      bool drop = got != received::data;
      if (!drop) {
        try {
          drop = !handle_messages(c);
        } catch (const std::exception&) {
          drop = true;  // a malformed message: this client is not speaking the protocol
        }
      }
      if (drop) {
        if (got == received::refused) {  // it never said hello: refused, not lost
          refused_peer = c.peer;
          refusal = c.refusal;
        } else {
          lost = !c.said_goodbye;
          lost_label = c.label;
        }
        clients_.erase(it);
      }
    }
    if (!refused_peer.empty()) report_refused(refused_peer, refusal);
    if (lost && on_lost_ && !stopping_) on_lost_(lost_label);
  }

  // Handles every whole message in c.in; false when the connection should close.
  bool handle_messages(client& c) {
    for (;;) {
      if (c.in.size() < 4) return true;
      detail::message_reader header(std::string_view(c.in).substr(0, 4));
      const std::uint32_t n = header.u32();
      if (n > detail::store_max_message) return false;
      if (c.in.size() < 4 + std::size_t(n)) return true;
      const std::string payload = c.in.substr(4, n);
      c.in.erase(0, 4 + std::size_t(n));
      if (!handle(c, payload)) return false;
    }
  }

  bool handle(client& c, const std::string& payload) {
    using detail::store_op;
    detail::message_reader r(payload);
    const auto op = static_cast<store_op>(r.u8());
    std::string reply;
    switch (op) {
      case store_op::set: {
        std::string key = r.str();
        data_[key] = r.str();
        reply.push_back(1);
        if (!reply_to(c, reply)) return false;
        answer_waiters();
        return true;
      }
      case store_op::add: {
        const std::string key = r.str();
        detail::put_i64(reply, add_locked(key, r.i64()));
        if (!reply_to(c, reply)) return false;
        answer_waiters();
        return true;
      }
      case store_op::get:
      case store_op::wait:
      case store_op::check: {
        std::vector<std::string> keys;
        if (op == store_op::get) {
          keys.push_back(r.str());
        } else {
          const std::uint32_t n = r.u32();
          for (std::uint32_t i = 0; i < n; ++i) keys.push_back(r.str());
        }
        if (op == store_op::check) {
          reply.push_back(all_present(keys) ? 1 : 0);
          return reply_to(c, reply);
        }
        c.waiting = op;
        c.keys = std::move(keys);
        return answer(c);
      }
      case store_op::hello:
        c.label = r.str();
        reply.push_back(1);
        return reply_to(c, reply);
      case store_op::goodbye:
        c.said_goodbye = true;
        reply.push_back(1);
        return reply_to(c, reply);
    }
    return false;
  }

  std::int64_t add_locked(const std::string& key, std::int64_t delta) {
    std::int64_t value = 0;
    if (auto it = data_.find(key); it != data_.end()) value = std::stoll(it->second);
    value += delta;
    data_[key] = std::to_string(value);
    return value;
  }

  bool all_present(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) != 0; });
  }

  // Replies to c's pending get or wait when its keys are all there; false when the
  // client is gone.
  bool answer(client& c) {
    if (c.keys.empty() && c.waiting == detail::store_op{}) return true;
    if (!all_present(c.keys)) return true;
    std::string reply;
    if (c.waiting == detail::store_op::get) reply = data_.at(c.keys.front());
    else reply.push_back(1);
    c.waiting = {};
    c.keys.clear();
    return reply_to(c, reply);
  }

  void answer_waiters() {
    for (auto& [fd, c] : clients_)
      if (c.waiting != detail::store_op{}) answer(c);  // a failed reply shows as a hang-up on the next poll
  }

  static bool reply_to(client& c, const std::string& payload) {
    const std::string m = detail::framed(payload);
#if TESSERA_WITH_TLS
    if (c.tls) {  // a client that takes no reply for this long is dropped
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      return detail::tls_complete(c.fd.get(), [&] { return c.tls->write(m.data(), m.size()); }, deadline) ==
             detail::tls_io::ok;
    }
#endif
    return detail::send_all(c.fd.get(), m.data(), m.size());
  }

  lost_handler on_lost_;
  refused_handler on_refused_;
#if TESSERA_WITH_TLS
  std::optional<detail::tls_context> tls_;
#endif
  detail::socket_fd listen_, wake_read_, wake_write_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mutex_;
  std::map<std::string, std::string> data_;
  std::map<int, client> clients_;
  std::thread thread_;
};

/// A connection to a store_server. Connecting retries until `timeout` (the server may
/// start after its clients); get() and wait() block until their keys are set, up to
/// the timeout, and then throw naming the keys. One request at a time (a mutex orders
/// calls from several threads).
///
/// With `tls`, the server must present a certificate that the CA of `tls` signed, and
/// this client presents its own (comm/tls.hpp); the constructor waits for the server's
/// verdict on it (the server's welcome, a message it sends first under TLS), and a
/// refusal throws naming the store and OpenSSL's reason.
class store_client {
 public:
  using clock = std::chrono::steady_clock;

  store_client(std::string host, int port, std::chrono::milliseconds timeout = std::chrono::seconds(300),
               const std::optional<tls_config>& tls = std::nullopt)
      : host_(std::move(host)), port_(port), timeout_(timeout) {
    detail::require_tls_built(tls);
#if TESSERA_WITH_TLS
    std::optional<detail::tls_context> context;  // first: unusable files fail at once
    if (tls) context.emplace(*tls, detail::tls_context::side::client);
#endif
    const auto deadline = clock::now() + timeout_;
    std::string last_error;
    for (;;) {
      auto addrs = detail::resolve(host_, port_, /*passive=*/false);
      for (addrinfo* a = addrs.get(); a != nullptr && !fd_; a = a->ai_next) {
        detail::socket_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        if (!fd) continue;
        if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) fd_ = std::move(fd);
        else last_error = std::strerror(errno);
      }
      if (fd_) break;
      if (clock::now() >= deadline)
        throw error("store: no server at " + where() + " after " + std::to_string(timeout_.count() / 1000) +
                    " s (" + last_error + ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const int one = 1;
    ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
#if TESSERA_WITH_TLS
    if (context) start_tls(*context);
#endif
  }

  store_client(const store_client&) = delete;
  store_client& operator=(const store_client&) = delete;

  ~store_client() {
    if (fd_ && !broken_) {
      try {
        goodbye();
      } catch (...) {  // the server is gone: nothing to say goodbye to
      }
    }
  }

  const std::string& host() const noexcept { return host_; }
  int port() const noexcept { return port_; }
  std::string where() const { return detail::endpoint_text(host_, port_); }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// The connection's socket (shutdown() on it wakes a request blocked in another thread).
  int native_handle() const noexcept { return fd_.get(); }

  void set(const std::string& key, std::string_view value) {
    std::string m(1, char(detail::store_op::set));
    detail::put_str(m, key);
    detail::put_str(m, value);
    request(m, "set \"" + key + "\"");
  }

  std::string get(const std::string& key) {
    std::string m(1, char(detail::store_op::get));
    detail::put_str(m, key);
    return request(m, "get \"" + key + "\"");
  }

  std::int64_t add(const std::string& key, std::int64_t delta) {
    std::string m(1, char(detail::store_op::add));
    detail::put_str(m, key);
    detail::put_i64(m, delta);
    detail::message_reader r(request(m, "add \"" + key + "\""));
    return r.i64();
  }

  bool check(const std::vector<std::string>& keys) {
    const std::string reply = request(keys_message(detail::store_op::check, keys), "check");
    return !reply.empty() && reply[0] == 1;
  }

  void wait(const std::vector<std::string>& keys) {
    request(keys_message(detail::store_op::wait, keys), describe_wait(keys));
  }

  /// Names this connection in the server's reports ("rank 3").
  void hello(std::string_view label) {
    std::string m(1, char(detail::store_op::hello));
    detail::put_str(m, label);
    request(m, "hello");
  }

  /// Tells the server that this connection ends normally.
  void goodbye() {
    request(std::string(1, char(detail::store_op::goodbye)), "goodbye");
    fd_.reset();
  }

  /// The address of this end of the connection (the interface that reaches the server),
  /// numeric: what peers on the server's network can reach this process at.
  std::string local_address() const {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&a), &len);
    char text[NI_MAXHOST] = {};
    ::getnameinfo(reinterpret_cast<sockaddr*>(&a), len, text, sizeof text, nullptr, 0, NI_NUMERICHOST);
    return text;
  }

 private:
  static std::string keys_message(detail::store_op op, const std::vector<std::string>& keys) {
    std::string m(1, char(op));
    detail::put_u32(m, std::uint32_t(keys.size()));
    for (const auto& k : keys) detail::put_str(m, k);
    return m;
  }

  static std::string describe_wait(const std::vector<std::string>& keys) {
    std::string s = "wait for";
    for (std::size_t i = 0; i < keys.size() && i < 8; ++i) s += " \"" + keys[i] + "\"";
    if (keys.size() > 8) s += " and " + std::to_string(keys.size() - 8) + " more";
    return s;
  }

#if TESSERA_WITH_TLS
  // The handshake (on a non-blocking socket, within the timeout and 30 s at most), then
  // the server's welcome: under TLS 1.3 the server judges this client's certificate
  // after the client's side of the handshake has ended, and its verdict (the welcome,
  // or an alert naming the reason) arrives only then.
  void start_tls(const detail::tls_context& context) {
    detail::set_non_blocking(fd_.get());
    tls_ = std::make_unique<detail::tls_session>(context, fd_.get());
    const auto deadline = clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(30));
    const detail::tls_io r = detail::tls_complete(fd_.get(), [this] { return tls_->handshake(); }, deadline);
    if (r == detail::tls_io::want_read || r == detail::tls_io::want_write)
      fail("TLS handshake", "no answer (is the server serving TLS?)");
    if (r != detail::tls_io::ok) fail("TLS handshake", tls_failure(r));
    receive_message("TLS handshake", clock::now() + timeout_);
  }

  std::string tls_failure(detail::tls_io r) const {
    if (r == detail::tls_io::failed) return tls_->failure();
    if (r == detail::tls_io::closed) return "the server closed the connection";
    return "no answer after " + std::to_string(timeout_.count() / 1000) + " s";
  }
#endif

  // Sends one request and returns its reply's payload.
  std::string request(const std::string& payload, const std::string& what) {
    std::lock_guard lock(mutex_);
    if (!fd_ || broken_) throw error("store: " + what + ": the connection to " + where() + " is closed");
    const std::string m = detail::framed(payload);
    const auto deadline = clock::now() + timeout_;
#if TESSERA_WITH_TLS
    if (tls_) {
      const detail::tls_io r =
          detail::tls_complete(fd_.get(), [&] { return tls_->write(m.data(), m.size()); }, deadline);
      if (r != detail::tls_io::ok) fail(what, tls_failure(r));
    } else
#endif
    if (!detail::send_all(fd_.get(), m.data(), m.size())) fail(what, "the server closed the connection");
    return receive_message(what, deadline);
  }

  // Receives one message from the server and returns its payload.
  std::string receive_message(const std::string& what, clock::time_point deadline) {
    short events = POLLIN;  // what the next read waits for
    std::string in;
    for (;;) {
      if (in.size() >= 4) {
        detail::message_reader h(std::string_view(in).substr(0, 4));
        const std::uint32_t n = h.u32();
        if (n > detail::store_max_message) fail(what, "a reply of " + std::to_string(n) + " bytes");
        if (in.size() >= 4 + std::size_t(n)) return in.substr(4, n);
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
      if (left.count() <= 0)
        fail(what, "no answer after " + std::to_string(timeout_.count() / 1000) + " s");
      char buf[65536];
#if TESSERA_WITH_TLS
      if (tls_) {  // what OpenSSL already holds is read before polling the socket
        if (!tls_->pending() && !wait_for(events, left, what)) continue;
        std::size_t got = 0;
        const detail::tls_io r = tls_->read(buf, sizeof buf, got);
        if (r == detail::tls_io::ok) in.append(buf, got);
        else if (r == detail::tls_io::want_read || r == detail::tls_io::want_write)
          events = r == detail::tls_io::want_write ? POLLOUT : POLLIN;
        else
          fail(what, tls_failure(r));
        continue;
      }
#endif
      if (!wait_for(events, left, what)) continue;
      const ssize_t k = ::recv(fd_.get(), buf, sizeof buf, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) fail(what, "the server closed the connection");
      in.append(buf, std::size_t(k));
    }
  }

  // Waits up to `left` (1 s at most) for the socket; false when it is not ready yet.
  bool wait_for(short events, std::chrono::milliseconds left, const std::string& what) {
    pollfd p{fd_.get(), events, 0};
    const int rc = ::poll(&p, 1, int(std::min<std::int64_t>(left.count(), 1000)));
    if (rc < 0 && errno != EINTR) fail(what, std::strerror(errno));
    return rc > 0;
  }

  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    broken_ = true;
    throw error("store " + where() + ": " + what + ": " + why);
  }

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  detail::socket_fd fd_;
#if TESSERA_WITH_TLS
  std::unique_ptr<detail::tls_session> tls_;  // under TLS (freed before fd_ closes)
#endif
  bool broken_ = false;
  std::mutex mutex_;
};

}  // namespace tessera
