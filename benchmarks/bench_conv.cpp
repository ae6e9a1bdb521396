// The convolutional network kernels of kernels/cpu/ (oneDNN) at ResNet-50's CIFAR-10
// shapes (batch 32, 32 x 32 images), forward and backward, single process:
//
//   OMP_NUM_THREADS=1 bench_conv --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//       --benchmark_out=results/bench_conv_t1.json --benchmark_out_format=json
//
// and its PyTorch peer on the same shapes with the same thread count (peers/torch_conv.py,
// which also prints the ratios from both files). One iteration:
//   conv/<shape>/<form>     conv2d_forward, conv2d_backward_data, conv2d_backward_weights
//                           (no bias, as ResNet's convolutions);
//   bn_relu/<C>/<form>      batch_norm_forward_training with the ReLU fused, and its
//                           backward;
//   bn_relu_split/<C>/plain the split form a sharded batch norm runs (sums, moments,
//                           normalise + ReLU, backward sums, backward data) on one rank.
// Forms: plain   xt::xarray<float> in plain NCHW in and out (each primitive reorders to
//                and from the blocked layout it computes in);
//        blocked dnnl_tensor operands already in oneDNN's blocked layout (nChw16c, as a
//                network that keeps its activations in oneDNN's formats between layers
//                hands them over), outputs left in the primitive's layout.
// Times are wall-clock (oneDNN runs OpenMP threads), in milliseconds.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>
#include <vector>
#include <tessera/kernels/cpu/batch_norm.hpp>
#include <tessera/kernels/cpu/conv.hpp>

