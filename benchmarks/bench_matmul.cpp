// Sharded C = A x B (fp32, square n x n) on every rank of the job: every MatMul strategy,
// plain and with its communication overlapped, against two peers: ScaLAPACK's psgemm
// on every process grid and one process calling sgemm with as many threads as there
// are ranks.
//
//   OPENBLAS_CORETYPE=SkylakeX mpiexec -n P --bind-to none bench_matmul
//       [--sizes=1024,2048,4096] (up to 8192)  [--chunks=4] (several: --chunks=2,4,8)
//       [--iterations=3] [--rounds=1] [--table_out=FILE] [--fresh_pages] [--poll_us=1000] (pipeline_options::poll_us)
//       [google benchmark flags, e.g. --benchmark_out=FILE]
//
// --bind-to none matters for the single-process peer: OpenMPI binds each of 2 ranks to
// one core by default, and rank 0's P BLAS threads would then share that core.
// With OpenBLAS set OPENBLAS_CORETYPE to the CPU's real type where it misdetects it.
//
// Benchmarks, per size n, in this order (the peers first, so that tessera's counters
// can give ratios to them):
//   scalapack/<pr>x<pc>/nb=<nb>/<n> psgemm on a pr x pc grid, block size 64 or n / grid
//       dim ("block": one block per process and dim, the distribution of SUMMA below).
//   blas_single/<P> threads/<n>    rank 0 alone, sgemm with P threads; the others wait
//       without spinning.
//   tessera/<strategy>/<n>         every MatMul strategy ((m, k), (k, n)) with m k n = P.
//       One iteration: inputs already in the rule's layouts -> ops::matmul -> the partial
//       sums resolved to the cheapest non-partial layout among C's layout with the k
//       axis moved to dim 0 (minor), to dim 1 (minor), or left replicated (the plan the
//       planner prices lowest). compute_ms: ops::matmul; comm_ms: the resolution;
//       (comm_ms, here and below: the slowest rank's total time minus the slowest rank's
//       product time, the communication on the critical path; a rank that finishes its
//       product early and waits for a slower one is not counted as communicating);
//       direct_gemm_ms: one sgemm on the same local shards, outside the timed region
//       (local_vs_direct = compute_ms / direct_gemm_ms: the local product's overhead).
//   tessera_overlapped/<strategy>/<n>/chunks=<c>   each strategy that splits the
//       contraction dim: ops::matmul_overlapped to the same layout as the plain run,
//       the local product in c chunks (of C's columns when the k axis goes to the rows),
//       the resolution of chunk i running while chunk i + 1 is multiplied. Every iteration also runs the plain variant (paired,
//       same machine load). compute_ms: the time in the products (on the compute
//       thread); comm_ms: the exposed communication (the time beyond compute_ms); plain_*: the plain
//       run; hidden_comm_fraction = 1 - comm_ms / plain_comm_ms (the share of the plain
//       run's communication time that the pipeline hides; negative when it exposes
//       more); chunked_compute_ratio = compute_ms / plain_compute_ms (the cost of
//       cutting the product into chunks).
//   tessera_summa/<strategy>/<n>/chunks=<c>   each strategy ((pm, 1), (1, pn)): A and
//       B split like C (no replica, ScaLAPACK's block distribution on a pm x pn grid),
//       ops::matmul_summa broadcasting panels while multiplying, paired with the plain
//       variant (all-gather A and B, then ops::matmul), counters as above.
// Counters of every run: gflops (total over ranks), gflops_per_rank, bytes_per_rank (the
// plan's, or the broadcasts' for SUMMA); tessera runs add vs_psgemm_grid (the ratio to
// psgemm's best block size on the grid matching the strategy: pm x pn for
// ((pm, 1), (1, pn)); pm*pk x pn for contraction splits, the grid with as many rows of
// processes as C's rows are cut), vs_psgemm_best and vs_blas_single.
// Every time is the slowest rank's (MPI_Allreduce MAX), manual time, 3 iterations (--iterations) after
// one untimed warm-up that also checks entries of C against dot products of the
// deterministic inputs. --rounds=R runs the whole list R times, each benchmark of round
// r > 1 named with "/round:r"; rank 0's tables at the end keep the fastest round of each
// (the machines are shared: a burst of load elsewhere slows one round, not all).
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <malloc.h>

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
#include <tessera/ops/matmul_pipelined.hpp>
#include "rank_reporting.hpp"

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

