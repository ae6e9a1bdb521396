// A pipelined training job whose one rank fails mid-step, started by tessera::run: the
// job must end, the failing rank named, while the other stage waits for that rank's
// values or gradients. With --fail-on=R, rank R feeds a batch of the wrong shape at step 3
// (the executor's error); with --kill-on=R, rank R kills itself with SIGKILL between
// that step's micro-batches. Run by the graph_pipeline_* tests under mpiexec and as a
// Gloo job networked by a scheduler.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <tessera/comm/launch.hpp>
#include <tessera/graph/execute.hpp>
#include <tessera/optim/sgd.hpp>

using namespace tessera;

int main(int argc, char** argv) {
  int fail_on = -1, kill_on = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--fail-on=", 10) == 0) fail_on = std::atoi(argv[i] + 10);
    if (std::strncmp(argv[i], "--kill-on=", 10) == 0) kill_on = std::atoi(argv[i] + 10);
  }
  return run(argc, argv, [&](any_communicator& world) {
    graph::graph_builder b;
    const graph::value x = b.input("x", {4, 8}), label = b.input("label", {4, 8});
    const graph::value w1 = b.parameter("w1", {8, 8}), w2 = b.parameter("w2", {8, 8});
    b.set_pipeline_stage(0);
    const graph::value h = b.relu(b.matmul(x, w1));
    b.set_pipeline_stage(1);
    const graph::value y = b.matmul(h, w2);
    const graph::traced_graph g = b.build(b.mse_loss(y, label));
    graph::parallel_config cfg;
    cfg.mode = graph::parallel_mode::data_parallel;
    cfg.device_num = world.size();
    cfg.pipeline_stages = 2;
    cfg.micro_size = 4;
    graph::executor<float> ex(graph::parallelize(g, cfg), world);
    ex.set_parameter("w1", xt::xarray<float>(xt::ones<float>({8, 8}) * 0.1f));
    ex.set_parameter("w2", xt::xarray<float>(xt::ones<float>({8, 8}) * 0.1f));
    optim::sgd<float> opt(0.01f);
    for (int step = 1; step <= 1000; ++step) {
      std::vector<xt::xarray<float>> whole{xt::ones<float>({16, 8}), xt::zeros<float>({16, 8})};
      std::vector<xt::xarray<float>> mine = ex.slice_batch(whole);
      if (world.rank() == fail_on && step == 3) mine[1] = xt::zeros<float>({3, 8});  // a wrong shape
      if (world.rank() == kill_on && step == 3) {
        std::printf("rank %d: killed at step 3\n", kill_on);
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
      ex.train_step(mine, opt);
    }
    return 0;  // never reached when a rank fails: the others wait for it
  });
}
