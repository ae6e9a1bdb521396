// data/dataset.hpp: batch, repeat, shuffle and map on generator datasets; sizes,
// determinism, map on several worker threads (the sequential rows, in order), and the
// operations' errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <tessera/data/source.hpp>
#include <tessera/data/transforms.hpp>

namespace data_test_dataset {  // the file's own scope in its test group's translation unit

using namespace tessera;
using data::array;

namespace {

data::dataset counting(std::int64_t n, data::shard_options o = {}) {
  return data::generator_dataset(
      [](std::int64_t i) {
        return std::vector<array>{array::scalar(static_cast<std::int32_t>(i)),
                                  array(xt::xarray<float>{static_cast<float>(i), 10.0f * static_cast<float>(i)})};
      },
      {"v", "w"}, n, o);
}

/// Every value of column "v" one pass yields, batches flattened.
std::vector<std::int32_t> values(const data::dataset& ds, std::int64_t pass = 0) {
  std::vector<std::int32_t> out;
  for (const data::row& r : ds.epoch(pass)) {
    const auto& v = r["v"].get<std::int32_t>();
    out.insert(out.end(), v.data(), v.data() + v.size());
  }
  return out;
}

std::int64_t count_rows(const data::dataset& ds, std::int64_t pass = 0) {
  std::int64_t n = 0;
  for (auto it = ds.epoch(pass); it.next();) ++n;
  return n;
}

}  // namespace

TEST_CASE("batch: stacks consecutive rows; the last batch is short unless dropped") {
  const data::dataset b = counting(7).batch(3);
  CHECK(b.get_dataset_size() == 3);
  std::vector<data::row> rows;
  for (const data::row& r : b) rows.push_back(r);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0]["v"] == array(xt::xarray<std::int32_t>{0, 1, 2}));
  CHECK(rows[0]["w"] == array(xt::xarray<float>{{0, 0}, {1, 10}, {2, 20}}));
  CHECK(rows[2]["v"] == array(xt::xarray<std::int32_t>{6}));
  CHECK(rows[2]["w"].shape() == std::vector<std::size_t>{1, 2});
  for (int i = 0; i < 3; ++i) CHECK(rows[static_cast<std::size_t>(i)].index == i);

  const data::dataset d = counting(7).batch(3, true);
  CHECK(d.get_dataset_size() == 2);
  CHECK(values(d) == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("batch, repeat: get_dataset_size equals the rows a pass yields") {
  for (std::int64_t n : {0, 1, 5, 12, 13})
    for (std::int64_t b : {1, 4, 5, 13, 20})
      for (bool drop : {false, true})
        for (std::int64_t rep : {1, 3}) {
          CAPTURE(n);
          CAPTURE(b);
          CAPTURE(drop);
          CAPTURE(rep);
          const data::dataset ds = counting(n).batch(b, drop).repeat(rep);
          const std::int64_t per_pass = drop ? n / b : (n + b - 1) / b;
          CHECK(ds.get_dataset_size() == per_pass * rep);
          CHECK(count_rows(ds) == per_pass * rep);
        }
  // Sharded: batches of one shard's rows.
  const data::dataset s = counting(10, {.num_shards = 4, .shard_id = 3}).batch(2);
  CHECK(s.get_dataset_size() == 2);
  CHECK(values(s) == std::vector<std::int32_t>{3, 7, 1});
}

TEST_CASE("repeat: pass p runs the child's passes p * count ... p * count + count - 1") {
  const data::dataset child = counting(6, {.shuffle = true, .seed = 4});
  const data::dataset rep = child.repeat(3);
  for (std::int64_t p : {0, 2}) {
    std::vector<std::int32_t> expected;
    for (std::int64_t k = 0; k < 3; ++k) {
      const std::vector<std::int32_t> part = values(child, p * 3 + k);
      expected.insert(expected.end(), part.begin(), part.end());
    }
    CHECK(values(rep, p) == expected);
  }
  // Each repetition is shuffled anew.
  const std::vector<std::int32_t> all = values(rep);
  CHECK(!std::equal(all.begin(), all.begin() + 6, all.begin() + 6));
}

TEST_CASE("shuffle: a permutation, deterministic for a seed and pass, different across seeds and passes") {
  const data::dataset s = counting(100).shuffle(16, 5);
  CHECK(s.get_dataset_size() == 100);
  const std::vector<std::int32_t> a = values(s);
  CHECK(values(s) == a);
  CHECK(values(counting(100).shuffle(16, 5)) == a);
  CHECK(values(s, 1) != a);
  CHECK(values(counting(100).shuffle(16, 6)) != a);
  std::vector<std::int32_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 100; ++i) CHECK(sorted[static_cast<std::size_t>(i)] == i);
  CHECK(a != sorted);
}

TEST_CASE("shuffle: the t-th output is among the first t + buffer_size inputs; buffer 1 keeps the order") {
  for (std::int64_t buffer : {1, 2, 7, 50, 200}) {
    const std::vector<std::int32_t> a = values(counting(100).shuffle(buffer, 11));
    for (std::size_t t = 0; t < a.size(); ++t) CHECK(a[t] < static_cast<std::int32_t>(t) + buffer);
  }
  std::vector<std::int32_t> id(20);
  for (int i = 0; i < 20; ++i) id[static_cast<std::size_t>(i)] = i;
  CHECK(values(counting(20).shuffle(1, 3)) == id);
}

