// data/mnist.hpp: idx-ubyte files written by write_mnist (and by hand) read back
// exactly; sharded reads; every malformed file is a tessera::error with its numbers;
// a seeded fuzz of truncations and header corruptions.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>
#include <tessera/data/mnist.hpp>
#include <tessera/data/random.hpp>
#include "temp_dir.hpp"

using namespace tessera;
using data::array;
namespace fs = std::filesystem;

namespace {

struct mnist_arrays {
  xt::xarray<std::uint8_t> images, labels;
};

/// n random images of rows x cols and labels in [0, 9].
mnist_arrays random_mnist(std::size_t n, std::size_t rows, std::size_t cols, std::uint64_t seed) {
  data::rng g(seed);
  mnist_arrays m{xt::xarray<std::uint8_t>::from_shape({n, rows, cols}), xt::xarray<std::uint8_t>::from_shape({n})};
  for (auto& v : m.images.storage()) v = static_cast<std::uint8_t>(g.below(256));
  for (auto& v : m.labels.storage()) v = static_cast<std::uint8_t>(g.below(10));
  return m;
}

/// Checks that `ds` yields exactly image i and label i of `m` for each row index i.
void check_rows(const data::dataset& ds, const mnist_arrays& m, std::size_t first = 0) {
  const std::size_t rows = m.images.shape()[1], cols = m.images.shape()[2];
  std::size_t n = 0;
  for (const data::row& r : ds) {
    const std::size_t i = static_cast<std::size_t>(r.index) - first;
    const auto& img = r["image"].get<std::uint8_t>();
    REQUIRE(r["image"].shape() == std::vector<std::size_t>{rows, cols, 1});
    for (std::size_t y = 0; y < rows; ++y)
      for (std::size_t x = 0; x < cols; ++x) CHECK(img(y, x, 0) == m.images(i, y, x));
    CHECK(r["label"].type() == data::dtype::int32);
    CHECK(r["label"].ndim() == 0);
    CHECK(r["label"].item<int>() == m.labels(i));
    ++n;
  }
  CHECK(n == static_cast<std::size_t>(ds.get_dataset_size()));
}

std::vector<unsigned char> be32(std::uint32_t v) {
  return {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16), static_cast<unsigned char>(v >> 8),
          static_cast<unsigned char>(v)};
}
std::uint32_t be32_at(const std::vector<unsigned char>& b, std::size_t i) {
  return (std::uint32_t{b[i]} << 24) | (std::uint32_t{b[i + 1]} << 16) | (std::uint32_t{b[i + 2]} << 8) | b[i + 3];
}

}  // namespace

TEST_CASE("mnist: write_mnist, then mnist_dataset reads every image and label back exactly") {
  test::temp_dir dir("mnist");
  const mnist_arrays train = random_mnist(6, 3, 4, 1), test = random_mnist(4, 3, 4, 2);
  data::write_mnist(dir.path(), "train", train.images, train.labels);
  data::write_mnist(dir.path(), "test", test.images, test.labels);
  CHECK(fs::file_size(dir.path() / "train-images-idx3-ubyte") == 16 + 6 * 12);
  CHECK(fs::file_size(dir.path() / "t10k-labels-idx1-ubyte") == 8 + 4);

  const data::dataset tr = data::mnist_dataset(dir.path(), "train");
  CHECK(tr.get_dataset_size() == 6);
  CHECK(tr.column_names() == std::vector<std::string>{"image", "label"});
  check_rows(tr, train);
  check_rows(data::mnist_dataset(dir.path(), "test"), test);

  // "all": train, then test.
  const data::dataset all = data::mnist_dataset(dir.path());
  CHECK(all.get_dataset_size() == 10);
  std::vector<int> labels;
  for (const data::row& r : all) labels.push_back(r["label"].item<int>());
  for (std::size_t i = 0; i < 10; ++i) CHECK(labels[i] == (i < 6 ? train.labels(i) : test.labels(i - 6)));

  // Shards of "all" cover it: 10 samples on 3 shards, 4 each.
  std::vector<int> seen(10, 0);
  for (std::int64_t s = 0; s < 3; ++s) {
    const data::dataset shard = data::mnist_dataset(dir.path(), "all", {.num_shards = 3, .shard_id = s});
    CHECK(shard.get_dataset_size() == 4);
    for (const data::row& r : shard) ++seen[static_cast<std::size_t>(r.index)];
  }
  CHECK(seen == std::vector<int>{2, 2, 1, 1, 1, 1, 1, 1, 1, 1});  // positions 10, 11 wrap to 0, 1

  // (n, rows, cols, 1) images are accepted too.
  test::temp_dir dir2("mnist");
  xt::xarray<std::uint8_t> hwc = train.images;
  hwc.reshape({6, 3, 4, 1});
  data::write_mnist(dir2.path(), "train", hwc, train.labels);
  check_rows(data::mnist_dataset(dir2.path(), "train"), train);
}

