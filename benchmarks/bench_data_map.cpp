// Seed 001's CIFAR-10 input pipeline (RandomCrop 32x32 with padding 4,
// RandomHorizontalFlip, Resize 224x224, Rescale, Normalize, HWC2CHW, TypeCast; batch
// 32) over 512 generated 32x32x3 images, with the map on 1, 2 and 4 worker threads
// (MindSpore's num_parallel_workers): images per second, and workers=1's time over
// each run's (speedup).
//
//   bench_data_map --benchmark_out=results/bench_data_map.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>
#include <tessera/data/source.hpp>
#include <tessera/data/transforms.hpp>

namespace {

using namespace tessera;

constexpr std::int64_t images = 512, batch = 32;

data::dataset cifar_like() {
  return data::generator_dataset(
      [](std::int64_t i) {
        xt::xarray<std::uint8_t> img = xt::xarray<std::uint8_t>::from_shape({32, 32, 3});
        for (std::size_t k = 0; k < img.size(); ++k) img.data()[k] = std::uint8_t((std::size_t(i) * 131 + k * 7) % 256);
        return std::vector<data::array>{data::array(std::move(img)), data::array::scalar(std::int32_t(i % 10))};
      },
      {"image", "label"}, images);
}

std::map<int, double> seconds_per_pass;  // by workers, for the speedup counter

void bm_map(benchmark::State& state) {
  const int workers = int(state.range(0));
  const std::vector<data::transform> ops{data::random_crop(32, 32, 4),
                                         data::random_horizontal_flip(),
                                         data::resize(224, 224),
                                         data::rescale(1.0f / 255, 0),
                                         data::normalize({0.4914f, 0.4822f, 0.4465f}, {0.2023f, 0.1994f, 0.2010f}),
                                         data::hwc2chw(),
                                         data::type_cast(data::dtype::float32)};
  const data::dataset ds = cifar_like().map(ops, "image", workers).batch(batch, true);
  std::int64_t pass = 0, rows = 0;
  double total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const data::row& r : ds.epoch(pass++)) {
      benchmark::DoNotOptimize(r["image"]);
      rows += batch;
    }
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double per_pass = total / double(pass);
  seconds_per_pass[workers] = per_pass;
  state.counters["images_per_s"] = benchmark::Counter(double(rows), benchmark::Counter::kIsRate);
  if (seconds_per_pass.count(1)) state.counters["speedup_vs_1_worker"] = seconds_per_pass[1] / per_pass;
}

}  // namespace

BENCHMARK(bm_map)->ArgName("workers")->Arg(1)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
