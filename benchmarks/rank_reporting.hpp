// What the benchmarks run under mpiexec share: every rank runs every benchmark (their
// collectives must pair up), rank 0 alone reports and writes --benchmark_out, and each
// rank's peak resident memory.
#pragma once

#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <cstring>
#include <vector>

namespace tessera::bench {

/// Discards everything: the reporter of ranks other than 0.
class null_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

/// On ranks other than 0, takes --benchmark_out and --benchmark_out_format out of argv
/// (they would open the file that rank 0 writes). Call before benchmark::Initialize.
inline void keep_output_on_rank0(int& argc, char** argv, int rank) {
  if (rank == 0) return;
  int out = 1;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--benchmark_out", 15) != 0) argv[out++] = argv[i];
  argc = out;
  argv[argc] = nullptr;
}

/// Runs the registered benchmarks on every rank: on rank 0 with `display` (Google
/// Benchmark's console or --benchmark_format reporter when null), elsewhere reporting
/// nothing.
inline void run_on_every_rank(int rank, benchmark::BenchmarkReporter* display = nullptr) {
  if (rank == 0) {
    if (display) benchmark::RunSpecifiedBenchmarks(display);
    else benchmark::RunSpecifiedBenchmarks();
  } else {
    null_reporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
}

/// This process's peak resident memory in MiB (getrusage).
inline double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace tessera::bench