TEST_CASE("mnist: a file written by hand in the idx format") {
  test::temp_dir dir("mnist");
  std::vector<unsigned char> images = be32(0x803), labels = be32(0x801);
  for (std::uint32_t v : {2u, 2u, 3u}) {
    const auto b = be32(v);
    images.insert(images.end(), b.begin(), b.end());
  }
  const auto two = be32(2);
  labels.insert(labels.end(), two.begin(), two.end());
  for (unsigned char p = 0; p < 12; ++p) images.push_back(static_cast<unsigned char>(p * 20));  // row-major
  labels.push_back(7);
  labels.push_back(0);
  test::write_all(dir.path() / "t10k-images-idx3-ubyte", images);
  test::write_all(dir.path() / "t10k-labels-idx1-ubyte", labels);
  auto it = data::mnist_dataset(dir.path(), "test").epoch(0);
  const data::row a = *it.next(), b = *it.next();
  CHECK_FALSE(it.next().has_value());
  xt::xarray<std::uint8_t> first{{0, 20, 40}, {60, 80, 100}}, second{{120, 140, 160}, {180, 200, 220}};
  first.reshape({2, 3, 1});
  second.reshape({2, 3, 1});
  CHECK(a["image"] == array(first));
  CHECK(b["image"] == array(second));
  CHECK(a["label"] == array::scalar(std::int32_t{7}));
  CHECK(b["label"] == array::scalar(std::int32_t{0}));
}

TEST_CASE("mnist: missing, truncated and corrupt files are errors naming the file and the numbers") {
  test::temp_dir dir("mnist");
  const mnist_arrays m = random_mnist(6, 3, 4, 3);
  const fs::path d = dir.path();
  const std::string P = (d / "train-images-idx3-ubyte").string(), Q = (d / "train-labels-idx1-ubyte").string();
  auto reset = [&] { data::write_mnist(d, "train", m.images, m.labels); };
  auto expect = [&](const std::string& message) {
    CHECK_THROWS_WITH_AS(data::mnist_dataset(d, "train"), message.c_str(), error);
    reset();
  };
  auto edit = [](const std::string& path, auto&& change) {
    std::vector<unsigned char> b = test::read_all(path);
    change(b);
    test::write_all(path, b);
  };
  reset();

  CHECK_THROWS_WITH_AS(data::mnist_dataset(d / "nope"), ("mnist: dataset folder " + (d / "nope").string() + " does not exist").c_str(), error);
  CHECK_THROWS_WITH_AS(data::mnist_dataset(d, "test"), ("mnist: " + (d / "t10k-images-idx3-ubyte").string() + ": no such file").c_str(), error);
  CHECK_THROWS_WITH_AS(data::mnist_dataset(d, "val"), "mnist: usage must be \"train\", \"test\", or \"all\": got \"val\"", error);
  CHECK_THROWS_WITH_AS(data::mnist_dataset(d, "train", {.num_shards = 2, .shard_id = -1}),
                       "mnist: shard_id must be in [0, num_shards): shard_id -1, num_shards 2", error);
  fs::remove(Q);
  expect("mnist: " + Q + ": no such file");

  edit(P, [](auto& b) { b.resize(10); });
  expect("mnist: " + P + ": truncated: an image file starts with a 16-byte header, the file has 10 bytes");
  edit(P, [](auto& b) { b[3] = 0x02; });
  expect("mnist: " + P + ": wrong magic number 0x00000802: an image file starts with 0x00000803 (unsigned bytes, 3 dims)");
  edit(P, [](auto& b) { b.resize(40); });
  expect("mnist: " + P + ": truncated: the header says 6 images of 3x4 (88 bytes), the file has 40 bytes");
  edit(P, [](auto& b) { b.push_back(0); });
  expect("mnist: " + P + ": longer than its header says: the header says 6 images of 3x4 (88 bytes), the file has 89 bytes");
  edit(P, [](auto& b) { b[11] = 0; });
  expect("mnist: " + P + ": the header says 6 images of 0x4: an image must have at least one row and column");
  edit(P, [](auto& b) { std::fill(b.begin() + 4, b.begin() + 16, 0xff); });
  expect("mnist: " + P + ": truncated: the header says 4294967295 images of 4294967295x4294967295 (over 2^64 bytes), "
         "the file has 88 bytes");
  // The example of an MNIST header with a short file.
  edit(P, [](auto& b) {
    b.resize(1000);
    const auto n = be32(60000), s = be32(28);
    std::copy(n.begin(), n.end(), b.begin() + 4);
    std::copy(s.begin(), s.end(), b.begin() + 8);
    std::copy(s.begin(), s.end(), b.begin() + 12);
  });
  expect("mnist: " + P + ": truncated: the header says 60000 images of 28x28 (47040016 bytes), the file has 1000 bytes");

  edit(Q, [](auto& b) { b.resize(5); });
  expect("mnist: " + Q + ": truncated: a label file starts with an 8-byte header, the file has 5 bytes");
  edit(Q, [](auto& b) { b[3] = 0x03; });
  expect("mnist: " + Q + ": wrong magic number 0x00000803: a label file starts with 0x00000801 (unsigned bytes, 1 dim)");
  edit(Q, [](auto& b) { b.resize(12); });
  expect("mnist: " + Q + ": truncated: the header says 6 labels (14 bytes), the file has 12 bytes");
  edit(Q, [](auto& b) {
    b[7] = 5;
    b.pop_back();
  });
  expect("mnist: the image and label counts differ: " + P + " has 6 images, " + Q + " has 5 labels");

  edit(Q, [](auto& b) { b[8 + 2] = 12; });
  expect("mnist: " + Q + ": label 12 of image 2 is not in [0, 9]");

  // A file cut short after the dataset was made.
  {
    const data::dataset ds = data::mnist_dataset(d, "train");
    edit(P, [](auto& b) { b.resize(70); });
    auto it = ds.epoch(0);
    for (int i = 0; i < 4; ++i) CHECK(it.next().has_value());
    CHECK_THROWS_WITH_AS(it.next(), ("mnist: " + P + ": short read: 12 bytes at offset 64 (the file is shorter than when "
                                     "the dataset was made)").c_str(),
                         error);
  }
  reset();

  // "all" needs one image size.
  const mnist_arrays small = random_mnist(2, 2, 2, 4);
  data::write_mnist(d, "test", small.images, small.labels);
  CHECK_THROWS_WITH_AS(data::mnist_dataset(d, "all"),
                       ("mnist: every file must hold images of one size: " + P + " has 3x4, " +
                        (d / "t10k-images-idx3-ubyte").string() + " has 2x2").c_str(),
                       error);

  CHECK_THROWS_WITH_AS(data::write_mnist(d, "all", m.images, m.labels),
                       "write_mnist: usage must be \"train\", \"test\": got \"all\"", error);
  CHECK_THROWS_WITH_AS(data::write_mnist(d, "train", xt::xarray<std::uint8_t>::from_shape({6, 12}), m.labels),
                       "write_mnist: images must have shape (n, rows, cols) or (n, rows, cols, 1): got (6, 12)", error);
  CHECK_THROWS_WITH_AS(data::write_mnist(d, "train", m.images, xt::xarray<std::uint8_t>::from_shape({5})),
                       "write_mnist: labels must have shape (n,) with n = 6 images: got (5,)", error);
}

