// tessera-run's worker processes: each one's environment, its start (fork and exec, in
// its own process group, killed when the launcher dies), its output copied to its log
// file (and to the terminal for the node's first worker), and signals sent to it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "options.hpp"

extern char** environ;

namespace tessera_run {

/// The environment variables tessera-run sets in every worker (the launcher's own
/// values of these names are replaced).
inline constexpr std::string_view worker_variables[] = {
    "TESSERA_RANK",       "TESSERA_WORLD_SIZE",  "TESSERA_LOCAL_RANK",  "TESSERA_LOCAL_WORLD_SIZE",
    "TESSERA_NODE_RANK",  "TESSERA_MASTER_ADDR", "TESSERA_MASTER_PORT", "TESSERA_RESTART_COUNT"};

/// How many of a worker's last output lines the launcher keeps to show on failure.
inline constexpr std::size_t tail_lines = 10;

/// One local worker of one attempt.
struct worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;   ///< started and not yet reaped
  int wait_status = 0;    ///< waitpid's status once reaped
  int output = -1;        ///< read end of the pipe holding its stdout and stderr; -1 at EOF
  int log = -1;           ///< its log file
  std::filesystem::path log_path;
  bool shown = false;     ///< its output is also copied to the launcher's stdout
  bool log_failed = false;
  std::string partial;    ///< the unfinished last line of its output
  std::deque<std::string> tail;  ///< its last complete lines (at most tail_lines)
};

/// The log file of `rank` in attempt `attempt` (1 for the first start):
/// DIR/<attempt>/rank.<rank>/stdout.
inline std::filesystem::path log_file(const options& o, int attempt, int rank) {
  return std::filesystem::path(o.log_dir) / std::to_string(attempt) / ("rank." + std::to_string(rank)) / "stdout";
}

/// The environment of local worker `local_rank`: the launcher's, without its own
/// TESSERA_* variables of worker_variables, followed by the worker's.
inline std::vector<std::string> worker_environment(const options& o, int port, int local_rank, int restart_count) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry = *e;
    const std::string_view name = entry.substr(0, entry.find('='));
    bool ours = false;
    for (std::string_view v : worker_variables) ours = ours || name == v;
    if (!ours) env.emplace_back(entry);
  }
  const auto set = [&env](std::string_view name, const std::string& value) {
    env.push_back(std::string(name) + "=" + value);
  };
  set("TESSERA_RANK", std::to_string(o.first_rank() + local_rank));
  set("TESSERA_WORLD_SIZE", std::to_string(o.worker_num));
  set("TESSERA_LOCAL_RANK", std::to_string(local_rank));
  set("TESSERA_LOCAL_WORLD_SIZE", std::to_string(o.local_worker_num));
  set("TESSERA_NODE_RANK", std::to_string(o.node_rank));
  set("TESSERA_MASTER_ADDR", o.master_addr);
  set("TESSERA_MASTER_PORT", std::to_string(port));
  set("TESSERA_RESTART_COUNT", std::to_string(restart_count));
  return env;
}

/// Writes all of [data, data + size) to `fd`; false when the write fails.
inline bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= std::size_t(n);
  }
  return true;
}