TEST_CASE("map: applies its transforms in order to one column, with the row's index and pass") {
  const data::transform plus_one = [](array a) {
    a.get<float>() += 1.0f;
    return a;
  };
  const data::transform times_two = [](array a) {
    a.get<float>() *= 2.0f;
    return a;
  };
  const data::transform stamp = [](array a, const data::sample_info& s) {
    a.get<float>()(1) = static_cast<float>(1000 * s.pass + s.index);
    return a;
  };
  const data::dataset ds = counting(4, {.shuffle = true, .seed = 1}).map({plus_one, times_two, stamp}, "w");
  for (std::int64_t pass : {0, 3})
    for (auto it = ds.epoch(pass); auto r = it.next();) {
      const float i = static_cast<float>(r->index);
      CHECK(r->index == r->values[0].item<std::int32_t>());
      CHECK(r->values[1] == array(xt::xarray<float>{(i + 1) * 2, static_cast<float>(1000 * pass) + i}));
    }
  CHECK_THROWS_WITH_AS(counting(4).map({plus_one}, "x"), "map: no column 'x'; the columns are v, w", error);
}

TEST_CASE("map with worker threads: the sequential map's rows, in order, for any number of workers") {
  // A random transform (seeded by index and pass) and one that sleeps a different time
  // for each row, so that the threads finish out of order.
  const data::transform jitter = [](array a, const data::sample_info& s) {
    std::this_thread::sleep_for(std::chrono::microseconds((s.index * 7919) % 13 * 50));
    a.get<float>() += static_cast<float>(s.index % 5);
    return a;
  };
  const data::dataset images = data::generator_dataset(
      [](std::int64_t i) {
        xt::xarray<float> img = xt::xarray<float>::from_shape({6, 6, 1});
        for (std::size_t k = 0; k < img.size(); ++k) img.data()[k] = static_cast<float>(i * 100 + std::int64_t(k));
        return std::vector<array>{array::scalar(static_cast<std::int32_t>(i)), array(std::move(img))};
      },
      {"v", "image"}, 40, {.shuffle = true, .seed = 3});
  const std::vector<data::transform> ops{data::random_crop(4, 4, 1, 5), jitter};
  auto rows = [](const data::dataset& ds, std::int64_t pass) {
    std::vector<data::row> out;
    for (const data::row& r : ds.epoch(pass)) out.push_back(r);
    return out;
  };
  for (const std::int64_t pass : {0, 2}) {
    const std::vector<data::row> want = rows(images.map(ops, "image").batch(3), pass);
    REQUIRE(want.size() == 14);
    for (const int workers : {2, 4, 8}) {
      CAPTURE(pass);
      CAPTURE(workers);
      for (const data::dataset& ds : {images.map(ops, "image", workers).batch(3),
                                      images.map(ops, "image", workers).batch(3).prefetch(2)}) {
        const std::vector<data::row> got = rows(ds, pass);
        REQUIRE(got.size() == want.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
          CHECK(got[i].index == want[i].index);
          CHECK(got[i]["v"] == want[i]["v"]);
          CHECK(got[i]["image"] == want[i]["image"]);
        }
      }
    }
  }
}

TEST_CASE("map with worker threads: a transform's error after the rows before it; a pass left early") {
  std::atomic<int> calls{0};
  const data::transform fails_at_5 = [&](array a, const data::sample_info& s) {
    ++calls;
    if (s.index == 5) throw std::runtime_error("transform failed at row 5");
    return a;
  };
  {
    auto it = counting(20).map({fails_at_5}, "w", 3).epoch(0);
    for (std::int32_t i = 0; i < 5; ++i) CHECK(it.next()->index == i);
    CHECK_THROWS_WITH(it.next(), "transform failed at row 5");
  }
  // Left after two rows of many: the threads stop after the rows in flight (at most
  // twice the workers, read ahead of the consumer).
  calls = 0;
  {
    auto early = counting(1000).map({fails_at_5}, "w", 4).epoch(0);
    CHECK(early.next()->index == 0);
    CHECK(early.next()->index == 1);
  }
  CHECK(calls.load() <= 2 + 2 * 4);
  CHECK_THROWS_WITH_AS(counting(4).map({fails_at_5}, "w", 0),
                       "map: num_parallel_workers must be at least 1: got 0", error);
}