int iterations = 3;  // --iterations
int poll_us = ops::pipeline_options{}.poll_us;  // --poll_us

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

// ---------------------------------------------------------------------------------
// Results, for the ratios in the counters and the tables (filled on every rank,
// printed by rank 0).

struct result {
  std::string name;
  double gflops = 0, compute_ms = 0, comm_ms = 0, direct_ms = 0;
};
// Per size: the best result of each kind ("tessera", "scalapack", ...), psgemm's best
// per grid ("2x1"), and the paired plain / pipelined rows.
std::map<index_t, std::map<std::string, result>> best;
std::map<index_t, std::map<std::string, double>> psgemm_grid;
struct pipelined_row {
  std::string kind, strategy, grid;
  int chunks = 0;
  double ms = 0, compute_ms = 0, comm_ms = 0;
  double plain_ms = 0, plain_compute_ms = 0, plain_comm_ms = 0;
  double gflops = 0, plain_gflops = 0;
};
// Per size, keyed by kind, strategy and chunks: the fastest round's row.
std::map<index_t, std::map<std::string, pipelined_row>> pipelined;
struct plain_row {
  std::string strategy, grid;
  double gflops = 0, compute_ms = 0, direct_ms = 0;
};
std::map<index_t, std::map<std::string, plain_row>> plains;  // the fastest round per strategy

// Keeps `row` under `key` when it is faster than what is there.
template <class Row>
void keep_fastest(std::map<std::string, Row>& rows, const std::string& key, const Row& row) {
  auto it = rows.find(key);
  if (it == rows.end() || row.gflops > it->second.gflops) rows[key] = row;
}

void record(const std::string& kind, index_t n, const result& r) {
  result& b = best[n][kind];
  if (r.gflops > b.gflops) b = r;
}

void set_rate_counters(benchmark::State& state, index_t n, double mean_s) {
  const int p = world_ptr->size();
  state.counters["gflops"] = gflops_of(n, mean_s);
  state.counters["gflops_per_rank"] = gflops_of(n, mean_s) / p;
}

// Ratios of a tessera result to the peers measured earlier in the run at this size.
void set_peer_ratios(benchmark::State& state, index_t n, double gflops, const std::string& grid) {
  auto it = psgemm_grid[n].find(grid);
  if (it != psgemm_grid[n].end() && it->second > 0) state.counters["vs_psgemm_grid"] = gflops / it->second;
  const result& s = best[n]["scalapack"];
  if (s.gflops > 0) state.counters["vs_psgemm_best"] = gflops / s.gflops;
  const result& b = best[n]["blas_single"];
  if (b.gflops > 0) state.counters["vs_blas_single"] = gflops / b.gflops;
}

// "2x1": the process grid on which psgemm leaves C cut as `l` cuts it (rows x columns).
std::string grid_of(const layout& l) {
  return std::to_string(l.pieces(0)) + "x" + std::to_string(l.pieces(1));
}

void skip(benchmark::State& state, const char* why) {
  state.SkipWithError(why);
  for (auto _ : state) {
  }
}

// Checks entries of this rank's shard of C (non-partial layout) against dot products.
bool check_entries(const dist_tensor<float>& c, index_t n) {
  const extents off = c.local_offset(), ls = c.local_shape();
  if (ls.v[0] == 0 || ls.v[1] == 0) return true;
  const index_t pts[][2] = {{0, 0}, {ls.v[0] - 1, ls.v[1] - 1}, {ls.v[0] / 2, ls.v[1] / 3},
                            {ls.v[0] / 3, ls.v[1] - 1}, {ls.v[0] - 1, 0}};
  bool ok = true;
  for (const auto& pt : pts)
    ok = ok && close(c.local()(pt[0], pt[1]), c_at(off.v[0] + pt[0], off.v[1] + pt[1], n));
  return ok;
}

