// Seed 001's ResNet-50 training step as a Google Benchmark, on the host
// (bench_resnet_step.cpp) or on a GPU (bench_resnet_step_cuda.cu): ResNet-50
// (nn::resnet50, 10 classes) trained by train::model in data parallel with
// Momentum(0.01, 0.9), the cross entropy of class labels and the gradients' mean, batch
// 32 per rank of NCHW float images made by a generator dataset.
//
// Each iteration is one step (train::model's forward, backward with the buckets'
// reductions, the update, and the loss read on the host; the data pipeline is not
// timed) reported as the slowest rank's time. Counters: median_ms, min_ms, max_ms,
// mean_ms, images_per_s (the global batch over the median step), the peak resident
// memory of each rank (peak_rss_mib_rank<r>, from getrusage) and their maximum, and the
// parameters.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/data/dataset.hpp>
#include <tessera/data/source.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/nn/resnet.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/data.hpp>
#include <tessera/train/model.hpp>
#include "rank_reporting.hpp"

namespace tessera::bench::resnet_step {

constexpr std::int64_t per_rank_batch = 32;

struct options {
  std::int64_t image_size = 32;
  std::int64_t steps = 20;
  std::int64_t warmup = 3;
  std::int64_t scratch_mib = -1;  // --scratch-mib: the host kernels' scratch pool per thread (-1: the default)
  std::string conv_layouts;       // --conv-layouts: measured, blocked or plain (empty: the default)
  std::int64_t kept_weights = -1;  // --kept-weights 0|1: the host's convolution weights kept in oneDNN's layout
  std::int64_t profile_step = 0;   // --profile-step K: the profiler's range is step K (1-based; 0: none)
};

// Records the step times after the warm-up, and marks step `profile_step` for a
// profiler (`mark(true)` before it, `mark(false)` after it).
class step_timer : public train::callback<float> {
 public:
  step_timer(std::int64_t warmup, std::int64_t profile_step, std::function<void(bool)> mark)
      : warmup_(warmup), profile_step_(profile_step), mark_(std::move(mark)) {}
  void on_step_begin(train::run_context<float>& rc) override {
    if (mark_ && rc.step + 1 == profile_step_) mark_(true);
  }
  void on_step_end(train::run_context<float>& rc) override {
    if (mark_ && rc.step == profile_step_) mark_(false);
    if (rc.step > warmup_) seconds.push_back(rc.step_seconds);
  }
  std::vector<double> seconds;

