// The MPI communicator's collectives against the raw MPI calls they wrap: same
// communicator, same buffers, same sizes, run as adjacent pairs in one job. Built with
// Gloo (tessera::gloo), the same job also forms a Gloo world (rank 0 serves the
// rendezvous, its port sent over MPI) and times gloo_communicator's collectives against
// Gloo's own calls on the same context (benchmarks gloo_<collective>/wrapper and /raw),
// and prints Gloo's raw times over MPI's: the two host transports on one machine.
//
//   mpiexec --bind-to none -n 2 bench_collectives --benchmark_format=json
//
// --bind-to none matters for Gloo: bound to one core, a rank's waiting main thread and
// Gloo's event-loop thread share it, and a Gloo call of 16 floats or more then takes a
// scheduler tick (4 ms) instead of ~0.1 ms.
//
// Each iteration is timed as the slowest rank's time (barrier, MPI_Wtime around the
// call, all-reduce MAX; MPI's for MPI's collectives, Gloo's for Gloo's), so every rank
// sees the same times and takes the same
// decisions about iteration counts. Besides the mean time the library reports, each
// benchmark reports the median and the fastest iteration (counters median_us,
// min_us): on a shared machine a few preempted iterations move the mean by tens of
// percent. Only rank 0 reports; at the end it prints to stderr the ratios wrapper /
// raw for every collective and size.
//
// Extra flags:
//   --rounds=N       registers the whole list N times, alternating the order of each
//                    pair (wrapper first, then raw first), to spread slow drifts of a
//                    shared machine evenly over both sides; the table uses every round.
//   --only=PREFIX    only the collectives whose name starts with PREFIX (gloo_, all_).
//   --interleaved=S  after the benchmarks, times wrapper and raw alternately call by
//                    call (about 20 S pairs at 64 MiB, more for smaller sizes) and
//                    prints a second ratio table: the most precise comparison on a
//                    noisy machine. S = 0 skips it; default 1.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/comm/mpi.hpp>
#if TESSERA_WITH_GLOO
#include <gloo/math.h>
#include <tessera/comm/gloo.hpp>
#include <tessera/comm/store.hpp>
#endif
#include "rank_reporting.hpp"

