// Redistribution demo: on a 2 x 2 mesh of 4 ranks, moves a 8 x 8 matrix through the
// transitions of DESIGN.md's table, prints each plan (computed by the compiler for
// static layouts), runs it, and checks every rank's shard against the slice geometry
// and the bytes moved against the plan.
//
//   mpiexec -n 4 redistribute_demo
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>
#include <tessera/tessera.hpp>

using namespace tessera;

namespace {

constexpr mesh dev{2, 2};
constexpr extents shape{8, 8};
constexpr float value(index_t i, index_t j) { return float(i * 8 + j); }

// Prints one line per rank, in rank order, from rank 0 (lines are gathered, so the
// output does not depend on how mpiexec interleaves the ranks' streams).
void print_in_order(mpi_communicator& world, const std::string& line) {
  constexpr std::size_t width = 200;
  std::vector<char> mine(width, '\0'), all(width * world.size());
  line.copy(mine.data(), width - 1);
  world.all_gather(std::span<const char>(mine), std::span<char>(all));
  if (world.rank() == 0)
    for (int r = 0; r < world.size(); ++r) std::cout << all.data() + r * width;
  std::cout << std::flush;
}

// Checks a shard against the global matrix; returns the number of wrong elements.
template <class Tensor>
int count_wrong(const Tensor& t) {
  const extents off = t.local_offset(), ls = t.local_shape();
  int wrong = 0;
  for (index_t i = 0; i < ls[0]; ++i)
    for (index_t j = 0; j < ls[1]; ++j)
      if (t.local()(i, j) != value(off[0] + i, off[1] + j)) ++wrong;
  return wrong;
}

template <layout From, layout To>
int demo_step(const char* title, const dist_tensor<float, From, shape>& x,
              dist_tensor<float, To, shape>& y, mesh_comm<mpi_communicator>& mc) {
  constexpr const plan& p = static_plan<From, To, shape, float>;
  if (mc.rank() == 0) std::cout << "\n== " << title << "\n" << to_string(p);
  mc.reset_stats();
  y = redistribute<To>(x, mc);
  const index_t moved = mc.total_stats().bytes;
  int wrong = 0;
  if constexpr (!To.has_partial()) wrong = count_wrong(y);
  char line[200];
  const extents ls = y.local_shape(), off = y.local_offset();
  std::snprintf(line, sizeof line, "  rank %d: shard (%lld, %lld) at (%lld, %lld), moved %lld bytes (plan: %lld), %s\n",
                mc.rank(), (long long)ls[0], (long long)ls[1], (long long)off[0], (long long)off[1],
                (long long)moved, (long long)p.bytes_for_rank(mc.rank()),
                wrong == 0 && moved == p.bytes_for_rank(mc.rank()) ? "ok" : "MISMATCH");
  print_in_order(mc.world(), line);
  return wrong + (moved != p.bytes_for_rank(mc.rank()));
}

}  // namespace

int main(int argc, char** argv) {
  return run_mpi(argc, argv, [](mpi_communicator& world) {
    mesh_comm<mpi_communicator> mc(dev, world);  // throws unless run on 4 ranks
    constexpr layout replicated = layout::replicated(dev, 2);
    constexpr layout rows(dev, {{0}, {}});            // rows over mesh axis 0
    constexpr layout blocks(dev, {{0}, {1}});         // 2 x 2 blocks
    constexpr layout cols(dev, {{}, {1, 0}});         // columns over both axes
    constexpr layout row_partial = rows.with_partial(1);  // a MatMul output: partial over axis 1

    if (world.rank() == 0)
      std::cout << "tessera redistribution demo: an 8 x 8 float matrix on mesh " << to_string(dev) << " ("
                << world.size() << " ranks)\n";

    dist_tensor<float, replicated, shape> full(world.rank());
    full.fill_global([](const auto& i) { return value(i[0], i[1]); });

    int bad = 0;
    dist_tensor<float, blocks, shape> b(world.rank());
    bad += demo_step("replicate -> split: a local slice, nothing sent", full, b, mc);
    dist_tensor<float, cols, shape> c(world.rank());
    bad += demo_step("2 x 2 blocks -> columns over both axes", b, c, mc);
    dist_tensor<float, rows, shape> r(world.rank());
    bad += demo_step("columns -> rows", c, r, mc);

    // Partial sums: each rank of a mesh row holds a share; a ReduceScatter both sums
    // them and splits the columns, at half the traffic of AllReduce + slice.
    dist_tensor<float, row_partial, shape> part(world.rank());
    const int j = group_index(dev, axis_list{1}, world.rank());
    part.fill_global([&](const auto& i) { return j == 0 ? value(i[0], i[1]) - 1.0f : 1.0f; });
    bad += demo_step("partial sums -> blocks: one ReduceScatter", part, b, mc);
    dist_tensor<float, replicated, shape> back(world.rank());
    bad += demo_step("blocks -> replicated: AllGather", b, back, mc);

    world.all_reduce(std::span<int>(&bad, 1), reduce_op::sum);
    if (world.rank() == 0)
      std::cout << "\n" << (bad == 0 ? "verified: every shard matches the slice geometry and every rank moved "
                                        "exactly the planned bytes\n"
                                      : "FAILED: " + std::to_string(bad) + " mismatches\n");
    if (bad != 0) throw error("redistribute_demo: " + std::to_string(bad) + " mismatches");
  });
}
