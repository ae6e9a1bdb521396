// docs/concepts.md: its opening example (static layouts on the device matrix (2, 4), a
// tensor whose shard shape the compiler checks, a redistribution the compiler plans),
// then the statements of the page's list, checked. mpiexec -n 8 concepts
// ranks: 8
#include <string>
#include <string_view>

// [example]
#include <iostream>
#include <tessera/tessera.hpp>
#include <tessera/comm/launch.hpp>
using namespace tessera;

constexpr mesh dev{2, 4};                       // device matrix: 8 ranks, row-major
constexpr layout blocks(dev, {{0}, {1}});       // rows over mesh axis 0, columns over axis 1
constexpr layout rows8(dev, {{1, 0}, {}});      // rows over both axes, axis 1 major

int main(int argc, char** argv) {
  return run(argc, argv, [](any_communicator& world) {  // mpiexec -n 8
    mesh_comm mc(dev, world);                   // the mesh's process groups (throws unless 8 ranks)
    dist_tensor<float, blocks, extents{16, 32}> x(world.rank());  // shard (8, 8), checked by the compiler
    static_assert(decltype(x)::static_local_shape() == extents{8, 8});
    x.fill_global([](const auto& i) { return float(i[0] * 32 + i[1]); });

    constexpr const plan& p = static_plan<blocks, rows8, extents{16, 32}, float>;  // planned by the compiler
    if (world.rank() == 0) std::cout << to_string(p);  // one exchange, 256 bytes per rank
    auto y = redistribute<rows8>(x, mc);        // runs p; y's shard is (2, 32)
    static_assert(decltype(y)::static_local_shape() == extents{2, 32});

    const extents off = y.local_offset();       // rank 5 holds piece 1 * 2 + 1 = 3: rows 6..8
    for (index_t i = 0; i < 2; ++i)
      for (index_t j = 0; j < 32; ++j)
        if (y.local()(i, j) != float((off[0] + i) * 32 + j)) throw error("concepts: y is not x");
  });
}
// [/example]

// ---- the page's list, checked --------------------------------------------------------

// The example's plan: one point-to-point exchange, 256 bytes per rank.
static_assert(static_plan<blocks, rows8, extents{16, 32}, float>.size() == 1);
static_assert(static_plan<blocks, rows8, extents{16, 32}, float>[0].kind == step_kind::exchange);
static_assert(static_plan<blocks, rows8, extents{16, 32}, float>.bytes_per_rank() == 256);

// Mesh: row-major, last axis fastest; ranks 0-3 have coordinate 0 on axis 0; the groups
// over axis 1 are {0,1,2,3} {4,5,6,7}.
static_assert(dev.size() == 8 && dev.coords(5)[0] == 1 && dev.coords(5)[1] == 1);
static_assert([] {
  for (int r = 0; r < 8; ++r)
    if ((dev.coords(r)[0] == 0) != (r < 4)) return false;
  return true;
}());
static_assert([] {
  for (int r = 0; r < 8; ++r)
    for (int i = 0; i < 4; ++i)
      if (group_member(dev, axis_list{1}, r, i) != (r / 4) * 4 + i) return false;
  return true;
}());

// Layout: layout(dev, {{0}, {}}).with_partial(1): rows split over axis 0, partial sums
// over the 4 ranks of axis 1.
constexpr layout matmul_out = layout(dev, {{0}, {}}).with_partial(1);
static_assert(matmul_out.split[0] == axis_list{0} && matmul_out.split[1].empty());
static_assert(matmul_out.is_partial(1) && !matmul_out.is_partial(0) && matmul_out.op == reduce_op::sum);
static_assert(group_size(dev, axis_list{1}) == 4 && matmul_out.replica_axes() == 0);

// Slice geometry: the piece of a dim a rank holds is the mixed-radix number of its
// coordinates on the axes splitting that dim (rows8: axis 1 major); dims divide evenly.
static_assert([] {
  for (int r = 0; r < 8; ++r) {
    const mesh_coords c = dev.coords(r);
    const box b = shard_box(rows8, extents{16, 32}, r);
    if (b.offset != extents{(c[1] * 2 + c[0]) * 2, 0} || b.shape != extents{2, 32}) return false;
    if (local_offset(blocks, extents{16, 32}, r) != extents{c[0] * 8, c[1] * 8}) return false;
  }
  return true;
}());

// Strategies and tensor maps.
static_assert(strategy{{2, 4}, {4, 1}}[0] == split_tuple{2, 4});
static_assert(strategy_layout(split_tuple{2, 1}, 8).dev == mesh{4, 2, 1});
static_assert(from_tensor_map(mesh{2, 4, 1}, tensor_map{2, 1}) == layout(mesh{2, 4, 1}, {{0}, {1}}));
static_assert(from_tensor_map(mesh{2, 4, 1}, tensor_map{1, 0}) == layout(mesh{2, 4, 1}, {{1}, {2}}));
static_assert(to_tensor_map(layout(mesh{2, 4, 1}, {{0}, {1}})) == tensor_map{2, 1});

// One algebra, two binding times: the compiler's status and the run-time error's text.
static_assert(check(blocks, extents{16, 30}) == status{errc::dim_not_divisible, 1, 1, 30, 4});
static_assert(what_must_hold(errc::dim_not_divisible) ==
              "layout: a tensor dim must be divisible by the product of its splits");

namespace {

void expect(bool holds, const std::string& what) {
  if (!holds) throw error("concepts: " + what);
}

template <class F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "(no error)";
}

// The statements only a run can check; run as the program starts, on every rank.
[[maybe_unused]] const bool statements_hold = [] {
  expect(format_groups(dev, axis_list{1}) == "{0,1,2,3} {4,5,6,7}", "the groups over axis 1");
  expect(parse_strategy("((2, 4), (4, 1))") == strategy{{2, 4}, {4, 1}}, "parse_strategy");
  const std::string_view want =
      "dist_tensor: layout: a tensor dim must be divisible by the product of its splits: "
      "dim 1 has extent 30, split into 4 pieces";
  const std::string static_layout = error_text([] { dist_tensor<float, blocks> t(extents{16, 30}, 0); });
  const std::string dynamic_layout = error_text([] { dist_tensor<float> t(blocks, extents{16, 30}, 0); });
  expect(static_layout == want, "dist_tensor<float, L>'s error: " + static_layout);
  expect(dynamic_layout == want, "dist_tensor<float>'s error: " + dynamic_layout);
  return true;
}();

}  // namespace
