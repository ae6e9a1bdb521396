// Tests of the rendezvous store under TLS (comm/store.hpp, comm/tls.hpp), in one
// process: a server and its clients with the certificates tests/comm/make_tls_certs.sh
// made in TESSERA_TEST_TLS_DIR. Values larger than a TLS record and a socket's buffer
// cross intact; a client whose certificate another CA signed, a client that trusts
// another CA and a client without TLS are refused (reported as refused, never as
// lost), while a connection that never starts its handshake holds up no other client;
// unusable files are errors naming them.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <tessera/comm/store.hpp>

using namespace tessera;

namespace {

std::string tls_file(const std::string& name) {
  const char* dir = std::getenv("TESSERA_TEST_TLS_DIR");
  REQUIRE_MESSAGE(dir != nullptr, "TESSERA_TEST_TLS_DIR names the folder of make_tls_certs.sh");
  return std::string(dir) + "/" + name;
}

tls_config node() { return {tls_file("node.pem"), tls_file("node.key"), tls_file("ca.pem")}; }

/// A TLS server that records the connections it refused and the clients it lost.
struct watched_server {
  std::mutex mutex;
  std::vector<std::string> refused;  // "peer: why"
  std::atomic<int> lost{0};
  store_server server{"127.0.0.1", 0, [this](const std::string&) { ++lost; }, node(),
                      [this](const std::string& peer, const std::string& why) {
                        std::lock_guard lock(mutex);
                        refused.push_back(peer + ": " + why);
                      }};

  /// The refusals, once there are `n` (waiting up to 5 s).
  std::vector<std::string> refusals(std::size_t n) {
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard lock(mutex);
        if (refused.size() >= n) return refused;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::lock_guard lock(mutex);
    return refused;
  }
};

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

constexpr std::chrono::seconds quick{5};

}  // namespace

TEST_CASE("store under TLS: set, get, add and wait between clients; values larger than a record") {
  watched_server s;
  store_client a("127.0.0.1", s.server.port(), quick, node());
  store_client b("127.0.0.1", s.server.port(), quick, node());
  std::string big(3 << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = char(i * 131 + i / 977);
  a.set("big", big);
  CHECK(b.get("big") == big);
  CHECK(a.add("n", 5) == 5);
  CHECK(b.add("n", -2) == 3);
  CHECK_FALSE(b.check({"later"}));
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    store_client c("127.0.0.1", s.server.port(), quick, node());
    c.set("later", "x");
  });
  b.wait({"later"});
  CHECK(a.get("later") == "x");
  setter.join();
  CHECK(s.refusals(0).empty());
  CHECK(s.lost == 0);
}

TEST_CASE("store under TLS: a certificate of another CA is refused, and named on both sides") {
  watched_server s;
  const tls_config rogue{tls_file("rogue.pem"), tls_file("rogue.key"), tls_file("ca.pem")};
  const std::string e = error_of([&] { store_client c("127.0.0.1", s.server.port(), quick, rogue); });
  const std::string where = "store 127.0.0.1:" + std::to_string(s.server.port()) + ": TLS handshake: ";
  CHECK_MESSAGE(e.starts_with(where + "the peer refused the connection ("), e);
  const auto refused = s.refusals(1);
  REQUIRE(refused.size() == 1);
  CHECK_MESSAGE(refused[0].starts_with("127.0.0.1:"), refused[0]);
  CHECK_MESSAGE(refused[0].ends_with(": certificate verify failed (unable to get local issuer certificate)"),
                refused[0]);
  // A client that trusts another CA refuses the server.
  const tls_config wary{tls_file("node.pem"), tls_file("node.key"), tls_file("rogue_ca.pem")};
  const std::string w = error_of([&] { store_client c("127.0.0.1", s.server.port(), quick, wary); });
  CHECK_MESSAGE(w.starts_with(where + "certificate verify failed ("), w);
  CHECK(s.refusals(2).size() == 2);
  // Refused connections never said hello: none is a lost client, and the store serves on.
  store_client good("127.0.0.1", s.server.port(), quick, node());
  good.set("k", "v");
  CHECK(good.get("k") == "v");
  CHECK(s.lost == 0);
}

TEST_CASE("store under TLS: a client without TLS is refused; a silent connection holds up no one") {
  watched_server s;
  // A connection that never sends a byte: its handshake waits, the others go on.
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(std::uint16_t(s.server.port()));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(silent, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
  const auto start = std::chrono::steady_clock::now();
  store_client good("127.0.0.1", s.server.port(), quick, node());
  good.set("k", "v");
  CHECK(good.get("k") == "v");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));

  store_client plain("127.0.0.1", s.server.port(), quick);
  const std::string e = error_of([&] { plain.set("k", "w"); });
  CHECK_MESSAGE(e == "store 127.0.0.1:" + std::to_string(s.server.port()) +
                         ": set \"k\": the server closed the connection",
                e);
  CHECK(s.refusals(1).size() == 1);
  CHECK(good.get("k") == "v");
  ::close(silent);
  CHECK(s.lost == 0);
}

TEST_CASE("store under TLS: unusable files are errors naming them") {
  const std::string missing = tls_file("missing.pem");
  CHECK(error_of([&] { store_server s("127.0.0.1", 0, {}, tls_config{missing, tls_file("node.key"), tls_file("ca.pem")}); }) ==
        "store: TLS: cannot use the certificate file " + missing + ": No such file or directory");
  CHECK(error_of([&] {
          store_client c("127.0.0.1", 1, quick, tls_config{tls_file("node.pem"), tls_file("rogue.key"), tls_file("ca.pem")});
        }).starts_with("store: TLS: the private key file " + tls_file("rogue.key") + " does not match the certificate file " +
                       tls_file("node.pem") + ": "));
  CHECK(error_of([&] {
          store_client c("127.0.0.1", 1, quick, tls_config{tls_file("node.pem"), tls_file("node.key"), tls_file("node.key")});
        }).starts_with("store: TLS: cannot use the CA file " + tls_file("node.key") + ": "));
}
