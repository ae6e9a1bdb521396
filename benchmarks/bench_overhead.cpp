// The library's fixed costs on tiny tensors, each against the call it wraps, measured
// as adjacent pairs in one job:
//
//   OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=1 mpiexec -n 1 bench_overhead
//   OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=1 mpiexec -n 2 bench_overhead
//   (add --benchmark_out=FILE --benchmark_out_format=json for the JSON)
//
// - matmul_8x8/eager_vs_kernel: ops::matmul of 8 x 8 floats with the data-parallel
//   strategy ((P, 1), (1, 1)) on an mpi_communicator's device_context (the rule, the
//   layout checks, the local product) against kernels::cpu::matmul on the same shards;
//   .../other_mesh: the same with the inputs laid out on device matrix (P,) rather
//   than the rule's (P, 1, 1): placed alike (same_placement), so borrowed, not moved.
// - split_to_replicated_8x8/cached_vs_mpi: redistribute of an 8 x 8 float tensor split
//   by rows -> replicated (one AllGather; its plan from the process's plan cache)
//   against MPI_Allgather of the same bytes on the same communicator.
// - split_to_replicated_8x8/uncached_vs_cached: the same redistribution planned on
//   every call (plan_redistribution + execute: what redistribute did before the cache)
//   against redistribute: the planning time the cache saves.
// - plan/.../planner_vs_cache: planning alone, the planner against a cache lookup.
//
// Each iteration runs a batch of calls of one side, then of the other (the order
// alternating from one iteration to the next), each batch timed as the slowest rank's
// (barrier, MPI_Wtime, MPI_Allreduce MAX). The iteration count is fixed so that every
// rank makes the same calls. The reported time is the first side's per call; counters:
// first_ns and second_ns (median per call), ratio (median over iterations of first /
// second batch time) with ratio_p10 and ratio_p90. Only rank 0 reports; at the end it
// prints the ratio table to stderr.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/cpu/matmul.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/plan/cache.hpp>
#include "rank_reporting.hpp"

using namespace tessera;

namespace {

constexpr int batch = 200;        // calls per side per iteration
constexpr int iterations = 300;   // iterations (pairs of batches) per benchmark

using tessera::bench::null_reporter;

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::size_t(q * double(v.size() - 1) + 0.5)];
}

struct pair_result {
  std::string name;
  double first_ns = 0, second_ns = 0, ratio = 0, p10 = 0, p90 = 0;
};
std::vector<pair_result> results;

// Times `first` and `second`, `batch` calls each per iteration, as the slowest rank.
void run_pair(benchmark::State& state, const std::string& name, mpi_communicator& world,
              const std::function<void()>& first, const std::function<void()>& second) {
  auto timed = [&](const std::function<void()>& f) {
    world.barrier();
    const double t0 = MPI_Wtime();
    for (int i = 0; i < batch; ++i) f();
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, world.native());
    return dt;
  };
  for (int i = 0; i < 20; ++i) {  // warm up: caches, the plan cache, MPI's first calls
    first();
    second();
  }
  std::vector<double> ta, tb, ratio;
  bool a_first = true;
  for (auto _ : state) {
    double a, b;
    if (a_first) {
      a = timed(first);
      b = timed(second);
    } else {
      b = timed(second);
      a = timed(first);
    }
    a_first = !a_first;
    ta.push_back(a / batch);
    tb.push_back(b / batch);
    ratio.push_back(a / b);
    state.SetIterationTime(a / batch);
  }
  pair_result r{name, quantile(ta, 0.5) * 1e9, quantile(tb, 0.5) * 1e9, quantile(ratio, 0.5),
                quantile(ratio, 0.1), quantile(ratio, 0.9)};
  state.counters["first_ns"] = r.first_ns;
  state.counters["second_ns"] = r.second_ns;
  state.counters["ratio"] = r.ratio;
  state.counters["ratio_p10"] = r.p10;
  state.counters["ratio_p90"] = r.p90;
  results.push_back(r);
}

