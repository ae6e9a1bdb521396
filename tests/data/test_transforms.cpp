// data/transforms.hpp: each vision transform against values computed by hand.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <set>
#include <vector>
#include <tessera/data/transforms.hpp>

using namespace tessera;
using data::array;
using data::dtype;

namespace {

array apply(const data::transform& t, const array& a, std::int64_t index = 0, std::int64_t pass = 0) {
  return t(a, data::sample_info{index, pass});
}

void check_close(const array& got, const xt::xarray<float>& expected) {
  REQUIRE(got.type() == dtype::float32);
  const auto& g = got.get<float>();
  REQUIRE(std::vector<std::size_t>(g.shape().begin(), g.shape().end()) ==
          std::vector<std::size_t>(expected.shape().begin(), expected.shape().end()));
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g.data()[i] == doctest::Approx(expected.data()[i]).epsilon(1e-6));
}

}  // namespace

TEST_CASE("rescale: x * scale + shift, as float32") {
  check_close(apply(data::rescale(1.0f / 255, 0), array(xt::xarray<std::uint8_t>{0, 51, 255})),
              xt::xarray<float>{0.0f, 0.2f, 1.0f});
  check_close(apply(data::rescale(1.0f / 255, -0.5f), array(xt::xarray<std::uint8_t>{{0, 51, 255}})),
              xt::xarray<float>{{-0.5f, -0.3f, 0.5f}});
  check_close(apply(data::rescale(2, 1), array(xt::xarray<float>{-1.5f})), xt::xarray<float>{-2.0f});
}

TEST_CASE("normalize: per channel over the last dim") {
  // An HWC image of 1x2 pixels with 3 channels: (1, 2, 3) and (5, 6, 7).
  const xt::xarray<float> img{{{1, 2, 3}, {5, 6, 7}}};
  const data::transform n = data::normalize({1, 2, 3}, {2, 4, 0.5f});
  check_close(apply(n, array(img)), xt::xarray<float>{{{0, 0, 0}, {2, 1, 8}}});
  check_close(apply(n, array(xt::xarray<std::uint8_t>{{{1, 2, 3}, {5, 6, 7}}})), xt::xarray<float>{{{0, 0, 0}, {2, 1, 8}}});
  // MNIST's one channel, after rescale (seed 002): (x - 0.1307) / 0.3081.
  xt::xarray<float> gray{{0.1307f, 1.0f}}, expected{{0.0f, (1.0f - 0.1307f) / 0.3081f}};
  gray.reshape({1, 2, 1});
  expected.reshape({1, 2, 1});
  check_close(apply(data::normalize({0.1307f}, {0.3081f}), array(gray)), expected);

  CHECK_THROWS_WITH_AS(apply(n, array(xt::xarray<float>::from_shape({28, 28, 1}))),
                       "normalize: the image's last dim (channels) must equal the number of means: image shape (28, "
                       "28, 1), 3 means",
                       error);
  CHECK_THROWS_WITH_AS(data::normalize({1, 2}, {1}), "normalize: give one mean and one std per channel: got 2 means and 1 stds",
                       error);
  CHECK_THROWS_WITH_AS(data::normalize({1, 2}, {1, 0}), "normalize: every std must be positive: std[1] = 0.000000", error);
}

TEST_CASE("hwc2chw: (H, W, C) -> (C, H, W), any dtype") {
  const xt::xarray<std::int32_t> hwc{{{1, 2}, {3, 4}, {5, 6}}, {{7, 8}, {9, 10}, {11, 12}}};
  CHECK(apply(data::hwc2chw(), array(hwc)) ==
        array(xt::xarray<std::int32_t>{{{1, 3, 5}, {7, 9, 11}}, {{2, 4, 6}, {8, 10, 12}}}));
  const array u = apply(data::hwc2chw(), array(xt::xarray<std::uint8_t>::from_shape({28, 28, 1})));
  CHECK(u.type() == dtype::uint8);
  CHECK(u.shape() == std::vector<std::size_t>{1, 28, 28});
  CHECK_THROWS_WITH_AS(apply(data::hwc2chw(), array(xt::xarray<float>::from_shape({28, 28}))),
                       "hwc2chw: the image must have shape (height, width, channels): got (28, 28)", error);
}

