// any_communicator over MPI against the typed mpi_communicator it wraps: all_reduce,
// all_gather, reduce_scatter, all_to_all and broadcast of 1 KiB to 16 MiB of floats,
// two communicators of the same ranks (duplicates of MPI_COMM_WORLD), the same buffers.
//
//   mpiexec -n 2 bench_any_communicator --benchmark_out=results.json --benchmark_out_format=json
//
// Every call is timed as the slowest rank's time (barrier, MPI_Wtime around the call,
// MPI_Allreduce MAX), so every rank sees the same times and runs the same iterations.
// Two kinds of benchmark per collective and size:
//
// - <collective>/typed/<bytes> and <collective>/handle/<bytes>: each side on its own, as
//   Google Benchmark times it (adaptive iteration count), with the median and fastest
//   iteration as counters (median_us, min_us).
// - <collective>/interleaved/<bytes>: the comparison to trust on a shared machine: pairs
//   of calls, typed and handle back to back (which goes first alternates), for about
//   --budget=S seconds of calls (default 20 s at 1 MiB and above, 5 s below; 200 to 20000
//   pairs), in one benchmark iteration. Counters: ratio (the median over pairs of handle
//   time / typed time, 1.000 = same cost), ratio_lo and ratio_hi (a 95% confidence
//   interval of that median, from the order statistics), pairs, typed_us and handle_us
//   (the median times).
//
// Only rank 0 reports; at the end it prints the interleaved ratios as a table to stderr.
// --rounds=N registers the whole list N times (the order of typed and handle alternating
// from round to round); the table then shows every round.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/mpi.hpp>
#include "rank_reporting.hpp"

namespace {

using tessera::any_communicator;
using tessera::mpi_communicator;
using tessera::reduce_op;

constexpr std::size_t min_bytes = std::size_t(1) << 10;   // 1 KiB
constexpr std::size_t max_bytes = std::size_t(16) << 20;  // 16 MiB

/// Buffers shared by every benchmark (both sides use the same memory), touched once up
/// front so that no run pays for first-touch page faults.
struct buffers {
  std::vector<float> in, out;
  explicit buffers(std::size_t floats) : in(floats, 1.0f), out(floats, 0.0f) {}
};

// One collective on n floats of payload, the largest buffer of the call: all_reduce,
// all_to_all and broadcast move n floats per rank; all_gather gathers n floats (n / g
// from each rank); reduce_scatter reduces n floats (n / g land on each rank). Written
// once for both communicator types.
struct all_reduce_op {
  static constexpr const char* name = "all_reduce";
  template <class C>
  void operator()(C& c, buffers& b, std::size_t n) const {
    c.all_reduce(std::span<const float>(b.in.data(), n), std::span<float>(b.out.data(), n), reduce_op::sum);
  }
};
struct all_gather_op {
  static constexpr const char* name = "all_gather";
  template <class C>
  void operator()(C& c, buffers& b, std::size_t n) const {
    const std::size_t part = n / std::size_t(c.size());
    c.all_gather(std::span<const float>(b.in.data(), part), std::span<float>(b.out.data(), part * std::size_t(c.size())));
  }
};
struct reduce_scatter_op {
  static constexpr const char* name = "reduce_scatter";
  template <class C>
  void operator()(C& c, buffers& b, std::size_t n) const {
    const std::size_t part = n / std::size_t(c.size());
    c.reduce_scatter(std::span<const float>(b.in.data(), part * std::size_t(c.size())),
                     std::span<float>(b.out.data(), part), reduce_op::sum);
  }
};
struct all_to_all_op {
  static constexpr const char* name = "all_to_all";
  template <class C>
  void operator()(C& c, buffers& b, std::size_t n) const {
    const std::size_t all = n / std::size_t(c.size()) * std::size_t(c.size());
    c.all_to_all(std::span<const float>(b.in.data(), all), std::span<float>(b.out.data(), all));
  }
};
struct broadcast_op {
  static constexpr const char* name = "broadcast";
  template <class C>
  void operator()(C& c, buffers& b, std::size_t n) const {
    c.broadcast(std::span<float>(b.out.data(), n), 0);
  }
};

/// The two communicators and the buffers every benchmark uses.
struct setup {
  mpi_communicator& typed;
  any_communicator& handle;
  buffers& buf;
  MPI_Comm timing;  // a communicator of its own for the barriers and the MAX reductions
};

/// Runs op(c) once between a barrier and the MAX over ranks of its time: the slowest
/// rank's time of the call, in seconds.
template <class Op, class C>
double timed_call(const Op& op, C& c, setup& s, std::size_t n) {
  MPI_Barrier(s.timing);
  const double t0 = MPI_Wtime();
  op(c, s.buf, n);
  const double mine = MPI_Wtime() - t0;
  double slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, s.timing);
  return slowest;
}