// ---------------------------------------------------------------------------------
// tessera

// C's layout without partial sums, the k axis placed where the planner says the
// resolution is cheapest: split dim 0 (minor), split dim 1 (minor), or replicated.
ops::partial_resolution resolution_of(const matmul_layouts& r, const extents& g) {
  using ops::partial_resolution;
  partial_resolution best_how = partial_resolution::all_reduce;
  index_t best_bytes = -1;
  for (partial_resolution how : {partial_resolution::scatter_rows, partial_resolution::scatter_cols,
                                 partial_resolution::all_reduce}) {
    const layout l = ops::resolved_layout(r, how);
    if (!check(l, g).ok()) continue;
    const index_t b = plan_redistribution(r.c, l, g, 4).bytes_per_rank();
    if (best_bytes < 0 || b < best_bytes) best_bytes = b, best_how = how;
  }
  return best_how;
}

// How many ranks hold each element of a tensor in layout l (size-1 axes do not count).
int replicas(const layout& l) {
  int c = 1;
  for (int a = 0; a < l.dev.ndim; ++a)
    if (l.replica_axes() >> a & 1u) c *= l.dev.dims[a];
  return c;
}

struct plain_inputs {
  ops::matmul_op op;
  matmul_layouts r;
  extents g;
  dist_tensor<float> a, b;
  plain_inputs(const strategy& st, index_t n, int p, int rank)
      : op{st}, r(op.rule(p)), g{n, n}, a(r.a, g, rank), b(r.b, g, rank) {
    a.fill_global([](const auto& i) { return a_at(i[0], i[1]); });
    b.fill_global([](const auto& i) { return b_at(i[0], i[1]); });
  }
};

// One plain run: ops::matmul, then the resolution plan. Times (seconds) of this rank.
struct split_times {
  double total = 0, compute = 0, comm = 0;
};
template <class F>
split_times plain_run(const ops::matmul_op& op, const dist_tensor<float>& a, const dist_tensor<float>& b,
                      const plan& p, device_context<mpi_communicator>& ctx, mesh_comm<mpi_communicator>& mc,
                      F&& use) {
  const double t0 = MPI_Wtime();
  dist_tensor<float> c = ops::matmul(op, a, b, ctx);
  const double t1 = MPI_Wtime();
  xt::xarray<float> out = execute(p, std::move(c.local()), mc);
  const double t2 = MPI_Wtime();
  use(out);
  return {t2 - t0, t1 - t0, t2 - t1};
}

