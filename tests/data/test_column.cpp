// data/column.hpp: typed column values, conversions, rows and stacking.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>
#include <tessera/data/column.hpp>

using namespace tessera;
using data::array;
using data::dtype;

TEST_CASE("array: dtype, shape and typed access") {
  array a = xt::xarray<std::uint8_t>{{1, 2, 3}, {4, 5, 6}};
  CHECK(a.type() == dtype::uint8);
  CHECK(a.shape() == std::vector<std::size_t>{2, 3});
  CHECK(a.ndim() == 2);
  CHECK(a.size() == 6);
  CHECK(a.get<std::uint8_t>()(1, 2) == 6);
  a.get<std::uint8_t>()(0, 0) = 9;
  CHECK(a.get<std::uint8_t>()(0, 0) == 9);
  CHECK_THROWS_WITH_AS(a.get<float>(), "data::array: the array holds uint8, asked for float32", error);

  const array s = array::scalar(std::int32_t{7});
  CHECK(s.type() == dtype::int32);
  CHECK(s.ndim() == 0);
  CHECK(s.size() == 1);
  CHECK(s.item<std::int32_t>() == 7);
  CHECK(s.item<float>() == 7.0f);
  CHECK_THROWS_WITH_AS(a.item<float>(), "data::array: item() needs exactly one element: the array has shape (2, 3)",
                       error);

  CHECK(array().type() == dtype::float32);
  CHECK(to_string(dtype::float32) == "float32");
}

TEST_CASE("array: cast truncates toward zero and saturates") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const array f = xt::xarray<float>{-3.7f, -0.5f, 0.9f, 254.6f, 255.5f, 300.0f, nan, 1e10f, -1e10f};
  CHECK(f.cast(dtype::uint8) == array(xt::xarray<std::uint8_t>{0, 0, 0, 254, 255, 255, 0, 255, 0}));
  CHECK(f.cast(dtype::int32) ==
        array(xt::xarray<std::int32_t>{-3, 0, 0, 254, 255, 300, 0, std::numeric_limits<std::int32_t>::max(),
                                       std::numeric_limits<std::int32_t>::min()}));

  const array i = xt::xarray<std::int32_t>{-5, 0, 7, 255, 300};
  CHECK(i.cast(dtype::uint8) == array(xt::xarray<std::uint8_t>{0, 0, 7, 255, 255}));
  CHECK(i.cast(dtype::float32) == array(xt::xarray<float>{-5, 0, 7, 255, 300}));

  const array u = xt::xarray<std::uint8_t>{0, 1, 255};
  CHECK(u.cast(dtype::int32) == array(xt::xarray<std::int32_t>{0, 1, 255}));
  CHECK(u.cast(dtype::float32) == array(xt::xarray<float>{0, 1, 255}));
  CHECK(u.cast(dtype::uint8) == u);
}

TEST_CASE("array: equality compares dtype, shape and elements") {
  const array a = xt::xarray<float>{1, 2};
  CHECK(a == array(xt::xarray<float>{1, 2}));
  CHECK_FALSE(a == array(xt::xarray<float>{1, 3}));
  CHECK_FALSE(a == array(xt::xarray<std::int32_t>{1, 2}));
  CHECK_FALSE(a == array(xt::xarray<float>{{1, 2}}));
}

TEST_CASE("row: columns by name") {
  data::row r{{"image", "label"}, {array(xt::xarray<float>{1, 2}), array::scalar(std::int32_t{3})}, 5};
  CHECK(r.column("label") == 1);
  CHECK(r["label"].item<int>() == 3);
  r["image"] = array(xt::xarray<float>{4});
  CHECK(r.values[0] == array(xt::xarray<float>{4}));
  CHECK_THROWS_WITH_AS(r["labels"], "row: no column 'labels'; the columns are image, label", error);
}

TEST_CASE("stack: a new leading dim, element (i, ...) from value i") {
  std::vector<array> items;
  for (int i = 0; i < 3; ++i) {
    xt::xarray<std::int32_t> v = xt::xarray<std::int32_t>::from_shape({2, 2});
    for (std::size_t r = 0; r < 2; ++r)
      for (std::size_t c = 0; c < 2; ++c) v(r, c) = 100 * i + 10 * static_cast<int>(r) + static_cast<int>(c);
    items.push_back(v);
  }
  const array s = data::stack(items);
  REQUIRE(s.shape() == std::vector<std::size_t>{3, 2, 2});
  const auto& x = s.get<std::int32_t>();
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t r = 0; r < 2; ++r)
      for (std::size_t c = 0; c < 2; ++c) CHECK(x(i, r, c) == items[i].get<std::int32_t>()(r, c));

  const array labels = data::stack({array::scalar(std::uint8_t{4}), array::scalar(std::uint8_t{9})});
  CHECK(labels == array(xt::xarray<std::uint8_t>{4, 9}));
}

TEST_CASE("stack: values of different dtypes or shapes are an error") {
  CHECK_THROWS_WITH_AS(data::stack({}), "stack: nothing to stack", error);
  CHECK_THROWS_WITH_AS(
      data::stack({array(xt::xarray<float>{1, 2}), array(xt::xarray<float>{1, 2, 3})}, "batch: column 'x'"),
      "batch: column 'x': every value of a batch must have the same shape: value 1 has shape (3,), value 0 has (2,)",
      error);
  CHECK_THROWS_WITH_AS(data::stack({array(xt::xarray<float>{1}), array(xt::xarray<std::int32_t>{1})}),
                       "stack: every value of a batch must have the same dtype: value 1 is int32, value 0 is float32",
                       error);
}
