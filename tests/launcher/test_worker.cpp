// A worker for tessera-run's tests (tests/launcher/test_launcher.py): prints its
// TESSERA_* variables and does what its arguments ask on given ranks. Each action
// argument names a rank; -1 means every rank.
//
//   --pid-dir DIR           write the process id to DIR/<rank>.pid (first of all)
//   --ignore-term RANK      ignore SIGTERM
//   --lines RANK COUNT      print COUNT numbered lines ("rank R: line i")
//   --partial RANK TEXT     end the output with TEXT and no newline
//   --delay SECONDS         wait before the actions below
//   --kill RANK             print a line, then kill itself with SIGKILL
//   --exit RANK CODE        print a line, then exit with CODE
//   --exit-first RANK CODE  the same, on the first attempt only (TESSERA_RESTART_COUNT 0)
//   --sleep SECONDS         then wait this long before exiting 0
//
// Every worker prints "rank R: NAME=VALUE" for each TESSERA_* variable it has (sorted),
// "rank R: to stderr" on stderr, and "rank R: done" when it ends normally.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

bool on(int target, int rank) { return target == -1 || target == rank; }

void sleep_for(double seconds) {
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace

int main(int argc, char** argv) {
  const int rank = env_int("TESSERA_RANK", -1);
  const int restart = env_int("TESSERA_RESTART_COUNT", 0);
  std::vector<std::string> args(argv + 1, argv + argc);
  const auto value = [&](std::size_t i) -> const std::string& {
    if (i >= args.size()) {
      std::fprintf(stderr, "test_worker: %s needs more values\n", args[i - 1].c_str());
      std::exit(64);
    }
    return args[i];
  };

  // First: the pid, and SIGTERM ignored (before the launcher could send it).
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--pid-dir") {
      std::ofstream(value(i + 1) + "/" + std::to_string(rank) + ".pid") << ::getpid() << "\n";
    } else if (args[i] == "--ignore-term" && on(std::atoi(value(i + 1).c_str()), rank)) {
      ::signal(SIGTERM, SIG_IGN);
    }
  }

  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string_view(*e).starts_with("TESSERA_")) vars.emplace_back(*e);
  std::sort(vars.begin(), vars.end());
  for (const std::string& v : vars) std::printf("rank %d: %s\n", rank, v.c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "rank %d: to stderr\n", rank);

  std::string partial;
  double delay = 0, sleep = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--lines" && on(std::atoi(value(i + 1).c_str()), rank)) {
      const int count = std::atoi(value(i + 2).c_str());
      for (int k = 0; k < count; ++k) std::printf("rank %d: line %d\n", rank, k);
    } else if (a == "--partial" && on(std::atoi(value(i + 1).c_str()), rank)) {
      partial = value(i + 2);
    } else if (a == "--delay") {
      delay = std::atof(value(i + 1).c_str());
    } else if (a == "--sleep") {
      sleep = std::atof(value(i + 1).c_str());
    }
  }
  std::fflush(stdout);
  sleep_for(delay);

  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--kill" && on(std::atoi(value(i + 1).c_str()), rank)) {
      std::printf("rank %d: killing itself\n", rank);
      std::fflush(stdout);
      ::kill(::getpid(), SIGKILL);
    } else if ((a == "--exit" || (a == "--exit-first" && restart == 0)) && on(std::atoi(value(i + 1).c_str()), rank)) {
      const int code = std::atoi(value(i + 2).c_str());
      std::printf("rank %d: exiting with %d\n", rank, code);
      std::fflush(stdout);
      std::exit(code);
    }
  }

  sleep_for(sleep);
  std::printf("rank %d: done\n%s", rank, partial.c_str());
  std::fflush(stdout);
  return 0;
}
