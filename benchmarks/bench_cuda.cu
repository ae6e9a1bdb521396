// The GPU side of tessera against its peers, single process, on the current device:
//
//   bench_cuda --benchmark_out=bench_cuda.json --benchmark_out_format=json
//
// - matmul/<precision>/<n>: C = A x B (n x n, fp32 storage) as the local product of a
//   sharded MatMul (ops::matmul on a one-rank context: the rule, the layout checks, the
//   caching allocator and the backend's cuBLAS call) against cublas/<precision>/<n>, a
//   direct cublasGemmEx into a preallocated C. Precision fp32 (full fp32 math) and tf32.
// - bandwidth/<kernel>: element-wise, reduction, fused (Dense's bias and activation,
//   an activation's backward) and optimizer kernels on 2^26-float (256 MiB) arrays,
//   counting the bytes each must read and write, against the device's nominal memory
//   bandwidth and a device-to-device cudaMemcpy (copy); and the bias and ReLU as two
//   kernels against one fused pass.
// - step/<device>/<network>: one training step (forward, backward, Momentum update)
//   of the seeds' MLPs, quickstart (32 -> 16 -> 16, batch 16) and MNIST
//   (784 -> 512 -> 512 -> 10, batch 256, softmax cross entropy), on the GPU and on the
//   host (OpenBLAS; set OPENBLAS_CORETYPE and OPENBLAS_NUM_THREADS as for the host
//   benchmarks).
//
// GPU times come from CUDA events around the work (manual time); training steps are
// wall-clock, since a step's host work counts. After the table a summary prints the
// ratios (tessera over cuBLAS, achieved over peak bandwidth, CPU over GPU step).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/cuda.hpp>
#include <tessera/nn/resnet.hpp>
#include <tessera/optim/momentum.hpp>
#include "random_device.hpp"

using namespace tessera;
namespace kc = tessera::kernels::cuda;
using darray = cuda::device_array<float>;