double quantile_sorted(const std::vector<double>& v, double q) {
  const std::size_t i = std::min(v.size() - 1, std::size_t(std::max(0.0, q * double(v.size()))));
  return v[i];
}

/// One side alone, timed by Google Benchmark (adaptive iteration count).
template <class Op, class C>
void run_side(benchmark::State& state, C& c, setup& s, std::size_t bytes) {
  const Op op;
  const std::size_t n = bytes / sizeof(float);
  op(c, s.buf, n);  // warm-up: connections, algorithm selection, caches
  std::vector<double> samples;
  for (auto _ : state) {
    const double t = timed_call(op, c, s, n);
    state.SetIterationTime(t);
    samples.push_back(t);
  }
  std::sort(samples.begin(), samples.end());
  if (!samples.empty()) {
    state.counters["median_us"] = quantile_sorted(samples, 0.5) * 1e6;
    state.counters["min_us"] = samples.front() * 1e6;
  }
  state.counters["bytes"] = benchmark::Counter(double(bytes), benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(bytes));
}

/// How long the interleaved comparison of one collective and size runs: `budget`
/// seconds of measured calls (--budget=S, default 20 s at 1 MiB and above, a quarter of
/// it below), at least 200 pairs and at most 20000.
struct interleave_limits {
  double budget = 20.0;
  std::int64_t min_pairs = 200, max_pairs = 20000;
  double seconds_for(std::size_t bytes) const { return bytes >= (std::size_t(1) << 20) ? budget : budget / 4; }
};

/// Typed and handle call by call, in one benchmark iteration: pairs of calls, the first
/// of each pair alternating, until the limits are reached (the decision is taken on the
/// slowest-rank times, the same on every rank). Reports the median of the per-pair ratios
/// handle / typed, its 95% confidence interval (order statistics n/2 -+ 0.98 sqrt(n)),
/// the pairs run and the median times.
template <class Op>
void run_interleaved(benchmark::State& state, setup& s, std::size_t bytes, const interleave_limits& lim) {
  const Op op;
  const std::size_t n = bytes / sizeof(float);
  op(s.typed, s.buf, n);
  op(s.handle, s.buf, n);
  std::vector<double> ratio, typed, handle;
  for (auto _ : state) {
    double spent = 0;
    const double limit = lim.seconds_for(bytes);
    for (std::int64_t k = 0; k < lim.max_pairs && (k < lim.min_pairs || spent < limit); ++k) {
      double tt, th;
      if (k % 2 == 0) {
        tt = timed_call(op, s.typed, s, n);
        th = timed_call(op, s.handle, s, n);
      } else {
        th = timed_call(op, s.handle, s, n);
        tt = timed_call(op, s.typed, s, n);
      }
      spent += tt + th;
      ratio.push_back(th / tt);
      typed.push_back(tt);
      handle.push_back(th);
    }
    state.SetIterationTime(spent);
  }
  std::sort(ratio.begin(), ratio.end());
  std::sort(typed.begin(), typed.end());
  std::sort(handle.begin(), handle.end());
  const double m = double(ratio.size()), half = 0.98 * std::sqrt(m);
  state.counters["pairs"] = m;
  state.counters["ratio"] = quantile_sorted(ratio, 0.5);
  state.counters["ratio_lo"] = ratio[std::size_t(std::max(0.0, std::floor(m / 2 - half)))];
  state.counters["ratio_hi"] = ratio[std::min(ratio.size() - 1, std::size_t(std::ceil(m / 2 + half)))];
  state.counters["typed_us"] = quantile_sorted(typed, 0.5) * 1e6;
  state.counters["handle_us"] = quantile_sorted(handle, 0.5) * 1e6;
  state.counters["bytes"] = benchmark::Counter(double(bytes), benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
}

std::string size_name(std::size_t bytes) {
  if (bytes >= (std::size_t(1) << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

using tessera::bench::null_reporter;

/// Forwards to the display reporter and keeps the interleaved runs for the table.
class capture_reporter : public benchmark::BenchmarkReporter {
 public:
  explicit capture_reporter(std::unique_ptr<benchmark::BenchmarkReporter> inner) : inner_(std::move(inner)) {}
  bool ReportContext(const Context& ctx) override { return inner_->ReportContext(ctx); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs)
      if (!r.error_occurred && r.run_type == Run::RT_Iteration &&
          r.run_name.function_name.find("/interleaved/") != std::string::npos)
        interleaved_.push_back(r);
    inner_->ReportRuns(runs);
  }
  void Finalize() override { inner_->Finalize(); }

  void print_table() const {
    std::fprintf(stderr,
                 "\nany_communicator / mpi_communicator, interleaved call by call (1.000 = same cost)\n"
                 "%-15s %7s %6s %8s %17s %12s %12s\n",
                 "collective", "size", "pairs", "ratio", "95% interval", "typed", "handle");
    for (const Run& r : interleaved_) {
      const std::string& name = r.run_name.function_name;
      const std::string coll = name.substr(0, name.find('/'));
      const std::size_t bytes = std::stoull(name.substr(name.rfind('/') + 1));
      auto c = [&](const char* k) { return r.counters.at(k).value; };
      std::fprintf(stderr, "%-15s %7s %6.0f %8.4f   [%6.4f, %6.4f] %10.1fus %10.1fus\n", coll.c_str(),
                   size_name(bytes).c_str(), c("pairs"), c("ratio"), c("ratio_lo"),
                   c("ratio_hi"), c("typed_us"), c("handle_us"));
    }
  }

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
  std::vector<Run> interleaved_;
};

std::string arg_value(int argc, char** argv, const char* flag) {
  const std::size_t len = std::strlen(flag);
  std::string value;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], flag, len) == 0 && argv[i][len] == '=') value = argv[i] + len + 1;
  return value;
}

