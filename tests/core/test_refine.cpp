// Tests of core/refine.hpp: common refinements of device matrices, layouts moved
// onto them with every rank's shard unchanged, and same_placement against the shards
// and partial groups of every rank.
#include <doctest/doctest.h>

#include <utility>
#include <vector>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/refine.hpp>

using namespace tessera;

TEST_CASE("common refinements") {
  CHECK(common_refinement(mesh{2, 4}, mesh{4, 2}) == mesh{2, 2, 2});
  CHECK(common_refinement(mesh{2, 4, 1}, mesh{8}) == mesh{2, 4});
  CHECK(common_refinement(mesh{8}, mesh{8}) == mesh{8});
  CHECK(common_refinement(mesh{1}, mesh{1}) == mesh{1});
  CHECK(common_refinement(mesh{4, 2, 1, 1}, mesh{2, 4}) == mesh{2, 2, 2});
  CHECK(check_refinement(mesh{2, 3}, mesh{3, 2}) == fail(errc::mesh_no_refinement, -1, -1, 3, 2));
  CHECK(std::string(error(check_refinement(mesh{2, 3}, mesh{3, 2})).what()) ==
        "mesh: two device matrices of one rank list must nest to share a refinement: suffix products 3 "
        "and 2 do not divide");
  CHECK(check_refinement(mesh{2, 4}, mesh{4}).code == errc::mesh_size_mismatch);
  // A refinement needing more axes than a mesh holds: strides 512 256 128 ... 2 1.
  CHECK(check_refinement(mesh{2, 4, 2, 4, 2, 4}, mesh{4, 2, 4, 2, 4, 2}) ==
        fail(errc::mesh_refinement_ndim, -1, -1, 9, max_mesh_ndim));
  CHECK(check_refinement(mesh{2, 4, 2, 4}, mesh{4, 2, 4, 2}).ok());  // 6 axes: fits
  CHECK(common_refinement(mesh{2, 4, 2, 4}, mesh{4, 2, 4, 2}) == mesh{2, 2, 2, 2, 2, 2});
}

TEST_CASE("refined layouts keep every rank's shard and partial group") {
  const std::vector<std::pair<mesh, mesh>> pairs = {
      {mesh{2, 4}, mesh{4, 2}}, {mesh{2, 4, 1}, mesh{8}}, {mesh{8}, mesh{2, 2, 2}},
      {mesh{4, 2}, mesh{2, 2, 2}}, {mesh{1, 4}, mesh{2, 2}}, {mesh{3, 4}, mesh{6, 2}},
  };
  int checked = 0;
  for (const auto& [coarse, other] : pairs) {
    const mesh fine = common_refinement(coarse, other);
    CAPTURE(to_string(coarse));
    CAPTURE(to_string(fine));
    for (int nd = 1; nd <= 3; ++nd) {
      extents g;
      g.ndim = nd;
      for (int d = 0; d < nd; ++d) g.v[d] = 24 * (d + 1);
      for_each_layout(coarse, nd, true, [&](const layout& l) {
        if (!check(l, g).ok()) return;
        const layout r = refine(l, fine);
        CAPTURE(to_string(l));
        CAPTURE(to_string(r));
        REQUIRE(check(r, g).ok());
        for (int k = 0; k < coarse.size(); ++k) {
          CHECK(shard_box(l, g, k) == shard_box(r, g, k));
          // Two ranks share a partial group on the coarse mesh iff they do on the fine one.
          for (int q = 0; q < coarse.size(); ++q) {
            const mesh_coords ck = coarse.coords(k), cq = coarse.coords(q);
            const mesh_coords fk = fine.coords(k), fq = fine.coords(q);
            bool same_coarse = true, same_fine = true;
            for (int a = 0; a < coarse.ndim; ++a)
              if (!l.is_partial(a) && ck[a] != cq[a]) same_coarse = false;
            for (int a = 0; a < fine.ndim; ++a)
              if (!r.is_partial(a) && fk[a] != fq[a]) same_fine = false;
            CHECK(same_coarse == same_fine);
          }
        }
        ++checked;
      });
    }
  }
  CHECK(checked >= 500);  // 542 layouts over these pairs and ranks
}