void run_tessera(benchmark::State& state, strategy st, index_t n) {
  mpi_communicator& world = *world_ptr;
  const int rank = world.rank();
  device_context<mpi_communicator> ctx(world);
  plain_inputs in(st, n, world.size(), rank);
  const layout target = ops::resolved_layout(in.r, resolution_of(in.r, in.g));
  const plan p = plan_redistribution(in.r.c, target, in.g, 4);
  mesh_comm<mpi_communicator>& mc = ctx.on(in.r.dev);

  // Warm-up (creates the communicators) and check.
  {
    mc.reset_stats();
    dist_tensor<float> out(target, in.g, rank);
    plain_run(in.op, in.a, in.b, p, ctx, mc, [&](xt::xarray<float>& o) { out.assign_local(std::move(o)); });
    const bool ok = mc.total_stats().bytes == p.bytes_for_rank(rank) && check_entries(out, n);
    if (!all_ranks(ok)) return skip(state, "wrong entries of C, or moved bytes differ from the plan");
  }

  // Direct sgemm on the same shards, for the overhead of ops::matmul.
  const auto& la = in.a.local();
  const auto& lb = in.b.local();
  const int lm = int(la.shape()[0]), lk = int(la.shape()[1]), ln = int(lb.shape()[1]);
  std::vector<float> direct(std::size_t(lm) * std::size_t(ln));

  double sum_total = 0, sum_compute = 0, sum_comm = 0, sum_direct = 0;
  for (auto _ : state) {
    world.barrier();
    const split_times s = plain_run(in.op, in.a, in.b, p, ctx, mc,
                                    [](xt::xarray<float>& o) { benchmark::DoNotOptimize(o.data()); });
    world.barrier();
    const double t3 = MPI_Wtime();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, lm, ln, lk, 1.0f, la.data(), lk,
                lb.data(), ln, 0.0f, direct.data(), ln);
    const double t4 = MPI_Wtime();
    double t[4] = {s.total, s.compute, 0, t4 - t3};
    max_over_ranks(t);
    t[2] = t[0] - t[1];  // communication beyond the slowest rank's product
    state.SetIterationTime(t[0]);
    sum_total += t[0], sum_compute += t[1], sum_comm += t[2], sum_direct += t[3];
  }
  const double k = double(state.iterations());
  const double gf = gflops_of(n, sum_total / k);
  set_rate_counters(state, n, sum_total / k);
  state.counters["bytes_per_rank"] = double(p.bytes_per_rank());
  state.counters["compute_ms"] = 1e3 * sum_compute / k;
  state.counters["comm_ms"] = 1e3 * sum_comm / k;
  state.counters["comm_share"] = sum_comm / sum_total;
  state.counters["direct_gemm_ms"] = 1e3 * sum_direct / k;
  state.counters["local_vs_direct"] = sum_compute / sum_direct;
  // Inputs held per rank: n^2 / P each for A and B only when neither is replicated
  // (strategy ((1, P), (P, 1))), as in ScaLAPACK; more otherwise.
  state.counters["input_bytes_per_rank"] = 4.0 * double(la.size() + lb.size());
  const std::string grid = grid_of(target);
  set_peer_ratios(state, n, gf, grid);
  state.SetLabel("resolve to " + to_string(target) + ", grid " + grid);
  const result res{to_string(st), gf, 1e3 * sum_compute / k, 1e3 * sum_comm / k, 1e3 * sum_direct / k};
  record("tessera", n, res);
  if (replicas(in.r.a) == 1 && replicas(in.r.b) == 1) record("tessera_unreplicated", n, res);
  keep_fastest(plains[n], to_string(st), plain_row{to_string(st), grid, gf, 1e3 * sum_compute / k, 1e3 * sum_direct / k});
}

// Sets the counters shared by the pipelined runs from the summed times and records
// the row. t: total, compute, exposed comm; q: the plain run's total, compute, comm.
void finish_pipelined(benchmark::State& state, const std::string& kind, const strategy& st, index_t n,
                      int chunks, const std::string& grid, double bytes, const double (&t)[3],
                      const double (&q)[3], int pieces) {
  const double k = double(state.iterations());
  const double gf = gflops_of(n, t[0] / k);
  set_rate_counters(state, n, t[0] / k);
  state.counters["bytes_per_rank"] = bytes;
  state.counters["compute_ms"] = 1e3 * t[1] / k;
  state.counters["comm_ms"] = 1e3 * t[2] / k;
  state.counters["comm_share"] = t[2] / t[0];
  state.counters["plain_ms"] = 1e3 * q[0] / k;
  state.counters["plain_compute_ms"] = 1e3 * q[1] / k;
  state.counters["plain_comm_ms"] = 1e3 * q[2] / k;
  state.counters["hidden_comm_fraction"] = q[2] > 0 ? 1.0 - t[2] / q[2] : 0.0;
  state.counters["speedup_vs_plain"] = q[0] / t[0];
  state.counters["chunked_compute_ratio"] = t[1] / q[1];
  state.counters["pieces"] = pieces;
  set_peer_ratios(state, n, gf, grid);
  record(kind, n, {to_string(st), gf, 1e3 * t[1] / k, 1e3 * t[2] / k, 0});
  keep_fastest(pipelined[n], kind + to_string(st) + std::to_string(chunks),
               pipelined_row{kind, to_string(st), grid, chunks, 1e3 * t[0] / k, 1e3 * t[1] / k, 1e3 * t[2] / k,
                                     1e3 * q[0] / k, 1e3 * q[1] / k, 1e3 * q[2] / k, gf, gflops_of(n, q[0] / k)});
}

