// data/prefetch.hpp: prefetching changes no result, runs ahead in a bounded queue,
// re-throws the worker's exceptions, and stops cleanly when dropped mid-pass.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <tessera/data/source.hpp>
#include <tessera/data/transforms.hpp>

using namespace tessera;
using data::array;
using clock_type = std::chrono::steady_clock;

namespace {

/// Sample i: an 6x6x1 uint8 image of value i mod 256 with a marker, and its label.
/// `calls` counts the generator's calls; `delay` slows each one.
data::dataset images(std::int64_t n, std::shared_ptr<std::atomic<int>> calls = nullptr,
                     std::chrono::milliseconds delay = {}, data::shard_options o = {}) {
  return data::generator_dataset(
      [calls, delay](std::int64_t i) {
        if (calls) ++*calls;
        if (delay.count()) std::this_thread::sleep_for(delay);
        xt::xarray<std::uint8_t> img = xt::xarray<std::uint8_t>::from_shape({6, 6, 1});
        for (std::size_t k = 0; k < img.size(); ++k) img.data()[k] = static_cast<std::uint8_t>((i * 7 + static_cast<std::int64_t>(k)) % 256);
        return std::vector<array>{array(std::move(img)), array::scalar(static_cast<std::int32_t>(i % 10))};
      },
      {"image", "label"}, n, o);
}

std::vector<data::row> collect(const data::dataset& ds, std::int64_t pass) {
  std::vector<data::row> out;
  for (const data::row& r : ds.epoch(pass)) out.push_back(r);
  return out;
}

}  // namespace

TEST_CASE("prefetch: the same rows as without it, for every depth, pass and position in the pipeline") {
  const data::dataset base = images(37, nullptr, {}, {.num_shards = 2, .shard_id = 1, .shuffle = true, .seed = 3})
                                 .map({data::random_crop(4, 4, 1, 7), data::random_horizontal_flip(0.5f, 8),
                                       data::rescale(1.0f / 255, 0)},
                                      "image")
                                 .shuffle(5, 2);
  const data::dataset plain = base.batch(4).repeat(2);
  for (std::int64_t depth : {1, 2, 8})
    for (std::int64_t pass : {0, 1}) {
      CAPTURE(depth);
      CAPTURE(pass);
      const std::vector<data::row> expected = collect(plain, pass);
      const std::vector<data::row> at_end = collect(plain.prefetch(depth), pass);
      const std::vector<data::row> inside = collect(base.prefetch(depth).batch(4).repeat(2).prefetch(depth), pass);
      REQUIRE(at_end.size() == expected.size());
      REQUIRE(inside.size() == expected.size());
      for (std::size_t i = 0; i < expected.size(); ++i) {
        CHECK(at_end[i].index == expected[i].index);
        CHECK(at_end[i].values == expected[i].values);
        CHECK(inside[i].values == expected[i].values);
      }
    }
  CHECK(plain.prefetch(3).get_dataset_size() == plain.get_dataset_size());
}

TEST_CASE("prefetch: an exception in the worker reaches the consumer after the rows made before it") {
  const data::dataset failing = data::generator_dataset(
      [](std::int64_t i) {
        if (i == 5) throw error("source: sample " + std::to_string(i) + " is unreadable");
        return std::vector<array>{array::scalar(static_cast<std::int32_t>(i))};
      },
      {"v"}, 10);
  for (std::int64_t depth : {1, 3, 20}) {
    auto it = failing.prefetch(depth).epoch(0);
    for (int i = 0; i < 5; ++i) CHECK(it.next()->values[0].item<int>() == i);
    CHECK_THROWS_WITH_AS(it.next(), "source: sample 5 is unreadable", error);
    CHECK_FALSE(it.next().has_value());
  }
  // The exception's type is kept, and an exception in a transform travels alike.
  auto it = images(4).map({[](array) -> array { throw std::out_of_range("transform failed"); }}, "label").prefetch(2).epoch(0);
  CHECK_THROWS_WITH_AS(it.next(), "transform failed", std::out_of_range);
  // Errors while opening the pass (here, in a nested prefetch) travel too.
  auto nested = failing.prefetch(2).prefetch(2).epoch(0);
  int rows = 0;
  CHECK_THROWS_WITH_AS(
      [&] {
        while (nested.next()) ++rows;
      }(),
      "source: sample 5 is unreadable", error);
  CHECK(rows == 5);
}

TEST_CASE("prefetch: runs at most depth + 1 rows ahead") {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto wait_for = [&](int n) {
    const auto until = clock_type::now() + std::chrono::seconds(5);
    while (*calls < n && clock_type::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return calls->load();
  };
  auto it = images(100, calls).prefetch(3).epoch(0);
  CHECK(wait_for(4) == 4);  // 3 queued, 1 made and waiting for room
  for (int i = 0; i < 10; ++i) CHECK(it.next()->values[1].item<int>() == i % 10);
  CHECK(wait_for(14) == 14);
}

TEST_CASE("prefetch: destroying an iterator mid-pass stops its thread promptly") {
  auto calls = std::make_shared<std::atomic<int>>(0);
  const data::dataset slow = images(1000, calls, std::chrono::milliseconds(20)).batch(2).prefetch(2).prefetch(2);
  const auto t0 = clock_type::now();
  {
    auto it = slow.epoch(0);
    CHECK(it.next().has_value());
  }
  const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  CHECK(seconds < 1.0);  // the whole pass would take 20 s
  const int after = *calls;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(*calls == after);  // no thread still reads
  CHECK(after < 20);

  // Many short-lived iterators, some never read, some read to the end.
  const data::dataset quick = images(20).batch(3).prefetch(2);
  for (int i = 0; i < 200; ++i) {
    auto it = quick.epoch(i);
    for (int k = 0; k < i % 9; ++k) it.next();
  }
}

TEST_CASE("prefetch: loading overlaps the consumer's work") {
  // 20 samples that take 10 ms each to load, and a consumer that works 10 ms per
  // sample: about 0.4 s one after the other, about 0.2 s overlapped.
  const auto delay = std::chrono::milliseconds(10);
  auto run = [&](const data::dataset& ds) {
    const auto t0 = clock_type::now();
    for (auto it = ds.epoch(0); it.next();) std::this_thread::sleep_for(delay);
    return std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  const double serial = run(images(20, nullptr, delay));
  const double overlapped = run(images(20, nullptr, delay).prefetch(4));
  MESSAGE("serial " << serial << " s, prefetched " << overlapped << " s");
  CHECK(serial > 0.38);
  CHECK(overlapped < 0.75 * serial);
}
