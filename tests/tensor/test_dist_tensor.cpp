// Tests of tensor/dist_tensor.hpp on one process: the three forms (static layout and
// shape, static layout with a run-time shape, fully dynamic) on every rank of a
// (2, 4) mesh, fill_global, assign_local, and the exact text of each run-time error.
#include <doctest/doctest.h>

#include <array>
#include <string>
#include <type_traits>
#include <vector>
#include <tessera/core/strategy.hpp>
#include <tessera/tensor/dist_tensor.hpp>

using namespace tessera;

namespace {

constexpr layout blocks{mesh{2, 4}, {{0}, {1}}};  // 2 x 4 blocks
constexpr extents g16x32{16, 32};

using fully_static = dist_tensor<float, blocks, extents{16, 32}>;
using static_layout_only = dist_tensor<float, blocks>;
using fully_dynamic = dist_tensor<float>;
using dynamic_cols = dist_tensor<float, blocks, extents{16, dynamic_extent}>;

// The message of the tessera::error that f throws ("" if none).
template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "";
}

// A global element's value, distinct for every index.
float value_at(const std::array<index_t, max_tensor_ndim>& g) { return float(g[0] * 1000 + g[1]); }

// Checks the shard of a (16, 32) tensor in 2 x 4 blocks held by `rank`.
template <class Tensor>
void check_blocks_shard(Tensor& t, int rank) {
  CAPTURE(rank);
  CHECK(t.layout() == blocks);
  CHECK(t.global_shape() == g16x32);
  CHECK(t.rank() == rank);
  CHECK(t.ndim() == 2);
  CHECK(t.dev() == mesh{2, 4});
  CHECK(t.local_shape() == extents{8, 8});
  CHECK(t.local_offset() == extents{8 * (rank / 4), 8 * (rank % 4)});
  REQUIRE(t.local().dimension() == 2);
  CHECK(t.local().shape()[0] == 8);
  CHECK(t.local().shape()[1] == 8);
  CHECK(t.data().size() == 64);
  for (float x : t.data()) CHECK(x == 0.0f);

  t.fill_global(value_at);
  const index_t r0 = 8 * (rank / 4), c0 = 8 * (rank % 4);
  for (std::size_t i = 0; i < 8; ++i)
    for (std::size_t j = 0; j < 8; ++j)
      CHECK(t.local()(i, j) == float((r0 + index_t(i)) * 1000 + c0 + index_t(j)));
  // Row-major: data() walks the last dim fastest.
  CHECK(t.data()[1] == float(r0 * 1000 + c0 + 1));
  CHECK(t.data()[8] == float((r0 + 1) * 1000 + c0));
}

}  // namespace

TEST_CASE("dist_tensor: the three forms on every rank of mesh (2, 4)") {
  static_assert(fully_static::static_layout && fully_static::static_shape);
  static_assert(static_layout_only::static_layout && !static_layout_only::static_shape);
  static_assert(!fully_dynamic::static_layout && !fully_dynamic::static_shape);
  static_assert(fully_static::static_local_shape() == extents{8, 8});
  static_assert(std::is_same_v<fully_static::value_type, float>);

  for (int rank = 0; rank < 8; ++rank) {
    SUBCASE("static layout and shape") {
      fully_static t(rank);
      check_blocks_shard(t, rank);
    }
    SUBCASE("static layout, run-time shape") {
      static_layout_only t(g16x32, rank);
      check_blocks_shard(t, rank);
    }
    SUBCASE("layout and shape at run time") {
      fully_dynamic t(blocks, g16x32, rank);
      check_blocks_shard(t, rank);
    }
    SUBCASE("static layout and shape, given again at run time") {
      fully_static t(blocks, g16x32, rank);
      check_blocks_shard(t, rank);
    }
  }
}