TEST_CASE("slice: each rank's shard of a column by a layout, the pieces covering the whole") {
  // Batches of 16 rows of 32 features ("w" widened), labels ("v") (16,).
  const data::dataset wide = data::generator_dataset(
      [](std::int64_t i) {
        xt::xarray<float> f = xt::xarray<float>::from_shape({32});
        for (std::size_t k = 0; k < 32; ++k) f(k) = static_cast<float>(i * 100 + std::int64_t(k));
        return std::vector<array>{array::scalar(static_cast<std::int32_t>(i)), array(std::move(f))};
      },
      {"v", "w"}, 32);
  const data::dataset ds = wide.batch(16);
  const layout blocks(mesh{2, 4}, {{0}, {1}});  // rows in 2, features in 4: (8, 8) a rank
  for (std::int64_t pass : {0, 1}) {
    std::vector<data::row> whole;
    for (const data::row& r : ds.epoch(pass)) whole.push_back(r);
    for (int rank = 0; rank < 8; ++rank) {
      CAPTURE(rank);
      std::size_t b = 0;
      for (const data::row& r : ds.slice("w", blocks, rank).slice("v", layout(mesh{8}, {{0}}), rank).epoch(pass)) {
        const xt::xarray<float>& w = r["w"].get<float>();
        const xt::xarray<float>& g = whole[b]["w"].get<float>();
        REQUIRE(w.shape() == std::vector<std::size_t>{8, 8});
        const std::size_t r0 = std::size_t(rank / 4) * 8, c0 = std::size_t(rank % 4) * 8;
        bool same = true;
        for (std::size_t i = 0; i < 8; ++i)
          for (std::size_t j = 0; j < 8; ++j) same = same && w(i, j) == g(r0 + i, c0 + j);
        CHECK(same);
        const xt::xarray<std::int32_t>& v = r["v"].get<std::int32_t>();
        REQUIRE(v.size() == 2);
        CHECK(v(0) == whole[b]["v"].get<std::int32_t>()(std::size_t(2 * rank)));
        CHECK(v(1) == whole[b]["v"].get<std::int32_t>()(std::size_t(2 * rank + 1)));
        ++b;
      }
      CHECK(b == whole.size());
    }
  }
  // A replicated layout keeps the whole value.
  auto it = ds.slice("w", layout::replicated(mesh{4}, 2), 3).epoch(0);
  CHECK(it.next()->values[1] == (*ds.epoch(0).next()).values[1]);
}

TEST_CASE("slice: errors name the column, shapes, layout and numbers") {
  const data::dataset ds = counting(8).batch(4);  // w: (4, 2)
  CHECK_THROWS_WITH_AS(ds.slice("x", layout(mesh{2}, {{0}, {}}), 0), "slice: no column 'x'; the columns are v, w",
                       error);
  CHECK_THROWS_WITH_AS(ds.slice("w", layout(mesh{2}, {{0}, {}}), 2),
                       "slice: column 'w': rank 2 is out of range for mesh (2,) of 2 ranks", error);
  CHECK_THROWS_WITH_AS(ds.slice("w", layout(mesh{2, 2}, {{0}, {}}).with_partial(1), 0),
                       "slice: column 'w': layout [0, -] partial sum {1} holds partial sums; data is whole", error);
  auto rank_1 = ds.slice("w", layout(mesh{2}, {{0}}), 0).epoch(0);
  CHECK_THROWS_WITH_AS(rank_1.next(), "slice: column 'w' (4, 2) in layout [0] on mesh (2,): the value has rank 2, the layout 1",
                       error);
  auto uneven = ds.slice("w", layout(mesh{4}, {{}, {0}}), 0).epoch(0);
  CHECK_THROWS_WITH_AS(uneven.next(),
                       "slice: column 'w' (4, 2) in layout [-, 0] on mesh (4,): layout: a tensor dim must be divisible "
                       "by the product of its splits: dim 1 has extent 2, split into 4 pieces",
                       error);
}

TEST_CASE("iteration: passes are independent; several iterators at once, in several threads") {
  const data::dataset ds = counting(40, {.shuffle = true, .seed = 2}).shuffle(8, 1).batch(3);
  const std::vector<std::int32_t> expected = values(ds, 1);
  std::vector<std::vector<std::int32_t>> got(4);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = values(ds, 1); });
  for (auto& t : threads) t.join();
  for (const auto& g : got) CHECK(g == expected);
  // A dataset outlives nothing it needs: an iterator keeps its steps alive.
  auto it = counting(3).batch(2).epoch(0);
  CHECK(it.next()->values[0] == array(xt::xarray<std::int32_t>{0, 1}));
}

TEST_CASE("pipeline operations: errors") {
  CHECK_THROWS_WITH_AS(counting(3).batch(0), "batch: the batch size must be at least 1: got 0", error);
  CHECK_THROWS_WITH_AS(counting(3).repeat(0), "repeat: the count must be at least 1: got 0", error);
  CHECK_THROWS_WITH_AS(counting(3).shuffle(0), "shuffle: buffer_size must be at least 1: got 0", error);
  CHECK_THROWS_WITH_AS(counting(3).prefetch(0), "prefetch: the depth must be at least 1: got 0", error);
  const data::dataset ragged = data::generator_dataset(
      [](std::int64_t i) { return std::vector<array>{array(xt::xarray<float>::from_shape({static_cast<std::size_t>(i + 1)}))}; },
      {"x"}, 3);
  auto it = ragged.batch(2).epoch(0);
  CHECK_THROWS_WITH_AS(
      it.next(),
      "batch: column 'x': every value of a batch must have the same shape: value 1 has shape (2,), value 0 has (1,)",
      error);
}
}  // namespace data_test_dataset
