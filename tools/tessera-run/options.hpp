// tessera-run's command line: the options, their checks and the --help text.
#pragma once

#include <charconv>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tessera_run {

inline constexpr std::string_view usage_text =
    R"(Usage: tessera-run --worker-num N [OPTIONS] [--] PROGRAM [ARGS...]

Starts this node's workers of a tessera job, one process per rank, each running
PROGRAM ARGS; keeps every rank's output in a log file; ends the whole job when
one worker fails, and can restart it.

Options:
  --worker-num N        the job's number of workers (ranks), N >= 1 (required)
  --local-worker-num L  workers started on this node (default N); N must be a
                        multiple of L; node R runs ranks R*L .. R*L+L-1
  --node-rank R         this node's index, 0 <= R < N/L (default 0)
  --master-addr HOST    the address of node 0 (default 127.0.0.1)
  --master-port PORT    the port node 0 serves the rendezvous on; node 0 picks
                        a free port when it is not given, every other node must
                        be given node 0's
  --log-dir DIR         where the logs go (default log_output)
  --max-restarts K      after a failure, restart every local worker, up to K
                        times (default 0)
  --stop-grace SECONDS  how long stopped workers have between SIGTERM and
                        SIGKILL (default 3)
  -h, --help            print this text

Options take their value as the next argument or after '=' (--worker-num=4).
The first argument that is not an option, or the one after '--', is PROGRAM.

Each worker's environment is the launcher's with these set:
  TESSERA_RANK              the worker's rank, R*L + TESSERA_LOCAL_RANK
  TESSERA_WORLD_SIZE        N
  TESSERA_LOCAL_RANK        0 .. L-1, the worker's index on this node
  TESSERA_LOCAL_WORLD_SIZE  L
  TESSERA_NODE_RANK         R
  TESSERA_MASTER_ADDR       --master-addr
  TESSERA_MASTER_PORT       --master-port, or the port node 0 picked
  TESSERA_RESTART_COUNT     0 on the first start, k on the k-th restart

TLS (seed 001's enable_ssl): with MS_ENABLE_SSL=1 or TESSERA_ENABLE_SSL=1 in
the launcher's environment, node 0 serves the rendezvous under mutual TLS, and
the workers (which inherit the variables) connect to it under TLS:
  TESSERA_SSL_CERT          this node's certificate (PEM), signed by the CA
  TESSERA_SSL_KEY           its private key (PEM)
  TESSERA_SSL_CA            the CA's certificate (PEM): the trust anchor; a
                            peer without a certificate the CA signed is refused
                            (host names are not checked)
Only the rendezvous (ranks, addresses, failures) is encrypted: the workers'
collectives over Gloo are plain TCP (Gloo has no TLS here).

Logs: DIR/<attempt>/rank.<rank>/stdout holds a rank's stdout and stderr, as
they come; attempt 1 is the first start, attempt k+1 the k-th restart, so a
restart never overwrites the logs of the failure. The output of this node's
first worker (rank 0 on node 0) is also shown on the launcher's stdout. A
worker's stdin is /dev/null.

When a worker exits with a non-zero status or is killed by a signal, the
launcher names it, shows the last lines of its output, sends SIGTERM to every
other worker (and SIGKILL after the grace period), and then restarts the
workers if restarts are left. SIGINT, SIGTERM and SIGHUP sent to the launcher
are passed on to the workers, and the launcher exits once they are gone. Each
worker runs in its own process group and is killed if the launcher dies.

Exit status: 0 when every worker exits 0; otherwise the failed worker's status
(128 + the signal's number when it was killed by one); 127 when PROGRAM is not
found, 126 when it cannot be executed; 128 + the signal's number when the
launcher was stopped by SIGINT, SIGTERM or SIGHUP; 2 for bad options; 1 when
the launcher itself fails (a log file that cannot be created).
)";

/// What the command line asks for.
struct options {
  int worker_num = 0;        ///< N, the job's world size
  int local_worker_num = 0;  ///< L, workers on this node
  int node_rank = 0;         ///< R
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  ///< 0: not given (node 0 picks one)
  std::string log_dir = "log_output";
  int max_restarts = 0;
  double stop_grace = 3.0;  ///< seconds between SIGTERM and SIGKILL
  bool help = false;
  std::vector<std::string> command;  ///< PROGRAM ARGS...

  /// The first rank of this node.
  int first_rank() const { return node_rank * local_worker_num; }
};

/// A command line that cannot be run; what() says why, naming the option.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

inline int integer_value(std::string_view option, std::string_view text, long long lo, long long hi) {
  long long v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end)
    throw usage_error(std::string(option) + " expects an integer, got \"" + std::string(text) + "\"");
  if (v < lo || v > hi)
    throw usage_error(std::string(option) + " " + std::string(text) + " is out of range: it must lie in [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return int(v);
}

inline double seconds_value(std::string_view option, std::string_view text) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || !(v >= 0) || v > 3600)
    throw usage_error(std::string(option) + " expects a number of seconds in [0, 3600], got \"" +
                      std::string(text) + "\"");
  return v;
}

}  // namespace detail

