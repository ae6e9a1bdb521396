// Tests of core/mesh.hpp: row-major coordinates, process groups over every ordered
// list of mesh axes, and the mesh checks with their exact error text.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>
#include <tessera/core/format.hpp>
#include <tessera/core/mesh.hpp>

namespace core_test_mesh {  // the file's own scope in its test group's translation unit

using namespace tessera;

namespace {

std::vector<mesh> test_meshes() {
  return {mesh{1}, mesh{2}, mesh{8}, mesh{2, 4}, mesh{4, 2}, mesh{2, 2, 2}, mesh{3, 1, 2}};
}

std::string name(const mesh& m) { return to_string(m); }

std::string name(const axis_list& axes) {
  std::string s = "{";
  for (int i = 0; i < axes.n; ++i) {
    if (i) s += ",";
    s += std::to_string(axes.v[i]);
  }
  return s + "}";
}

// Every ordered list of distinct axes of an ndim-axis mesh: all subsets in all orders,
// the empty list included.
void ordered_axis_lists(int ndim, axis_list& cur, std::vector<axis_list>& out) {
  out.push_back(cur);
  for (int a = 0; a < ndim; ++a) {
    if (cur.contains(a)) continue;
    cur.push_back(a);
    ordered_axis_lists(ndim, cur, out);
    cur.pop_back();
  }
}

std::vector<axis_list> ordered_axis_lists(int ndim) {
  std::vector<axis_list> out;
  axis_list cur;
  ordered_axis_lists(ndim, cur, out);
  return out;
}

std::string text(const status& s) { return error(s).what(); }

}  // namespace

TEST_CASE("mesh: size, extent and equality") {
  const mesh m{2, 4};
  CHECK(m.ndim == 2);
  CHECK(m.size() == 8);
  CHECK(m.extent(0) == 2);
  CHECK(m.extent(1) == 4);
  CHECK(mesh{2, 4} == mesh{2, 4});
  CHECK_FALSE(mesh{2, 4} == mesh{4, 2});
  CHECK_FALSE(mesh{2} == mesh{2, 1});
  CHECK(mesh{3, 1, 2}.size() == 6);
  CHECK(mesh{1}.size() == 1);
}

TEST_CASE("mesh: coords and rank_of are inverse, row-major, last axis fastest") {
  for (const mesh& m : test_meshes()) {
    CAPTURE(name(m));
    std::set<mesh_coords> seen;
    for (int r = 0; r < m.size(); ++r) {
      CAPTURE(r);
      const mesh_coords c = m.coords(r);
      CHECK(m.rank_of(c) == r);
      // Independent row-major rank from the coordinates.
      int expect = 0;
      for (int a = 0; a < m.ndim; ++a) {
        CHECK(c[a] >= 0);
        CHECK(c[a] < m.dims[a]);
        expect = expect * m.dims[a] + c[a];
      }
      CHECK(expect == r);
      for (int a = m.ndim; a < max_mesh_ndim; ++a) CHECK(c[a] == 0);
      seen.insert(c);
    }
    CHECK(int(seen.size()) == m.size());
  }
}

TEST_CASE("mesh: the seed's rank order on device matrix (2, 4)") {
  const mesh m{2, 4};
  for (int r = 0; r < 4; ++r) CHECK(m.coords(r)[0] == 0);
  for (int r = 4; r < 8; ++r) CHECK(m.coords(r)[0] == 1);
  for (int r = 0; r < 8; ++r) CHECK(m.coords(r)[1] == r % 4);
  CHECK(m.coords(5) == mesh_coords{1, 1});
  CHECK(m.rank_of(mesh_coords{1, 3}) == 7);

  const mesh c{2, 2, 2};
  CHECK(c.coords(6) == mesh_coords{1, 1, 0});
  CHECK(c.coords(1) == mesh_coords{0, 0, 1});
}

TEST_CASE("axis_list: construction and queries") {
  axis_list l{1, 0};
  CHECK(l.size() == 2);
  CHECK_FALSE(l.empty());
  CHECK(l[0] == 1);
  CHECK(l.back() == 0);
  CHECK(l.contains(0));
  CHECK_FALSE(l.contains(2));
  CHECK(l.mask() == 3u);
  l.pop_back();
  CHECK(l == axis_list{1});
  l.push_back(2);
  CHECK(l == axis_list{1, 2});
  CHECK(l.mask() == 6u);
  CHECK(axis_list{}.empty());
  CHECK(axis_list{}.mask() == 0u);
}

TEST_CASE("mesh: the header's group examples") {
  const mesh m{2, 4};
  CHECK(group_size(m, {1}) == 4);
  CHECK(group_index(m, {1}, 5) == 1);
  CHECK(group_index(m, {0}, 5) == 1);
  std::vector<int> over1, over0, over10;
  for (int i = 0; i < 4; ++i) over1.push_back(group_member(m, {1}, 5, i));
  for (int i = 0; i < 2; ++i) over0.push_back(group_member(m, {0}, 5, i));
  for (int i = 0; i < 8; ++i) over10.push_back(group_member(m, {1, 0}, 5, i));
  CHECK(over1 == std::vector<int>{4, 5, 6, 7});
  CHECK(over0 == std::vector<int>{1, 5});
  CHECK(over10 == std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7});
  CHECK(group_color(m, {1}, 5) == 1);
  CHECK(group_color(m, {0}, 5) == 1);
  CHECK(group_color(m, {0}, 6) == 2);
  CHECK(group_color(m, {1, 0}, 5) == 0);
  CHECK(group_color(m, {}, 5) == 5);
}