template <class Op>
void register_collective(setup& s, int round, const interleave_limits& lim) {
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const std::string suffix = std::string(1, '/').append(std::to_string(bytes));
    auto side = [&](const char* which, bool handle) {
      benchmark::RegisterBenchmark((std::string(Op::name) + "/" + which + suffix).c_str(),
                                   [&s, bytes, handle](benchmark::State& st) {
                                     if (handle) run_side<Op>(st, s.handle, s, bytes);
                                     else run_side<Op>(st, s.typed, s, bytes);
                                   })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    };
    if (round % 2 == 0) {
      side("typed", false);
      side("handle", true);
    } else {
      side("handle", true);
      side("typed", false);
    }
    benchmark::RegisterBenchmark((std::string(Op::name) + "/interleaved" + suffix).c_str(),
                                 [&s, bytes, lim](benchmark::State& st) { run_interleaved<Op>(st, s, bytes, lim); })
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_mpi(argc, argv, [&](mpi_communicator& world) -> int {
    const bool root = world.rank() == 0;
    std::vector<char*> args;
    int rounds = 1;
    interleave_limits lim;
    for (int i = 0; i < argc; ++i) {
      if (i > 0 && std::strncmp(argv[i], "--rounds=", 9) == 0) {
        rounds = std::max(1, std::atoi(argv[i] + 9));
        continue;
      }
      if (i > 0 && std::strncmp(argv[i], "--budget=", 9) == 0) {
        lim.budget = std::max(0.0, std::atof(argv[i] + 9));
        continue;
      }
      // Only rank 0 writes the --benchmark_out file.
      if (!root && i > 0 && std::strncmp(argv[i], "--benchmark_out", 15) == 0) continue;
      if (std::strncmp(argv[i], "--benchmark_enable_random_interleaving", 38) == 0)
        throw tessera::error(
            "bench_any_communicator: --benchmark_enable_random_interleaving would run the benchmarks in a "
            "different order on each rank; use --rounds=N");
      args.push_back(argv[i]);
    }
    int nargs = int(args.size());
    args.push_back(nullptr);
    benchmark::Initialize(&nargs, args.data());
    if (benchmark::ReportUnrecognizedArguments(nargs, args.data())) return 1;

    mpi_communicator timing = mpi_communicator::world();
    any_communicator handle = mpi_communicator::world();
    buffers buf(max_bytes / sizeof(float));
    setup s{world, handle, buf, timing.native()};
    for (int round = 0; round < rounds; ++round) {
      register_collective<all_reduce_op>(s, round, lim);
      register_collective<all_gather_op>(s, round, lim);
      register_collective<reduce_scatter_op>(s, round, lim);
      register_collective<all_to_all_op>(s, round, lim);
      register_collective<broadcast_op>(s, round, lim);
    }

    if (root) {
      std::unique_ptr<benchmark::BenchmarkReporter> display;
      if (arg_value(argc, argv, "--benchmark_format") == "json") display = std::make_unique<benchmark::JSONReporter>();
      else display = std::make_unique<benchmark::ConsoleReporter>(benchmark::ConsoleReporter::OO_Tabular);
      capture_reporter rep(std::move(display));
      benchmark::RunSpecifiedBenchmarks(&rep);
      rep.print_table();
    } else {
      null_reporter rep;
      benchmark::RunSpecifiedBenchmarks(&rep);
    }
    benchmark::Shutdown();
    return 0;
  });
}
