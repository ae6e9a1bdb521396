// Seed 001's training step on the host: ResNet-50 in data parallel (resnet_step.hpp),
// oneDNN's convolutions and batch norms, OpenMP threads as OMP_NUM_THREADS says:
//
//   OMP_NUM_THREADS=2 bench_resnet_step --image-size 32
//       --benchmark_out=results/bench_resnet_step_32_np1_t2.json --benchmark_out_format=json
//   OMP_NUM_THREADS=1 mpiexec -n 2 --bind-to none bench_resnet_step --image-size 32 ...
//
// Options (before Google Benchmark's): --image-size S (32; 224 is seed 001's Resize),
// --steps N timed steps (20), --warmup N untimed steps first (3), --scratch-mib M the
// MiB of freed scratch buffers oneDNN's kernels keep per thread (64 unless given; 0
// keeps none: set_dnnl_scratch_budget), --conv-layouts measured|blocked|plain how the
// convolutions lay out their plain arrays (measured unless given: set_dnnl_conv_layouts),
// --kept-weights 0|1 whether the convolutions keep their weights in oneDNN's layout
// between steps (1 unless given: set_dnnl_conv_weights_kept).
// The PyTorch peer
// (torchvision's resnet50, SGD with the same momentum, DDP over gloo on several ranks)
// is peers/torch_resnet_step.py, which prints the ratios from both files;
// peers/resnet_step_rounds.py runs the two in alternating rounds and takes the median
// ratio (the figures in results/resnet_step_*.json).
#include <tessera/comm/launch.hpp>
#include <tessera/comm/mpi.hpp>
#include "resnet_step.hpp"

int main(int argc, char** argv) {
  using namespace tessera;
  namespace rs = bench::resnet_step;
  train::retain_freed_memory();  // a training process: keep freed step memory for the next step
  const rs::options o = rs::parse(argc, argv);
  if (o.scratch_mib >= 0) kernels::cpu::set_dnnl_scratch_budget(std::size_t(o.scratch_mib) << 20);
  if (!o.conv_layouts.empty())
    kernels::cpu::set_dnnl_conv_layouts(o.conv_layouts == "plain"     ? kernels::cpu::conv_layouts::plain
                                        : o.conv_layouts == "blocked" ? kernels::cpu::conv_layouts::blocked
                                                                      : kernels::cpu::conv_layouts::measured);
  if (o.kept_weights >= 0) kernels::cpu::set_dnnl_conv_weights_kept(o.kept_weights != 0);
  return tessera::run(argc, argv, [&](any_communicator& world) {
    bench::keep_output_on_rank0(argc, argv, world.rank());
    benchmark::Initialize(&argc, argv);
    const std::string name = rs::name(o, world.size());
    benchmark::RegisterBenchmark(name.c_str(),
                                 [&](benchmark::State& s) { rs::bm_resnet50_step<cpu_device>(s, world, o); })
        ->UseManualTime()
        ->Iterations(o.steps)
        ->Unit(benchmark::kMillisecond);
    bench::run_on_every_rank(world.rank());
    benchmark::Shutdown();
  });
}