namespace {

std::map<std::string, double> seconds_per_iteration;  // filled by each benchmark, for the summary

using bench::random_device;

/// Times f with CUDA events on tessera's stream; records the mean under `name`.
template <class F>
void time_on_device(benchmark::State& state, const std::string& name, F&& f) {
  cudaEvent_t start, stop;
  TESSERA_CUDA_CHECK(cudaEventCreate(&start));
  TESSERA_CUDA_CHECK(cudaEventCreate(&stop));
  f();  // warm-up: allocations reach the cache, cuBLAS picks its kernels
  cuda::synchronize();
  double total = 0;
  for (auto _ : state) {
    TESSERA_CUDA_CHECK(cudaEventRecord(start, cuda::stream()));
    f();
    TESSERA_CUDA_CHECK(cudaEventRecord(stop, cuda::stream()));
    TESSERA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms / 1e3);
    total += ms / 1e3;
  }
  seconds_per_iteration[name] = total / double(state.iterations());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

const char* precision_name(int p) { return p == 0 ? "fp32" : "tf32"; }
kc::matmul_precision precision_of(int p) { return p == 0 ? kc::matmul_precision::fp32 : kc::matmul_precision::tf32; }

// ---- matmul --------------------------------------------------------------------------

void bm_cublas(benchmark::State& state) {
  const int p = int(state.range(0)), n = int(state.range(1));
  kc::set_matmul_precision(precision_of(p));
  const darray a = random_device({std::size_t(n), std::size_t(n)}, 1), b = random_device({std::size_t(n), std::size_t(n)}, 2);
  darray c(std::vector<std::size_t>{std::size_t(n), std::size_t(n)});
  time_on_device(state, std::string("cublas/") + precision_name(p) + "/" + std::to_string(n), [&] {
    kc::detail::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * n * n * double(n) / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  kc::set_matmul_precision(kc::matmul_precision::fp32);
}

void bm_sharded_matmul(benchmark::State& state) {
  const int p = int(state.range(0)), n = int(state.range(1));
  kc::set_matmul_precision(precision_of(p));
  staged_communicator<local_communicator> one{local_communicator{}};
  device_context<staged_communicator<local_communicator>> ctx(one);
  const ops::matmul_op op{strategy{{1, 1}, {1, 1}}};
  const layout l = op.rule(1).a;
  const extents s{n, n};
  const tensor_on<float, cuda_device> a(l, s, 0, random_device({std::size_t(n), std::size_t(n)}, 1));
  const tensor_on<float, cuda_device> b(op.rule(1).b, s, 0, random_device({std::size_t(n), std::size_t(n)}, 2));
  time_on_device(state, std::string("matmul/") + precision_name(p) + "/" + std::to_string(n), [&] {
    const tensor_on<float, cuda_device> c = ops::matmul(op, a, b, ctx);
    benchmark::DoNotOptimize(c.local().data());
  });
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * n * n * double(n) / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  kc::set_matmul_precision(kc::matmul_precision::fp32);
}

// ---- bandwidth -------------------------------------------------------------------------

constexpr std::size_t big = std::size_t(1) << 26;
constexpr std::size_t row = 4096;

template <class F>
void bandwidth(benchmark::State& state, const std::string& name, double bytes, F&& f) {
  time_on_device(state, "bandwidth/" + name, f);
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["of_peak"] = bytes / seconds_per_iteration["bandwidth/" + name] / 1e9 / cuda::info().memory_bandwidth_gbs;
}

void bm_copy(benchmark::State& state) {
  const darray a = random_device({big}, 1);
  darray b(std::vector<std::size_t>{big});
  bandwidth(state, "copy", 2.0 * big * 4, [&] {
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), big * 4, cudaMemcpyDeviceToDevice, cuda::stream()));
  });
}
void bm_add(benchmark::State& state) {
  const darray a = random_device({big}, 1), b = random_device({big}, 2);
  bandwidth(state, "add", 3.0 * big * 4, [&] { benchmark::DoNotOptimize(kc::add(a, b).data()); });
}
void bm_add_broadcast(benchmark::State& state) {
  const darray a = random_device({big / row, row}, 1), b = random_device({row}, 2);
  bandwidth(state, "bias_add", 2.0 * big * 4, [&] { benchmark::DoNotOptimize(kc::bias_add(a, b).data()); });
}
void bm_relu(benchmark::State& state) {
  const darray a = random_device({big}, 1);
  bandwidth(state, "relu", 2.0 * big * 4, [&] { benchmark::DoNotOptimize(kc::relu(a).data()); });
}
void bm_exp(benchmark::State& state) {
  const darray a = random_device({big}, 1);
  bandwidth(state, "exp", 2.0 * big * 4, [&] { benchmark::DoNotOptimize(kc::exp(a).data()); });
}
void bm_scale(benchmark::State& state) {
  darray a = random_device({big}, 1);
  bandwidth(state, "scale_in_place", 2.0 * big * 4, [&] { kc::scale(a, 1.0f); });
}
void bm_sum_all(benchmark::State& state) {
  const darray a = random_device({big}, 1);
  bandwidth(state, "reduce_sum_all", 1.0 * big * 4, [&] { benchmark::DoNotOptimize(kc::reduce_sum(a).data()); });
}
void bm_sum_rows(benchmark::State& state) {
  const darray a = random_device({big / row, row}, 1);
  bandwidth(state, "reduce_sum_rows", 1.0 * big * 4,
            [&] { benchmark::DoNotOptimize(kc::reduce_sum(a, std::vector<int>{1}).data()); });
}
void bm_sum_cols(benchmark::State& state) {
  const darray a = random_device({big / row, row}, 1);
  bandwidth(state, "reduce_sum_columns", 1.0 * big * 4,
            [&] { benchmark::DoNotOptimize(kc::reduce_sum(a, std::vector<int>{0}).data()); });
}
void bm_max_rows(benchmark::State& state) {
  const darray a = random_device({big / row, row}, 1);
  bandwidth(state, "reduce_max_rows", 1.0 * big * 4,
            [&] { benchmark::DoNotOptimize(kc::reduce_max(a, std::vector<int>{1}).data()); });
}
void bm_momentum(benchmark::State& state) {
  darray p = random_device({big}, 1), a = random_device({big}, 2);
  const darray g = random_device({big}, 3);
  bandwidth(state, "momentum_update", 5.0 * big * 4, [&] { kc::momentum_update(p, a, g, 1e-3f, 0.9f); });
}

