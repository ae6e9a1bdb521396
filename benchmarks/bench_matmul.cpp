// Sharded C = A x B (fp32, square n x n) on every rank of the job, against two peers:
// ScaLAPACK's psgemm on the matching process grids and one process calling sgemm with
// as many threads as there are ranks.
//
//   mpiexec -n 2 --bind-to none bench_matmul [--sizes=1024,2048,4096] [--table_out=FILE]
//                                           [google benchmark flags, e.g. --benchmark_out=FILE]
//
// --bind-to none matters for the single-process peer: OpenMPI binds each of 2 ranks to
// one core by default, and rank 0's P BLAS threads would then share that core.
// With OpenBLAS set OPENBLAS_CORETYPE to the CPU's real type where it misdetects it.
//
// Benchmarks, per size n:
//   tessera/<strategy>/<n>         every MatMul strategy ((m, k), (k, n)) with m k n = P.
//       One iteration: inputs already in the rule's layouts -> ops::matmul -> the partial
//       sums resolved to the cheapest non-partial layout among C's layout with the k
//       axis moved to dim 0 (minor), to dim 1 (minor), or left replicated (the plan the
//       planner prices lowest). Counters: gflops (total), gflops_per_rank,
//       bytes_per_rank (the resolution plan's price), compute_ms (ops::matmul),
//       comm_ms (the resolution), direct_gemm_ms (one sgemm on the same local shards,
//       outside the timed region: what the local product would cost with no overhead).
//   scalapack/<pr>x<pc>/nb=<nb>/<n> psgemm on a pr x pc grid, block size 64 or n / grid
//       dim ("block": one block per process and dim).
//   blas_single/<P> threads/<n>    rank 0 alone, sgemm with P threads; the others wait
//       without spinning.
// Every time is the slowest rank's (MPI_Allreduce MAX), manual time, 3 iterations after
// one untimed warm-up that also checks entries of C against dot products of the
// deterministic inputs. Rank 0 prints a table of the best of each kind at the end.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/ops/matmul.hpp>

#ifndef TESSERA_BENCH_NO_SCALAPACK
extern "C" {
void Cblacs_get(int icontxt, int what, int* val);
void Cblacs_gridinit(int* icontxt, const char* order, int nprow, int npcol);
void Cblacs_gridinfo(int icontxt, int* nprow, int* npcol, int* myrow, int* mycol);
void Cblacs_gridexit(int icontxt);
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb,
               const int* irsrc, const int* icsrc, const int* ictxt, const int* lld, int* info);
int numroc_(const int* n, const int* nb, const int* iproc, const int* isrcproc, const int* nprocs);
void psgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
             const float* alpha, const float* a, const int* ia, const int* ja, const int* desca,
             const float* b, const int* ib, const int* jb, const int* descb, const float* beta,
             float* c, const int* ic, const int* jc, const int* descc);
}
#endif

using namespace tessera;