TEST_CASE("type_cast: converts as array::cast") {
  CHECK(apply(data::type_cast(dtype::int32), array(xt::xarray<std::uint8_t>{3, 200})) ==
        array(xt::xarray<std::int32_t>{3, 200}));
  CHECK(apply(data::type_cast(dtype::uint8), array(xt::xarray<float>{-1.5f, 2.9f, 256.0f})) ==
        array(xt::xarray<std::uint8_t>{0, 2, 255}));
  CHECK(apply(data::type_cast(dtype::float32), array::scalar(std::int32_t{-7})) == array::scalar(-7.0f));
}

TEST_CASE("random_crop: every window of the zero-padded image, uniformly, reproducibly") {
  // A 3x3 image, 2x2 crops, no padding: the four windows.
  const xt::xarray<std::uint8_t> img{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}};
  const std::vector<array> windows{array(xt::xarray<std::uint8_t>{{1, 2}, {4, 5}}),
                                   array(xt::xarray<std::uint8_t>{{2, 3}, {5, 6}}),
                                   array(xt::xarray<std::uint8_t>{{4, 5}, {7, 8}}),
                                   array(xt::xarray<std::uint8_t>{{5, 6}, {8, 9}})};
  const data::transform crop = data::random_crop(2, 2, 0, 17);
  std::vector<int> seen(4, 0);
  for (std::int64_t i = 0; i < 400; ++i) {
    const array out = apply(crop, array(img), i);
    CHECK(out == apply(crop, array(img), i));
    int which = -1;
    for (int w = 0; w < 4; ++w)
      if (out == windows[static_cast<std::size_t>(w)]) which = w;
    REQUIRE(which >= 0);
    ++seen[static_cast<std::size_t>(which)];
  }
  for (int c : seen) CHECK((c > 60 && c < 140));  // about 100 each

  // Padding (left, top, right, bottom) = (2, 0, 0, 0) on a 1x3 image: three windows.
  const xt::xarray<float> line{{1, 2, 3}};
  std::set<std::vector<float>> got;
  for (std::int64_t i = 0; i < 60; ++i) {
    const array out = apply(data::random_crop(1, 3, {2, 0, 0, 0}), array(line), i);
    const auto& o = out.get<float>();
    got.insert(std::vector<float>(o.data(), o.data() + o.size()));
  }
  CHECK(got == std::set<std::vector<float>>{{0, 0, 1}, {0, 1, 2}, {1, 2, 3}});

  // HWC with padding 1 on all sides: 9 windows, each a shifted copy with zeros.
  const xt::xarray<std::int32_t> hwc{{{1, 10}, {2, 20}}, {{3, 30}, {4, 40}}};
  std::map<std::pair<int, int>, int> offsets;
  for (std::int64_t i = 0; i < 300; ++i) {
    const array out = apply(data::random_crop(2, 2, 1), array(hwc), i, 5);
    const auto& o = out.get<std::int32_t>();
    REQUIRE(o.shape() == hwc.shape());
    bool matched = false;
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx) {
        bool ok = true;
        for (int y = 0; y < 2; ++y)
          for (int x = 0; x < 2; ++x)
            for (int c = 0; c < 2; ++c) {
              const int sy = y + dy, sx = x + dx;
              const int expected = (sy >= 0 && sy < 2 && sx >= 0 && sx < 2) ? hwc(sy, sx, c) : 0;
              ok = ok && o(y, x, c) == expected;
            }
        if (ok && !matched) {
          matched = true;
          ++offsets[{dy, dx}];
        }
      }
    CHECK(matched);
  }
  CHECK(offsets.size() == 9);

  // Another pass draws other offsets; the crop of the full image is the identity.
  int differ = 0;
  for (std::int64_t i = 0; i < 50; ++i) differ += !(apply(crop, array(img), i, 0) == apply(crop, array(img), i, 1));
  CHECK(differ > 10);
  CHECK(apply(data::random_crop(3, 3), array(img), 4) == array(img));

  CHECK_THROWS_WITH_AS(apply(data::random_crop(5, 5, 0), array(img)),
                       "random_crop: the crop 5x5 is larger than the padded image 3x3", error);
  CHECK_THROWS_WITH_AS(data::random_crop(0, 5), "random_crop: the crop size must be positive: got 0x5", error);
  CHECK_THROWS_WITH_AS(apply(data::random_crop(1, 1), array(xt::xarray<float>{1, 2})),
                       "random_crop: the image must have shape (height, width) or (height, width, channels): got (2,)",
                       error);
}