void bm_momentum_nesterov(benchmark::State& state) {
  darray p = random_device({big}, 1), a = random_device({big}, 2);
  const darray g = random_device({big}, 3);
  bandwidth(state, "momentum_nesterov_wd", 5.0 * big * 4,
            [&] { kc::momentum_update(p, a, g, 1e-3f, 0.9f, 1e-4f, true); });
}
// An optimizer step over ResNet-50's 161 parameters (10 classes: 23,528,522 values), one
// momentum_update per parameter against one momentum_update_many for all: at 32x32 the
// training step is bound by the host's launches, and this is what the update's share
// of them costs. The time runs from the first launch to the last kernel's end.
std::vector<std::size_t> resnet50_parameter_sizes() {
  std::vector<std::size_t> sizes;
  for (const auto* p : nn::resnet50<float>(10)->trainable_params()) sizes.push_back(std::size_t(p->shape().size()));
  return sizes;
}

void bm_update_resnet50(benchmark::State& state) {
  const bool batched = state.range(0) == 1;
  std::vector<darray> p, a, g;
  std::vector<darray*> pp, ap;
  std::vector<const darray*> gp;
  int seed = 1;
  for (const std::size_t n : resnet50_parameter_sizes()) {
    p.push_back(random_device({n}, seed++));
    a.push_back(random_device({n}, seed++));
    g.push_back(random_device({n}, seed++));
  }
  for (std::size_t i = 0; i < p.size(); ++i) {
    pp.push_back(&p[i]);
    ap.push_back(&a[i]);
    gp.push_back(&g[i]);
  }
  time_on_device(state, batched ? "update/resnet50/batched" : "update/resnet50/per_array", [&] {
    if (batched) kc::momentum_update_many<float>(pp, ap, gp, 1e-3f, 0.9f);
    else
      for (std::size_t i = 0; i < p.size(); ++i) kc::momentum_update(p[i], a[i], g[i], 1e-3f, 0.9f);
  });
  state.counters["parameters"] = double(p.size());
}

// Dense's epilogue: the bias and ReLU fused in one in-place pass, against bias_add then
// relu (two passes, two new arrays); and the activation's fused backward.
void bm_bias_relu_fused(benchmark::State& state) {
  darray x = random_device({big / row, row}, 1);
  const darray b = random_device({row}, 2);
  namespace fz = kernels::fused;
  bandwidth(state, "bias_relu_fused", 2.0 * big * 4,
            [&] { x = kc::fused_bias_map("dense", std::move(x), b, fz::bias_act<fz::activation::relu>{}); });
}
void bm_bias_relu_separate(benchmark::State& state) {
  const darray x = random_device({big / row, row}, 1), b = random_device({row}, 2);
  bandwidth(state, "bias_relu_separate", 4.0 * big * 4,
            [&] { benchmark::DoNotOptimize(kc::relu(kc::bias_add(x, b)).data()); });
}
void bm_act_grad(benchmark::State& state) {
  const darray dy = random_device({big}, 1), y = random_device({big}, 2);
  namespace fz = kernels::fused;
  bandwidth(state, "sigmoid_grad_fused", 3.0 * big * 4, [&] {
    benchmark::DoNotOptimize(kc::fused_map("dense_backward", fz::act_grad<fz::activation::sigmoid>{}, dy, y).data());
  });
}

// ---- training steps ----------------------------------------------------------------------

template <class D>
struct mlp {
  using tensor = tensor_on<float, D>;
  std::vector<index_t> dims;
  index_t batch;
  bool classify;  // softmax cross entropy over one-hot labels, else MSE
  std::vector<tensor> params;
  std::vector<tensor> data;  // the input batch and its labels