namespace {

constexpr int iterations = 3;

mpi_communicator* world_ptr = nullptr;

// Deterministic inputs whose products are multiples of 1/64 and whose sums stay far
// below 2^24 / 64: every dot product is exact in fp32, so checks compare exactly (a
// small tolerance covers other summation orders anyway).
inline float a_at(index_t i, index_t j) { return float(int((i * 31 + j * 17) % 15) - 7) / 8.0f; }
inline float b_at(index_t i, index_t j) { return float(int((i * 13 + j * 29) % 11) - 5) / 8.0f; }
double c_at(index_t i, index_t j, index_t n) {
  double s = 0;
  for (index_t l = 0; l < n; ++l) s += double(a_at(i, l)) * double(b_at(l, j));
  return s;
}
bool close(double got, double want) { return std::abs(got - want) <= 1e-3 * (1.0 + std::abs(want)); }

double gflops_of(index_t n, double seconds) { return 2.0 * double(n) * double(n) * double(n) / seconds * 1e-9; }

// The slowest rank's value of each entry.
template <std::size_t N>
void max_over_ranks(double (&v)[N]) {
  world_ptr->all_reduce(std::span<double>(v, N), reduce_op::max);
}

// True on every rank when it is true on all.
bool all_ranks(bool ok) {
  int v = ok ? 1 : 0;
  world_ptr->all_reduce(std::span<int>(&v, 1), reduce_op::min);
  return v == 1;
}

// A barrier that sleeps instead of spinning, so that waiting ranks leave the cores to
// the one doing the work.
void idle_barrier() {
  MPI_Request req;
  MPI_Ibarrier(world_ptr->native(), &req);
  int done = 0;
  const timespec pause{0, 200000};
  for (;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    nanosleep(&pause, nullptr);
  }
}

// The best result of each kind per size, for the final table (filled on every rank,
// printed by rank 0).
struct result {
  std::string name;
  double gflops = 0, compute_ms = 0, comm_ms = 0, direct_ms = 0;
};
std::map<index_t, std::map<std::string, result>> best;

void record(const std::string& kind, index_t n, const result& r) {
  result& b = best[n][kind];
  if (r.gflops > b.gflops) b = r;
}

void set_rate_counters(benchmark::State& state, index_t n, double mean_s) {
  const int p = world_ptr->size();
  state.counters["gflops"] = gflops_of(n, mean_s);
  state.counters["gflops_per_rank"] = gflops_of(n, mean_s) / p;
}

// ---------------------------------------------------------------------------------
// tessera

// C's layout without partial sums, the k axis placed where the planner says the
// resolution is cheapest: split dim 0 (minor), split dim 1 (minor), or replicated.
layout resolution_target(const layout& c, const extents& g) {
  const layout base = c.without_partial();
  if (!c.has_partial()) return base;
  int k_axis = -1;
  for (int a = 0; a < c.dev.ndim; ++a)
    if (c.is_partial(a)) k_axis = a;
  std::vector<layout> cands;
  for (int d = 0; d < 2; ++d) {
    axis_list s = base.split[d];
    s.push_back(k_axis);
    const layout l = base.with_split(d, s);
    if (check(l, g).ok()) cands.push_back(l);
  }
  cands.push_back(base);
  layout bestl = cands.back();
  index_t best_bytes = plan_redistribution(c, bestl, g, 4).bytes_per_rank();
  for (const layout& l : cands) {
    const index_t b = plan_redistribution(c, l, g, 4).bytes_per_rank();
    if (b < best_bytes) best_bytes = b, bestl = l;
  }
  return bestl;
}

// How many ranks hold each element of a tensor in layout l (size-1 axes do not count).
int replicas(const layout& l) {
  int c = 1;
  for (int a = 0; a < l.dev.ndim; ++a)
    if (l.replica_axes() >> a & 1u) c *= l.dev.dims[a];
  return c;
}

void run_tessera(benchmark::State& state, strategy st, index_t n) {
  mpi_communicator& world = *world_ptr;
  const int rank = world.rank();
  device_context<mpi_communicator> ctx(world);
  const ops::matmul_op op{st};
  const matmul_layouts r = op.rule(world.size());
  const extents g{n, n};
  dist_tensor<float> a(r.a, g, rank), b(r.b, g, rank);
  a.fill_global([](const auto& i) { return a_at(i[0], i[1]); });
  b.fill_global([](const auto& i) { return b_at(i[0], i[1]); });
  const layout target = resolution_target(r.c, g);
  const plan p = plan_redistribution(r.c, target, g, 4);
  mesh_comm<mpi_communicator>& mc = ctx.on(r.dev);

  // Warm-up (creates the communicators) and check.
  {
    dist_tensor<float> c = ops::matmul(op, a, b, ctx);
    mc.reset_stats();
    dist_tensor<float> out(target, g, rank);
    out.assign_local(execute(p, std::move(c.local()), mc));
    bool ok = mc.total_stats().bytes == p.bytes_for_rank(rank);
    const extents off = out.local_offset(), ls = out.local_shape();
    const index_t pts[][2] = {{0, 0}, {ls.v[0] - 1, ls.v[1] - 1}, {ls.v[0] / 2, ls.v[1] / 3},
                              {ls.v[0] / 3, ls.v[1] - 1}, {ls.v[0] - 1, 0}};
    for (const auto& pt : pts)
      ok = ok && close(out.local()(pt[0], pt[1]), c_at(off.v[0] + pt[0], off.v[1] + pt[1], n));
    if (!all_ranks(ok)) {
      state.SkipWithError("wrong entries of C, or moved bytes differ from the plan");
      for (auto _ : state) {}
      return;
    }
  }

  // Direct sgemm on the same shards, for the overhead of ops::matmul.
  const auto& la = a.local();
  const auto& lb = b.local();
  const int lm = int(la.shape()[0]), lk = int(la.shape()[1]), ln = int(lb.shape()[1]);
  std::vector<float> direct(std::size_t(lm) * std::size_t(ln));

  double sum_total = 0, sum_compute = 0, sum_comm = 0, sum_direct = 0;
  for (auto _ : state) {
    world.barrier();
    const double t0 = MPI_Wtime();
    dist_tensor<float> c = ops::matmul(op, a, b, ctx);
    const double t1 = MPI_Wtime();
    xt::xarray<float> out = execute(p, std::move(c.local()), mc);
    const double t2 = MPI_Wtime();
    benchmark::DoNotOptimize(out.data());
    world.barrier();
    const double t3 = MPI_Wtime();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, lm, ln, lk, 1.0f, la.data(), lk,
                lb.data(), ln, 0.0f, direct.data(), ln);
    const double t4 = MPI_Wtime();
    double t[4] = {t2 - t0, t1 - t0, t2 - t1, t4 - t3};
    max_over_ranks(t);
    state.SetIterationTime(t[0]);
    sum_total += t[0], sum_compute += t[1], sum_comm += t[2], sum_direct += t[3];
  }
  const double k = double(state.iterations());
  set_rate_counters(state, n, sum_total / k);
  state.counters["bytes_per_rank"] = double(p.bytes_per_rank());
  state.counters["compute_ms"] = 1e3 * sum_compute / k;
  state.counters["comm_ms"] = 1e3 * sum_comm / k;
  state.counters["direct_gemm_ms"] = 1e3 * sum_direct / k;
  // Inputs held per rank: n^2 / P each for A and B only when neither is replicated
  // (strategy ((1, P), (P, 1))), as in ScaLAPACK; more otherwise.
  const double input_bytes = 4.0 * double(la.size() + lb.size());
  state.counters["input_bytes_per_rank"] = input_bytes;
  state.SetLabel("resolve to " + to_string(target));
  const result res{to_string(st), gflops_of(n, sum_total / k), 1e3 * sum_compute / k,
                   1e3 * sum_comm / k, 1e3 * sum_direct / k};
  record("tessera", n, res);
  if (replicas(r.a) == 1 && replicas(r.b) == 1) record("tessera_unreplicated", n, res);
}

