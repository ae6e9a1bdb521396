// tessera-run: starts the local workers of a tessera job, keeps per-rank logs, ends the
// job when one worker fails, and restarts it (msrun's and torchrun's job).
//
// Usage:
//
//     tessera-run --worker-num N [--local-worker-num L] [--node-rank R]
//                 [--master-addr HOST] [--master-port PORT] [--log-dir DIR]
//                 [--max-restarts K] [--stop-grace SECONDS] [--] PROGRAM [ARGS...]
//
// One machine, 8 ranks:
//
//     tessera-run --worker-num 8 ./train --epochs 10
//
// Two machines, 4 ranks each (node 0 at 10.0.0.1; the same port on both), one
// command on each:
//
//     tessera-run --worker-num 8 --local-worker-num 4 --node-rank 0
//                 --master-addr 10.0.0.1 --master-port 29500 ./train
//     tessera-run --worker-num 8 --local-worker-num 4 --node-rank 1
//                 --master-addr 10.0.0.1 --master-port 29500 ./train
//
// Node R runs ranks R*L .. R*L+L-1. Each worker finds its place in TESSERA_RANK,
// TESSERA_WORLD_SIZE, TESSERA_LOCAL_RANK, TESSERA_LOCAL_WORLD_SIZE, TESSERA_NODE_RANK,
// TESSERA_MASTER_ADDR, TESSERA_MASTER_PORT and TESSERA_RESTART_COUNT (0 on the first
// start, k on the k-th restart: a program resumes from its newest checkpoint when it
// is not 0). Each rank's stdout and stderr go to DIR/<attempt>/rank.<rank>/stdout
// (DIR is log_output unless --log-dir says otherwise; attempt 1 is the first start,
// attempt k+1 the k-th restart), and the node's first worker's (rank 0's on node 0)
// also to the launcher's stdout. When a worker fails, the launcher names it, shows its
// last lines, stops the other workers (SIGTERM, then SIGKILL after --stop-grace
// seconds), and restarts them all while --max-restarts allows; it exits with the
// failed worker's status. `tessera-run --help` gives the whole contract
// (options.hpp's usage_text).
//
// Node 0's launcher serves the job's rendezvous (comm/rendezvous.hpp) on the master
// port, for every attempt: the workers' tessera::run meets there and forms the Gloo
// world, and a worker that dies is reported to the others through it as well. With
// MS_ENABLE_SSL or TESSERA_ENABLE_SSL (and TESSERA_SSL_CERT, TESSERA_SSL_KEY,
// TESSERA_SSL_CA, which the workers inherit) it serves the rendezvous under mutual TLS;
// the workers' Gloo collectives stay unencrypted.
//
// Linux only: workers are tied to the launcher with PR_SET_PDEATHSIG, and signals
// reach the launcher through a signalfd.

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>
#include <tessera/comm/rendezvous.hpp>

#include "options.hpp"
#include "workers.hpp"

namespace tessera_run {

using steady = std::chrono::steady_clock;

/// How one attempt ended.
struct attempt_result {
  enum class how { succeeded, worker_failed, interrupted, cannot_execute } end = how::succeeded;
  int rank = -1;         ///< worker_failed: the first worker that failed
  int wait_status = 0;   ///< worker_failed: its wait status
  int signal = 0;        ///< interrupted: the signal the launcher got
  int exec_errno = 0;    ///< cannot_execute: why exec failed
  std::deque<std::string> tail;  ///< worker_failed: its last lines
  std::string log_path;          ///< worker_failed: its log file
  bool named_first = false;      ///< worker_failed: the rendezvous had heard of no failure before it
};

/// Reaps every worker that has exited; returns the index of the one among them that
/// failed (non-zero status or a signal; one killed by a signal first), or -1.
inline int reap_workers(std::vector<worker>& workers) {
  int failed = -1;
  int status;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    for (std::size_t i = 0; i < workers.size(); ++i) {
      worker& w = workers[i];
      if (w.pid != pid || !w.running) continue;
      w.running = false;
      w.wait_status = status;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      // Of the failures reaped together, one by a signal is more likely the cause (the
      // others end with a status when they lose it).
      if (!ok && (failed < 0 || (WIFSIGNALED(status) && !WIFSIGNALED(workers[std::size_t(failed)].wait_status))))
        failed = int(i);
    }
  }
  return failed;
}