namespace {

using tessera::mpi_communicator;
using tessera::reduce_op;

constexpr std::size_t min_bytes = std::size_t(4) << 10;   // 4 KiB
constexpr std::size_t max_bytes = std::size_t(64) << 20;  // 64 MiB

/// Buffers shared by every benchmark (so wrapper and raw use the same memory), touched
/// once up front so that no run pays for first-touch page faults.
struct buffers {
  std::vector<float> in, out;
  explicit buffers(std::size_t floats) : in(floats, 1.0f), out(floats, 0.0f) {}
};

/// One measured collective on `n` floats of payload.
using op_fn = std::function<void(mpi_communicator&, buffers&, std::size_t n)>;

/// How the ranks line up before a timed call and agree on its time: a barrier, and the
/// maximum of the ranks' times. MPI's for MPI's collectives; Gloo's own for Gloo's (an
/// MPI barrier just before a Gloo call, on this 2-core machine, costs the Gloo call a
/// scheduler tick: ~4 ms instead of ~0.15 ms).
struct sync_fns {
  std::function<void()> barrier;
  std::function<double(double)> slowest;
};

struct collective {
  const char* name;
  op_fn wrapper;
  op_fn raw;
  sync_fns sync = {};  // set by collectives() and gloo_collectives()
};

// Payload = the largest buffer of the call: all_reduce, all_to_all and broadcast move
// n floats per rank; all_gather gathers n floats (n / g from each rank); reduce_scatter
// reduces n floats (n / g land on each rank).
std::vector<collective> collectives(mpi_communicator& world) {
  const MPI_Comm comm = world.native();
  const sync_fns mpi_sync{[comm] { MPI_Barrier(comm); },
                          [comm](double mine) {
                            double slowest = 0;
                            MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
                            return slowest;
                          }};
  std::vector<collective> ops{
      {"all_reduce",
       [](mpi_communicator& c, buffers& b, std::size_t n) {
         c.all_reduce(std::span<const float>(b.in.data(), n), std::span<float>(b.out.data(), n),
                      reduce_op::sum);
       },
       [](mpi_communicator& c, buffers& b, std::size_t n) {
         MPI_Allreduce(b.in.data(), b.out.data(), int(n), MPI_FLOAT, MPI_SUM, c.native());
       }},
      {"all_gather",
       [](mpi_communicator& c, buffers& b, std::size_t n) {
         const std::size_t part = n / std::size_t(c.size());
         c.all_gather(std::span<const float>(b.in.data(), part),
                      std::span<float>(b.out.data(), part * std::size_t(c.size())));
       },
       [](mpi_communicator& c, buffers& b, std::size_t n) {
         const int part = int(n / std::size_t(c.size()));
         MPI_Allgather(b.in.data(), part, MPI_FLOAT, b.out.data(), part, MPI_FLOAT, c.native());
       }},
      {"reduce_scatter",
       [](mpi_communicator& c, buffers& b, std::size_t n) {
         const std::size_t part = n / std::size_t(c.size());
         c.reduce_scatter(std::span<const float>(b.in.data(), part * std::size_t(c.size())),
                          std::span<float>(b.out.data(), part), reduce_op::sum);
       },
       [](mpi_communicator& c, buffers& b, std::size_t n) {
         const int part = int(n / std::size_t(c.size()));
         MPI_Reduce_scatter_block(b.in.data(), b.out.data(), part, MPI_FLOAT, MPI_SUM, c.native());
       }},
      {"all_to_all",
       [](mpi_communicator& c, buffers& b, std::size_t n) {
         const std::size_t part = n / std::size_t(c.size());
         c.all_to_all(std::span<const float>(b.in.data(), part * std::size_t(c.size())),
                      std::span<float>(b.out.data(), part * std::size_t(c.size())));
       },
       [](mpi_communicator& c, buffers& b, std::size_t n) {
         const int part = int(n / std::size_t(c.size()));
         MPI_Alltoall(b.in.data(), part, MPI_FLOAT, b.out.data(), part, MPI_FLOAT, c.native());
       }},
      {"broadcast",
       [](mpi_communicator& c, buffers& b, std::size_t n) {
         c.broadcast(std::span<float>(b.out.data(), n), 0);
       },
       [](mpi_communicator& c, buffers& b, std::size_t n) {
         MPI_Bcast(b.out.data(), int(n), MPI_FLOAT, 0, c.native());
       }},
  };
  for (collective& c : ops) c.sync = mpi_sync;
  return ops;
}

#if TESSERA_WITH_GLOO
using tessera::gloo_communicator;

/// The Gloo world of the MPI job: rank 0 serves the rendezvous on a free port and sends
/// the port over MPI; every rank joins on the loopback.
struct gloo_job {
  std::unique_ptr<tessera::store_server> server;
  std::unique_ptr<gloo_communicator> world;