TEST_CASE("dist_tensor: the header's example values") {
  fully_static t(5);
  t.fill_global(value_at);
  CHECK(t.local_offset() == extents{8, 8});
  CHECK(t.local()(0, 0) == 8008.0f);
  CHECK(t.local()(7, 7) == 15015.0f);
  CHECK(t.local()(2, 5) == 10013.0f);

  // Rows in 8 pieces, axis 1 major: rank 5 holds rows 6..8.
  fully_dynamic rows(layout(mesh{2, 4}, {{1, 0}, {}}), g16x32, 5);
  rows.fill_global(value_at);
  CHECK(rows.local_shape() == extents{2, 32});
  CHECK(rows.local()(0, 0) == 6000.0f);
  CHECK(rows.local()(1, 31) == 7031.0f);

  // A partial layout holds full-size blocks of its split dims.
  fully_dynamic part(layout(mesh{2, 4}, {{0}, {}}).with_partial(1), g16x32, 6);
  CHECK(part.local_shape() == extents{8, 32});
  CHECK(part.local_offset() == extents{8, 0});
  part.fill_global(value_at);
  CHECK(part.local()(0, 0) == 8000.0f);
}

TEST_CASE("dist_tensor: other element types, ranks and strategies") {
  dist_tensor<double, shard_layout<split_tuple{2, 1}, 8>, extents{16, 4}> d(3);
  CHECK(d.local_shape() == extents{8, 4});
  CHECK(d.local_offset() == extents{8, 0});
  d.fill_global([](const auto& g) { return double(g[0]) + 0.5 * double(g[1]); });
  CHECK(d.local()(0, 3) == 9.5);

  dist_tensor<int> cube(layout(mesh{2, 2, 2}, {{2}, {}, {0, 1}}), extents{4, 3, 8}, 6);
  CHECK(cube.local_shape() == extents{2, 3, 2});
  CHECK(cube.local_offset() == extents{0, 0, 6});
  cube.fill_global([](const auto& g) { return int(g[0] * 100 + g[1] * 10 + g[2]); });
  CHECK(cube.local()(1, 2, 1) == 127);

  dist_tensor<float> scalar(layout::replicated(mesh{4}, 0), extents{}, 2);
  CHECK(scalar.data().size() == 1);
}

TEST_CASE("dist_tensor: assign_local") {
  static_layout_only t(g16x32, 1);
  xt::xarray<float> good = xt::xarray<float>::from_shape({8, 8});
  good.fill(2.5f);
  t.assign_local(std::move(good));
  CHECK(t.local()(7, 7) == 2.5f);

  CHECK(thrown([&] { t.assign_local(xt::xarray<float>::from_shape({3})); }) ==
        "dist_tensor: tensor: the local buffer size must equal the layout's local shard size: "
        "buffer holds 3 elements, the shard needs 64");
  // A buffer of the right size but another shape takes the shard's shape.
  fully_dynamic rows(layout(mesh{2, 4}, {{1, 0}, {}}), g16x32, 0);
  xt::xarray<float> square = xt::xarray<float>::from_shape({8, 8});
  for (std::size_t i = 0; i < square.size(); ++i) square.data()[i] = float(i);
  rows.assign_local(std::move(square));
  REQUIRE(rows.local().dimension() == 2);
  CHECK(rows.local().shape()[0] == 2);
  CHECK(rows.local().shape()[1] == 32);
  CHECK(rows.local()(1, 0) == 32.0f);
  CHECK(thrown([&] { rows.assign_local(xt::xarray<float>::from_shape({2, 31})); }) ==
        "dist_tensor: tensor: the local buffer size must equal the layout's local shard size: "
        "buffer holds 62 elements, the shard needs 64");
  CHECK_THROWS_AS(t.assign_local(xt::xarray<float>::from_shape({65})), error);
  // The failed assignments left the shard as it was.
  CHECK(t.local()(0, 0) == 2.5f);
}