void run_overlapped(benchmark::State& state, strategy st, index_t n, int chunks) {
  mpi_communicator& world = *world_ptr;
  const int rank = world.rank();
  device_context<mpi_communicator> ctx(world);
  plain_inputs in(st, n, world.size(), rank);
  const ops::partial_resolution how = resolution_of(in.r, in.g);
  const layout target = ops::resolved_layout(in.r, how);
  const plan p = plan_redistribution(in.r.c, target, in.g, 4);
  mesh_comm<mpi_communicator>& mc = ctx.on(in.r.dev);
  const ops::pipeline_options opt{chunks, poll_us};

  // Warm-up of both and check.
  {
    plain_run(in.op, in.a, in.b, p, ctx, mc, [](xt::xarray<float>&) {});
    const dist_tensor<float> c = ops::matmul_overlapped(in.op, in.a, in.b, ctx, how, opt);
    if (!all_ranks(c.layout() == target && check_entries(c, n))) return skip(state, "wrong entries of C");
  }
  double t[3] = {0, 0, 0}, q[3] = {0, 0, 0};
  int pieces = 0;
  for (auto _ : state) {
    world.barrier();
    const split_times s = plain_run(in.op, in.a, in.b, p, ctx, mc,
                                    [](xt::xarray<float>& o) { benchmark::DoNotOptimize(o.data()); });
    world.barrier();
    ops::pipeline_stats ps;
    const double t0 = MPI_Wtime();
    dist_tensor<float> c = ops::matmul_overlapped(in.op, in.a, in.b, ctx, how, opt, &ps);
    const double t1 = MPI_Wtime();
    benchmark::DoNotOptimize(c.local().data());
    pieces = ps.pieces;
    double v[6] = {t1 - t0, ps.compute_s, 0, s.total, s.compute, 0};
    max_over_ranks(v);
    v[2] = v[0] - v[1], v[5] = v[3] - v[4];  // beyond the slowest rank's products
    state.SetIterationTime(v[0]);
    for (int i = 0; i < 3; ++i) t[i] += v[i], q[i] += v[3 + i];
  }
  state.SetLabel("resolve to " + to_string(target) + ", grid " + grid_of(target));
  finish_pipelined(state, "tessera_overlapped", st, n, chunks, grid_of(target), double(p.bytes_per_rank()), t, q,
                   pieces);
}