  explicit gloo_job(mpi_communicator& mpi) {
    int port = 0;
    if (mpi.rank() == 0) {
      server = std::make_unique<tessera::store_server>("127.0.0.1", 0);
      port = server->port();
    }
    mpi.broadcast(std::span<int>(&port, 1), 0);
    auto store = std::make_shared<tessera::store_client>("127.0.0.1", port);
    world = std::make_unique<gloo_communicator>(gloo_communicator::connect(store, mpi.rank(), mpi.size()));
  }
};

// The same five collectives on the Gloo world: the wrapper, and Gloo's own calls on the
// wrapper's context. Gloo has no reduce-scatter of its own; its raw side is what a Gloo
// user writes instead (an all-reduce of the whole buffer), which is also what the
// wrapper does (plus its copy of the input and of this rank's block).
std::vector<collective> gloo_collectives(gloo_communicator& g) {
  auto sum = [](gloo::AllreduceOptions& o) {
    o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
  };
  const sync_fns gloo_sync{[&g] {
                             gloo::BarrierOptions o(g.native());
                             gloo::barrier(o);
                           },
                           [&g](double mine) {
                             double slowest = mine;
                             gloo::AllreduceOptions o(g.native());
                             o.setOutput(&slowest, 1);
                             o.setReduceFunction(
                                 static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::max<double>));
                             gloo::allreduce(o);
                             return slowest;
                           }};
  std::vector<collective> ops{
      {"gloo_all_reduce",
       [&g](mpi_communicator&, buffers& b, std::size_t n) {
         g.all_reduce(std::span<const float>(b.in.data(), n), std::span<float>(b.out.data(), n), reduce_op::sum);
       },
       [&g, sum](mpi_communicator&, buffers& b, std::size_t n) {
         gloo::AllreduceOptions o(g.native());
         o.setInput(b.in.data(), n);
         o.setOutput(b.out.data(), n);
         sum(o);
         gloo::allreduce(o);
       }},
      {"gloo_all_gather",
       [&g](mpi_communicator&, buffers& b, std::size_t n) {
         const std::size_t part = n / std::size_t(g.size());
         g.all_gather(std::span<const float>(b.in.data(), part), std::span<float>(b.out.data(), part * std::size_t(g.size())));
       },
       [&g](mpi_communicator&, buffers& b, std::size_t n) {
         const std::size_t part = n / std::size_t(g.size());
         gloo::AllgatherOptions o(g.native());
         o.setInput(b.in.data(), part);
         o.setOutput(b.out.data(), part * std::size_t(g.size()));
         gloo::allgather(o);
       }},
      {"gloo_reduce_scatter",
       [&g](mpi_communicator&, buffers& b, std::size_t n) {
         const std::size_t part = n / std::size_t(g.size());
         g.reduce_scatter(std::span<const float>(b.in.data(), part * std::size_t(g.size())),
                          std::span<float>(b.out.data(), part), reduce_op::sum);
       },
       [&g, sum](mpi_communicator&, buffers& b, std::size_t n) {
         const std::size_t whole = n / std::size_t(g.size()) * std::size_t(g.size());
         gloo::AllreduceOptions o(g.native());
         o.setInput(b.in.data(), whole);
         o.setOutput(b.out.data(), whole);
         sum(o);
         gloo::allreduce(o);
       }},
      {"gloo_all_to_all",
       [&g](mpi_communicator&, buffers& b, std::size_t n) {
         const std::size_t whole = n / std::size_t(g.size()) * std::size_t(g.size());
         g.all_to_all(std::span<const float>(b.in.data(), whole), std::span<float>(b.out.data(), whole));
       },
       [&g](mpi_communicator&, buffers& b, std::size_t n) {
         const std::size_t whole = n / std::size_t(g.size()) * std::size_t(g.size());
         gloo::AlltoallOptions o(g.native());
         o.setInput(b.in.data(), whole);
         o.setOutput(b.out.data(), whole);
         gloo::alltoall(o);
       }},
      {"gloo_broadcast",
       [&g](mpi_communicator&, buffers& b, std::size_t n) { g.broadcast(std::span<float>(b.out.data(), n), 0); },
       [&g](mpi_communicator&, buffers& b, std::size_t n) {
         gloo::BroadcastOptions o(g.native());
         o.setOutput(b.out.data(), n);
         o.setRoot(0);
         gloo::broadcast(o);
       }},
  };
  for (collective& c : ops) c.sync = gloo_sync;
  return ops;
}
#endif

/// Runs `op` once per iteration; the iteration's time is the slowest rank's.
void run_timed(benchmark::State& state, mpi_communicator& c, buffers& b, const op_fn& op, const sync_fns& sync,
               std::size_t bytes) {
  const std::size_t n = bytes / sizeof(float);
  op(c, b, n);  // warm-up: connections, algorithm selection, caches
  std::vector<double> samples;
  samples.reserve(std::size_t(state.max_iterations));
  for (auto _ : state) {
    sync.barrier();
    const double t0 = MPI_Wtime();
    op(c, b, n);
    const double slowest = sync.slowest(MPI_Wtime() - t0);
    state.SetIterationTime(slowest);
    samples.push_back(slowest);
  }
  // The mean time (what the library reports) is at the mercy of a few preempted
  // iterations on a shared machine; the median and the minimum are robust.
  if (!samples.empty()) {
    std::sort(samples.begin(), samples.end());
    state.counters["median_us"] = samples[samples.size() / 2] * 1e6;
    state.counters["min_us"] = samples.front() * 1e6;
  }
  state.counters["bytes"] =
      benchmark::Counter(double(bytes), benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(bytes));
}

using tessera::bench::null_reporter;

