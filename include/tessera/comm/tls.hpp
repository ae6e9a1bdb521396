// TLS for the rendezvous store (seed 001's enable_ssl): the files of a process's
// identity (tls_config), and, where OpenSSL is linked (CMake: tessera::tls, which
// defines TESSERA_WITH_TLS), the sessions comm/store.hpp runs its connections through.
// Under TLS the store's server and every client authenticate each other (mutual TLS:
// each presents a certificate, and each accepts only certificates that the job's CA
// signed) and the store's traffic is encrypted. The CA is the trust anchor: host names
// are not checked, so any process holding a certificate of the job's CA may join.
// Only the control plane is covered: Gloo's data plane (the collectives' bytes between
// workers) is NOT encrypted, since Gloo as Debian packages it has no TLS.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tessera/core/error.hpp>
#if TESSERA_WITH_TLS
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#endif

namespace tessera {

/// The PEM files of a process's identity in a job whose rendezvous runs under TLS. Every
/// process of the job holds a certificate signed by the job's CA, with its private key,
/// and accepts only peers whose certificates that CA signed.
struct tls_config {
  std::string certificate;  ///< this process's certificate (TESSERA_SSL_CERT)
  std::string private_key;  ///< its private key (TESSERA_SSL_KEY)
  std::string ca;           ///< the CA's certificate (TESSERA_SSL_CA)
};

namespace detail {

/// True where this program was built with OpenSSL (tessera::tls).
#if TESSERA_WITH_TLS
inline constexpr bool tls_built = true;
#else
inline constexpr bool tls_built = false;
#endif

/// Throws when TLS is asked for in a program built without it.
inline void require_tls_built(const std::optional<tls_config>& tls) {
  if (tls && !tls_built)
    throw error("store: TLS is enabled, but this program was built without TLS: link tessera::tls");
}

#if TESSERA_WITH_TLS

/// OpenSSL's reason for the oldest error in this thread's queue ("certificate verify
/// failed", "No such file or directory", "DECODER routines: unsupported"), or
/// `otherwise` when the queue is empty; empties the queue.
inline std::string openssl_reason(const std::string& otherwise) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return otherwise;
  if (ERR_SYSTEM_ERROR(e)) return std::strerror(int(ERR_GET_REASON(e)));
  const char* reason = ERR_reason_error_string(e);
  const char* library = ERR_lib_error_string(e);
  if (reason == nullptr) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    return text;
  }
  if (ERR_GET_LIB(e) == ERR_LIB_SSL || library == nullptr) return reason;
  return std::string(library) + ": " + reason;
}

/// The socket BIO of a TLS session: recv and send(MSG_NOSIGNAL), so that a write to a
/// peer that is gone fails instead of raising SIGPIPE (OpenSSL's own socket BIO writes
/// with write(2)). The descriptor is not owned.
struct tls_socket_bio {
  static int fd(BIO* b) { return int(reinterpret_cast<std::intptr_t>(BIO_get_data(b))); }
  static bool retry(ssize_t k) { return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR); }
  static int write(BIO* b, const char* data, int n) {
    BIO_clear_retry_flags(b);
    const ssize_t k = ::send(fd(b), data, std::size_t(n), MSG_NOSIGNAL);
    if (retry(k)) BIO_set_retry_write(b);
    return int(k);
  }
  static int read(BIO* b, char* data, int n) {
    BIO_clear_retry_flags(b);
    const ssize_t k = ::recv(fd(b), data, std::size_t(n), 0);
    if (retry(k)) BIO_set_retry_read(b);
    return int(k);
  }
  static long ctrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }
  static BIO_METHOD* method() {
    static BIO_METHOD* const m = [] {
      BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "tessera socket");
      if (m == nullptr || BIO_meth_set_write(m, &write) != 1 || BIO_meth_set_read(m, &read) != 1 ||
          BIO_meth_set_ctrl(m, &ctrl) != 1)
        throw error("store: TLS: " + openssl_reason("cannot make a socket BIO"));
      return m;
    }();
    return m;
  }
  static BIO* make(int socket) {
    BIO* b = BIO_new(method());
    if (b == nullptr) throw error("store: TLS: " + openssl_reason("cannot make a socket BIO"));
    BIO_set_data(b, reinterpret_cast<void*>(std::intptr_t(socket)));
    BIO_set_init(b, 1);
    return b;
  }
};

struct openssl_free {
  void operator()(SSL_CTX* p) const noexcept { SSL_CTX_free(p); }
  void operator()(SSL* p) const noexcept { SSL_free(p); }
};

/// An OpenSSL context of one side of the store's connections, from a tls_config: its
/// certificate and key (which must match), and the CA its peers' certificates must be
/// signed by. The server requires a certificate from each client; TLS 1.2 at least.
/// A file that cannot be read, or a key of another certificate, throws naming the file
/// and OpenSSL's reason.
class tls_context {
 public:
  enum class side : std::uint8_t { server, client };

