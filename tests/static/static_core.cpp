// Compile-time tests of the layout algebra (core/) and of dist_tensor's static
// shapes: the same functions as the run-time tests, evaluated by the compiler.
#include <array>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/tensor/dist_tensor.hpp>

namespace tessera::static_core_test {

// ---- mesh ---------------------------------------------------------------------------

inline constexpr mesh m24{2, 4};

static_assert(m24.size() == 8);
static_assert(mesh{2, 2, 2}.size() == 8);
static_assert(mesh{3, 1, 2}.size() == 6);
static_assert(m24.extent(1) == 4);
static_assert(m24 == mesh{2, 4});
static_assert(!(m24 == mesh{4, 2}));
static_assert(m24.coords(5) == mesh_coords{1, 1});
static_assert(m24.coords(3) == mesh_coords{0, 3});
static_assert(m24.rank_of({1, 2}) == 6);

constexpr bool coords_round_trip(const mesh& m) {
  for (int r = 0; r < m.size(); ++r)
    if (m.rank_of(m.coords(r)) != r) return false;
  return true;
}
static_assert(coords_round_trip(mesh{8}));
static_assert(coords_round_trip(mesh{2, 4}));
static_assert(coords_round_trip(mesh{2, 2, 2}));
static_assert(coords_round_trip(mesh{3, 1, 2}));

// Ranks 0-3 have coordinate 0 on axis 0 (the seed's order).
constexpr bool first_row_is_ranks_0_to_3() {
  for (int r = 0; r < 8; ++r)
    if ((m24.coords(r)[0] == 0) != (r < 4)) return false;
  return true;
}
static_assert(first_row_is_ranks_0_to_3());

static_assert(check(m24).ok());
static_assert(check(mesh{}) == fail(errc::mesh_ndim, -1, -1, 0, max_mesh_ndim));
static_assert(check(mesh{1, 1, 1, 1, 1, 1, 1}).code == errc::mesh_ndim);
static_assert(check(mesh{2, 0}) == fail(errc::mesh_axis_size, -1, 1, 0));
static_assert(check_mesh_size(m24, 8).ok());
static_assert(check_mesh_size(mesh{2, 2}, 8) == fail(errc::mesh_size_mismatch, -1, -1, 4, 8));

// ---- groups ------------------------------------------------------------------------

static_assert(group_size(m24, {1}) == 4);
static_assert(group_size(m24, {}) == 1);
static_assert(group_size(m24, {1, 0}) == 8);
static_assert(group_index(m24, {1}, 5) == 1);
static_assert(group_index(m24, {0}, 5) == 1);
static_assert(group_index(m24, {1, 0}, 5) == 3);
static_assert(group_index(m24, {0, 1}, 5) == 5);
static_assert(group_color(m24, {1}, 5) == 1);
static_assert(group_color(m24, {0}, 6) == 2);
static_assert(group_member(m24, {1}, 5, 0) == 4);
static_assert(group_member(m24, {1}, 5, 3) == 7);
static_assert(group_member(m24, {0}, 5, 0) == 1);

constexpr bool group_order(const mesh& m, const axis_list& axes, int rank,
                           const std::array<int, 8>& expect, int n) {
  for (int i = 0; i < n; ++i)
    if (group_member(m, axes, rank, i) != expect[i]) return false;
  return true;
}
static_assert(group_order(m24, {1, 0}, 5, {0, 4, 1, 5, 2, 6, 3, 7}, 8));
static_assert(group_order(m24, {1}, 5, {4, 5, 6, 7}, 4));
static_assert(group_order(m24, {0}, 5, {1, 5}, 2));

constexpr bool member_index_inverse(const mesh& m, const axis_list& axes) {
  for (int r = 0; r < m.size(); ++r) {
    if (group_member(m, axes, r, group_index(m, axes, r)) != r) return false;
    for (int i = 0; i < group_size(m, axes); ++i)
      if (group_index(m, axes, group_member(m, axes, r, i)) != i) return false;
  }
  return true;
}
static_assert(member_index_inverse(mesh{2, 2, 2}, {2, 0}));
static_assert(member_index_inverse(mesh{3, 1, 2}, {0, 2, 1}));
static_assert(member_index_inverse(mesh{4, 2}, {}));

// ---- layout checks -----------------------------------------------------------------

inline constexpr layout blocks{m24, {{0}, {1}}};

static_assert(check(blocks).ok());
static_assert(check(blocks, extents{16, 32}).ok());
static_assert(check(blocks, extents{16, dynamic_extent}).ok());
static_assert(check(layout(m24, {{0}, {0}})) == fail(errc::axis_used_twice, 1, 0));
static_assert(check(layout(m24, {{1, 1}, {}})) == fail(errc::axis_used_twice, 0, 1));
static_assert(check(layout(m24, {{0}, {2}})) == fail(errc::axis_out_of_range, 1, 2, 2));
static_assert(check(layout(m24, {{0}, {}}).with_partial(2)) == fail(errc::partial_axis_out_of_range, -1, 2, 2));
static_assert(check(blocks.with_partial(1)) == fail(errc::partial_axis_splits, 1, 1));
static_assert(check(layout(m24, {{0}, {}}).with_partial(1, reduce_op::mean)).code == errc::partial_op);
static_assert(check(blocks, extents{16, 30}) == fail(errc::dim_not_divisible, 1, 1, 30, 4));
static_assert(check(blocks, extents{16}) == fail(errc::shape_ndim, -1, -1, 1, 2));
static_assert(check(blocks, extents{-4, 32}) == fail(errc::negative_extent, 0, -1, -4));
static_assert(check(layout(mesh{2, 0}, {{0}})).code == errc::mesh_axis_size);

static_assert(what_must_hold(errc::dim_not_divisible) ==
              "layout: a tensor dim must be divisible by the product of its splits");

// ---- geometry: the header's worked examples ------------------------------------------

static_assert(local_shape(blocks, extents{16, 32}) == extents{8, 8});
static_assert(local_size(blocks, extents{16, 32}) == 64);
static_assert(local_offset(blocks, extents{16, 32}, 5) == extents{8, 8});
static_assert(local_offset(blocks, extents{16, 32}, 7) == extents{8, 24});
static_assert(piece_index(layout(m24, {{1, 0}, {}}), 0, 5) == 3);
static_assert(local_offset(layout(m24, {{1, 0}, {}}), extents{16, 32}, 5) == extents{6, 0});
static_assert(local_shape(layout(m24, {{0}, {}}).with_partial(1), extents{16, 32}) == extents{8, 32});
static_assert(shard_box(blocks, extents{16, 32}, 5) == box{extents{8, 8}, extents{8, 8}});
static_assert(intersect(box{extents{0, 0}, extents{8, 8}}, box{extents{4, 6}, extents{8, 8}}) ==
              box{extents{4, 6}, extents{4, 2}});
static_assert(intersect(box{extents{0}, extents{4}}, box{extents{6}, extents{2}}).shape == extents{0});

// The shards of every layout of a 4 x 4 matrix on mesh (2, 2) cover each element once
// per copy (a copy: the ranks that agree on the replica and partial axes).
constexpr bool tiles_once(const layout& l, const extents& g) {
  const axis_mask copy_axes = l.replica_axes() | l.partial;
  for (int r0 = 0; r0 < l.dev.size(); ++r0) {
    std::array<int, 16> count{};
    for (int r = 0; r < l.dev.size(); ++r) {
      bool same_copy = true;
      for (int a = 0; a < l.dev.ndim; ++a)
        if ((copy_axes >> a & 1u) && l.dev.coords(r)[a] != l.dev.coords(r0)[a]) same_copy = false;
      if (!same_copy) continue;
      const box b = shard_box(l, g, r);
      for (index_t i = 0; i < b.shape[0]; ++i)
        for (index_t j = 0; j < b.shape[1]; ++j) ++count[(b.offset[0] + i) * g[1] + b.offset[1] + j];
    }
    for (int c : count)
      if (c != 1) return false;
  }
  return true;
}
constexpr bool every_layout_tiles() {
  bool ok = true;
  for_each_layout(mesh{2, 2}, 2, true, [&](const layout& l) { ok = ok && tiles_once(l, extents{4, 4}); });
  return ok;
}
static_assert(every_layout_tiles());

// ---- enumeration ------------------------------------------------------------------

constexpr int count_layouts(const mesh& m, int ndim, bool partial) {
  int n = 0;
  for_each_layout(m, ndim, partial, [&](const layout&) { ++n; });
  return n;
}
static_assert(count_layouts(mesh{2, 2}, 2, true) == 18);
static_assert(count_layouts(mesh{2, 2}, 2, false) == 11);
static_assert(count_layouts(mesh{2, 2, 2}, 3, true) == 176);

template <int N>
constexpr bool all_distinct_and_valid(const mesh& m, int ndim, bool partial) {
  std::array<layout, N> seen{};
  int n = 0;
  bool ok = true;
  for_each_layout(m, ndim, partial, [&](const layout& l) {
    ok = ok && n < N && check(l).ok();
    for (int i = 0; ok && i < n; ++i) ok = !(seen[i] == l);
    if (ok) seen[n++] = l;
  });
  return ok && n == N;
}
static_assert(all_distinct_and_valid<18>(mesh{2, 2}, 2, true));
static_assert(all_distinct_and_valid<176>(mesh{2, 2, 2}, 3, true));

// ---- strategies and tensor maps -------------------------------------------------------

static_assert(check(split_tuple{2, 4}, 8).ok());
static_assert(check(split_tuple{2, 0}, 8) == fail(errc::strategy_split, 0, 1, 0));
static_assert(check(split_tuple{2, 3}, 8) == fail(errc::strategy_device_num, 0, -1, 6, 8));
static_assert(check(strategy{{2, 4}, {3, 1}}, 8) == fail(errc::strategy_device_num, 1, -1, 3, 8));
static_assert(strategy_layout(split_tuple{2, 1}, 8) == layout(mesh{4, 2, 1}, {{1}, {2}}));
static_assert(strategy_layout(split_tuple{2, 4}, 8) == layout(mesh{2, 4}, {{0}, {1}}));
static_assert(check(strategy_layout(split_tuple{}, 1)).ok());
static_assert(shard_layout<split_tuple{2, 4}, 8> == blocks);
static_assert(shard_layout<split_tuple{2, 1}, 8>.dev == mesh{4, 2, 1});
static_assert(to_split_tuple(shard_layout<split_tuple{2, 1}, 8>) == split_tuple{2, 1});
static_assert(to_split_tuple(layout(m24, {{1, 0}, {}})) == split_tuple{8, 1});

static_assert(from_tensor_map(mesh{2, 4, 1}, tensor_map{2, 1}) == layout(mesh{2, 4, 1}, {{0}, {1}}));
static_assert(from_tensor_map(mesh{2, 4, 1}, tensor_map{1, 0}) == layout(mesh{2, 4, 1}, {{1}, {2}}));
static_assert(from_tensor_map(m24, tensor_map{-1, 0}) == layout(m24, {{}, {1}}));
static_assert(from_tensor_map(mesh{2, 4, 1}, tensor_map{{2, 1}, {}}) == layout(mesh{2, 4, 1}, {{0, 1}, {}}));
static_assert(to_tensor_map(blocks) == tensor_map{1, 0});
static_assert(to_tensor_map(layout(m24, {{1, 0}, {}})) == tensor_map{{0, 1}, {}});
static_assert(check(tensor_map{2, 0}, m24) == fail(errc::tensor_map_value, 0, -1, 2, 2));

constexpr bool tensor_map_round_trip(const mesh& m, int ndim) {
  bool ok = true;
  for_each_layout(m, ndim, false, [&](const layout& l) {
    ok = ok && check(to_tensor_map(l), m).ok() && from_tensor_map(m, to_tensor_map(l)) == l;
  });
  return ok;
}
static_assert(tensor_map_round_trip(m24, 2));
static_assert(tensor_map_round_trip(mesh{2, 2, 2}, 3));

// ---- dist_tensor's static shapes ------------------------------------------------------

using blocks_16x32 = dist_tensor<float, layout(mesh{2, 4}, {{0}, {1}}), extents{16, 32}>;
static_assert(blocks_16x32::static_local_shape() == extents{8, 8});
static_assert(blocks_16x32::static_layout && blocks_16x32::static_shape);
static_assert(dist_tensor<double, shard_layout<split_tuple{2, 1}, 8>, extents{16, 4}>::static_local_shape() ==
              extents{8, 4});
static_assert(dist_tensor<float, blocks>::static_layout && !dist_tensor<float, blocks>::static_shape);
static_assert(!dist_tensor<float>::static_layout && !dist_tensor<float>::static_shape);

}  // namespace tessera::static_core_test