TEST_CASE("mesh: groups over every ordered list of axes") {
  for (const mesh& m : test_meshes()) {
    for (const axis_list& axes : ordered_axis_lists(m.ndim)) {
      CAPTURE(name(m));
      CAPTURE(name(axes));
      int g = 1;
      for (int i = 0; i < axes.n; ++i) g *= m.dims[axes.v[i]];
      CHECK(group_size(m, axes) == g);
      const int colors = m.size() / g;

      // members[color] in group order, filled from each rank's (color, index).
      std::vector<std::vector<int>> members(colors, std::vector<int>(g, -1));
      for (int r = 0; r < m.size(); ++r) {
        CAPTURE(r);
        const int idx = group_index(m, axes, r);
        const int color = group_color(m, axes, r);
        REQUIRE(idx >= 0);
        REQUIRE(idx < g);
        REQUIRE(color >= 0);
        REQUIRE(color < colors);
        CHECK(group_member(m, axes, r, idx) == r);
        CHECK(members[color][idx] == -1);  // each (color, index) slot taken once
        members[color][idx] = r;

        // Independent index: mixed radix over the listed axes, first listed major.
        const mesh_coords c = m.coords(r);
        int expect = 0;
        for (int i = 0; i < axes.n; ++i) expect = expect * m.dims[axes.v[i]] + c[axes.v[i]];
        CHECK(idx == expect);

        // The group's members share r's coordinates off the listed axes, have
        // their index as position, and the same color.
        for (int i = 0; i < g; ++i) {
          const int q = group_member(m, axes, r, i);
          REQUIRE(q >= 0);
          REQUIRE(q < m.size());
          CHECK(group_index(m, axes, q) == i);
          CHECK(group_color(m, axes, q) == color);
          const mesh_coords cq = m.coords(q);
          for (int a = 0; a < m.ndim; ++a)
            if (!axes.contains(a)) CHECK(cq[a] == c[a]);
        }
      }
      // Every rank in exactly one group; colors run over 0..size/g-1, all used.
      for (int color = 0; color < colors; ++color)
        for (int i = 0; i < g; ++i) CHECK(members[color][i] != -1);
      // Ranks with different colors differ off the listed axes.
      for (int r = 0; r < m.size(); ++r)
        for (int q = 0; q < m.size(); ++q) {
          bool same_off = true;
          for (int a = 0; a < m.ndim; ++a)
            if (!axes.contains(a) && m.coords(r)[a] != m.coords(q)[a]) same_off = false;
          CHECK(same_off == (group_color(m, axes, r) == group_color(m, axes, q)));
        }
    }
  }
}

TEST_CASE("mesh: ordered lists count") {
  // 1 + 3 + 6 + 6 ordered lists of distinct axes of a 3-axis mesh.
  CHECK(ordered_axis_lists(3).size() == 16);
  CHECK(ordered_axis_lists(2).size() == 5);
  CHECK(ordered_axis_lists(1).size() == 2);
}

TEST_CASE("mesh: check accepts valid meshes") {
  for (const mesh& m : test_meshes()) CHECK(check(m).ok());
  CHECK(check(mesh{1, 1, 1, 1, 1, 1}).ok());
}

TEST_CASE("mesh: check errors and their text") {
  SUBCASE("no axes") {
    const status s = check(mesh{});
    CHECK(s == fail(errc::mesh_ndim, -1, -1, 0, max_mesh_ndim));
    CHECK(text(s) == "mesh: the number of mesh axes must be between 1 and max_mesh_ndim: "
                     "mesh has 0 axes, limit 6");
  }
  SUBCASE("seven axes") {
    const status s = check(mesh{1, 1, 1, 1, 1, 1, 1});
    CHECK(s.code == errc::mesh_ndim);
    CHECK(text(s) == "mesh: the number of mesh axes must be between 1 and max_mesh_ndim: "
                     "mesh has 7 axes, limit 6");
  }
  SUBCASE("an axis of size 0") {
    const status s = check(mesh{2, 0, 3});
    CHECK(s == fail(errc::mesh_axis_size, -1, 1, 0));
    CHECK(text(s) == "mesh: every mesh axis size must be positive: mesh axis 1 has size 0");
  }
  SUBCASE("a negative axis") {
    CHECK(text(check(mesh{-2})) ==
          "mesh: every mesh axis size must be positive: mesh axis 0 has size -2");
  }
  SUBCASE("the first bad axis is reported") {
    CHECK(check(mesh{0, 0}).axis == 0);
  }
}

TEST_CASE("mesh: check_mesh_size") {
  CHECK(check_mesh_size(mesh{2, 4}, 8).ok());
  CHECK(check_mesh_size(mesh{1}, 1).ok());
  const status s = check_mesh_size(mesh{2, 2}, 8);
  CHECK(s == fail(errc::mesh_size_mismatch, -1, -1, 4, 8));
  CHECK(text(s) ==
        "mesh: the mesh size must equal the number of ranks: mesh size 4, communicator size 8");
  // An invalid mesh reports its own error first.
  CHECK(check_mesh_size(mesh{2, 0}, 0).code == errc::mesh_axis_size);
  // A context prefixes the message.
  CHECK(std::string(error(s, "launch").what()) ==
        "launch: mesh: the mesh size must equal the number of ranks: mesh size 4, "
        "communicator size 8");
}

TEST_CASE("mesh: constexpr") {
  constexpr mesh m{2, 4};
  static_assert(m.size() == 8);
  static_assert(m.coords(5)[0] == 1 && m.coords(5)[1] == 1);
  static_assert(group_member(m, {1, 0}, 5, 2) == 1);
  static_assert(check(m).ok());
  static_assert(check(mesh{}).code == errc::mesh_ndim);
}
}  // namespace core_test_mesh
