// data/synthetic.hpp: reproducible labelled images whose classes a nearest-mean rule
// separates (so a small network can learn them).
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <vector>
#include <tessera/data/synthetic.hpp>

namespace data_test_synthetic {  // the file's own scope in its test group's translation unit

using namespace tessera;

TEST_CASE("synthetic_images: shapes, label range, reproducibility") {
  const auto a = data::synthetic_images(50, 6, 5, 3, 4, 11);
  CHECK(a.images.shape() == xt::xarray<std::uint8_t>::shape_type{50, 6, 5, 3});
  CHECK(a.labels.shape() == xt::xarray<std::uint8_t>::shape_type{50});
  for (auto l : a.labels) CHECK(l < 4);
  const auto b = data::synthetic_images(50, 6, 5, 3, 4, 11);
  CHECK(a.images == b.images);
  CHECK(a.labels == b.labels);
  CHECK_FALSE(data::synthetic_images(50, 6, 5, 3, 4, 12).images == a.images);
  CHECK_THROWS_WITH_AS(data::synthetic_images(1, 1, 1, 1, 0, 1), "synthetic_images: num_classes must be in [1, 256]: got 0",
                       error);
}

TEST_CASE("synthetic_images: every image is nearest to its own class's mean") {
  const std::size_t n = 400, px = 28 * 28;
  const auto a = data::synthetic_images(n, 28, 28, 1, 10, 3);
  std::vector<double> mean(10 * px, 0.0);
  std::vector<int> count(10, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t l = a.labels(i);
    ++count[l];
    for (std::size_t k = 0; k < px; ++k) mean[l * px + k] += a.images.data()[i * px + k];
  }
  for (std::size_t l = 0; l < 10; ++l) {
    CHECK(count[l] > 15);
    for (std::size_t k = 0; k < px; ++k) mean[l * px + k] /= count[l];
  }
  std::size_t right = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double best = std::numeric_limits<double>::max();
    std::size_t arg = 0;
    for (std::size_t l = 0; l < 10; ++l) {
      double d = 0;
      for (std::size_t k = 0; k < px; ++k) {
        const double e = a.images.data()[i * px + k] - mean[l * px + k];
        d += e * e;
      }
      if (d < best) best = d, arg = l;
    }
    right += arg == a.labels(i);
  }
  CHECK(right == n);
}
}  // namespace data_test_synthetic