TEST_CASE("dist_tensor: a run-time shape that the layout does not divide") {
  const std::string text =
      "dist_tensor: layout: a tensor dim must be divisible by the product of its splits: "
      "dim 1 has extent 30, split into 4 pieces";
  CHECK(thrown([] { static_layout_only t(extents{16, 30}, 0); }) == text);
  CHECK(thrown([] { fully_dynamic t(blocks, extents{16, 30}, 0); }) == text);
  CHECK(thrown([] { dynamic_cols t(extents{16, 30}, 0); }) == text);
  CHECK(thrown([] { static_layout_only t(extents{16}, 0); }) ==
        "dist_tensor: layout: the shape's rank must equal the layout's tensor rank: "
        "shape has rank 1, layout has rank 2");
  CHECK(thrown([] { fully_dynamic t(layout(mesh{2, 4}, {{0}, {0}}), g16x32, 0); }) ==
        "dist_tensor: layout: a mesh axis splits more than one tensor dim, or one dim twice: "
        "mesh axis 0 is used again at dim 1");
  // A run-time shape must know every extent.
  const std::string unknown = "dist_tensor: layout: a tensor extent must not be negative: "
                              "dim 1 has extent -1";
  CHECK(thrown([] { fully_dynamic t(blocks, extents{16, dynamic_extent}, 0); }) == unknown);
  CHECK(thrown([] { dynamic_cols t(extents{16, dynamic_extent}, 0); }) == unknown);
  CHECK(thrown([] { fully_dynamic t(layout(mesh{2, 4}, {{0}, {}}), extents{16, dynamic_extent}, 0); }) ==
        unknown);
}

TEST_CASE("dist_tensor: a static shape with a dynamic extent") {
  static_assert(dynamic_cols::static_shape);
  static_assert(!std::is_constructible_v<dynamic_cols, int>);
  static_assert(std::is_constructible_v<dynamic_cols, extents, int>);
  static_assert(std::is_constructible_v<fully_static, int>);

  dynamic_cols t(extents{16, 40}, 6);
  CHECK(t.global_shape() == extents{16, 40});
  CHECK(t.local_shape() == extents{8, 10});
  CHECK(t.local_offset() == extents{8, 20});
  t.fill_global(value_at);
  CHECK(t.local()(1, 2) == 9022.0f);

  CHECK(thrown([] { dynamic_cols t(extents{8, 32}, 0); }) ==
        "dist_tensor: a run-time shape must agree with the static shape: "
        "dim 0 has extent 8, the static shape says 16");
  CHECK(thrown([] { fully_static t(extents{16, 24}, 0); }) ==
        "dist_tensor: a run-time shape must agree with the static shape: "
        "dim 1 has extent 24, the static shape says 32");
  CHECK(thrown([] { dynamic_cols t(extents{16, 8, 2}, 0); }) ==
        "dist_tensor: layout: the shape's rank must equal the layout's tensor rank: "
        "shape has rank 3, layout has rank 2");
}

TEST_CASE("dist_tensor: a run-time layout must equal the static layout") {
  const layout other(mesh{2, 4}, {{1}, {0}});
  CHECK(thrown([&] { static_layout_only t(other, g16x32, 0); }) ==
        "dist_tensor [1, 0] vs [0, 1]: dist_tensor: a run-time layout must equal the static layout");
}

TEST_CASE("dist_tensor: rank out of range") {
  CHECK(thrown([] { fully_static t(8); }) ==
        "dist_tensor: mesh: a rank must lie in [0, mesh size): rank 8, mesh size 8");
  CHECK(thrown([] { static_layout_only t(g16x32, -1); }) ==
        "dist_tensor: mesh: a rank must lie in [0, mesh size): rank -1, mesh size 8");
  CHECK(thrown([] { fully_dynamic t(layout(mesh{2}, {{0}}), extents{4}, 2); }) ==
        "dist_tensor: mesh: a rank must lie in [0, mesh size): rank 2, mesh size 2");
  CHECK(thrown([] { fully_static t(7); }).empty());
}