// ---------------------------------------------------------------------------------
// ScaLAPACK

#ifndef TESSERA_BENCH_NO_SCALAPACK
// Global index of local index l in a block-cyclic dim (block nb, this process iproc of
// nprocs, source 0).
inline index_t global_of(int l, int nb, int iproc, int nprocs) {
  return index_t(l / nb) * nprocs * nb + index_t(iproc) * nb + l % nb;
}

void run_scalapack(benchmark::State& state, int pr, int pc, int nb_req, index_t n) {
  mpi_communicator& world = *world_ptr;
  const int ni = int(n);
  // nb_req 0: one block per process and dim (mb = n / pr, nb = n / pc).
  const int mb = nb_req ? nb_req : ni / pr, nb = nb_req ? nb_req : ni / pc;
  int ctxt = 0, nprow = 0, npcol = 0, myrow = 0, mycol = 0;
  Cblacs_get(-1, 0, &ctxt);
  Cblacs_gridinit(&ctxt, "Row", pr, pc);
  Cblacs_gridinfo(ctxt, &nprow, &npcol, &myrow, &mycol);
  const int zero = 0, one = 1;
  const int mloc = numroc_(&ni, &mb, &myrow, &zero, &nprow);
  const int nloc = numroc_(&ni, &nb, &mycol, &zero, &npcol);
  const int lld = std::max(1, mloc);
  int desc[9], info = 0;
  descinit_(desc, &ni, &ni, &mb, &nb, &zero, &zero, &ctxt, &lld, &info);
  if (!all_ranks(info == 0)) {
    state.SkipWithError("descinit_ failed");
    for (auto _ : state) {}
    Cblacs_gridexit(ctxt);
    return;
  }
  // Column-major local arrays.
  std::vector<float> a(std::size_t(lld) * nloc), b(a.size()), c(a.size());
  for (int j = 0; j < nloc; ++j) {
    const index_t gj = global_of(j, nb, mycol, npcol);
    for (int i = 0; i < mloc; ++i) {
      const index_t gi = global_of(i, mb, myrow, nprow);
      a[std::size_t(j) * lld + i] = a_at(gi, gj);
      b[std::size_t(j) * lld + i] = b_at(gi, gj);
    }
  }
  const float alpha = 1.0f, beta = 0.0f;
  auto product = [&] {
    psgemm_("N", "N", &ni, &ni, &ni, &alpha, a.data(), &one, &one, desc, b.data(), &one, &one,
            desc, &beta, c.data(), &one, &one, desc);
  };
  product();  // warm-up and check
  bool ok = true;
  const int pts[][2] = {{0, 0}, {mloc - 1, nloc - 1}, {mloc / 2, nloc / 3}};
  for (const auto& pt : pts)
    if (mloc > 0 && nloc > 0)
      ok = ok && close(c[std::size_t(pt[1]) * lld + pt[0]],
                       c_at(global_of(pt[0], mb, myrow, nprow), global_of(pt[1], nb, mycol, npcol), n));
  if (!all_ranks(ok)) {
    state.SkipWithError("wrong entries of C");
    for (auto _ : state) {}
    Cblacs_gridexit(ctxt);
    return;
  }
  double sum = 0;
  for (auto _ : state) {
    world.barrier();
    const double t0 = MPI_Wtime();
    product();
    double t[1] = {MPI_Wtime() - t0};
    max_over_ranks(t);
    state.SetIterationTime(t[0]);
    sum += t[0];
  }
  set_rate_counters(state, n, sum / double(state.iterations()));
  Cblacs_gridexit(ctxt);
  record("scalapack", n,
         {std::to_string(pr) + "x" + std::to_string(pc) + " nb=" +
              (nb_req ? std::to_string(nb_req) : "block"),
          gflops_of(n, sum / double(state.iterations()))});
}
#endif

