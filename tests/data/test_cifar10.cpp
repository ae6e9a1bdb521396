// data/cifar10.hpp: binary records (label byte, CHW image) read back as HWC images;
// write_cifar10's file split; malformed files are errors; a seeded fuzz.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>
#include <tessera/data/cifar10.hpp>
#include <tessera/data/random.hpp>
#include <tessera/data/synthetic.hpp>
#include "temp_dir.hpp"

using namespace tessera;
using data::array;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t record = 3073, plane = 1024;

/// Checks that a row is record `rec` of a CIFAR-10 file: label byte, then CHW planes.
void check_record(const data::row& r, const unsigned char* rec) {
  REQUIRE(r["image"].shape() == std::vector<std::size_t>{32, 32, 3});
  CHECK(r["label"].type() == data::dtype::int32);
  CHECK(r["label"].item<int>() == rec[0]);
  const auto& img = r["image"].get<std::uint8_t>();
  bool same = true;
  for (std::size_t y = 0; y < 32; ++y)
    for (std::size_t x = 0; x < 32; ++x)
      for (std::size_t c = 0; c < 3; ++c) same = same && img(y, x, c) == rec[1 + c * plane + y * 32 + x];
  CHECK(same);
}

}  // namespace

TEST_CASE("cifar10: records written by hand read as HWC images with their labels") {
  test::temp_dir dir("cifar");
  std::vector<unsigned char> file;
  for (std::size_t r = 0; r < 3; ++r) {
    file.push_back(static_cast<unsigned char>(r + 3));
    for (std::size_t c = 0; c < 3; ++c)
      for (std::size_t y = 0; y < 32; ++y)
        for (std::size_t x = 0; x < 32; ++x) file.push_back(static_cast<unsigned char>((c * 7 + y * 3 + x + r) % 256));
  }
  test::write_all(dir.path() / "test_batch.bin", file);
  const data::dataset ds = data::cifar10_dataset(dir.path(), "test");
  CHECK(ds.get_dataset_size() == 3);
  std::size_t n = 0;
  for (const data::row& r : ds) {
    CHECK(r.index == static_cast<std::int64_t>(n));
    check_record(r, file.data() + n * record);
    // Pixel (y, x) = (5, 9), green: (1 * 7 + 5 * 3 + 9 + r) mod 256.
    CHECK(r["image"].get<std::uint8_t>()(5, 9, 1) == 7 + 15 + 9 + n);
    ++n;
  }
  CHECK(n == 3);
}

TEST_CASE("cifar10: write_cifar10 splits train over five files; reads give the arrays back") {
  test::temp_dir dir("cifar");
  const auto train = data::synthetic_images(12, 32, 32, 3, 10, 1);
  const auto test = data::synthetic_images(2, 32, 32, 3, 10, 2);
  data::write_cifar10(dir.path(), "train", train.images, train.labels);
  data::write_cifar10(dir.path(), "test", test.images, test.labels);
  // data_batch_k holds records [(k - 1) 12 / 5, 12 k / 5): 2, 2, 3, 2, 3.
  const std::size_t counts[5] = {2, 2, 3, 2, 3};
  for (int k = 1; k <= 5; ++k)
    CHECK(fs::file_size(dir.path() / ("data_batch_" + std::to_string(k) + ".bin")) == counts[k - 1] * record);

  auto check_all = [](const data::dataset& ds, const data::labelled_images& a, std::size_t first) {
    for (const data::row& r : ds) {
      const std::size_t i = static_cast<std::size_t>(r.index) - first;
      const auto& img = r["image"].get<std::uint8_t>();
      CHECK(std::equal(img.data(), img.data() + img.size(), a.images.data() + i * 3072));
      CHECK(r["label"].item<int>() == a.labels(i));
    }
  };
  const data::dataset tr = data::cifar10_dataset(dir.path(), "train");
  CHECK(tr.get_dataset_size() == 12);
  check_all(tr, train, 0);
  check_all(data::cifar10_dataset(dir.path(), "test"), test, 0);
  const data::dataset all = data::cifar10_dataset(dir.path());
  CHECK(all.get_dataset_size() == 14);
  std::vector<int> labels;
  for (const data::row& r : all) labels.push_back(r["label"].item<int>());
  for (std::size_t i = 0; i < 14; ++i) CHECK(labels[i] == (i < 12 ? train.labels(i) : test.labels(i - 12)));

  // Seed 001's sharding: 14 samples on 4 shards, 4 each, covering all.
  std::vector<int> seen(14, 0);
  for (std::int64_t s = 0; s < 4; ++s) {
    const data::dataset shard = data::cifar10_dataset(dir.path(), "all", {.num_shards = 4, .shard_id = s, .shuffle = true});
    CHECK(shard.get_dataset_size() == 4);
    for (const data::row& r : shard) ++seen[static_cast<std::size_t>(r.index)];
  }
  int twice = 0;
  for (int v : seen) {
    CHECK((v == 1 || v == 2));
    twice += v == 2;
  }
  CHECK(twice == 2);
}

