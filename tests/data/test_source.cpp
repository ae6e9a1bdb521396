// data/source.hpp: sharding (disjoint, complete, equal counts, wrap-around padding),
// the source shuffle, and generator_dataset.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>
#include <tessera/data/source.hpp>

namespace data_test_source {  // the file's own scope in its test group's translation unit

using namespace tessera;
using data::array;

namespace {

/// Sample i: column "v" = i (int32 scalar), column "w" = (i, -i) as float.
data::dataset counting(std::int64_t n, data::shard_options o = {}) {
  return data::generator_dataset(
      [](std::int64_t i) {
        return std::vector<array>{array::scalar(static_cast<std::int32_t>(i)),
                                  array(xt::xarray<float>{static_cast<float>(i), -static_cast<float>(i)})};
      },
      {"v", "w"}, n, o);
}

/// The "v" values one pass of a shard reads, checking that each row's index and
/// values agree with the generator.
std::vector<std::int64_t> read_shard(const data::dataset& ds, std::int64_t pass = 0) {
  std::vector<std::int64_t> out;
  for (const data::row& r : ds.epoch(pass)) {
    const std::int64_t v = r["v"].item<std::int32_t>();
    CHECK(r.index == v);
    CHECK(r["w"] == array(xt::xarray<float>{static_cast<float>(v), -static_cast<float>(v)}));
    out.push_back(v);
  }
  return out;
}

/// The sharding rule's properties for n samples on k shards: every shard reads
/// ceil(n / k) samples; the positions p = j * k + s below n are each sample once
/// (disjoint and complete); the positions from n on repeat the samples at p - n.
void check_sharding(std::int64_t n, std::int64_t k, bool shuffle, std::int64_t pass) {
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(shuffle);
  CAPTURE(pass);
  const std::int64_t m = (n + k - 1) / k;
  std::vector<std::int64_t> by_position(static_cast<std::size_t>(m * k), -1);
  for (std::int64_t s = 0; s < k; ++s) {
    const data::dataset ds = counting(n, {.num_shards = k, .shard_id = s, .shuffle = shuffle, .seed = 3});
    CHECK(ds.get_dataset_size() == m);
    const std::vector<std::int64_t> got = read_shard(ds, pass);
    REQUIRE(static_cast<std::int64_t>(got.size()) == m);
    CHECK(got == data::shard_indices(n, {.num_shards = k, .shard_id = s, .shuffle = shuffle, .seed = 3}, pass));
    for (std::int64_t j = 0; j < m; ++j) by_position[static_cast<std::size_t>(j * k + s)] = got[static_cast<std::size_t>(j)];
  }
  std::vector<std::int64_t> first(by_position.begin(), by_position.begin() + n);
  std::sort(first.begin(), first.end());
  for (std::int64_t i = 0; i < n; ++i) CHECK(first[static_cast<std::size_t>(i)] == i);
  for (std::int64_t p = n; p < m * k; ++p)
    CHECK(by_position[static_cast<std::size_t>(p)] == by_position[static_cast<std::size_t>(p % n)]);
}

}  // namespace

TEST_CASE("sharding: disjoint, complete and equal for shard counts that do and do not divide the size") {
  for (std::int64_t n : {1, 7, 10, 12, 60, 61})
    for (std::int64_t k : {1, 2, 3, 4, 5, 8, 13}) check_sharding(n, k, false, 0);
}

TEST_CASE("sharding: the documented example, 10 samples on 4 shards") {
  CHECK(read_shard(counting(10, {.num_shards = 4, .shard_id = 0})) == std::vector<std::int64_t>{0, 4, 8});
  CHECK(read_shard(counting(10, {.num_shards = 4, .shard_id = 1})) == std::vector<std::int64_t>{1, 5, 9});
  CHECK(read_shard(counting(10, {.num_shards = 4, .shard_id = 2})) == std::vector<std::int64_t>{2, 6, 0});
  CHECK(read_shard(counting(10, {.num_shards = 4, .shard_id = 3})) == std::vector<std::int64_t>{3, 7, 1});
}

TEST_CASE("sharding: an empty source gives empty shards") {
  const data::dataset ds = counting(0, {.num_shards = 3, .shard_id = 2});
  CHECK(ds.get_dataset_size() == 0);
  CHECK(read_shard(ds).empty());
}

TEST_CASE("source shuffle: one permutation on every shard, so shards stay disjoint and complete") {
  for (std::int64_t n : {10, 61})
    for (std::int64_t k : {1, 3, 4, 8})
      for (std::int64_t pass : {0, 1}) check_sharding(n, k, true, pass);
}

TEST_CASE("source shuffle: deterministic for a seed, new every pass") {
  const data::dataset a = counting(50, {.shuffle = true, .seed = 9});
  const std::vector<std::int64_t> p0 = read_shard(a, 0);
  CHECK(read_shard(a, 0) == p0);
  CHECK(read_shard(counting(50, {.shuffle = true, .seed = 9}), 0) == p0);
  CHECK(read_shard(a, 1) != p0);
  CHECK(read_shard(counting(50, {.shuffle = true, .seed = 10}), 0) != p0);
  std::vector<std::int64_t> sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 50; ++i) CHECK(sorted[static_cast<std::size_t>(i)] == i);
  CHECK(p0 != sorted);
}

TEST_CASE("generator_dataset: errors") {
  auto one = [](std::int64_t) { return std::vector<array>{array::scalar(1.0f)}; };
  CHECK_THROWS_WITH_AS(data::generator_dataset(one, {"a"}, 4, {.num_shards = 4, .shard_id = 4}),
                       "generator_dataset: shard_id must be in [0, num_shards): shard_id 4, num_shards 4", error);
  CHECK_THROWS_WITH_AS(data::generator_dataset(one, {"a"}, 4, {.num_shards = 0}),
                       "generator_dataset: num_shards must be at least 1: got 0", error);
  CHECK_THROWS_WITH_AS(data::generator_dataset(one, {"a"}, -1), "generator_dataset: size must not be negative: got -1",
                       error);
  CHECK_THROWS_WITH_AS(data::generator_dataset(one, {"a", "a"}, 1), "generator_dataset: column 'a' is named twice",
                       error);
  CHECK_THROWS_WITH_AS(data::generator_dataset(nullptr, {"a"}, 1), "generator_dataset: the callable is empty", error);
  const data::dataset two = data::generator_dataset(one, {"a", "b"}, 3);
  CHECK(two.column_names() == std::vector<std::string>{"a", "b"});
  auto it = two.epoch(0);
  CHECK_THROWS_WITH_AS(it.next(),
                       "generator_dataset: the callable must return one value per column: it returned 1 values for 2 "
                       "columns (a, b) at index 0",
                       error);
}
}  // namespace data_test_source