// ---------------------------------------------------------------------------------
// One process, P threads

void run_blas_single(benchmark::State& state, index_t n) {
  mpi_communicator& world = *world_ptr;
  const bool root = world.rank() == 0;
  const int nn = int(n);
  std::vector<float> a, b, c;
  if (root) {
    a.resize(std::size_t(n) * n), b.resize(a.size()), c.resize(a.size());
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < n; ++j) a[i * n + j] = a_at(i, j), b[i * n + j] = b_at(i, j);
    openblas_set_num_threads(world.size());
  }
  auto product = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nn, nn, nn, 1.0f, a.data(), nn,
                b.data(), nn, 0.0f, c.data(), nn);
  };
  if (root) product();
  bool ok = true;
  if (root)
    for (index_t pt : {index_t(0), n - 1, n / 3})
      ok = ok && close(c[pt * n + (n - 1 - pt)], c_at(pt, n - 1 - pt, n));
  const bool all_ok = all_ranks(ok);
  double sum = 0;
  if (all_ok)
    for (auto _ : state) {
      idle_barrier();
      double t[1] = {0};
      if (root) {
        const double t0 = MPI_Wtime();
        product();
        t[0] = MPI_Wtime() - t0;
      }
      idle_barrier();
      max_over_ranks(t);
      state.SetIterationTime(t[0]);
      sum += t[0];
    }
  if (root) openblas_set_num_threads(1);
  if (!all_ok) {
    state.SkipWithError("wrong entries of C");
    for (auto _ : state) {}
    return;
  }
  set_rate_counters(state, n, sum / double(state.iterations()));
  state.counters["threads"] = world.size();
  record("blas_single", n, {std::to_string(world.size()) + " threads", gflops_of(n, sum / double(state.iterations()))});
}

// Discards results on ranks other than 0 (every rank runs every benchmark).
class null_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// ---------------------------------------------------------------------------------

template <class F>
void add(const std::string& name, F f) {
  benchmark::RegisterBenchmark(name.c_str(), f)
      ->UseManualTime()
      ->Iterations(iterations)
      ->Unit(benchmark::kMillisecond);
}

void register_all(int p, const std::vector<index_t>& sizes) {
  for (index_t n : sizes) {
    std::string ns = "/";  // appended, not "/" + s: sidesteps a false -Wrestrict in g++ 12
    ns += std::to_string(n);
    for (int m = 1; m <= p; ++m)
      for (int k = 1; m * k <= p; ++k) {
        if (p % (m * k) != 0) continue;
        const int nn = p / (m * k);
        const strategy st{{m, k}, {k, nn}};
        if (n % m || n % k || n % nn) continue;
        add("tessera/" + to_string(st) + ns, [st, n](benchmark::State& s) { run_tessera(s, st, n); });
      }
#ifndef TESSERA_BENCH_NO_SCALAPACK
    for (int pr = 1; pr <= p; ++pr) {
      if (p % pr) continue;
      const int pc = p / pr;
      const std::string grid = "scalapack/" + std::to_string(pr) + "x" + std::to_string(pc);
      add(grid + "/nb=64" + ns, [pr, pc, n](benchmark::State& s) { run_scalapack(s, pr, pc, 64, n); });
      if (n % pr == 0 && n % pc == 0)
        add(grid + "/nb=block" + ns,
            [pr, pc, n](benchmark::State& s) { run_scalapack(s, pr, pc, 0, n); });
    }
#endif
    add("blas_single/" + std::to_string(p) + " threads" + ns,
        [n](benchmark::State& s) { run_blas_single(s, n); });
  }
}

