// Tests of core/layout.hpp, core/geometry.hpp and core/enumerate.hpp: for every
// layout of small tensors on small meshes, the shards tile the tensor exactly once
// per replica, shapes and offsets follow the mixed-radix rule (computed here
// independently), box intersection agrees with brute force, and the layout checks
// give their exact error text.
#include <doctest/doctest.h>

#include <random>
#include <set>
#include <string>
#include <vector>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/layout.hpp>

namespace core_test_geometry {  // the file's own scope in its test group's translation unit

using namespace tessera;

namespace {

std::vector<mesh> test_meshes() { return {mesh{2}, mesh{4}, mesh{2, 2}, mesh{2, 4}, mesh{2, 2, 2}}; }

// Extents that every layout on a mesh of at most 8 ranks divides, different per dim
// so that a mixed-up dim shows.
extents test_shape(int ndim) {
  extents e;
  e.ndim = ndim;
  for (int d = 0; d < ndim; ++d) e.v[d] = 8 * (d + 1);
  return e;
}

std::string name(const mesh& m) { return to_string(m); }

std::string text(const status& s) { return error(s).what(); }

// Row-major coordinates, computed without the library: coordinate a is
// (rank / prod(dims after a)) % dims[a].
std::vector<int> my_coords(const mesh& m, int rank) {
  std::vector<int> c(m.ndim);
  for (int a = 0; a < m.ndim; ++a) {
    int stride = 1;
    for (int b = a + 1; b < m.ndim; ++b) stride *= m.dims[b];
    c[a] = rank / stride % m.dims[a];
  }
  return c;
}

// The piece of dim d a rank holds: mixed radix over the splitting axes, major first.
index_t my_piece(const layout& l, int d, int rank) {
  const std::vector<int> c = my_coords(l.dev, rank);
  index_t p = 0;
  for (int i = 0; i < l.split[d].n; ++i) {
    const int a = l.split[d].v[i];
    p = p * l.dev.dims[a] + c[a];
  }
  return p;
}

index_t my_pieces(const layout& l, int d) {
  index_t p = 1;
  for (int i = 0; i < l.split[d].n; ++i) p *= l.dev.dims[l.split[d].v[i]];
  return p;
}

// Calls f(index) for every index of a shape (row-major), index as a vector.
template <class F>
void for_each_element(const extents& shape, F&& f) {
  std::vector<index_t> idx(shape.ndim, 0);
  if (shape.size() == 0) return;
  while (true) {
    f(idx);
    int d = shape.ndim - 1;
    while (d >= 0 && ++idx[d] == shape.v[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

index_t linear(const extents& shape, const std::vector<index_t>& idx) {
  index_t lin = 0;
  for (int d = 0; d < shape.ndim; ++d) lin = lin * shape.v[d] + idx[d];
  return lin;
}

bool inside(const box& b, const std::vector<index_t>& idx) {
  for (int d = 0; d < b.shape.ndim; ++d)
    if (idx[d] < b.offset.v[d] || idx[d] >= b.offset.v[d] + b.shape.v[d]) return false;
  return true;
}

std::vector<layout> all_layouts(const mesh& m, int ndim, bool partial) {
  std::vector<layout> out;
  for_each_layout(m, ndim, partial, [&](const layout& l) { out.push_back(l); });
  return out;
}

// Number of layouts counted independently: every assignment of mesh axes to
// {dim 0..ndim-1, replica, partial}, times the orderings of the axes on each dim.
long count_layouts(int naxes, int ndim, bool partial) {
  const int choices = ndim + (partial ? 2 : 1);
  long total = 0;
  std::vector<int> what(naxes, 0);
  while (true) {
    long ways = 1;
    for (int d = 0; d < ndim; ++d) {
      int k = 0;
      for (int w : what) k += (w == d);
      for (int i = 2; i <= k; ++i) ways *= i;
    }
    total += ways;
    int a = 0;
    while (a < naxes && ++what[a] == choices) what[a++] = 0;
    if (a == naxes) break;
  }
  return total;
}

}  // namespace

// ---- the header's worked examples ---------------------------------------------------

TEST_CASE("geometry: worked examples on mesh (2, 4), 16 x 32") {
  const mesh m{2, 4};
  const extents g{16, 32};

  SUBCASE("blocks 2 x 4") {
    const layout l(m, {{0}, {1}});
    REQUIRE(check(l, g).ok());
    CHECK(l.pieces(0) == 2);
    CHECK(l.pieces(1) == 4);
    CHECK(local_shape(l, g) == extents{8, 8});
    CHECK(local_size(l, g) == 64);
    CHECK(local_offset(l, g, 5) == extents{8, 8});
    CHECK(local_offset(l, g, 0) == extents{0, 0});
    CHECK(local_offset(l, g, 3) == extents{0, 24});
    CHECK(local_offset(l, g, 7) == extents{8, 24});
    CHECK(shard_box(l, g, 5) == box{extents{8, 8}, extents{8, 8}});
    CHECK(piece_index(l, 0, 5) == 1);
    CHECK(piece_index(l, 1, 5) == 1);
  }
  SUBCASE("rows in 8 pieces, axis 1 major") {
    const layout l(m, {{1, 0}, {}});
    REQUIRE(check(l, g).ok());
    CHECK(l.pieces(0) == 8);
    CHECK(l.pieces(1) == 1);
    CHECK(piece_index(l, 0, 5) == 3);
    CHECK(local_shape(l, g) == extents{2, 32});
    CHECK(local_offset(l, g, 5) == extents{6, 0});
    // ranks 0, 4, 1, 5, 2, 6, 3, 7 hold pieces 0..7
    const int order[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    for (int p = 0; p < 8; ++p) CHECK(piece_index(l, 0, order[p]) == p);
  }
  SUBCASE("the seed's MatMul output before AllReduce") {
    const layout l = layout(m, {{0}, {}}).with_partial(1);
    REQUIRE(check(l, g).ok());
    CHECK(l.is_partial(1));
    CHECK_FALSE(l.is_partial(0));
    CHECK(l.replica_axes() == 0u);
    CHECK(local_shape(l, g) == extents{8, 32});
    for (int r = 4; r < 8; ++r) CHECK(local_offset(l, g, r) == extents{8, 0});
    for (int r = 0; r < 4; ++r) CHECK(local_offset(l, g, r) == extents{0, 0});
    CHECK(to_string(l) == "[0, -] partial sum {1}");
  }
  SUBCASE("the format examples") {
    CHECK(to_string(layout(m, {{1, 0}, {}})) == "[1.0, -]");
    CHECK(to_string(layout::replicated(m, 2)) == "[-, -]");
    CHECK(to_string(m) == "(2, 4)");
    CHECK(to_string(mesh{8}) == "(8,)");
    CHECK(to_string(g) == "(16, 32)");
    CHECK(to_string(extents{16, dynamic_extent}) == "(16, ?)");
    CHECK(to_string(layout(mesh{2, 2, 2}, {{2}, {}}).with_partial({0, 1}, reduce_op::max)) ==
          "[2, -] partial max {0, 1}");
  }
}

TEST_CASE("layout: queries") {
  const mesh m{2, 2, 2};
  const layout l = layout(m, {{2, 0}, {}}).with_partial(1, reduce_op::min);
  CHECK(l.ndim == 2);
  CHECK(l.pieces(0) == 4);
  CHECK(l.pieces(1) == 1);
  CHECK(l.dim_of(0) == 0);
  CHECK(l.dim_of(2) == 0);
  CHECK(l.dim_of(1) == -1);
  CHECK(l.split_axes() == 5u);
  CHECK(l.partial == 2u);
  CHECK(l.replica_axes() == 0u);
  CHECK(l.has_partial());
  CHECK(l.op == reduce_op::min);
  CHECK(l.without_partial() == layout(m, {{2, 0}, {}}));
  CHECK(l.without_partial().replica_axes() == 2u);
  CHECK(l.with_split(1, {1}).split[1] == axis_list{1});
  CHECK(layout::replicated(m, 3).replica_axes() == 7u);
  CHECK(layout::replicated(m, 3) == layout(m, {{}, {}, {}}));
  CHECK_FALSE(layout(m, {{0, 2}, {}}) == layout(m, {{2, 0}, {}}));
}

// ---- every layout ---------------------------------------------------------------------

TEST_CASE("geometry: shards of every layout tile the tensor once per replica") {
  for (const mesh& m : test_meshes()) {
    for (int ndim = 1; ndim <= 3; ++ndim) {
      const extents g = test_shape(ndim);
      for (const layout& l : all_layouts(m, ndim, true)) {
        CAPTURE(name(m));
        CAPTURE(to_string(l));
        REQUIRE(check(l, g).ok());
        // Ranks that share their coordinates on the replica and partial axes form
        // one copy of the tensor; group them by those coordinates.
        const axis_mask copy_axes = l.replica_axes() | l.partial;
        std::vector<std::vector<int>> copies;
        std::vector<std::vector<int>> keys;
        for (int r = 0; r < m.size(); ++r) {
          const std::vector<int> c = my_coords(m, r);
          std::vector<int> key;
          for (int a = 0; a < m.ndim; ++a)
            if (copy_axes >> a & 1u) key.push_back(c[a]);
          std::size_t i = 0;
          while (i < keys.size() && keys[i] != key) ++i;
          if (i == keys.size()) {
            keys.push_back(key);
            copies.emplace_back();
          }
          copies[i].push_back(r);
        }
        index_t pieces = 1;
        for (int d = 0; d < ndim; ++d) pieces *= my_pieces(l, d);
        CHECK(index_t(copies.size()) * pieces == m.size());
        for (const std::vector<int>& ranks : copies) {
          std::vector<int> count(std::size_t(g.size()), 0);
          for (int r : ranks) {
            const box b = shard_box(l, g, r);
            REQUIRE(b.offset.ndim == ndim);
            REQUIRE(b.shape.ndim == ndim);
            for_each_element(b.shape, [&](const std::vector<index_t>& idx) {
              std::vector<index_t> gi(ndim);
              for (int d = 0; d < ndim; ++d) gi[d] = b.offset.v[d] + idx[d];
              for (int d = 0; d < ndim; ++d) REQUIRE(gi[d] < g.v[d]);
              ++count[std::size_t(linear(g, gi))];
            });
          }
          for (int c : count) REQUIRE(c == 1);
        }
      }
    }
  }
}

TEST_CASE("geometry: local shape and offset follow the mixed-radix rule") {
  for (const mesh& m : test_meshes()) {
    for (int ndim = 1; ndim <= 3; ++ndim) {
      const extents g = test_shape(ndim);
      for (const layout& l : all_layouts(m, ndim, true)) {
        CAPTURE(name(m));
        CAPTURE(to_string(l));
        const extents ls = local_shape(l, g);
        CHECK(ls.ndim == ndim);
        index_t size = 1;
        for (int d = 0; d < ndim; ++d) {
          CHECK(l.pieces(d) == my_pieces(l, d));
          CHECK(ls.v[d] == g.v[d] / my_pieces(l, d));
          size *= ls.v[d];
        }
        CHECK(local_size(l, g) == size);
        for (int r = 0; r < m.size(); ++r) {
          CAPTURE(r);
          const extents off = local_offset(l, g, r);
          CHECK(off.ndim == ndim);
          for (int d = 0; d < ndim; ++d) {
            CHECK(piece_index(l, d, r) == my_piece(l, d, r));
            CHECK(off.v[d] == my_piece(l, d, r) * ls.v[d]);
          }
          CHECK(shard_box(l, g, r) == box{off, ls});
        }
        // A partial layout's geometry is that of the same placement without it.
        if (l.has_partial())
          for (int r = 0; r < m.size(); ++r)
            CHECK(shard_box(l, g, r) == shard_box(l.without_partial(), g, r));
      }
    }
  }
}

TEST_CASE("geometry: intersect against brute force on random boxes") {
  std::mt19937 gen(12345);
  std::uniform_int_distribution<int> coord(0, 9), len(0, 6);
  for (int ndim = 1; ndim <= 3; ++ndim) {
    extents space;
    space.ndim = ndim;
    for (int d = 0; d < ndim; ++d) space.v[d] = 16;
    for (int trial = 0; trial < 300; ++trial) {
      box x, y;
      x.offset.ndim = x.shape.ndim = y.offset.ndim = y.shape.ndim = ndim;
      for (int d = 0; d < ndim; ++d) {
        x.offset.v[d] = coord(gen);
        x.shape.v[d] = len(gen);
        y.offset.v[d] = coord(gen);
        y.shape.v[d] = len(gen);
      }
      const box r = intersect(x, y);
      CAPTURE(to_string(x.offset));
      CAPTURE(to_string(x.shape));
      CAPTURE(to_string(y.offset));
      CAPTURE(to_string(y.shape));
      index_t both = 0;
      for_each_element(space, [&](const std::vector<index_t>& idx) {
        const bool in_both = inside(x, idx) && inside(y, idx);
        both += in_both;
        CHECK(inside(r, idx) == in_both);
      });
      CHECK(r.shape.size() == both);
      CHECK(r.offset.ndim == ndim);
      CHECK(r.shape.ndim == ndim);
      for (int d = 0; d < ndim; ++d) CHECK(r.shape.v[d] >= 0);
      // Commutative, idempotent, and a box meets itself whole.
      const box s = intersect(y, x);
      CHECK(s.shape.size() == both);
      CHECK(s == r);
      CHECK(intersect(x, x) == x);
      CHECK(intersect(r, x).shape.size() == both);
    }
  }
}

TEST_CASE("geometry: shards of two layouts intersect as their elements do") {
  // The redistribution planner's use of intersect: for shards of any two layouts, the
  // intersection counts the elements both ranks hold.
  const mesh m{2, 4};
  const extents g{8, 16};
  const std::vector<layout> ls = all_layouts(m, 2, false);
  for (std::size_t i = 0; i < ls.size(); i += 3)
    for (std::size_t j = 0; j < ls.size(); j += 2)
      for (int r = 0; r < 8; r += 3)
        for (int q = 0; q < 8; q += 2) {
          const box a = shard_box(ls[i], g, r), b = shard_box(ls[j], g, q);
          index_t both = 0;
          for_each_element(g, [&](const std::vector<index_t>& idx) { both += inside(a, idx) && inside(b, idx); });
          CHECK(intersect(a, b).shape.size() == both);
        }
}

// ---- enumeration -------------------------------------------------------------------

TEST_CASE("enumerate: counts of layouts") {
  CHECK(all_layouts(mesh{2, 2}, 2, true).size() == 18);
  CHECK(all_layouts(mesh{2, 2}, 2, false).size() == 11);
  CHECK(all_layouts(mesh{2, 2, 2}, 3, true).size() == 176);
  CHECK(all_layouts(mesh{2}, 1, true).size() == 3);
  CHECK(all_layouts(mesh{2}, 0, false).size() == 1);
  for (const mesh& m : test_meshes())
    for (int ndim = 0; ndim <= 3; ++ndim)
      for (bool partial : {false, true}) {
        CAPTURE(name(m));
        CAPTURE(ndim);
        CAPTURE(partial);
        CHECK(long(all_layouts(m, ndim, partial).size()) == count_layouts(m.ndim, ndim, partial));
      }
}

TEST_CASE("enumerate: layouts are distinct, valid and cover every placement") {
  for (const mesh& m : test_meshes())
    for (int ndim = 1; ndim <= 3; ++ndim)
      for (bool partial : {false, true}) {
        CAPTURE(name(m));
        CAPTURE(ndim);
        const std::vector<layout> ls = all_layouts(m, ndim, partial);
        std::set<std::string> names;
        for (std::size_t i = 0; i < ls.size(); ++i) {
          const layout& l = ls[i];
          CAPTURE(to_string(l));
          CHECK(check(l).ok());
          CHECK(check(l, test_shape(ndim)).ok());
          CHECK(l.dev == m);
          CHECK(l.ndim == ndim);
          if (!partial) CHECK_FALSE(l.has_partial());
          // every mesh axis is exactly one of: split, partial, replica
          int placed = 0;
          for (int a = 0; a < m.ndim; ++a)
            placed += (l.dim_of(a) >= 0) + l.is_partial(a) + (l.replica_axes() >> a & 1u);
          CHECK(placed == m.ndim);
          names.insert(to_string(l));
          for (std::size_t j = 0; j < i; ++j) CHECK_FALSE(ls[j] == l);
        }
        CHECK(names.size() == ls.size());
      }
}

TEST_CASE("enumerate: partial layouts carry the requested reduction") {
  int partial_count = 0;
  for_each_layout(
      mesh{2, 2}, 2, true,
      [&](const layout& l) {
        if (l.has_partial()) {
          ++partial_count;
          CHECK(l.op == reduce_op::max);
        } else {
          CHECK(l.op == reduce_op::sum);
        }
      },
      reduce_op::max);
  CHECK(partial_count == 18 - 11);
}

// ---- layout checks and their text ---------------------------------------------------

TEST_CASE("layout: valid layouts pass") {
  const mesh m{2, 4};
  CHECK(check(layout(m, {{0}, {1}})).ok());
  CHECK(check(layout(m, {{0}, {1}}), extents{16, 32}).ok());
  CHECK(check(layout(m, {{1, 0}, {}}), extents{8, 3}).ok());
  CHECK(check(layout(m, {{0}, {}}).with_partial(1), extents{2, 5}).ok());
  CHECK(check(layout(m, {{0}, {}}).with_partial(1, reduce_op::max)).ok());
  CHECK(check(layout::replicated(m, 0), extents{}).ok());
  // Dynamic extents are checked when known.
  CHECK(check(layout(m, {{0}, {1}}), extents{16, dynamic_extent}).ok());
  CHECK(check(layout(m, {{0}, {1}}), extents::dynamic(2)).ok());
  CHECK(check(layout(m, {{0}, {1}}), extents{0, 0}).ok());
}

TEST_CASE("layout: check errors and their text") {
  const mesh m{2, 4};
  SUBCASE("axis used by two dims") {
    const status s = check(layout(m, {{0}, {0}}));
    CHECK(s == fail(errc::axis_used_twice, 1, 0));
    CHECK(text(s) == "layout: a mesh axis splits more than one tensor dim, or one dim twice: "
                     "mesh axis 0 is used again at dim 1");
  }
  SUBCASE("axis used twice in one dim") {
    CHECK(text(check(layout(m, {{}, {1, 1}}))) ==
          "layout: a mesh axis splits more than one tensor dim, or one dim twice: "
          "mesh axis 1 is used again at dim 1");
  }
  SUBCASE("axis out of range") {
    const status s = check(layout(m, {{0}, {2}}));
    CHECK(s == fail(errc::axis_out_of_range, 1, 2, 2));
    CHECK(text(s) == "layout: a mesh axis index is out of range: dim 1 names mesh axis 2, "
                     "mesh has 2 axes");
    CHECK(text(check(layout(m, {{-1}, {}}))) ==
          "layout: a mesh axis index is out of range: dim 0 names mesh axis -1, mesh has 2 axes");
  }
  SUBCASE("partial axis out of range") {
    const status s = check(layout(m, {{0}, {}}).with_partial(3));
    CHECK(s == fail(errc::partial_axis_out_of_range, -1, 3, 2));
    CHECK(text(s) == "layout: a partial mesh axis is out of range: partial mesh axis 3, mesh has 2 axes");
  }
  SUBCASE("partial axis that also splits") {
    const status s = check(layout(m, {{0}, {1}}).with_partial(1));
    CHECK(s == fail(errc::partial_axis_splits, 1, 1));
    CHECK(text(s) == "layout: a partial mesh axis cannot also split a tensor dim: "
                     "mesh axis 1 is partial and splits dim 1");
  }
  SUBCASE("partial reduced by mean") {
    const status s = check(layout(m, {{0}, {}}).with_partial(1, reduce_op::mean));
    CHECK(s == fail(errc::partial_op));
    CHECK(text(s) == "layout: a partial layout reduces with sum, max or min");
  }
  SUBCASE("non-divisible extent") {
    const status s = check(layout(m, {{0}, {1}}), extents{16, 30});
    CHECK(s == fail(errc::dim_not_divisible, 1, 1, 30, 4));
    CHECK(text(s) == "layout: a tensor dim must be divisible by the product of its splits: "
                     "dim 1 has extent 30, split into 4 pieces");
    CHECK(text(check(layout(m, {{1, 0}, {}}), extents{12, 3})) ==
          "layout: a tensor dim must be divisible by the product of its splits: "
          "dim 0 has extent 12, split into 8 pieces");
    CHECK(std::string(error(s, "dist_tensor").what()) ==
          "dist_tensor: layout: a tensor dim must be divisible by the product of its splits: "
          "dim 1 has extent 30, split into 4 pieces");
  }
  SUBCASE("shape rank mismatch") {
    const status s = check(layout(m, {{0}, {1}}), extents{16});
    CHECK(s == fail(errc::shape_ndim, -1, -1, 1, 2));
    CHECK(text(s) == "layout: the shape's rank must equal the layout's tensor rank: "
                     "shape has rank 1, layout has rank 2");
  }
  SUBCASE("negative extent") {
    CHECK(text(check(layout(m, {{0}, {1}}), extents{-4, 32})) ==
          "layout: a tensor extent must not be negative: dim 0 has extent -4");
  }
  SUBCASE("tensor rank above the limit") {
    const layout l(m, {{}, {}, {}, {}, {}, {}, {}});
    CHECK(text(check(l)) ==
          "layout: the tensor rank must be between 0 and max_tensor_ndim: tensor rank 7, limit 6");
  }
  SUBCASE("an invalid mesh is reported first") {
    CHECK(check(layout(mesh{2, 0}, {{0}, {5}})) == fail(errc::mesh_axis_size, -1, 1, 0));
  }
  SUBCASE("the layout is checked before the shape") {
    CHECK(check(layout(m, {{0}, {0}}), extents{3}).code == errc::axis_used_twice);
  }
}

TEST_CASE("layout and geometry: constexpr") {
  constexpr layout l(mesh{2, 4}, {{0}, {1}});
  static_assert(check(l, extents{16, 32}).ok());
  static_assert(local_offset(l, extents{16, 32}, 5) == extents{8, 8});
  static_assert(local_shape(l, extents{16, 32}) == extents{8, 8});
  static_assert(check(l, extents{16, 30}) == fail(errc::dim_not_divisible, 1, 1, 30, 4));
}
}  // namespace core_test_geometry