void add(const std::string& name, mpi_communicator& world, std::function<void()> first,
         std::function<void()> second) {
  benchmark::RegisterBenchmark(
      name.c_str(), [name, &world, first, second](benchmark::State& s) { run_pair(s, name, world, first, second); })
      ->UseManualTime()
      ->Iterations(iterations)
      ->Unit(benchmark::kNanosecond);
}

float value(index_t i, index_t j) { return float((i * 8 + j) % 13) - 6.0f; }

// Everything the benchmarks touch, alive for the whole run.
struct fixture {
  mpi_communicator& world;
  device_context<mpi_communicator> ctx;
  int p;
  ops::matmul_op mm;
  tensor_on<float, cpu_device> a, b, a_other, b_other, x;
  layout rep;
  std::vector<float> gathered;

  static tensor_on<float, cpu_device> make(const layout& l, int rank) {
    dist_tensor<float> t(l, extents{8, 8}, rank);
    t.fill_global([](const auto& i) { return value(index_t(i[0]), index_t(i[1])); });
    return t;
  }

  explicit fixture(mpi_communicator& w)
      : world(w),
        ctx(w),
        p(w.size()),
        mm{strategy{{p, 1}, {1, 1}}},
        a(make(mm.rule(p).a, w.rank())),
        b(make(mm.rule(p).b, w.rank())),
        a_other(make(layout(mesh{p}, {{0}, {}}), w.rank())),
        b_other(make(layout::replicated(mesh{p}, 2), w.rank())),
        x(make(layout(mesh{p}, {{0}, {}}), w.rank())),
        rep(layout::replicated(mesh{p}, 2)),
        gathered(64) {}
};

void register_all(fixture& f) {
  mpi_communicator& world = f.world;
  const std::string P = "/P" + std::to_string(f.p);
  if (8 % f.p != 0) throw error("bench_overhead: the rank count must divide 8");

  // Check once that each pair computes the same thing.
  const xt::xarray<float> kernel = kernels::cpu::matmul(f.a.local(), f.b.local());
  if (!(ops::matmul(f.mm, f.a, f.b, f.ctx).local() == kernel) ||
      !(ops::matmul(f.mm, f.a_other, f.b_other, f.ctx).local() == kernel))
    throw error("bench_overhead: ops::matmul and the kernel differ");
  MPI_Allgather(f.x.local().data(), 64 / f.p, MPI_FLOAT, f.gathered.data(), 64 / f.p, MPI_FLOAT, world.native());
  const xt::xarray<float> whole = redistribute(f.x, f.rep, f.ctx).local();
  if (!std::equal(f.gathered.begin(), f.gathered.end(), whole.data()))
    throw error("bench_overhead: redistribute and MPI_Allgather differ");

  // Each side makes its result (one allocation) and keeps it from being optimised away.
  add("matmul_8x8/eager_vs_kernel" + P, world,
      [&f] {
        const auto c = ops::matmul(f.mm, f.a, f.b, f.ctx);
        benchmark::DoNotOptimize(c.local().data());
      },
      [&f] {
        const auto c = kernels::cpu::matmul(f.a.local(), f.b.local());
        benchmark::DoNotOptimize(c.data());
      });
  add("matmul_8x8/other_mesh/eager_vs_kernel" + P, world,
      [&f] {
        const auto c = ops::matmul(f.mm, f.a_other, f.b_other, f.ctx);
        benchmark::DoNotOptimize(c.local().data());
      },
      [&f] {
        const auto c = kernels::cpu::matmul(f.a_other.local(), f.b_other.local());
        benchmark::DoNotOptimize(c.data());
      });
  add("split_to_replicated_8x8/cached_vs_mpi" + P, world,
      [&f] {
        const auto y = redistribute(f.x, f.rep, f.ctx);
        benchmark::DoNotOptimize(y.local().data());
      },
      [&f] {
        MPI_Allgather(f.x.local().data(), 64 / f.p, MPI_FLOAT, f.gathered.data(), 64 / f.p, MPI_FLOAT,
                      f.world.native());
      });
  add("split_to_replicated_8x8/uncached_vs_cached" + P, world,
      [&f] {
        const plan pl = plan_redistribution(f.x.layout(), f.rep, f.x.global_shape(), 4);
        const tensor_on<float, cpu_device> y(f.rep, f.x.global_shape(), f.x.rank(),
                                             execute(pl, f.x.local(), f.ctx.on(f.x.layout().dev)));
        benchmark::DoNotOptimize(y.local().data());
      },
      [&f] {
        const auto y = redistribute(f.x, f.rep, f.ctx);
        benchmark::DoNotOptimize(y.local().data());
      });

  // Planning alone (no communication; every rank plans).
  add("plan/split_to_replicated_8x8/planner_vs_cache" + P, world,
      [&f] { benchmark::DoNotOptimize(plan_redistribution(f.x.layout(), f.rep, extents{8, 8}, 4).bytes_per_rank()); },
      [&f] { benchmark::DoNotOptimize(cached_plan(f.x.layout(), f.rep, extents{8, 8}, 4)->p.bytes_per_rank()); });
  // The seed's MatMul output on (2, 4, 1) -> ReLU's input on (2, 4), on the common
  // refinement: the planning call of every edge between operators of other strategies.
  const layout from = layout(mesh{2, 4, 1}, {{0}, {2}}).with_partial(1), to(mesh{2, 4}, {{0}, {1}});
  add("plan/across_meshes_16x16/planner_vs_cache" + P, world,
      [from, to] { benchmark::DoNotOptimize(plan_across_meshes(from, to, extents{16, 16}, 4).p.bytes_per_rank()); },
      [from, to] { benchmark::DoNotOptimize(cached_plan(from, to, extents{16, 16}, 4)->p.bytes_per_rank()); });
}