 private:
  std::int64_t warmup_, profile_step_;
  std::function<void(bool)> mark_;
};

/// One benchmark run of `o.warmup + o.steps` steps on device D over `world` (the host
/// world; D's shards move through device_communicator(world, D{})). `profile_mark`, when
/// given, is called before and after step `o.profile_step`.
template <class D>
void bm_resnet50_step(benchmark::State& state, any_communicator& world, const options& o,
                      std::function<void(bool)> profile_mark = {}) {
  const int p = world.size(), me = world.rank();
  const std::int64_t s = o.image_size, steps = o.warmup + o.steps;
  any_communicator comm = device_communicator(world, D{});
  context ctx(comm);
  auto net = nn::resnet50<float, D>(10);
  nn::cross_entropy_loss<float, D> loss_fn;
  optim::momentum<float, D> opt(net->trainable_params(), 0.01f, 0.9f);
  typename train::model<nn::resnet<float, D>, nn::cross_entropy_loss<float, D>>::options mo;
  mo.seed = 1;
  if (p == 1) mo.parallel.mode = graph::parallel_mode::stand_alone;
  train::model model(*net, loss_fn, opt, ctx, mo);
  // Images in [-1, 1) and labels from the sample's index: this rank's shard.
  const nn::random_stream rs(7);
  const std::size_t pixels = std::size_t(3 * s * s);
  data::dataset images = data::generator_dataset(
                             [&](std::int64_t i) {
                               xt::xarray<float> x = xt::xarray<float>::from_shape(
                                   {3, std::size_t(s), std::size_t(s)});
                               for (std::size_t k = 0; k < pixels; ++k)
                                 x.data()[k] = 2.0f * float(rs.uniform01(std::uint64_t(i) * pixels + k)) - 1.0f;
                               return std::vector<data::array>{std::move(x),
                                                               data::array::scalar(std::int32_t(i * 7 % 10))};
                             },
                             {"image", "label"}, steps * per_rank_batch * p, {.num_shards = p, .shard_id = me})
                             .batch(per_rank_batch, true);
  step_timer timer(o.warmup, o.profile_step, std::move(profile_mark));
  model.train(1, images, {&timer});
  if (timer.seconds.empty()) throw error("bench_resnet_step: no timed steps (--steps 0?)");
  std::vector<double> slowest(timer.seconds.size());
  world.all_reduce(std::span<const double>(timer.seconds), std::span<double>(slowest), reduce_op::max);
  std::size_t k = 0;
  for (auto _ : state) state.SetIterationTime(slowest[k++ % slowest.size()]);
  std::vector<double> sorted = slowest;
  std::sort(sorted.begin(), sorted.end());
  state.counters["median_ms"] = 1e3 * sorted[sorted.size() / 2];
  state.counters["min_ms"] = 1e3 * sorted.front();
  state.counters["max_ms"] = 1e3 * sorted.back();
  double total = 0;
  for (double t : sorted) total += t;
  state.counters["mean_ms"] = 1e3 * total / double(sorted.size());
  state.counters["images_per_s"] = double(per_rank_batch * p) / sorted[sorted.size() / 2];
  state.counters["ranks"] = p;
  state.counters["image_size"] = double(s);
  state.counters["batch_per_rank"] = double(per_rank_batch);
  double params = 0;
  for (auto* q : net->trainable_params()) params += double(q->shape().size());
  state.counters["parameters"] = params;
  std::vector<double> rss(std::size_t(p), 0.0), all(rss.size());
  rss[std::size_t(me)] = peak_rss_mib();
  world.all_reduce(std::span<const double>(rss), std::span<double>(all), reduce_op::sum);
  for (std::size_t r = 0; r < all.size(); ++r) state.counters["peak_rss_mib_rank" + std::to_string(r)] = all[r];
  state.counters["peak_rss_mib"] = *std::max_element(all.begin(), all.end());
}

/// Takes the benchmark's options out of argv (Google Benchmark rejects unknown flags):
/// --image-size S (32; 224 is seed 001's Resize), --steps N timed steps (20), --warmup N
/// untimed steps first (3), --scratch-mib M, --conv-layouts measured|blocked|plain,
/// --kept-weights 0|1, --profile-step K.
inline options parse(int& argc, char** argv) {
  options o;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--conv-layouts") {
      if (i + 1 >= argc) throw error("bench_resnet_step: --conv-layouts needs a value");
      o.conv_layouts = argv[++i];
      if (o.conv_layouts != "measured" && o.conv_layouts != "blocked" && o.conv_layouts != "plain")
        throw error("bench_resnet_step: --conv-layouts must be measured, blocked or plain, got '" + o.conv_layouts +
                    "'");
      continue;
    }
    std::int64_t* target = a == "--image-size" ? &o.image_size : a == "--steps" ? &o.steps
                           : a == "--warmup"      ? &o.warmup
                           : a == "--scratch-mib"  ? &o.scratch_mib
                           : a == "--kept-weights" ? &o.kept_weights
                           : a == "--profile-step" ? &o.profile_step
                                                   : nullptr;
    if (!target) {
      argv[out++] = argv[i];
      continue;
    }
    if (i + 1 >= argc) throw error("bench_resnet_step: " + a + " needs a value");
    const std::string v = argv[++i];
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 0)
      throw error("bench_resnet_step: " + a + " needs a non-negative number, got '" + v + "'");
    *target = n;
  }
  argc = out;
  if (o.image_size < 32) throw error("bench_resnet_step: --image-size must be at least 32");
  if (o.steps < 1) throw error("bench_resnet_step: --steps must be at least 1");
  return o;
}

/// The benchmark's name: resnet50_step/<S>x<S>/batch=32/ranks=<P>, then `suffix`.
inline std::string name(const options& o, int ranks, const std::string& suffix = "") {
  return "resnet50_step/" + std::to_string(o.image_size) + "x" + std::to_string(o.image_size) +
         "/batch=32/ranks=" + std::to_string(ranks) + suffix;
}

}  // namespace tessera::bench::resnet_step