TEST_CASE("cifar10: missing files, partial records and bad labels are errors naming the file") {
  test::temp_dir dir("cifar");
  const fs::path d = dir.path();
  const auto a = data::synthetic_images(10, 32, 32, 3, 10, 3);
  data::write_cifar10(d, "train", a.images, a.labels);
  const std::string p3 = (d / "data_batch_3.bin").string(), pt = (d / "test_batch.bin").string();

  CHECK_THROWS_WITH_AS(data::cifar10_dataset(d, "test"), ("cifar10: " + pt + ": no such file").c_str(), error);
  CHECK_THROWS_WITH_AS(data::cifar10_dataset(d / "x"), ("cifar10: dataset folder " + (d / "x").string() + " does not exist").c_str(), error);
  CHECK_THROWS_WITH_AS(data::cifar10_dataset(d, "eval"), "cifar10: usage must be \"train\", \"test\", or \"all\": got \"eval\"", error);

  std::vector<unsigned char> b = test::read_all(p3);
  b.push_back(0);
  test::write_all(p3, b);
  CHECK_THROWS_WITH_AS(data::cifar10_dataset(d, "train"),
                       ("cifar10: " + p3 + ": the file must hold whole 3073-byte records (a label byte, then a 3x32x32 "
                        "image): it has 6147 bytes, 1 more than 2 records").c_str(),
                       error);
  b.resize(3000);
  test::write_all(p3, b);
  CHECK_THROWS_WITH_AS(data::cifar10_dataset(d, "train"),
                       ("cifar10: " + p3 + ": the file must hold whole 3073-byte records (a label byte, then a 3x32x32 "
                        "image): it has 3000 bytes, less than one record").c_str(),
                       error);
  fs::remove(p3);
  CHECK_THROWS_WITH_AS(data::cifar10_dataset(d, "train"), ("cifar10: " + p3 + ": no such file").c_str(), error);

  data::write_cifar10(d, "test", a.images, a.labels);
  b = test::read_all(pt);
  b[record * 7] = 10;  // record 7's label
  test::write_all(pt, b);
  auto it = data::cifar10_dataset(d, "test").epoch(0);
  for (int i = 0; i < 7; ++i) CHECK(it.next().has_value());
  CHECK_THROWS_WITH_AS(it.next(), ("cifar10: " + pt + ": record 7 has label 10, not in [0, 9]").c_str(), error);

  CHECK_THROWS_WITH_AS(data::write_cifar10(d, "test", xt::xarray<std::uint8_t>::from_shape({2, 3, 32, 32}), a.labels),
                       "write_cifar10: images must have shape (n, 32, 32, 3): got (2, 3, 32, 32)", error);
  CHECK_THROWS_WITH_AS(data::write_cifar10(d, "all", a.images, a.labels),
                       "write_cifar10: usage must be \"train\", \"test\": got \"all\"", error);
}

TEST_CASE("cifar10: fuzz: truncated or corrupted files read valid data or throw tessera::error") {
  test::temp_dir dir("cifar_fuzz");
  const fs::path path = dir.path() / "test_batch.bin";
  const auto a = data::synthetic_images(5, 32, 32, 3, 10, 4);
  data::write_cifar10(dir.path(), "test", a.images, a.labels);
  const std::vector<unsigned char> valid = test::read_all(path);
  data::rng g(77);
  int errors = 0, reads = 0;
  for (int c = 0; c < 300; ++c) {
    CAPTURE(c);
    std::vector<unsigned char> b = valid;
    switch (g.below(4)) {
      case 0: b.resize(g.below(b.size())); break;                                    // truncate anywhere
      case 1: b.resize(record * g.below(5) + g.below(3)); break;                      // near a record boundary
      case 2:                                                                         // corrupt label bytes
        for (std::uint64_t k = 0, n = 1 + g.below(2); k < n; ++k) b[record * g.below(5)] = static_cast<unsigned char>(g.below(256));
        break;
      default:                                                                        // corrupt any byte, or append
        if (g.below(2)) b[g.below(b.size())] = static_cast<unsigned char>(g.below(256));
        else b.insert(b.end(), 1 + g.below(4000), 0);
    }
    test::write_all(path, b);
    try {
      const std::int64_t k = 1 + static_cast<std::int64_t>(g.below(3));
      for (std::int64_t s = 0; s < k; ++s) {
        const data::dataset ds = data::cifar10_dataset(dir.path(), "test", {.num_shards = k, .shard_id = s});
        REQUIRE(b.size() % record == 0);
        for (const data::row& r : ds) {
          REQUIRE(static_cast<std::size_t>(r.index) < b.size() / record);
          check_record(r, b.data() + static_cast<std::size_t>(r.index) * record);
          CHECK(r["label"].item<int>() <= 9);
        }
      }
      ++reads;
    } catch (const error&) {
      ++errors;
    }
  }
  MESSAGE(errors << " cases raised tessera::error, " << reads << " read valid data");
  CHECK(errors > 100);
  CHECK(reads > 30);
}