std::string table(int p) {
  std::ostringstream o;
  char line[512];
  std::snprintf(line, sizeof line, "bench_matmul: C = A x B, fp32, n x n, P = %d ranks; GFLOP/s of the slowest rank\n", p);
  o << line;
  std::snprintf(line, sizeof line, "%6s  %-22s %8s %9s %9s %10s  %-16s %8s  %-10s %8s  %9s %9s\n", "n",
                "best tessera", "GFLOP/s", "compute", "comm", "direct", "best scalapack", "GFLOP/s",
                "single", "GFLOP/s", "t/scalap", "t/single");
  o << line;
  for (const auto& [n, kinds] : best) {
    auto get = [&](const char* k) {
      auto it = kinds.find(k);
      return it == kinds.end() ? result{"-", 0} : it->second;
    };
    const result t = get("tessera"), s = get("scalapack"), b = get("blas_single");
    const result u = get("tessera_unreplicated");
    std::snprintf(line, sizeof line,
                  "%6lld  %-22s %8.1f %7.1fms %7.1fms %8.1fms  %-16s %8.1f  %-10s %8.1f  %9.3f %9.3f\n",
                  (long long)n, t.name.c_str(), t.gflops, t.compute_ms, t.comm_ms, t.direct_ms,
                  s.name.c_str(), s.gflops, b.name.c_str(), b.gflops,
                  s.gflops > 0 ? t.gflops / s.gflops : 0.0, b.gflops > 0 ? t.gflops / b.gflops : 0.0);
    o << line;
    std::snprintf(line, sizeof line,
                  "%6s  %-22s %8.1f %7.1fms %7.1fms %8.1fms  (inputs not replicated: %.3f x scalapack, %.3f x single)\n",
                  "", u.name.c_str(), u.gflops, u.compute_ms, u.comm_ms, u.direct_ms,
                  s.gflops > 0 ? u.gflops / s.gflops : 0.0, b.gflops > 0 ? u.gflops / b.gflops : 0.0);
    o << line;
  }
  o << "Second line per size: the best strategy whose inputs hold n^2 / P elements per rank each,\n"
       "the data volume ScaLAPACK holds (the first line's strategy may replicate A or B).\n";
  if (unsigned(p) > std::thread::hardware_concurrency())
    o << "WARNING: " << p << " ranks on " << std::thread::hardware_concurrency()
      << " hardware threads: ranks take turns, and a rank's own interval (the slowest of which\n"
         "is reported) no longer covers the job's wall time; these GFLOP/s are not comparable.\n";
  o << "compute = ops::matmul (local product), comm = resolution of the partial sums, direct = one\n"
       "sgemm on the same local shards; slowest rank each, mean of the timed iterations.\n";
  return o.str();
}

std::vector<index_t> parse_sizes(const std::string& s) {
  std::vector<index_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<index_t> sizes{1024, 2048, 4096};
  std::string table_out;
  bool to_file = false;  // --benchmark_out: every rank must run with a file reporter
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--sizes=", 0) == 0) sizes = parse_sizes(a.substr(8));
    else if (a.rfind("--table_out=", 0) == 0) table_out = a.substr(12);
    else args.push_back(argv[i]);
    to_file |= a.rfind("--benchmark_out=", 0) == 0;
  }
  int nargs = int(args.size());
  args.push_back(nullptr);
  char** av = args.data();
  return run_mpi(nargs, av, [&](mpi_communicator& world) {
    world_ptr = &world;
    // Only rank 0 writes --benchmark_out; the others send their copy nowhere.
    static char null_out[] = "--benchmark_out=/dev/null";
    if (world.rank() != 0)
      for (int i = 1; i < nargs; ++i)
        if (std::string(av[i]).rfind("--benchmark_out=", 0) == 0) av[i] = null_out;
    openblas_set_num_threads(1);  // one core per rank
    benchmark::Initialize(&nargs, av);
    register_all(world.size(), sizes);
    if (world.rank() == 0) {
      benchmark::RunSpecifiedBenchmarks();
      const std::string t = table(world.size());
      std::fputs(t.c_str(), stdout);
      if (!table_out.empty()) std::ofstream(table_out) << t;
    } else {
      null_reporter quiet;
      if (to_file) benchmark::RunSpecifiedBenchmarks(&quiet, &quiet);
      else benchmark::RunSpecifiedBenchmarks(&quiet);
    }
    benchmark::Shutdown();
  });
}