/// Opens w's log file (creating its folders) and starts PROGRAM ARGS as w, with its
/// stdout and stderr on one pipe and stdin on /dev/null. The worker runs in its own
/// process group and gets SIGKILL when the launcher dies; `child_mask` is the signal
/// mask it starts with. Returns 0 once the program runs, or the errno of the exec that
/// failed (w is then reaped, not running). Throws std::runtime_error when the log file
/// or a pipe cannot be made.
inline int spawn_worker(worker& w, const options& o, const std::vector<std::string>& env,
                        const sigset_t& child_mask) {
  std::error_code ec;
  std::filesystem::create_directories(w.log_path.parent_path(), ec);
  if (ec) throw std::runtime_error("cannot create the log folder " + w.log_path.parent_path().string() + ": " + ec.message());
  w.log = ::open(w.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.log < 0) throw std::runtime_error("cannot create the log file " + w.log_path.string() + ": " + std::strerror(errno));

  // Everything the child needs is built before fork.
  std::vector<char*> argv, envp;
  for (const std::string& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int out[2], exec_status[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error(std::string("cannot make a pipe: ") + std::strerror(errno));
  if (::pipe2(exec_status, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw std::runtime_error(std::string("cannot make a pipe: ") + std::strerror(errno));
  }
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {out[0], out[1], exec_status[0], exec_status[1]}) ::close(fd);
    throw std::runtime_error(std::string("cannot start a worker (fork): ") + std::strerror(errno));
  }
  if (pid == 0) {
    // The worker, before exec: only async-signal-safe calls from here.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &child_mask, nullptr);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(out[1], STDERR_FILENO);
    ::execvpe(argv[0], argv.data(), envp.data());
    const int e = errno;
    (void)!::write(exec_status[1], &e, sizeof e);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that the group exists before any signal is sent to it
  ::close(out[1]);
  ::close(exec_status[1]);
  int exec_errno = 0;
  ssize_t n;
  do n = ::read(exec_status[0], &exec_errno, sizeof exec_errno);
  while (n < 0 && errno == EINTR);
  ::close(exec_status[0]);
  if (n != ssize_t(sizeof exec_errno)) exec_errno = 0;  // closed by a successful exec
  if (exec_errno != 0) {
    ::close(out[0]);
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return exec_errno;
  }
  ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
  w.pid = pid;
  w.running = true;
  w.output = out[0];
  return 0;
}

/// Keeps the last tail_lines complete lines of w's output, and the unfinished one.
inline void remember_lines(worker& w, std::string_view data) {
  for (std::size_t nl; (nl = data.find('\n')) != std::string_view::npos; data.remove_prefix(nl + 1)) {
    w.partial.append(data.substr(0, nl));
    w.tail.push_back(std::move(w.partial));
    w.partial.clear();
    if (w.tail.size() > tail_lines) w.tail.pop_front();
  }
  w.partial.append(data);
  if (w.partial.size() > 4096) w.partial.erase(0, w.partial.size() - 4096);  // a line with no end: its end
}

/// Closes w's output pipe; an unfinished last line counts as a line.
inline void close_output(worker& w) {
  if (w.output < 0) return;
  ::close(w.output);
  w.output = -1;
  if (!w.partial.empty()) remember_lines(w, "\n");
}

/// Copies what w's pipe holds now to its log file (and to the launcher's stdout when
/// w is shown), byte for byte; closes the pipe at its end.
inline void pump_output(worker& w) {
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(w.output, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      close_output(w);
      return;
    }
    if (!w.log_failed && !write_all(w.log, buffer, std::size_t(n))) {
      w.log_failed = true;
      std::fprintf(stderr, "tessera-run: writing %s failed: %s (rank %d's output goes on without its log)\n",
                   w.log_path.c_str(), std::strerror(errno), w.rank);
    }
    if (w.shown && !write_all(STDOUT_FILENO, buffer, std::size_t(n))) w.shown = false;  // stdout closed
    remember_lines(w, std::string_view(buffer, std::size_t(n)));
  }
}

/// Sends `sig` to the process group of every worker still running.
inline void signal_workers(std::vector<worker>& workers, int sig) {
  for (const worker& w : workers)
    if (w.running) ::kill(-w.pid, sig);
}

/// "exited with status 3" or "was killed by signal 9 (SIGKILL)".
inline std::string describe_status(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* abbrev = ::sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + " (" + (abbrev ? "SIG" + std::string(abbrev) : "unknown") + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
}

/// A shell's status for a wait status: the exit status, or 128 + the signal's number.
inline int shell_status(int wait_status) {
  return WIFSIGNALED(wait_status) ? 128 + WTERMSIG(wait_status) : WEXITSTATUS(wait_status);
}

}  // namespace tessera_run