/// Reads the command line (argv[1..argc)) and checks it: N >= 1, L divides N,
/// R < N/L, a port on every node but node 0, a program to run. Throws usage_error.
inline options parse_options(int argc, char** argv) {
  options o;
  bool have_worker_num = false, have_local = false, have_port = false;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      return o;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // PROGRAM
    std::string_view name = arg, value;
    bool inline_value = false;
    if (const std::size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      inline_value = true;
    }
    static constexpr std::string_view known[] = {"--worker-num", "--local-worker-num", "--node-rank",
                                                 "--master-addr", "--master-port",      "--log-dir",
                                                 "--max-restarts", "--stop-grace"};
    bool is_known = false;
    for (std::string_view k : known) is_known = is_known || name == k;
    if (!is_known) throw usage_error("unknown option " + std::string(name));
    if (!inline_value) {
      if (i + 1 >= argc) throw usage_error(std::string(name) + " needs a value");
      value = argv[++i];
    }
    if (name == "--worker-num") {
      o.worker_num = detail::integer_value(name, value, 1, 1 << 20);
      have_worker_num = true;
    } else if (name == "--local-worker-num") {
      o.local_worker_num = detail::integer_value(name, value, 1, 1 << 20);
      have_local = true;
    } else if (name == "--node-rank") {
      o.node_rank = detail::integer_value(name, value, 0, 1 << 20);
    } else if (name == "--master-addr") {
      if (value.empty()) throw usage_error("--master-addr must not be empty");
      o.master_addr = std::string(value);
    } else if (name == "--master-port") {
      o.master_port = detail::integer_value(name, value, 1, 65535);
      have_port = true;
    } else if (name == "--log-dir") {
      if (value.empty()) throw usage_error("--log-dir must not be empty");
      o.log_dir = std::string(value);
    } else if (name == "--max-restarts") {
      o.max_restarts = detail::integer_value(name, value, 0, 1 << 20);
    } else if (name == "--stop-grace") {
      o.stop_grace = detail::seconds_value(name, value);
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);

  if (!have_worker_num) throw usage_error("--worker-num is required");
  if (!have_local) o.local_worker_num = o.worker_num;
  if (o.worker_num % o.local_worker_num != 0)
    throw usage_error("--worker-num " + std::to_string(o.worker_num) + " is not a multiple of --local-worker-num " +
                      std::to_string(o.local_worker_num));
  const int nodes = o.worker_num / o.local_worker_num;
  if (o.node_rank >= nodes)
    throw usage_error("--node-rank " + std::to_string(o.node_rank) + " is out of range: --worker-num " +
                      std::to_string(o.worker_num) + " / --local-worker-num " + std::to_string(o.local_worker_num) +
                      " gives " + std::to_string(nodes) + (nodes == 1 ? " node (0)" : " nodes (0 to " +
                      std::to_string(nodes - 1) + ")"));
  if (o.node_rank > 0 && !have_port)
    throw usage_error("--master-port is required on node " + std::to_string(o.node_rank) +
                      ": give every node the port node 0 uses");
  if (o.command.empty()) throw usage_error("no program to run: give PROGRAM [ARGS...] after the options");
  return o;
}

}  // namespace tessera_run