  mlp(std::vector<index_t> d, index_t b, bool cls) : dims(std::move(d)), batch(b), classify(cls) {
    std::mt19937 gen(7);
    std::normal_distribution<float> n(0.0f, 0.05f);
    auto make = [&](index_t r, index_t c, bool one_hot = false) {
      dist_tensor<float> h(layout(mesh{1}, {{}, {}}), extents{r, c}, 0);
      h.fill_global([&](const auto& i) { return one_hot ? float(i[1] == i[0] % c) : n(gen); });
      if constexpr (std::is_same_v<D, cpu_device>) return h;
      else return to_device(h);
    };
    for (std::size_t i = 0; i + 1 < dims.size(); ++i) params.push_back(make(dims[i], dims[i + 1]));
    data.push_back(make(batch, dims.front()));
    data.push_back(make(batch, dims.back(), classify));
  }

  float step(context& ctx, optim::momentum<float, D>& opt) {
    const ops::matmul_op mm{strategy{{1, 1}, {1, 1}}};
    const ops::relu_op relu{strategy{{1, 1}}};
    auto [loss, grads] = autodiff::value_and_grad(
        [&](autodiff::tape<float, D>& tp, const auto& w) {
          auto h = tp.leaf(data[0], false);
          for (std::size_t i = 0; i < w.size(); ++i) {
            h = autodiff::apply(mm, h, w[i]);
            if (i + 1 < w.size()) h = autodiff::apply(relu, h);
          }
          const auto t = tp.leaf(data[1], false);
          if (classify)
            return autodiff::apply(ops::reduce_mean_op{strategy{{1}}, {}, false},
                                         autodiff::apply(
                                             ops::softmax_cross_entropy_op{strategy{{1, 1}, {1, 1}}}, h, t));
          const auto d = autodiff::apply(ops::sub_op{strategy{{1, 1}, {1, 1}}}, h, t);
          return autodiff::apply(ops::reduce_mean_op{strategy{{1, 1}}, {}, false},
                                       autodiff::apply(ops::mul_op{strategy{{1, 1}, {1, 1}}}, d, d));
        },
        params, ctx);
    opt.step(params, grads);
    if constexpr (std::is_same_v<D, cpu_device>) return loss.local()();
    else return storage<float, D>::to_host(loss.local())();  // waits for the GPU
  }
};

template <class D>
void bm_step(benchmark::State& state, std::string name, std::vector<index_t> dims, index_t batch, bool classify) {
  any_communicator host(local_communicator{});
  any_communicator world = device_communicator(host, D{});
  context ctx(world);
  mlp<D> net(std::move(dims), batch, classify);
  optim::momentum<float, D> opt(0.01f, 0.9f);
  net.step(ctx, opt);  // warm-up
  double total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(net.step(ctx, opt));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(s);
    total += s;
  }
  seconds_per_iteration["step/" + name] = total / double(state.iterations());
}