void print_table(int p) {
  std::fprintf(stderr, "\nfirst / second, %d rank(s), median over %d iterations of %d calls each\n", p, iterations,
               batch);
  std::fprintf(stderr, "%-58s %10s %10s %8s %8s %8s\n", "benchmark", "first_ns", "second_ns", "ratio", "p10", "p90");
  for (const pair_result& r : results)
    std::fprintf(stderr, "%-58s %10.1f %10.1f %8.3f %8.3f %8.3f\n", r.name.c_str(), r.first_ns, r.second_ns, r.ratio,
                 r.p10, r.p90);
  const plan_cache_stats s = process_plan_cache().stats();
  std::fprintf(stderr, "plan cache: %zu plans, %llu hits, %llu planner runs\n", s.entries,
               (unsigned long long)s.hits, (unsigned long long)s.planned);
}

}  // namespace

int main(int argc, char** argv) {
  return run_mpi(argc, argv, [&](mpi_communicator& world) -> int {
    const bool root = world.rank() == 0;
    // Other ranks must not open the --benchmark_out file that rank 0 writes.
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
      if (!root && i > 0 && std::strncmp(argv[i], "--benchmark_out", 15) == 0) continue;
      if (std::strncmp(argv[i], "--benchmark_enable_random_interleaving", 38) == 0 ||
          std::strncmp(argv[i], "--benchmark_repetitions", 23) == 0 ||
          std::strncmp(argv[i], "--benchmark_min_time", 20) == 0)
        throw error(std::string("bench_overhead: ") + argv[i] +
                    ": every rank must make the same calls; the iteration count is fixed");
      args.push_back(argv[i]);
    }
    int nargs = int(args.size());
    args.push_back(nullptr);
    benchmark::Initialize(&nargs, args.data());
    if (benchmark::ReportUnrecognizedArguments(nargs, args.data())) return 1;
    fixture f(world);
    register_all(f);
    if (root) {
      benchmark::RunSpecifiedBenchmarks();
      print_table(world.size());
    } else {
      null_reporter quiet;
      benchmark::RunSpecifiedBenchmarks(&quiet);
    }
    benchmark::Shutdown();
    return 0;
  });
}