void run_summa(benchmark::State& state, strategy st, index_t n, int chunks) {
  mpi_communicator& world = *world_ptr;
  const int rank = world.rank();
  device_context<mpi_communicator> ctx(world);
  const ops::matmul_op op{st};
  const matmul_layouts r = op.rule(world.size());
  const ops::summa_layouts sl = ops::summa_rule(op, world.size());
  const extents g{n, n};
  dist_tensor<float> a(sl.a, g, rank), b(sl.b, g, rank);
  a.fill_global([](const auto& i) { return a_at(i[0], i[1]); });
  b.fill_global([](const auto& i) { return b_at(i[0], i[1]); });
  mesh_comm<mpi_communicator>& mc = ctx.on(r.dev);
  const plan pa = plan_redistribution(sl.a, r.a, g, 4), pb = plan_redistribution(sl.b, r.b, g, 4);
  const ops::pipeline_options opt{chunks, poll_us};
  // The plain variant: all-gather A and B to the rule's layouts, then ops::matmul.
  auto plain = [&] {
    const double t0 = MPI_Wtime();
    const dist_tensor<float> fa(r.a, g, rank, execute(pa, a.local(), mc));
    const dist_tensor<float> fb(r.b, g, rank, execute(pb, b.local(), mc));
    const double t1 = MPI_Wtime();
    dist_tensor<float> c = ops::matmul(op, fa, fb, ctx);
    const double t2 = MPI_Wtime();
    benchmark::DoNotOptimize(c.local().data());
    return split_times{t2 - t0, t2 - t1, t1 - t0};
  };
  {
    plain();
    const dist_tensor<float> c = ops::matmul_summa(op, a, b, ctx, opt);
    if (!all_ranks(c.layout() == r.c && check_entries(c, n))) return skip(state, "wrong entries of C");
  }
  double t[3] = {0, 0, 0}, q[3] = {0, 0, 0};
  int pieces = 0;
  for (auto _ : state) {
    world.barrier();
    const split_times s = plain();
    world.barrier();
    ops::pipeline_stats ps;
    const double t0 = MPI_Wtime();
    dist_tensor<float> c = ops::matmul_summa(op, a, b, ctx, opt, &ps);
    const double t1 = MPI_Wtime();
    benchmark::DoNotOptimize(c.local().data());
    pieces = ps.pieces;
    double v[6] = {t1 - t0, ps.compute_s, 0, s.total, s.compute, 0};
    max_over_ranks(v);
    v[2] = v[0] - v[1], v[5] = v[3] - v[4];  // beyond the slowest rank's products
    state.SetIterationTime(v[0]);
    for (int i = 0; i < 3; ++i) t[i] += v[i], q[i] += v[3 + i];
  }
  state.SetLabel("A " + to_string(sl.a) + ", B " + to_string(sl.b) + ", grid " + grid_of(r.c));
  finish_pipelined(state, "tessera_summa", st, n, chunks, grid_of(r.c),
                   double(pa.bytes_per_rank() + pb.bytes_per_rank()), t, q, pieces);
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
  double& grid_best = psgemm_grid[n][std::to_string(pr) + "x" + std::to_string(pc)];
  grid_best = std::max(grid_best, gflops_of(n, sum / double(state.iterations())));
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

// ---------------------------------------------------------------------------------

template <class F>
void add(const std::string& name, F f) {
  benchmark::RegisterBenchmark(name.c_str(), f)
      ->UseManualTime()
      ->Iterations(iterations)
      ->Unit(benchmark::kMillisecond);
}

// Every benchmark, `rounds` times over (round r > 1 named with a "/round:r" suffix):
// each round samples every benchmark at another moment, and the tables keep the
// fastest round, so that a burst of load elsewhere on the machine does not decide a
// comparison.
void register_all(int p, const std::vector<index_t>& sizes, const std::vector<int>& chunk_counts, int rounds) {
  for (int round = 1; round <= rounds; ++round)
  for (index_t n : sizes) {
    std::string ns = "/";  // appended, not "/" + s: sidesteps a false -Wrestrict in g++ 12
    ns += std::to_string(n);
    const std::string rs = round > 1 ? "/round:" + std::to_string(round) : std::string();
#ifndef TESSERA_BENCH_NO_SCALAPACK
    for (int pr = 1; pr <= p; ++pr) {
      if (p % pr) continue;
      const int pc = p / pr;
      const std::string grid = "scalapack/" + std::to_string(pr) + "x" + std::to_string(pc);
      add(grid + "/nb=64" + ns + rs, [pr, pc, n](benchmark::State& s) { run_scalapack(s, pr, pc, 64, n); });
      if (n % pr == 0 && n % pc == 0)
        add(grid + "/nb=block" + ns + rs,
            [pr, pc, n](benchmark::State& s) { run_scalapack(s, pr, pc, 0, n); });
    }
#endif
    add("blas_single/" + std::to_string(p) + " threads" + ns + rs,
        [n](benchmark::State& s) { run_blas_single(s, n); });
    std::vector<strategy> all;
    for (int m = 1; m <= p; ++m)
      for (int k = 1; m * k <= p; ++k) {
        if (p % (m * k) != 0) continue;
        const int nn = p / (m * k);
        if (n % m || n % k || n % nn) continue;
        all.push_back(strategy{{m, k}, {k, nn}});
      }
    for (const strategy& st : all)
      add("tessera/" + to_string(st) + ns + rs, [st, n](benchmark::State& s) { run_tessera(s, st, n); });
    for (int chunks : chunk_counts) {
      const std::string cs = ns + "/chunks=" + std::to_string(chunks) + rs;
      for (const strategy& st : all)
        if (st.in[0].v[1] > 1)
          add("tessera_overlapped/" + to_string(st) + cs,
              [st, n, chunks](benchmark::State& s) { run_overlapped(s, st, n, chunks); });
      for (const strategy& st : all)
        if (st.in[0].v[1] == 1)
          add("tessera_summa/" + to_string(st) + cs,
              [st, n, chunks](benchmark::State& s) { run_summa(s, st, n, chunks); });
    }
  }
}

std::string table(int p) {
  std::ostringstream o;
  char line[512];
  std::snprintf(line, sizeof line, "bench_matmul: C = A x B, fp32, n x n, P = %d ranks; GFLOP/s of the slowest rank\n", p);
  o << line;
  if (unsigned(p) > std::thread::hardware_concurrency())
    o << "WARNING: " << p << " ranks on " << std::thread::hardware_concurrency()
      << " hardware threads (oversubscribed): ranks take turns on the cores, so GFLOP/s and\n"
         "times are not those of " << p << " cores; ratios measured in the same run (hidden\n"
         "communication, chunked compute) remain comparisons on the same machine.\n";
  o << "\n1. Best of each kind\n";
  std::snprintf(line, sizeof line, "%6s  %-22s %8s  %-22s %8s  %-16s %8s  %-10s %8s  %9s %9s\n", "n",
                "best tessera", "GFLOP/s", "best pipelined", "GFLOP/s", "best scalapack", "GFLOP/s",
                "single", "GFLOP/s", "t/scalap", "t/single");
  o << line;
  for (const auto& [n, kinds] : best) {
    auto get = [&](const char* k) {
      auto it = kinds.find(k);
      return it == kinds.end() ? result{"-", 0} : it->second;
    };
    const result t = get("tessera"), s = get("scalapack"), b = get("blas_single");
    const result ov = get("tessera_overlapped"), su = get("tessera_summa");
    const result pl = ov.gflops >= su.gflops ? ov : su;
    const double top = std::max(t.gflops, pl.gflops);
    std::snprintf(line, sizeof line, "%6lld  %-22s %8.1f  %-22s %8.1f  %-16s %8.1f  %-10s %8.1f  %9.3f %9.3f\n",
                  (long long)n, t.name.c_str(), t.gflops, pl.name.c_str(), pl.gflops, s.name.c_str(), s.gflops,
                  b.name.c_str(), b.gflops, s.gflops > 0 ? top / s.gflops : 0.0,
                  b.gflops > 0 ? top / b.gflops : 0.0);
    o << line;
  }
  o << "t/scalap, t/single: the better of the two tessera columns over the peer.\n";

  o << "\n2. Against psgemm on the grid where it leaves C cut as tessera's result is\n";
  std::snprintf(line, sizeof line, "%6s  %-5s %-22s %-10s %8s %9s  %s\n", "n", "grid", "strategy", "variant",
                "GFLOP/s", "x psgemm", "(psgemm: best block size on that grid)");
  o << line;
  for (const auto& [n, grids] : psgemm_grid) {
    auto row = [&](const std::string& grid, const std::string& st, const std::string& variant, double gf) {
      auto it = grids.find(grid);
      if (it == grids.end() || it->second <= 0) return;
      std::snprintf(line, sizeof line, "%6lld  %-5s %-22s %-10s %8.1f %9.3f  (psgemm %.1f)\n", (long long)n,
                    grid.c_str(), st.c_str(), variant.c_str(), gf, gf / it->second, it->second);
      o << line;
    };
    for (const auto& [key, r] : plains[n]) row(r.grid, r.strategy, "plain", r.gflops);
    for (const auto& [key, r] : pipelined[n])
      row(r.grid, r.strategy, (r.kind == "tessera_summa" ? "summa/" : "overlap/") + std::to_string(r.chunks), r.gflops);
  }

  o << "\n3. Communication hidden by the pipelined variants (paired with the plain run in each iteration)\n";
  std::snprintf(line, sizeof line, "%6s  %-10s %-22s %6s  %9s %9s %9s  %9s %9s %9s  %7s %7s %7s\n", "n", "variant",
                "strategy", "chunks", "plain ms", "compute", "comm", "pipe ms", "compute", "exposed", "hidden",
                "speedup", "chunked");
  o << line;
  for (const auto& [n, rows] : pipelined)
    for (const auto& [key, r] : rows) {
      std::snprintf(line, sizeof line,
                    "%6lld  %-10s %-22s %6d  %9.1f %9.1f %9.1f  %9.1f %9.1f %9.1f  %7.3f %7.3f %7.3f\n",
                    (long long)n, r.kind == "tessera_summa" ? "summa" : "overlapped", r.strategy.c_str(), r.chunks,
                    r.plain_ms, r.plain_compute_ms, r.plain_comm_ms, r.ms, r.compute_ms, r.comm_ms,
                    r.plain_comm_ms > 0 ? 1.0 - r.comm_ms / r.plain_comm_ms : 0.0, r.plain_ms / r.ms,
                    r.compute_ms / r.plain_compute_ms);
      o << line;
    }
  o << "hidden = 1 - exposed / plain comm; speedup = plain ms / pipelined ms; chunked = pipelined compute /\n"
       "plain compute (the cost of cutting the product). exposed = pipelined ms - its compute.\n";

  o << "\n4. The local product inside ops::matmul against one direct sgemm on the same shards\n";
  std::snprintf(line, sizeof line, "%6s  %-22s %10s %10s %8s\n", "n", "strategy", "compute ms", "direct ms", "ratio");
  o << line;
  for (const auto& [n, rows] : plains)
    for (const auto& [key, r] : rows) {
      std::snprintf(line, sizeof line, "%6lld  %-22s %10.1f %10.1f %8.3f\n", (long long)n, r.strategy.c_str(),
                    r.compute_ms, r.direct_ms, r.direct_ms > 0 ? r.compute_ms / r.direct_ms : 0.0);
      o << line;
    }
  o << "Slowest rank each, mean of the timed iterations.\n";
  return o.str();
}

template <class T>
std::vector<T> parse_list(const std::string& s) {
  std::vector<T> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(T(std::stoll(item)));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // Freed memory stays in the process for reuse (every variant allocates its result,
  // psgemm its workspace): by default glibc returns blocks over 32 MiB to the kernel,
  // and the next allocation faults every page in again, which on the virtual machines
  // these numbers come from costs about 12 us per 4 KiB page (200 ms for 64 MiB, more
  // than the product of 2 x 2048^3 flops). --fresh_pages keeps glibc's default.
  bool fresh_pages = false;
  for (int i = 1; i < argc; ++i) fresh_pages |= std::string(argv[i]) == "--fresh_pages";
  if (!fresh_pages) {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  std::vector<index_t> sizes{1024, 2048, 4096};
  std::vector<int> chunks{4};
  int rounds = 1;
  std::string table_out;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--sizes=", 0) == 0) sizes = parse_list<index_t>(a.substr(8));
    else if (a.rfind("--chunks=", 0) == 0) chunks = parse_list<int>(a.substr(9));
    else if (a.rfind("--table_out=", 0) == 0) table_out = a.substr(12);
    else if (a == "--fresh_pages") continue;
    else if (a.rfind("--poll_us=", 0) == 0) poll_us = std::stoi(a.substr(10));
    else if (a.rfind("--iterations=", 0) == 0) iterations = std::stoi(a.substr(13));
    else if (a.rfind("--rounds=", 0) == 0) rounds = std::stoi(a.substr(9));
    else args.push_back(argv[i]);
  }
  int nargs = int(args.size());
  args.push_back(nullptr);
  char** av = args.data();
  return run_mpi(nargs, av, [&](mpi_communicator& world) {
    world_ptr = &world;
    bench::keep_output_on_rank0(nargs, av, world.rank());
    openblas_set_num_threads(1);  // one core per rank
    benchmark::Initialize(&nargs, av);
    register_all(world.size(), sizes, chunks, rounds);
    if (world.rank() == 0) {
      benchmark::RunSpecifiedBenchmarks();
      const std::string t = table(world.size());
      std::fputs(t.c_str(), stdout);
      if (!table_out.empty()) std::ofstream(table_out) << t;
    } else {
      bench::run_on_every_rank(world.rank());
    }
    benchmark::Shutdown();
  });
}
