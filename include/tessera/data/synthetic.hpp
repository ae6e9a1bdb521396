// Synthetic labelled images, learnable by a small network: for examples and tests
// that write them with write_mnist / write_cifar10 and read them back.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/error.hpp>
#include <tessera/data/random.hpp>

namespace tessera::data {

/// Images and their labels, as write_mnist and write_cifar10 take them.
struct labelled_images {
  xt::xarray<std::uint8_t> images;  // (n, height, width, channels)
  xt::xarray<std::uint8_t> labels;  // (n,), in [0, num_classes)
};

/// n images of height x width x channels: each class has a fixed random pattern, and
/// each image is its class's pattern plus uniform noise of +-`noise` grey levels
/// (clamped to [0, 255]); labels are uniform over the classes. The same arguments give
/// the same images everywhere.
///
///     auto [images, labels] = data::synthetic_images(600, 28, 28, 1, 10, /*seed=*/1);
///     data::write_mnist(dir, "train", images, labels);
inline labelled_images synthetic_images(std::size_t n, std::size_t height, std::size_t width, std::size_t channels,
                                        int num_classes, std::uint64_t seed, int noise = 48) {
  if (num_classes < 1 || num_classes > 256)
    throw error("synthetic_images: num_classes must be in [1, 256]: got " + std::to_string(num_classes));
  if (noise < 0 || noise > 255)
    throw error("synthetic_images: noise must be in [0, 255]: got " + std::to_string(noise));
  const std::size_t pixels = height * width * channels;
  std::vector<std::uint8_t> patterns(static_cast<std::size_t>(num_classes) * pixels);
  rng g(make_key({seed, 0x70617474}));
  for (std::uint8_t& v : patterns) v = static_cast<std::uint8_t>(g.below(256));
  labelled_images out{xt::xarray<std::uint8_t>::from_shape({n, height, width, channels}),
                      xt::xarray<std::uint8_t>::from_shape({n})};
  for (std::size_t i = 0; i < n; ++i) {
    const auto label = static_cast<std::uint8_t>(g.below(static_cast<std::uint64_t>(num_classes)));
    out.labels(i) = label;
    const std::uint8_t* p = patterns.data() + label * pixels;
    std::uint8_t* img = out.images.data() + i * pixels;
    for (std::size_t k = 0; k < pixels; ++k) {
      const int v = int{p[k]} + static_cast<int>(g.below(2 * static_cast<std::uint64_t>(noise) + 1)) - noise;
      img[k] = static_cast<std::uint8_t>(std::clamp(v, 0, 255));
    }
  }
  return out;
}

}  // namespace tessera::data