TEST_CASE("mnist: fuzz: truncated or corrupted files read valid data or throw tessera::error") {
  test::temp_dir dir("mnist_fuzz");
  const fs::path d = dir.path();
  const mnist_arrays m = random_mnist(7, 4, 5, 5);
  data::write_mnist(d, "train", m.images, m.labels);
  const fs::path paths[2] = {d / "train-images-idx3-ubyte", d / "train-labels-idx1-ubyte"};
  const std::vector<unsigned char> valid[2] = {test::read_all(paths[0]), test::read_all(paths[1])};
  const std::size_t header[2] = {16, 8};

  data::rng g(2024);
  int errors = 0, reads = 0;
  for (int c = 0; c < 400; ++c) {
    CAPTURE(c);
    std::vector<unsigned char> files[2] = {valid[0], valid[1]};
    const std::size_t f = g.below(2);
    std::vector<unsigned char>& b = files[f];
    switch (g.below(4)) {
      case 0: b.resize(g.below(b.size())); break;                       // truncate anywhere
      case 1: b.resize(g.below(header[f] + 1)); break;                  // truncate in the header
      case 2:                                                           // corrupt header bytes
        for (std::uint64_t k = 0, n = 1 + g.below(3); k < n; ++k) b[g.below(header[f])] = static_cast<unsigned char>(g.below(256));
        break;
      default:                                                          // corrupt any byte, or append
        if (g.below(2)) b[g.below(b.size())] = static_cast<unsigned char>(g.below(256));
        else b.push_back(static_cast<unsigned char>(g.below(256)));
    }
    test::write_all(paths[0], files[0]);
    test::write_all(paths[1], files[1]);
    try {
      const std::int64_t k = 1 + static_cast<std::int64_t>(g.below(3));
      for (std::int64_t s = 0; s < k; ++s) {
        const data::dataset ds = data::mnist_dataset(d, "train", {.num_shards = k, .shard_id = s});
        // It read: the rows must be the files' bytes as their headers describe them.
        const auto& im = files[0];
        const std::size_t rows = be32_at(im, 8), cols = be32_at(im, 12), n = be32_at(im, 4);
        REQUIRE(im.size() == 16 + n * rows * cols);
        for (const data::row& r : ds) {
          const std::size_t i = static_cast<std::size_t>(r.index);
          REQUIRE(i < n);
          REQUIRE(r["image"].shape() == std::vector<std::size_t>{rows, cols, 1});
          const auto& img = r["image"].get<std::uint8_t>();
          CHECK(std::equal(img.data(), img.data() + img.size(), im.begin() + static_cast<std::ptrdiff_t>(16 + i * rows * cols)));
          CHECK(r["label"].item<int>() == files[1][8 + i]);
          CHECK(r["label"].item<int>() <= 9);
        }
      }
      ++reads;
    } catch (const error&) {
      ++errors;
    }
  }
  MESSAGE(errors << " cases raised tessera::error, " << reads << " read valid data");
  CHECK(errors > 200);
  CHECK(reads > 10);
}