/// Forwards to the display reporter chosen by --benchmark_format and keeps the times
/// per benchmark name for the ratio table.
class capture_reporter : public benchmark::BenchmarkReporter {
 public:
  explicit capture_reporter(std::unique_ptr<benchmark::BenchmarkReporter> inner)
      : inner_(std::move(inner)) {}
  bool ReportContext(const Context& ctx) override { return inner_->ReportContext(ctx); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.error_occurred) continue;
      const std::string name = r.run_name.function_name;
      if (r.run_type != Run::RT_Iteration) continue;
      sample& s = samples_[name];
      s.mean.push_back(r.GetAdjustedRealTime());
      if (auto it = r.counters.find("median_us"); it != r.counters.end())
        s.median.push_back(it->second.value);
      if (auto it = r.counters.find("min_us"); it != r.counters.end())
        s.min.push_back(it->second.value);
    }
    inner_->ReportRuns(runs);
  }
  void Finalize() override { inner_->Finalize(); }

  /// Per run of a benchmark (all rounds and repetitions), in microseconds: the mean
  /// iteration time, the median iteration time and the fastest iteration.
  struct sample {
    std::vector<double> mean, median, min;
  };

  const sample* find(const std::string& name) const {
    auto it = samples_.find(name);
    return it == samples_.end() || it->second.median.empty() ? nullptr : &it->second;
  }

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
  std::map<std::string, sample> samples_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

std::string arg_value(int argc, char** argv, const char* flag) {
  const std::size_t len = std::strlen(flag);
  std::string value;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], flag, len) == 0 && argv[i][len] == '=') value = argv[i] + len + 1;
  return value;
}

std::string size_name(std::size_t bytes) {
  if (bytes >= (std::size_t(1) << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

double smallest(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// Ratios wrapper / raw of: the median iteration time (median over runs), the fastest
// iteration, and the mean iteration time the library reports (median over runs).
void print_ratio_table(const capture_reporter& rep, const std::vector<collective>& ops) {
  std::fprintf(stderr,
               "\nwrapper / raw (1.000 = same cost), per collective and payload size\n"
               "%-15s %7s %5s %8s %8s %8s %12s %12s\n",
               "collective", "size", "runs", "median", "min", "mean", "raw median", "wrap median");
  for (const collective& c : ops)
    for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      const std::string suffix = std::string(1, '/').append(std::to_string(bytes));
      const auto* w = rep.find(std::string(c.name) + "/wrapper" + suffix);
      const auto* r = rep.find(std::string(c.name) + "/raw" + suffix);
      if (!w || !r) continue;
      const double wmed = median(w->median), rmed = median(r->median);
      std::fprintf(stderr, "%-15s %7s %5zu %8.3f %8.3f %8.3f %10.1fus %10.1fus\n", c.name,
                   size_name(bytes).c_str(), std::min(w->median.size(), r->median.size()),
                   wmed / rmed, smallest(w->min) / smallest(r->min),
                   median(w->mean) / median(r->mean), rmed, wmed);
    }
}

// Gloo over MPI (1.000 = the same time; above 1, Gloo is slower): the raw calls of
// both transports, per collective and payload size, medians over runs.
void print_transport_table(const capture_reporter& rep, const std::vector<collective>& ops) {
  std::fprintf(stderr,
               "\ngloo / mpi, raw calls (1.000 = same time), per collective and payload size\n"
               "%-15s %7s %8s %12s %12s\n",
               "collective", "size", "median", "mpi median", "gloo median");
  for (const collective& c : ops) {
    const std::string name = c.name;
    if (name.rfind("gloo_", 0) == 0) continue;
    for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      const std::string suffix = std::string(1, '/').append(std::to_string(bytes));
      const auto* m = rep.find(name + "/raw" + suffix);
      const auto* g = rep.find("gloo_" + name + "/raw" + suffix);
      if (!m || !g) continue;
      const double mmed = median(m->median), gmed = median(g->median);
      std::fprintf(stderr, "%-15s %7s %8.3f %10.1fus %10.1fus\n", c.name, size_name(bytes).c_str(), gmed / mmed,
                   mmed, gmed);
    }
  }
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(q * double(v.size())))];
}