  tls_context(const tls_config& c, side s)
      : ctx_(SSL_CTX_new(s == side::server ? TLS_server_method() : TLS_client_method())), side_(s) {
    ERR_clear_error();
    if (!ctx_) throw error("store: TLS: " + openssl_reason("cannot make a context"));
    SSL_CTX* ctx = ctx_.get();
    const auto refuse = [](const std::string& what) {
      throw error("store: TLS: " + what + ": " + openssl_reason("unknown reason"));
    };
    if (c.certificate.empty() || c.private_key.empty() || c.ca.empty())
      throw error("store: TLS: a certificate, its private key and the CA's certificate are all needed");
    if (SSL_CTX_use_certificate_chain_file(ctx, c.certificate.c_str()) != 1)
      refuse("cannot use the certificate file " + c.certificate);
    if (SSL_CTX_use_PrivateKey_file(ctx, c.private_key.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      const unsigned long e = ERR_peek_error();
      if (ERR_GET_LIB(e) == ERR_LIB_X509 && ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH)
        refuse("the private key file " + c.private_key + " does not match the certificate file " + c.certificate);
      refuse("cannot use the private key file " + c.private_key);
    }
    if (SSL_CTX_load_verify_locations(ctx, c.ca.c_str(), nullptr) != 1) refuse("cannot use the CA file " + c.ca);
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | (s == side::server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), nullptr);
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  }

  SSL_CTX* get() const noexcept { return ctx_.get(); }
  side which() const noexcept { return side_; }

 private:
  std::unique_ptr<SSL_CTX, openssl_free> ctx_;
  side side_;
};

/// What a step of a TLS session came to.
enum class tls_io : std::uint8_t {
  ok,          ///< done
  want_read,   ///< call again once the socket is readable
  want_write,  ///< call again once the socket is writable
  closed,      ///< the peer closed the connection
  failed,      ///< a TLS failure (failure() says which)
};

/// One TLS connection over a socket (not owned), either side; the socket may be
/// non-blocking (then each call may want to be repeated once the socket is ready).
class tls_session {
 public:
  tls_session(const tls_context& ctx, int socket) : ssl_(SSL_new(ctx.get())) {
    ERR_clear_error();
    if (!ssl_) throw error("store: TLS: " + openssl_reason("cannot make a session"));
    BIO* b = tls_socket_bio::make(socket);
    SSL_set_bio(ssl_.get(), b, b);
    if (ctx.which() == tls_context::side::server) SSL_set_accept_state(ssl_.get());
    else SSL_set_connect_state(ssl_.get());
  }

  /// A step of the handshake.
  tls_io handshake() {
    ERR_clear_error();
    return outcome(SSL_do_handshake(ssl_.get()));
  }

  /// Reads up to n bytes; ok with got > 0, or why not.
  tls_io read(char* data, std::size_t n, std::size_t& got) {
    ERR_clear_error();
    got = 0;
    return outcome(SSL_read_ex(ssl_.get(), data, n, &got));
  }

  /// Writes all n bytes (ok), or wants to be called again with the same bytes.
  tls_io write(const char* data, std::size_t n) {
    ERR_clear_error();
    std::size_t put = 0;
    return outcome(SSL_write_ex(ssl_.get(), data, n, &put));
  }

  /// Whether OpenSSL holds received bytes not yet read (which poll(2) cannot see).
  bool pending() const { return SSL_pending(ssl_.get()) > 0; }

  /// Why the last step closed or failed: OpenSSL's reason, and the certificate check's
  /// verdict when it failed ("certificate verify failed (unable to get local issuer
  /// certificate)").
  const std::string& failure() const noexcept { return failure_; }

 private:
  tls_io outcome(int rc) {
    const int e = SSL_get_error(ssl_.get(), rc);
    switch (e) {
      case SSL_ERROR_NONE: return tls_io::ok;
      case SSL_ERROR_WANT_READ: return tls_io::want_read;
      case SSL_ERROR_WANT_WRITE: return tls_io::want_write;
      case SSL_ERROR_ZERO_RETURN:
        failure_ = "the peer closed the connection";
        return tls_io::closed;
      case SSL_ERROR_SYSCALL: {
        const int err = errno;
        failure_ = openssl_reason(err != 0 ? std::strerror(err) : "the peer closed the connection");
        return tls_io::closed;
      }
      default: break;
    }
    const unsigned long first = ERR_peek_error();
    failure_ = openssl_reason("TLS error " + std::to_string(e));
    if (ERR_GET_LIB(first) == ERR_LIB_SSL && ERR_GET_REASON(first) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
      return tls_io::closed;
    if (const long v = SSL_get_verify_result(ssl_.get()); v != X509_V_OK)
      failure_ += std::string(" (") + X509_verify_cert_error_string(v) + ")";
    else if (ERR_GET_LIB(first) == ERR_LIB_SSL && ERR_GET_REASON(first) >= SSL_AD_REASON_OFFSET)
      failure_ = "the peer refused the connection (" + failure_ + ")";
    return tls_io::failed;
  }

  std::unique_ptr<SSL, openssl_free> ssl_;
  std::string failure_;
};

/// Repeats `step` (a handshake or a write on session s over socket fd), waiting for the
/// socket as it asks, until it completes (ok), closes or fails, or `deadline` passes
/// (then what it last wanted).
template <class Step>
tls_io tls_complete(int fd, Step step, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const tls_io r = step();
    if (r != tls_io::want_read && r != tls_io::want_write) return r;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return r;
    pollfd p{fd, short(r == tls_io::want_read ? POLLIN : POLLOUT), 0};
    if (::poll(&p, 1, int(std::min<std::int64_t>(left.count(), 1000))) < 0 && errno != EINTR)
      return tls_io::closed;
  }
}

#endif  // TESSERA_WITH_TLS

}  // namespace detail

}  // namespace tessera
