// Seed 001's training step on a GPU: ResNet-50 in data parallel (resnet_step.hpp) on
// device tensors, cuDNN's convolutions, batch norms and poolings, cuBLAS's products,
// FP32 math (no TF32), one rank per GPU:
//
//   bench_resnet_step_cuda --image-size 224 --benchmark_out=FILE --benchmark_out_format=json
//
// Beside the step, resnet50_convs/cudnn times what the step's convolutions alone cost:
// every Conv2D of the traced ResNet-50 at the step's shapes, its forward, its data
// gradient and its weight gradient through kernels::cuda (cuDNN with the step's
// algorithms and workspaces), one after another on tessera's stream, timed by CUDA
// events. The step over that time says what the rest of the step costs (batch norms,
// ReLUs, poolings, the residual adds, the classifier, the update, the framework). The
// PyTorch peer on the same GPU is peers/torch_resnet_step.py --device cuda.
//
// Options as bench_resnet_step's: --image-size S (32), --steps N (20), --warmup N (3);
// --profile-step K brackets step K with cudaProfilerStart/Stop, so that a profiler started
// with its collection off (`ncu --profile-from-start off ...`) records that step's kernels
// alone, and the counter device_mib_between_steps says what the step starts with in use.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>
#include <tessera/comm/launch.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/cuda.hpp>
#include <tessera/nn/trace.hpp>
#include "random_device.hpp"
#include "resnet_step.hpp"

namespace {

using namespace tessera;
namespace rs = bench::resnet_step;
namespace kc = kernels::cuda;
using darray = cuda::device_array<float>;

struct conv_case {
  std::vector<std::size_t> x, w, y;
  kernels::conv2d_params p;
};

// Every Conv2D of ResNet-50 traced at batch 32 and the given image size.
std::vector<conv_case> resnet50_convs(std::int64_t image) {
  auto net = nn::resnet50<float, cuda_device>(10);
  nn::cross_entropy_loss<float, cuda_device> ce;
  const nn::traced_network t = nn::trace(*net, ce, extents{rs::per_rank_batch, 3, image, image}, extents{rs::per_rank_batch});
  const graph::traced_graph& g = t.graph;
  const auto dims = [](const extents& e) {
    std::vector<std::size_t> v;
    for (int i = 0; i < e.ndim; ++i) v.push_back(std::size_t(e[i]));
    return v;
  };
  std::vector<conv_case> out;
  for (int id : g.ids(graph::node_kind::op)) {
    const auto* conv = g.at(id).op->definition<ops::conv2d_op>();
    if (!conv) continue;
    const shape_list in = g.input_shapes(id);
    out.push_back({dims(in.v[0]), dims(in.v[1]), dims(g.at(id).shape), conv->p});
  }
  return out;
}

void bm_convs(benchmark::State& state, const rs::options& o) {
  kc::set_matmul_precision(kc::matmul_precision::fp32);
  const std::vector<conv_case> convs = resnet50_convs(o.image_size);
  std::vector<darray> xs, ws, dys;
  double flops = 0;
  for (std::size_t i = 0; i < convs.size(); ++i) {
    const conv_case& c = convs[i];
    xs.push_back(bench::random_device(c.x, unsigned(3 * i)));
    ws.push_back(bench::random_device(c.w, unsigned(3 * i + 1)));
    dys.push_back(bench::random_device(c.y, unsigned(3 * i + 2)));
    double outputs = 1;
    for (std::size_t d : c.y) outputs *= double(d);
    flops += 3 * 2 * outputs * double(c.w[1] * c.w[2] * c.w[3]);  // forward, data and weight gradients
  }
  const auto pass = [&] {
    for (std::size_t i = 0; i < convs.size(); ++i) {
      const conv_case& c = convs[i];
      benchmark::DoNotOptimize(kc::conv2d_forward(xs[i], ws[i], nullptr, c.p, false));
      benchmark::DoNotOptimize(kc::conv2d_backward_data(dys[i], ws[i], c.x, c.p));
      benchmark::DoNotOptimize(kc::conv2d_backward_weights(dys[i], xs[i], c.w, false, c.p));
    }
  };
  pass();  // plans, algorithms and workspaces chosen, the allocator's cache filled
  cuda::synchronize();
  cudaEvent_t start, stop;
  TESSERA_CUDA_CHECK(cudaEventCreate(&start));
  TESSERA_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (auto _ : state) {
    TESSERA_CUDA_CHECK(cudaEventRecord(start, cuda::stream()));
    pass();
    TESSERA_CUDA_CHECK(cudaEventRecord(stop, cuda::stream()));
    TESSERA_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    state.SetIterationTime(t / 1e3);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  state.counters["median_ms"] = ms[ms.size() / 2];
  state.counters["convolutions"] = double(convs.size());
  state.counters["tflops"] = flops / (ms[ms.size() / 2] * 1e-3) / 1e12;
  state.counters["image_size"] = double(o.image_size);
}

}  // namespace

int main(int argc, char** argv) {
  train::retain_freed_memory();
  const rs::options o = rs::parse(argc, argv);
  return tessera::run(argc, argv, [&](any_communicator& world) {
    cuda::select_device(world.node_local().rank());        // a GPU per rank of the node, round-robin
    kc::set_matmul_precision(kc::matmul_precision::fp32);  // FP32 math, as the peer's
    bench::keep_output_on_rank0(argc, argv, world.rank());
    benchmark::Initialize(&argc, argv);
    const std::string step = rs::name(o, world.size(), "/device=cuda");
    benchmark::RegisterBenchmark(step.c_str(), [&](benchmark::State& s) {
      cuda::allocator().reset_peak();
      double between_steps = 0;  // device memory in use before the profiled step
      rs::bm_resnet50_step<cuda_device>(s, world, o, [&](bool start) {
        cuda::synchronize();
        if (start) between_steps = double(cuda::allocator().stats().in_use) / (1 << 20);
        TESSERA_CUDA_CHECK(start ? cudaProfilerStart() : cudaProfilerStop());
      });
      s.counters["peak_device_mib"] = double(cuda::allocator().stats().peak_in_use) / (1 << 20);
      if (o.profile_step > 0) s.counters["device_mib_between_steps"] = between_steps;
    })
        ->UseManualTime()
        ->Iterations(o.steps)
        ->Unit(benchmark::kMillisecond);
    const std::string convs = "resnet50_convs/cudnn/" + std::to_string(o.image_size) + "x" +
                              std::to_string(o.image_size) + "/batch=32";
    if (world.size() == 1)
      benchmark::RegisterBenchmark(convs.c_str(), [&](benchmark::State& s) { bm_convs(s, o); })
          ->UseManualTime()
          ->Iterations(o.steps)
          ->Unit(benchmark::kMillisecond);
    bench::run_on_every_rank(world.rank());
    benchmark::Shutdown();
  });
}