/// Runs one attempt: starts the local workers, copies their output until every one
/// has exited, and stops them all when one fails or the launcher gets SIGINT, SIGTERM
/// or SIGHUP (`signals`, a signalfd; `child_mask` is the workers' signal mask).
inline attempt_result run_attempt(const options& o, int port, int restart_count, int signals,
                                  const sigset_t& child_mask, tessera::rendezvous_server* rendezvous) {
  attempt_result result;
  std::vector<worker> workers(std::size_t(o.local_worker_num));
  for (int i = 0; i < o.local_worker_num; ++i) {
    worker& w = workers[std::size_t(i)];
    w.local_rank = i;
    w.rank = o.first_rank() + i;
    w.log_path = log_file(o, restart_count + 1, w.rank);
    w.shown = i == 0;
  }

  // Stopping: every running worker got SIGTERM (or the launcher's signal) at
  // stop_since; SIGKILL follows after the grace period.
  bool stopping = false, killed = false;
  steady::time_point stop_since{};
  const auto stop = [&](int sig) {
    signal_workers(workers, sig);
    if (!stopping) stop_since = steady::now();
    stopping = true;
  };

  try {
    for (worker& w : workers) {
      const int e = spawn_worker(w, o, worker_environment(o, port, w.local_rank, restart_count), child_mask);
      if (e != 0) {
        result.end = attempt_result::how::cannot_execute;
        result.exec_errno = e;
        stop(SIGTERM);
        break;
      }
    }
  } catch (const std::exception&) {
    stop(SIGKILL);
    for (worker& w : workers) {
      while (w.running) {
        int status;
        if (::waitpid(w.pid, &status, 0) == w.pid || errno != EINTR) w.running = false;
      }
      close_output(w);
      if (w.log >= 0) ::close(w.log);
    }
    throw;
  }

  // After the last worker exits, what its pipe still holds is read for up to this long
  // (a process it started may keep the pipe open).
  constexpr auto drain_time = std::chrono::seconds(1);
  steady::time_point all_exited{};
  bool all_gone = false;
  const auto grace = std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(o.stop_grace));
  for (;;) {
    const bool any_running = std::any_of(workers.begin(), workers.end(), [](const worker& w) { return w.running; });
    const bool any_output = std::any_of(workers.begin(), workers.end(), [](const worker& w) { return w.output >= 0; });
    if (!any_running && !all_gone) {
      all_gone = true;
      all_exited = steady::now();
    }
    if (!any_running && !any_output) break;
    const steady::time_point now = steady::now();
    if (!any_running && now - all_exited >= drain_time) break;
    if (stopping && !killed && now - stop_since >= grace) {
      signal_workers(workers, SIGKILL);
      killed = true;
    }

    steady::duration wait = steady::duration::max();
    if (!any_running) wait = all_exited + drain_time - now;
    else if (stopping && !killed) wait = stop_since + grace - now;
    const int timeout_ms = wait == steady::duration::max()
                               ? -1
                               : int(std::max<long long>(
                                     0, std::chrono::ceil<std::chrono::milliseconds>(wait).count()));

    std::vector<pollfd> fds{{signals, POLLIN, 0}};
    std::vector<worker*> owners{nullptr};
    for (worker& w : workers)
      if (w.output >= 0) {
        fds.push_back({w.output, POLLIN, 0});
        owners.push_back(&w);
      }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("poll failed: ") + std::strerror(errno));
    }

    for (std::size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents != 0) pump_output(*owners[i]);

    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      while (::read(signals, &info, sizeof info) == ssize_t(sizeof info)) {
        const int sig = int(info.ssi_signo);
        if (sig == SIGCHLD) continue;  // reaped below
        if (result.end != attempt_result::how::interrupted) {
          std::fprintf(stderr, "tessera-run: got signal %d (SIG%s): passing it on to the workers\n", sig,
                       ::sigabbrev_np(sig));
          result.end = attempt_result::how::interrupted;
          result.signal = sig;
        }
        stop(sig);
      }
    }

    const int failed = reap_workers(workers);
    if (failed >= 0 && result.end == attempt_result::how::succeeded) {
      const worker& w = workers[std::size_t(failed)];
      result.end = attempt_result::how::worker_failed;
      result.rank = w.rank;
      result.wait_status = w.wait_status;
      std::fprintf(stderr, "tessera-run: rank %d %s\n", w.rank, describe_status(w.wait_status).c_str());
      // The rendezvous hears it before the workers are stopped, so that the ranks about
      // to be stopped do not count as the failure.
      if (rendezvous)
        result.named_first = rendezvous->report("rank " + std::to_string(w.rank) + " " + describe_status(w.wait_status));
      if (std::any_of(workers.begin(), workers.end(), [](const worker& x) { return x.running; }))
        std::fprintf(stderr, "tessera-run: stopping the other workers\n");
      stop(SIGTERM);
    }
  }

  for (worker& w : workers) {
    close_output(w);
    if (w.log >= 0) ::close(w.log);
    w.log = -1;
    if (w.rank == result.rank) {
      result.tail = w.tail;
      result.log_path = w.log_path.string();
    }
  }
  return result;
}