// The finest comparison: wrapper and raw alternate call by call (which goes first
// alternates too), each call timed as in run_timed, so that both sides see the same
// machine. Prints the ratios of the medians and of the 10th and 90th percentiles.
// All ranks run it; rank 0 prints.
void print_interleaved_table(mpi_communicator& world, buffers& b,
                             const std::vector<collective>& ops, double scale) {
  if (world.rank() == 0)
    std::fprintf(stderr,
                 "\nwrapper / raw, interleaved call by call\n"
                 "%-15s %7s %6s %8s %8s %8s %12s\n",
                 "collective", "size", "pairs", "median", "p10", "p90", "raw median");
  for (const collective& c : ops)
    for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      const std::size_t n = bytes / sizeof(float);
      // about 20 pairs at 64 MiB, up to 2000 for small sizes
      const auto pairs = std::size_t(std::clamp(scale * 20.0 * double(max_bytes / bytes), 4.0, 2000.0 * std::max(scale, 0.01)));
      std::vector<double> tw, tr;
      c.wrapper(world, b, n);
      c.raw(world, b, n);
      for (std::size_t i = 0; i < pairs; ++i)
        for (int side = 0; side < 2; ++side) {
          const bool wrapper = side == int(i % 2);
          c.sync.barrier();
          const double t0 = MPI_Wtime();
          (wrapper ? c.wrapper : c.raw)(world, b, n);
          (wrapper ? tw : tr).push_back(c.sync.slowest(MPI_Wtime() - t0));
        }
      if (world.rank() == 0)
        std::fprintf(stderr, "%-15s %7s %6zu %8.4f %8.4f %8.4f %10.1fus\n", c.name,
                     size_name(bytes).c_str(), pairs, quantile(tw, 0.5) / quantile(tr, 0.5),
                     quantile(tw, 0.1) / quantile(tr, 0.1), quantile(tw, 0.9) / quantile(tr, 0.9),
                     quantile(tr, 0.5) * 1e6);
    }
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_mpi(argc, argv, [&](mpi_communicator& world) -> int {
    const bool root = world.rank() == 0;
    // Other ranks must not open the --benchmark_out file that rank 0 writes.
    std::vector<char*> args;
    int rounds = 1;
    double interleaved = 1.0;
    std::string only;
    for (int i = 0; i < argc; ++i) {
      if (i > 0 && std::strncmp(argv[i], "--only=", 7) == 0) {
        only = argv[i] + 7;
        continue;
      }
      if (i > 0 && std::strncmp(argv[i], "--rounds=", 9) == 0) {
        rounds = std::max(1, std::atoi(argv[i] + 9));
        continue;
      }
      if (i > 0 && std::strncmp(argv[i], "--interleaved=", 14) == 0) {
        interleaved = std::atof(argv[i] + 14);
        continue;
      }
      if (!root && i > 0 && std::strncmp(argv[i], "--benchmark_out", 15) == 0) continue;
      if (std::strncmp(argv[i], "--benchmark_enable_random_interleaving", 38) == 0)
        throw tessera::error(
            "bench_collectives: --benchmark_enable_random_interleaving would run the benchmarks "
            "in a different order on each rank; use --rounds=N");
      args.push_back(argv[i]);
    }
    int nargs = int(args.size());
    args.push_back(nullptr);
    benchmark::Initialize(&nargs, args.data());
    if (benchmark::ReportUnrecognizedArguments(nargs, args.data())) return 1;

    auto ops = collectives(world);
#if TESSERA_WITH_GLOO
    gloo_job gloo(world);
    for (collective& c : gloo_collectives(*gloo.world)) ops.push_back(std::move(c));
#endif
    std::erase_if(ops, [&](const collective& c) { return std::string_view(c.name).substr(0, only.size()) != only; });
    buffers buf(max_bytes / sizeof(float));
    for (int round = 0; round < rounds; ++round)
      for (const collective& c : ops)
        for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
          const std::string suffix = std::string(1, '/').append(std::to_string(bytes));
          auto add = [&](const char* side, const op_fn* op) {
            benchmark::RegisterBenchmark(
                (std::string(c.name) + "/" + side + suffix).c_str(),
                [&world, &buf, op, sync = &c.sync, bytes](benchmark::State& st) {
                  run_timed(st, world, buf, *op, *sync, bytes);
                })
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
          };
          if (round % 2 == 0) {
            add("wrapper", &c.wrapper);
            add("raw", &c.raw);
          } else {
            add("raw", &c.raw);
            add("wrapper", &c.wrapper);
          }
        }

    if (root) {
      const std::string format = arg_value(argc, argv, "--benchmark_format");
      std::unique_ptr<benchmark::BenchmarkReporter> display;
      if (format == "json") display = std::make_unique<benchmark::JSONReporter>();
      else display = std::make_unique<benchmark::ConsoleReporter>(benchmark::ConsoleReporter::OO_Tabular);
      capture_reporter rep(std::move(display));
      benchmark::RunSpecifiedBenchmarks(&rep);
      print_ratio_table(rep, ops);
      print_transport_table(rep, ops);
    } else {
      null_reporter rep;
      benchmark::RunSpecifiedBenchmarks(&rep);
    }
    if (interleaved > 0) print_interleaved_table(world, buf, ops, interleaved);
    benchmark::Shutdown();
    return 0;
  });
}