TEST_CASE("random_horizontal_flip: mirrors columns with the given probability") {
  const xt::xarray<std::uint8_t> img{{{1, 2}, {3, 4}, {5, 6}}, {{7, 8}, {9, 10}, {11, 12}}};
  const array flipped(xt::xarray<std::uint8_t>{{{5, 6}, {3, 4}, {1, 2}}, {{11, 12}, {9, 10}, {7, 8}}});
  CHECK(apply(data::random_horizontal_flip(1.0f), array(img), 3) == flipped);
  CHECK(apply(data::random_horizontal_flip(0.0f), array(img), 3) == array(img));
  CHECK(apply(data::random_horizontal_flip(1.0f), array(xt::xarray<float>{{1, 2, 3, 4}})) ==
        array(xt::xarray<float>{{4, 3, 2, 1}}));
  const array empty(xt::xarray<float>::from_shape({2, 0, 3}));
  CHECK(apply(data::random_horizontal_flip(1.0f), empty) == empty);

  const data::transform flip = data::random_horizontal_flip(0.5f, 9);
  int n = 0;
  for (std::int64_t i = 0; i < 1000; ++i) {
    const array out = apply(flip, array(img), i, 2);
    CHECK(out == apply(flip, array(img), i, 2));
    CHECK((out == flipped || out == array(img)));
    n += out == flipped;
  }
  CHECK((n > 430 && n < 570));
  CHECK_THROWS_WITH_AS(data::random_horizontal_flip(1.5f),
                       "random_horizontal_flip: the probability must be in [0, 1]: got 1.500000", error);
}

TEST_CASE("resize: bilinear with half-pixel centres") {
  // Up: (0, 10; 20, 30) to 4x4. Output column x samples sx = (x + 0.5) / 2 - 0.5 =
  // -0.25 (clamped to 0), 0.25, 0.75, 1.25 (upper neighbour clamped): rows blend alike.
  check_close(apply(data::resize(4, 4), array(xt::xarray<float>{{0, 10}, {20, 30}})),
              xt::xarray<float>{{0, 2.5f, 7.5f, 10}, {5, 7.5f, 12.5f, 15}, {15, 17.5f, 22.5f, 25}, {20, 22.5f, 27.5f, 30}});
  // Down by 2: sx = 2x + 0.5, the mean of each 2x2 block.
  xt::xarray<float> ramp = xt::xarray<float>::from_shape({4, 4});
  for (std::size_t i = 0; i < 16; ++i) ramp.data()[i] = static_cast<float>(i);
  check_close(apply(data::resize(2, 2), array(ramp)), xt::xarray<float>{{2.5f, 4.5f}, {10.5f, 12.5f}});
  // 3 -> 2 columns: sx = 0.25 and 1.75.
  check_close(apply(data::resize(1, 2), array(xt::xarray<float>{{0, 4, 8}})), xt::xarray<float>{{1, 7}});
  // HWC: channels independent.
  check_close(apply(data::resize(1, 4), array(xt::xarray<float>{{{0, 100}, {10, 200}}})),
              xt::xarray<float>{{{0, 100}, {2.5f, 125}, {7.5f, 175}, {10, 200}}});
  // uint8 rounds to nearest, halves away from zero: rows 0, .25, .75, 1 and .5, .75, 1.25, 1.5.
  const array u = apply(data::resize(4, 4), array(xt::xarray<std::uint8_t>{{0, 1}, {2, 3}}));
  CHECK(u.type() == dtype::uint8);
  CHECK(u.get<std::uint8_t>()(0, 0) == 0);
  CHECK(u.get<std::uint8_t>() == xt::xarray<std::uint8_t>{{0, 0, 1, 1}, {1, 1, 1, 2}, {2, 2, 2, 3}, {2, 2, 3, 3}});
  // int32, halves away from zero on both sides: -1 + 0.25 * 2 = -0.5 -> -1, 0.5 -> 1.
  CHECK(apply(data::resize(1, 4), array(xt::xarray<std::int32_t>{{-1, 1}})) ==
        array(xt::xarray<std::int32_t>{{-1, -1, 1, 1}}));
  CHECK(apply(data::resize(1, 4), array(xt::xarray<std::int32_t>{{-2, 1}})) ==
        array(xt::xarray<std::int32_t>{{-2, -1, 0, 1}}));
  // Same size: the identity.
  CHECK(apply(data::resize(4, 4), array(ramp)) == array(ramp));
  CHECK_THROWS_WITH_AS(data::resize(0, 3), "resize: the size must be positive: got 0x3", error);
}
