// docs/redistribution.md: its opening example (a plan from partial sums to blocks on the
// device matrix (2, 4), printed, checked and run on a tensor), then the page's table
// and statements, checked. mpiexec -n 8 redistribution
// ranks: 8
#include <string>

// [example]
#include <iostream>
#include <tessera/tessera.hpp>
#include <tessera/comm/launch.hpp>
using namespace tessera;

int main(int argc, char** argv) {
  return run(argc, argv, [](any_communicator& world) {  // mpiexec -n 8
    const mesh dev{2, 4};
    const extents shape{16, 16};
    const layout from = layout(dev, {{0}, {}}).with_partial(1);  // rows over axis 0, partial sums over axis 1
    const layout to(dev, {{0}, {1}});                             // blocks of (8, 4)
    const plan p = plan_redistribution(from, to, shape, sizeof(float));
    if (world.rank() == 0) std::cout << to_string(p);
    // One reduce_scatter over the 4 ranks of each mesh row: 3/4 of the 512-byte shard.
    if (p.size() != 1 || p[0].kind != step_kind::reduce_scatter || p.bytes_per_rank() != 384)
      throw error("redistribution: expected one reduce_scatter of 384 bytes per rank");

    // x(i, j) = 16 i + j, each of the 4 ranks of a mesh row holding a quarter of it.
    dist_tensor<float> x(from, shape, world.rank());
    x.fill_global([](const auto& i) { return float(i[0] * 16 + i[1]) / 4; });
    mesh_comm mc(dev, world);                   // the mesh's process groups (throws unless 8 ranks)
    const dist_tensor<float> y(to, shape, world.rank(), execute(p, x.local(), mc));
    const extents off = y.local_offset();
    for (index_t i = 0; i < 8; ++i)
      for (index_t j = 0; j < 4; ++j)
        if (y.local()(i, j) != float((off[0] + i) * 16 + off[1] + j)) throw error("redistribution: y is not x");
    if (mc.total_stats().bytes != p.bytes_for_rank(world.rank()))  // what the communicators counted
      throw error("redistribution: the bytes received differ from the plan's");
  });
}
// [/example]

// ---- the page's table and statements, checked --------------------------------------

namespace {

constexpr mesh m24{2, 4};
constexpr extents g16{16, 16};
constexpr layout replicated = layout::replicated(m24, 2);
constexpr layout rows(m24, {{0}, {}});                 // S = 8 * 16 floats = 512 bytes
constexpr layout blocks(m24, {{0}, {1}});              // S = 8 * 4 floats = 128 bytes
constexpr layout partial_rows = rows.with_partial(1);  // S = 512 bytes
constexpr int g = 4;                                   // mesh axis 1's groups
constexpr index_t rows_bytes = local_size(rows, g16) * 4, blocks_bytes = local_size(blocks, g16) * 4;
static_assert(rows_bytes == 512 && blocks_bytes == 128);

constexpr plan plan_of(const layout& from, const layout& to) { return plan_redistribution(from, to, g16, 4); }
constexpr bool one_step(const plan& p, step_kind kind, index_t bytes) {
  return p.size() == 1 && p[0].kind == kind && p[0].axis == 1 && p.bytes_per_rank() == bytes;
}

// The table, each step over the groups of mesh axis 1 (g = 4).
static_assert(one_step(plan_of(rows, blocks), step_kind::slice, 0));
static_assert(one_step(plan_of(blocks, rows), step_kind::all_gather, (g - 1) * blocks_bytes));
static_assert(one_step(plan_of(partial_rows, rows), step_kind::all_reduce, 2 * (g - 1) * rows_bytes / g));
static_assert(one_step(plan_of(partial_rows, blocks), step_kind::reduce_scatter, (g - 1) * rows_bytes / g));
static_assert(one_step(plan_of(blocks, layout(m24, {{0, 1}, {}})), step_kind::all_to_all, (g - 1) * blocks_bytes / g));
static_assert(one_step(plan_of(rows, partial_rows), step_kind::mask, 0));
static_assert(one_step(plan_of(blocks, partial_rows), step_kind::expand, 0));
// exchange: rows over axis 0 -> rows over axis 1; each rank receives exactly the part
// of its target shard that its own shard lacks.
static_assert([] {
  const layout rows_over_1(m24, {{1}, {}});
  const plan p = plan_of(rows, rows_over_1);
  if (p.size() != 1 || p[0].kind != step_kind::exchange) return false;
  for (int r = 0; r < m24.size(); ++r) {
    const box target = shard_box(rows_over_1, g16, r);
    const box have = intersect(target, shard_box(rows, g16, r));
    if (p.bytes_for_rank(r) != (target.shape.size() - have.shape.size()) * 4) return false;
  }
  return p.bytes_per_rank() == 256;  // the most any rank receives: a whole (4, 16) shard
}());

// Partial -> split is half of AllReduce; replicate -> split moves nothing; across mesh
// axes, slices come before gathers.
static_assert(2 * plan_of(partial_rows, blocks).bytes_per_rank() == plan_of(partial_rows, rows).bytes_per_rank());
static_assert(plan_of(replicated, blocks).bytes_per_rank() == 0);
static_assert([] {
  const plan p = plan_of(rows, layout(m24, {{}, {1}}));  // (8, 16) on axis 0 -> (16, 4) on axis 1
  return p.size() == 2 && p[0].kind == step_kind::slice && p[1].kind == step_kind::all_gather &&
         p.bytes_per_rank() == 128;  // gathering first would receive 512 bytes
}());
// Ties go to fewer exchanges: an exchange from replicated to blocks would also move 0 bytes.
static_assert(step_bytes(replicated, g16, 4, step_kind::exchange, -1, blocks) == 0);
static_assert([] {
  const plan p = plan_of(replicated, blocks);
  return p.size() == 2 && p[0].kind == step_kind::slice && p[1].kind == step_kind::slice;
}());
// The byte counts are plan/cost.hpp's.
static_assert(plan_of(partial_rows, blocks).bytes_per_rank() == cost::reduce_scatter(rows_bytes, g));
static_assert(plan_of(blocks, rows).bytes_per_rank() == cost::all_gather(blocks_bytes, g));
// Between static layouts and a static shape the plan is a compile-time constant.
static_assert(static_plan<partial_rows, blocks, g16, float> == plan_of(partial_rows, blocks));

void expect(bool holds, const std::string& what) {
  if (!holds) throw error("redistribution: " + what);
}

// The printed forms; checked as the program starts, on every rank.
[[maybe_unused]] const bool printed_forms_hold = [] {
  expect(to_string(plan_of(partial_rows, blocks)) ==
             "redistribute (16, 16) on mesh (2, 4), 4-byte elements: [0, -] partial sum {1} -> [0, 1]\n"
             "  1. reduce_scatter sum  mesh axis 1, dim 1  groups {0,1,2,3} {4,5,6,7}  384 bytes/rank -> [0, 1]\n"
             "  total: 384 bytes per rank\n",
         "the printed plan");
  expect(to_string(layout(m24, {{1, 0}, {}})) == "[1.0, -]", "a layout split by two axes prints as [1.0, -]");
  expect(to_string(partial_rows) == "[0, -] partial sum {1}", "a partial layout's text");
  return true;
}();

}  // namespace