TEST_CASE("same_placement: layouts on different device matrices that put the same shard on every rank") {
  CHECK(same_placement(layout(mesh{2, 1, 1}, {{0}, {2}}), layout(mesh{2, 1}, {{0}, {}})));
  CHECK(same_placement(layout(mesh{2, 1}, {{0}, {}}), layout(mesh{2}, {{0}, {}})));
  CHECK(same_placement(layout::replicated(mesh{8}, 2), layout::replicated(mesh{2, 4, 1}, 2)));
  CHECK(same_placement(layout(mesh{8}, {{0}, {}}), layout(mesh{2, 4}, {{0, 1}, {}})));
  CHECK(!same_placement(layout(mesh{8}, {{0}, {}}), layout(mesh{2, 4}, {{1, 0}, {}})));  // another order
  CHECK(!same_placement(layout(mesh{2}, {{0}, {}}), layout::replicated(mesh{2}, 2)));
  CHECK(!same_placement(layout(mesh{2}, {{0}, {}}), layout(mesh{2}, {{}, {0}})));
  CHECK(!same_placement(layout::replicated(mesh{2}, 2), layout::replicated(mesh{2}, 2).with_partial(0)));
  CHECK(!same_placement(layout(mesh{2, 4}, {{0}, {}}), layout(mesh{2, 4}, {{0}, {}}).with_partial(1)));
  CHECK(!same_placement(layout::replicated(mesh{4}, 2), layout::replicated(mesh{8}, 2)));
  CHECK(!same_placement(layout(mesh{2, 3}, {{0}, {}}), layout(mesh{3, 2}, {{0}, {}})));
  CHECK(!same_placement(layout(mesh{2, 3}, {{0}, {1}}), layout(mesh{3, 2}, {{0}, {1}})));
  // (2, 3) and (3, 2) share no refinement, yet cut rows into the same 6 pieces.
  CHECK(same_placement(layout(mesh{2, 3}, {{0, 1}, {}}), layout(mesh{3, 2}, {{0, 1}, {}})));
  CHECK(same_placement(layout::replicated(mesh{2, 3}, 1).with_partial(axis_list{0, 1}),
                       layout::replicated(mesh{3, 2}, 1).with_partial(axis_list{0, 1})));
  CHECK(!same_placement(layout::replicated(mesh{2, 3}, 1).with_partial(axis_list{0, 1}),
                        layout::replicated(mesh{3, 2}, 1).with_partial(axis_list{0, 1}, reduce_op::max)));
  // Partial over an axis of size 1 only: one rank per group, nothing to reduce.
  CHECK(same_placement(layout(mesh{2, 1}, {{0}}).with_partial(1), layout(mesh{2}, {{0}})));
  CHECK(same_placement(layout(mesh{2, 3, 1}, {{0, 1}}).with_partial(2), layout(mesh{3, 2}, {{0, 1}})));
  static_assert(same_placement(layout(mesh{2, 1, 1}, {{0}, {2}}), layout(mesh{2, 1}, {{0}, {}})));
}

namespace {

// Whether `a` and `b` give every rank the same shard of `g` and the same partial group
// (and, where the groups have more than one rank, the same reduction): by the slice
// geometry and the mesh coordinates alone.
bool same_shards_and_groups(const layout& a, const layout& b, const extents& g) {
  const int p = a.dev.size();
  if (b.dev.size() != p) return false;
  auto together = [](const layout& l, int r, int s) {
    const mesh_coords cr = l.dev.coords(r), cs = l.dev.coords(s);
    for (int x = 0; x < l.dev.ndim; ++x)
      if (!l.is_partial(x) && cr[x] != cs[x]) return false;
    return true;
  };
  bool grouped = false;
  for (int r = 0; r < p; ++r) {
    if (!(shard_box(a, g, r) == shard_box(b, g, r))) return false;
    for (int s = 0; s < p; ++s) {
      if (together(a, r, s) != together(b, r, s)) return false;
      grouped |= s != r && together(a, r, s);
    }
  }
  return !grouped || a.op == b.op;
}

}  // namespace

TEST_CASE("same_placement: exactly when every rank's shard and partial group agree") {
  const std::vector<std::pair<mesh, mesh>> pairs = {
      {mesh{2, 3}, mesh{3, 2}}, {mesh{2, 4}, mesh{4, 2}}, {mesh{8}, mesh{2, 4}},
      {mesh{2, 4, 1}, mesh{8}}, {mesh{2, 1}, mesh{2}},    {mesh{2, 3, 1}, mesh{3, 2}},
      {mesh{6}, mesh{2, 3}},    {mesh{6}, mesh{3, 2}},    {mesh{2, 2}, mesh{2, 2}},
      {mesh{1}, mesh{1, 1}},
  };
  int checked = 0, same = 0;
  for (const auto& [ma, mb] : pairs)
    for (int nd = 1; nd <= 2; ++nd) {
      extents g;
      g.ndim = nd;
      for (int d = 0; d < nd; ++d) g.v[d] = 48 * (d + 1);
      std::vector<layout> la, lb;
      for (reduce_op op : {reduce_op::sum, reduce_op::max}) {
        for_each_layout(ma, nd, true, [&](const layout& l) { la.push_back(l); }, op);
        for_each_layout(mb, nd, true, [&](const layout& l) { lb.push_back(l); }, op);
      }
      for (const layout& a : la)
        for (const layout& b : lb) {
          const bool want = same_shards_and_groups(a, b, g);
          if (same_placement(a, b) != want || same_placement(b, a) != want) {
            CAPTURE(to_string(a));
            CAPTURE(to_string(a.dev));
            CAPTURE(to_string(b));
            CAPTURE(to_string(b.dev));
            CHECK(same_placement(a, b) == want);
            CHECK(same_placement(b, a) == want);
          }
          ++checked;
          same += want ? 1 : 0;
        }
    }
  MESSAGE(checked << " pairs, " << same << " placed alike");
  CHECK(same > 50);
}
