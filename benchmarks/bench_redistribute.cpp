// Redistribution of a 64 MiB float tensor (4096 x 4096) for the transitions of
// DESIGN.md's table, on every rank of the job:
//
//   mpiexec -n 2 bench_redistribute --benchmark_format=json
//   mpiexec -n 8 --oversubscribe bench_redistribute --benchmark_format=json
//
// Each benchmark reports `bytes_per_rank` (the plan's price, also checked against the
// communicators' count) and the time of the slowest rank. Next to tessera's plan, the
// same transition with MindSpore's default steps (AllReduce + StridedSlice for partial ->
// split, AllGather + Split for split(i) -> split(j)) runs in the same job, so the
// `naive/...` vs `tessera/...` times compare as ratios.
#include <benchmark/benchmark.h>

#include <functional>
#include <string>
#include <vector>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/plan/format.hpp>
#include "rank_reporting.hpp"

using namespace tessera;

namespace {

constexpr index_t n = 4096;  // 4096 x 4096 floats = 64 MiB

mpi_communicator* world_ptr = nullptr;

// A plan built from explicit steps (the peer's step sequences).
plan manual_plan(const layout& from, const layout& to, const extents& g,
                 std::initializer_list<std::tuple<step_kind, int, int, int>> steps) {
  plan p;
  p.from = from;
  p.to = to;
  p.global = g;
  p.elem_bytes = 4;
  layout cur = from;
  for (auto [kind, axis, dim, dim2] : steps) {
    detail::push_step(p, cur, kind, axis, dim, dim2, from.op);
    cur = p.steps[p.n - 1].after;
  }
  if (!(cur == to)) throw error("bench_redistribute: a manual plan does not reach its target");
  return p;
}

void run_plan(benchmark::State& state, const plan& p) {
  mpi_communicator& world = *world_ptr;
  mesh_comm<mpi_communicator> mc(p.from.dev, world);
  dist_tensor<float> x(p.from.without_partial(), p.global, world.rank());
  x.local().fill(1.0f);
  index_t moved = 0;
  for (auto _ : state) {
    world.barrier();
    mc.reset_stats();
    const double t0 = MPI_Wtime();
    xt::xarray<float> y = execute(p, x.local(), mc);
    double dt = MPI_Wtime() - t0;
    moved = mc.total_stats().bytes;
    world.all_reduce(std::span<double>(&dt, 1), reduce_op::max);
    state.SetIterationTime(dt);
    benchmark::DoNotOptimize(y.data());
  }
  if (moved != p.bytes_for_rank(world.rank()))
    state.SkipWithError("moved bytes differ from the plan");
  state.counters["bytes_per_rank"] = double(p.bytes_per_rank());
  state.counters["steps"] = double(p.size());
  state.SetBytesProcessed(state.iterations() * p.bytes_per_rank());
}

void add(const std::string& name, plan p) {
  benchmark::RegisterBenchmark(name.c_str(), [p](benchmark::State& s) { run_plan(s, p); })
      ->UseManualTime()
      ->Iterations(5)
      ->Unit(benchmark::kMillisecond);
}

void register_all(int nranks) {
  const mesh m{nranks};
  const extents g{n, n};
  const std::string P = "/P" + std::to_string(nranks);
  const layout rep = layout::replicated(m, 2), row(m, {{0}, {}}), col(m, {{}, {0}});
  const layout part = rep.with_partial(0);
  add("replicate_to_split/tessera" + P, plan_redistribution(rep, row, g, 4));
  add("split_to_replicate/tessera" + P, plan_redistribution(row, rep, g, 4));
  add("partial_to_replicate/tessera" + P, plan_redistribution(part, rep, g, 4));
  add("partial_to_split/tessera" + P, plan_redistribution(part, col, g, 4));
  add("partial_to_split/naive" + P,
      manual_plan(part, col, g, {{step_kind::all_reduce, 0, -1, -1}, {step_kind::slice, 0, 1, -1}}));
  add("split_to_split/tessera" + P, plan_redistribution(row, col, g, 4));
  add("split_to_split/naive" + P,
      manual_plan(row, col, g, {{step_kind::all_gather, 0, 0, -1}, {step_kind::slice, 0, 1, -1}}));
  if (nranks == 8) {
    // The seed's MatMul output on device matrix (2, 4): partial over the 4 ranks of
    // each mesh row, wanted split by columns over them.
    const mesh m2{2, 4};
    const layout from = layout(m2, {{0}, {}}).with_partial(1), to(m2, {{0}, {1}});
    add("seed_matmul_output/tessera/mesh2x4", plan_redistribution(from, to, g, 4));
    add("seed_matmul_output/naive/mesh2x4",
        manual_plan(from, to, g, {{step_kind::all_reduce, 1, -1, -1}, {step_kind::slice, 1, 1, -1}}));
  }
}

}  // namespace

int main(int argc, char** argv) {
  return run_mpi(argc, argv, [&](mpi_communicator& world) {
    world_ptr = &world;
    bench::keep_output_on_rank0(argc, argv, world.rank());
    benchmark::Initialize(&argc, argv);
    register_all(world.size());
    bench::run_on_every_rank(world.rank());
    benchmark::Shutdown();
  });
}