void print_summary() {
  auto t = [](const std::string& k) {
    const auto it = seconds_per_iteration.find(k);
    return it == seconds_per_iteration.end() ? 0.0 : it->second;
  };
  const cuda::device_info dev = cuda::info();
  std::printf("\nSummary on %s (nominal memory bandwidth %.0f GB/s)\n", dev.name.c_str(), dev.memory_bandwidth_gbs);
  std::printf("  sharded matmul's local product / direct cuBLAS (throughput ratio, >= 0.95 wanted at n >= 4096):\n");
  for (int p : {0, 1})
    for (int n : {1024, 2048, 4096, 8192}) {
      const std::string k = std::string(precision_name(p)) + "/" + std::to_string(n);
      if (t("matmul/" + k) > 0)
        std::printf("    %s n=%-5d %.3f  (%.1f vs %.1f TFLOP/s)\n", precision_name(p), n, t("cublas/" + k) / t("matmul/" + k),
                    2.0 * n * n * double(n) / t("matmul/" + k) / 1e12, 2.0 * n * n * double(n) / t("cublas/" + k) / 1e12);
    }
  const double copy_gbs = 2.0 * big * 4 / t("bandwidth/copy") / 1e9;
  std::printf("  kernel bandwidth, 2^26 floats (fraction of nominal peak; of cudaMemcpy D2D at %.0f GB/s):\n", copy_gbs);
  const std::pair<const char*, double> kernels[] = {
      {"add", 3}, {"bias_add", 2}, {"relu", 2}, {"exp", 2}, {"scale_in_place", 2}, {"reduce_sum_all", 1},
      {"reduce_sum_rows", 1}, {"reduce_sum_columns", 1}, {"reduce_max_rows", 1}, {"momentum_update", 5},
      {"momentum_nesterov_wd", 5}, {"bias_relu_fused", 2}, {"bias_relu_separate", 4}, {"sigmoid_grad_fused", 3}};
  for (const auto& [name, arrays] : kernels) {
    const double gbs = arrays * big * 4 / t(std::string("bandwidth/") + name) / 1e9;
    std::printf("    %-20s %7.0f GB/s  %.2f of peak  %.2f of copy\n", name, gbs, gbs / dev.memory_bandwidth_gbs,
                gbs / copy_gbs);
  }
  std::printf("  Momentum over ResNet-50's 161 parameters, per-array launches / one batched update (time ratio): "
              "%.2f (%.3f against %.3f ms)\n",
              t("update/resnet50/per_array") / t("update/resnet50/batched"), t("update/resnet50/per_array") * 1e3,
              t("update/resnet50/batched") * 1e3);
  std::printf("  Dense's epilogue, bias_add then relu / fused bias and relu (time ratio): %.2f\n",
              t("bandwidth/bias_relu_separate") / t("bandwidth/bias_relu_fused"));
  std::printf("  training step, CPU time / GPU time:\n");
  for (const char* net : {"quickstart", "mnist"})
    std::printf("    %-10s cpu %.3f ms, gpu %.3f ms: %.2fx\n", net, t(std::string("step/cpu/") + net) * 1e3,
                t(std::string("step/cuda/") + net) * 1e3, t(std::string("step/cpu/") + net) / t(std::string("step/cuda/") + net));
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::available()) {
    std::fprintf(stderr, "bench_cuda: no CUDA device\n");
    return 1;
  }
  for (int p : {0, 1})
    for (int n : {1024, 2048, 4096, 8192}) {
      const std::string suffix = std::string(precision_name(p)) + "/" + std::to_string(n);
      benchmark::RegisterBenchmark(("cublas/" + suffix).c_str(), bm_cublas)->Args({p, n})->UseManualTime()->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("matmul/" + suffix).c_str(), bm_sharded_matmul)->Args({p, n})->UseManualTime()->Unit(benchmark::kMillisecond);
    }
  for (auto [name, fn] : std::initializer_list<std::pair<const char*, void (*)(benchmark::State&)>>{
           {"bandwidth/copy", bm_copy}, {"bandwidth/add", bm_add}, {"bandwidth/bias_add", bm_add_broadcast},
           {"bandwidth/relu", bm_relu}, {"bandwidth/exp", bm_exp}, {"bandwidth/scale_in_place", bm_scale},
           {"bandwidth/reduce_sum_all", bm_sum_all}, {"bandwidth/reduce_sum_rows", bm_sum_rows},
           {"bandwidth/reduce_sum_columns", bm_sum_cols}, {"bandwidth/reduce_max_rows", bm_max_rows},
           {"bandwidth/momentum_update", bm_momentum}, {"bandwidth/momentum_nesterov_wd", bm_momentum_nesterov},
           {"bandwidth/bias_relu_fused", bm_bias_relu_fused}, {"bandwidth/bias_relu_separate", bm_bias_relu_separate},
           {"bandwidth/sigmoid_grad_fused", bm_act_grad}})
    benchmark::RegisterBenchmark(name, fn)->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("update/resnet50/per_array", bm_update_resnet50)->Arg(0)->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("update/resnet50/batched", bm_update_resnet50)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
  const std::vector<index_t> quick{32, 16, 16}, mnist{784, 512, 512, 10};
  benchmark::RegisterBenchmark("step/cpu/quickstart", bm_step<cpu_device>, "cpu/quickstart", quick, 16, false)->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("step/cuda/quickstart", bm_step<cuda_device>, "cuda/quickstart", quick, 16, false)->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("step/cpu/mnist", bm_step<cpu_device>, "cpu/mnist", mnist, 256, true)->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("step/cuda/mnist", bm_step<cuda_device>, "cuda/mnist", mnist, 256, true)->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary();
  return 0;
}