namespace {

namespace cpu = tessera::kernels::cpu;
using tessera::index_t;
using tessera::kernels::conv2d_params;
using tessera::kernels::pad2d;
using farray = xt::xarray<float>;

constexpr std::size_t batch = 32;

struct conv_case {
  const char* name;
  std::size_t in, out, kernel, stride, size;
};
// ResNet-50 (CIFAR variant: 3x3 stem, no stem pooling): the stem, a stage-1 3x3, the
// bottleneck's 1x1 reduce and expand at 32 x 32, and stage 2's strided 3x3.
constexpr conv_case conv_cases[] = {
    {"3x3_3to64", 3, 64, 3, 1, 32},       {"3x3_64to64", 64, 64, 3, 1, 32},
    {"1x1_256to64", 256, 64, 1, 1, 32},   {"1x1_64to256", 64, 256, 1, 1, 32},
    {"3x3_128to128_s2", 128, 128, 3, 2, 32},
};
constexpr std::size_t bn_channels[] = {64, 256};

farray values(const std::vector<std::size_t>& shape, unsigned seed) {
  farray x = farray::from_shape(shape);
  for (std::size_t i = 0; i < x.size(); ++i)
    x.data()[i] = float(int((i * 2654435761u + seed * 40503u) % 2001) - 1000) / 1000.f;
  return x;
}

cpu::dnnl_tensor blocked(const farray& x) {
  const auto tag = x.shape()[1] >= 16 ? dnnl::memory::format_tag::nChw16c : dnnl::memory::format_tag::nchw;
  return cpu::dnnl_tensor::from_xarray(x).in_format(tag);
}

void conv_step(benchmark::State& state, const conv_case& c, bool keep_blocked) {
  const conv2d_params p{index_t(c.stride), index_t(c.stride), pad2d::uniform(index_t(c.kernel / 2))};
  const std::vector<std::size_t> xs{batch, c.in, c.size, c.size}, ws{c.out, c.in, c.kernel, c.kernel};
  const auto ys = tessera::kernels::conv2d_output_shape("bench", xs, ws, p);
  const farray x = values(xs, 1), w = values(ws, 2), dy = values({ys.begin(), ys.end()}, 3);
  if (keep_blocked) {
    const cpu::dnnl_tensor tx = blocked(x), tdy = blocked(dy);
    for (auto _ : state) {
      auto y = cpu::conv2d_forward(tx, w, nullptr, p);
      auto dx = cpu::conv2d_backward_data(tdy, w, xs, p);
      auto g = cpu::conv2d_backward_weights(tdy, tx, ws, false, p);
      benchmark::DoNotOptimize(y);
      benchmark::DoNotOptimize(dx);
      benchmark::DoNotOptimize(g);
    }
  } else {
    for (auto _ : state) {
      auto y = cpu::conv2d_forward(x, w, nullptr, p);
      auto dx = cpu::conv2d_backward_data(dy, w, xs, p);
      auto g = cpu::conv2d_backward_weights(dy, x, ws, false, p);
      benchmark::DoNotOptimize(y.data());
      benchmark::DoNotOptimize(dx.data());
      benchmark::DoNotOptimize(g.dw.data());
    }
  }
  const double flops = 2.0 * double(batch * c.out * ys[2] * ys[3]) * double(c.in * c.kernel * c.kernel) * 3;
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void bn_step(benchmark::State& state, std::size_t c, bool keep_blocked) {
  const std::vector<std::size_t> xs{batch, c, 32, 32};
  const farray x = values(xs, 4), dy = values(xs, 5);
  const farray gamma = values({c}, 6) + 1.5f, beta = values({c}, 7);
  const float eps = 1e-5f;
  if (keep_blocked) {
    const cpu::dnnl_tensor tx = blocked(x), tdy = blocked(dy);
    for (auto _ : state) {
      auto f = cpu::batch_norm_forward_training(tx, gamma, beta, eps, true);
      auto g = cpu::batch_norm_backward(tdy, tx, gamma, f.mean, f.variance, f.workspace, eps, true);
      benchmark::DoNotOptimize(f);
      benchmark::DoNotOptimize(g);
    }
  } else {
    for (auto _ : state) {
      auto f = cpu::batch_norm_forward_training(x, gamma, beta, eps, true);
      auto g = cpu::batch_norm_backward(dy, x, gamma, f.mean, f.variance, f.workspace, eps, true);
      benchmark::DoNotOptimize(f.y.data());
      benchmark::DoNotOptimize(g.dx.data());
    }
  }
}

void bn_split_step(benchmark::State& state, std::size_t c) {
  const std::vector<std::size_t> xs{batch, c, 32, 32};
  const farray x = values(xs, 4), dy = values(xs, 5);
  const farray gamma = values({c}, 6) + 1.5f, beta = values({c}, 7);
  const float eps = 1e-5f;
  const std::size_t count = batch * 32 * 32;
  for (auto _ : state) {
    const auto m = cpu::batch_norm_moments(cpu::batch_norm_sums(x), count);
    const farray y = cpu::batch_norm_forward_inference(x, gamma, beta, m.mean, m.variance, eps, true);
    const auto r = cpu::batch_norm_backward_sums(dy, x, m.mean, m.variance, eps, &y);
    const farray dx = cpu::batch_norm_backward_data(dy, x, gamma, m.mean, m.variance, r, count, eps, &y);
    benchmark::DoNotOptimize(dx.data());
  }
}

const int registered = [] {
  const char* threads = std::getenv("OMP_NUM_THREADS");
  benchmark::AddCustomContext("omp_num_threads", threads ? threads : "(unset)");
  benchmark::AddCustomContext("batch", std::to_string(batch));
  for (const conv_case& c : conv_cases)
    for (bool keep : {false, true})
      benchmark::RegisterBenchmark((std::string("conv/") + c.name + (keep ? "/blocked" : "/plain")).c_str(),
                                   [c, keep](benchmark::State& s) { conv_step(s, c, keep); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->MinTime(1.0);
  for (std::size_t c : bn_channels) {
    for (bool keep : {false, true})
      benchmark::RegisterBenchmark(("bn_relu/" + std::to_string(c) + (keep ? "/blocked" : "/plain")).c_str(),
                                   [c, keep](benchmark::State& s) { bn_step(s, c, keep); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->MinTime(1.0);
    benchmark::RegisterBenchmark(("bn_relu_split/" + std::to_string(c) + "/plain").c_str(),
                                 [c](benchmark::State& s) { bn_split_step(s, c); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(1.0);
  }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