/// Prints the last lines of the failed worker's output.
inline void report_failure(const attempt_result& r) {
  if (r.tail.empty()) {
    std::fprintf(stderr, "tessera-run: rank %d wrote nothing (%s)\n", r.rank, r.log_path.c_str());
    return;
  }
  if (r.tail.size() == 1)
    std::fprintf(stderr, "tessera-run: the last line of rank %d's output (%s):\n", r.rank, r.log_path.c_str());
  else
    std::fprintf(stderr, "tessera-run: the last %zu lines of rank %d's output (%s):\n", r.tail.size(), r.rank,
                 r.log_path.c_str());
  for (const std::string& line : r.tail) std::fprintf(stderr, "    %s\n", line.c_str());
}

/// The launcher: parse options, choose the port, then run attempts until one succeeds,
/// the launcher is interrupted, or the restarts are spent. Returns the exit status.
inline int run(int argc, char** argv) {
  options o;
  try {
    o = parse_options(argc, argv);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "tessera-run: %s\nTry 'tessera-run --help' for more information.\n", e.what());
    return 2;
  }
  if (o.help) {
    std::fputs(usage_text.data(), stdout);
    return 0;
  }

  // Signals reach the launcher through a signalfd; the workers start with the mask the
  // launcher had. A closed stdout is not fatal (the logs still get everything).
  sigset_t handled, original;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
  ::sigprocmask(SIG_BLOCK, &handled, &original);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigdelset(&original, sig);
  const int signals = ::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signals < 0) {
    std::fprintf(stderr, "tessera-run: signalfd failed: %s\n", std::strerror(errno));
    return 1;
  }
  ::signal(SIGPIPE, SIG_IGN);

  try {
    // Node 0 serves the job's rendezvous for the whole job, restarts included, on
    // --master-port or on a free port the system picks.
    std::unique_ptr<tessera::rendezvous_server> rendezvous;
    int port = o.master_port;
    if (o.node_rank == 0) {
      rendezvous =
          std::make_unique<tessera::rendezvous_server>("", o.master_port, 0, tessera::tls_from_environment(), "tessera-run");
      if (port == 0) {
        port = rendezvous->port();
        if (o.worker_num > o.local_worker_num)
          std::fprintf(stderr, "tessera-run: node 0 serves the rendezvous on port %d: give the other nodes --master-port %d\n",
                       port, port);
      }
    }

    for (int restart = 0;; ++restart) {
      if (rendezvous) rendezvous->begin_attempt(restart);
      const attempt_result r = run_attempt(o, port, restart, signals, original, rendezvous.get());
      switch (r.end) {
        case attempt_result::how::succeeded:
          // Node 0 keeps the rendezvous until the other nodes' workers have finished too
          // (when the workers met there: a program that is not a tessera::run job never
          // arrives).
          if (rendezvous && rendezvous->all_arrived(o.worker_num) &&
              rendezvous->serve_until_done(o.worker_num, std::chrono::seconds(120)) != 0) {
            std::fprintf(stderr, "tessera-run: this node's workers finished, but the job failed elsewhere\n");
            return 1;
          }
          return 0;
        case attempt_result::how::interrupted:
          return 128 + r.signal;
        case attempt_result::how::cannot_execute:
          std::fprintf(stderr, "tessera-run: cannot execute \"%s\": %s\n", o.command[0].c_str(),
                       std::strerror(r.exec_errno));
          return r.exec_errno == ENOENT ? 127 : 126;
        case attempt_result::how::worker_failed:
          report_failure(r);
          // The job's first failure, as the rendezvous heard of it, when it came before
          // the one named above (which then may only have followed it).
          if (rendezvous && !r.named_first)
            if (const auto first = rendezvous->failure())
              std::fprintf(stderr, "tessera-run: the job's first failure: %s\n", first->c_str());
          if (restart >= o.max_restarts) return shell_status(r.wait_status);
          std::fprintf(stderr,
                       "tessera-run: restart %d of %d: starting the %d local workers again "
                       "(TESSERA_RESTART_COUNT=%d, logs in %s)\n",
                       restart + 1, o.max_restarts, o.local_worker_num, restart + 1,
                       log_file(o, restart + 2, o.first_rank()).parent_path().parent_path().string().c_str());
          break;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera-run: %s\n", e.what());
    return 1;
  }
}

}  // namespace tessera_run

int main(int argc, char** argv) { return tessera_run::run(argc, argv); }
