// Tests of core/refine.hpp: common refinements of device matrices, and layouts moved
// onto them with every rank's shard unchanged.
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
