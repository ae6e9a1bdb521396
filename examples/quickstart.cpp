// The quickstart of the seeds, on the traced graph: a 32 -> 16 -> 16 MLP (weights w and
// w2, MatMul, ReLU, MatMul) with an MSE loss, trained with Momentum(0.2, 0.1) for 5
// epochs of 4 steps, 2 samples per rank, in auto_parallel mode with sharding
// propagation and dataset_strategy data_parallel. Only the first MatMul has a
// strategy, the seed's ((2, 4), (4, 1)) on 8 ranks; the parallel pass gives the other
// operators theirs. Each rank prints `epoch: E step: S, loss is L`.
//
//   mpiexec -n 8 quickstart                      # the seed's run
//   mpiexec -n 8 quickstart --verify             # also trains stand-alone on each rank and compares
//   mpiexec -n 8 quickstart --save-graphs DIR    # writes DIR/rank_R/{step_parallel_begin.ir,execute.ir,execute.dot}
//   quickstart --stand-alone                     # the same training (global batch 16) on one rank
//   mpiexec -n 8 quickstart --device cuda        # shards on the GPUs (ranks share them round-robin)
//   mpiexec -n 8 quickstart --search dynamic_programming   # the other operators' strategies by
//                                                          # dynamic programming over bytes and work
//
// Built by nvcc where CMake finds it (then --device cuda is available); by the host
// compiler otherwise.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>
#include <tessera/tessera.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/graph/execute.hpp>
#include <tessera/optim/momentum.hpp>
#if defined(__CUDACC__)
#include <tessera/cuda.hpp>
#define QUICKSTART_WITH_CUDA 1
#else
#define QUICKSTART_WITH_CUDA 0
#endif

using namespace tessera;

namespace {

constexpr index_t per_rank_batch = 2, in_dim = 32, hidden_dim = 16, out_dim = 16;
constexpr int epochs = 5, steps_per_epoch = 4;
constexpr float learning_rate = 0.2f, momentum_factor = 0.1f;

// The seed's random dataset: one batch of uniform [0, 1) inputs and labels from a fixed
// seed, yielded at every step. `global_batch` rows, the same on every rank; each rank
// reads its slice (dataset_strategy data_parallel).
struct dataset {
  xt::xarray<float> input, label;
  explicit dataset(index_t global_batch) {
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    input = xt::xarray<float>::from_shape({std::size_t(global_batch), std::size_t(in_dim)});
    label = xt::xarray<float>::from_shape({std::size_t(global_batch), std::size_t(out_dim)});
    for (float& x : input) x = u(gen);
    for (float& x : label) x = u(gen);
  }
};

// Parameters drawn from the normal initializer (sigma 0.01) with a fixed seed, so every
// rank (and the stand-alone run) starts from the same weights.
xt::xarray<float> normal_init(index_t rows, index_t cols, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> n(0.0f, 0.01f);
  xt::xarray<float> w = xt::xarray<float>::from_shape({std::size_t(rows), std::size_t(cols)});
  for (float& x : w) x = n(gen);
  return w;
}

// The seed's Net with its loss, traced for `p` ranks: the first MatMul split (2, 4) on 8
// ranks (rows 2 ways, the contraction 4 ways); (2, p / 2) or (1, p) on other counts.
graph::traced_graph trace_net(index_t global_batch, int p) {
  graph::graph_builder b;
  const graph::value x = b.input("input", {global_batch, in_dim});
  const graph::value label = b.input("label", {global_batch, out_dim});
  const graph::value w = b.parameter("w", {in_dim, hidden_dim});
  const graph::value w2 = b.parameter("w2", {hidden_dim, out_dim});
  const int a = p % 2 == 0 ? 2 : 1, k = p / a;
  graph::value out = b.matmul(x, w).shard({{a, k}, {k, 1}}).named("matmul");
  out = b.relu(out);
  out = b.matmul(out, w2).named("matmul2");
  return b.build(b.mse_loss(out, label));
}

// The communicator the shards of device D move through: a duplicate of the host world,
// or for GPU shards a staging communicator of device buffers over one.
template <class D>
any_communicator device_comm(any_communicator& host) {
#if QUICKSTART_WITH_CUDA
  if constexpr (std::is_same_v<D, cuda_device>) return any_communicator(staged_communicator(host.split(0, host.rank())));
  else
#endif
    return host.split(0, host.rank());
}

// Trains the network on the ranks of `world` (a host communicator) with its shards on
// device D, a global batch of `global_batch` samples, in `mode`; returns the loss of
// every step.
template <class D>
std::vector<float> train_network(any_communicator& world, graph::parallel_mode mode, index_t global_batch, bool print,
                                 const std::string& save_dir,
                                 graph::search_mode search = graph::search_mode::sharding_propagation) {
  any_communicator comm = device_comm<D>(world);
  const int p = world.size(), me = world.rank();
  graph::parallel_config cfg;
  cfg.mode = mode;
  cfg.search = search;
  cfg.dataset = graph::dataset_strategy::data_parallel();
  cfg.device_num = p;
  graph::executor<float, D> ex(graph::parallelize(trace_net(global_batch, p), cfg), comm);
  if (!save_dir.empty()) ex.save_graphs(save_dir);
  ex.set_parameter("w", normal_init(in_dim, hidden_dim, 2));
  ex.set_parameter("w2", normal_init(hidden_dim, out_dim, 3));
  const dataset data(global_batch);
  const std::vector<xt::xarray<float>> batch = ex.slice_batch({data.input, data.label});
  optim::momentum<float, D> opt(learning_rate, momentum_factor);

  const graph::parallel_graph& pg = ex.plan();
  if (print && me == 0) {
    std::cout << "quickstart on " << p << (p == 1 ? " rank" : " ranks") << " (" << D::name << "), " << to_string(mode)
              << (mode == graph::parallel_mode::auto_parallel ? " with " + std::string(to_string(search)) : "")
              << ", dataset_strategy data_parallel; rank 0's shards:\n";
    const graph::traced_graph& g = pg.traced();
    for (int id = 0; id < g.size(); ++id) {
      if (g.at(id).kind != graph::node_kind::op) continue;
      const graph::op_plan& o = pg.op(id);
      std::string shapes;
      for (std::size_t s = 0; s < g.at(id).inputs.size(); ++s)
        shapes += (s ? " x " : "") + to_string(local_shape(o.lay.in[s], g.at(g.at(id).inputs[s]).shape));
      std::cout << "  " << g.describe(id) << " " << to_string(o.st) << " (" << to_string(o.source) << "): " << shapes
                << " -> " << to_string(pg.local_shape(id)) << "\n";
    }
    std::cout << "  communication per step: " << pg.bytes_for_rank(0) << " bytes received by rank 0\n";
    if (!save_dir.empty()) std::cout << "  graphs saved under " << save_dir << "/rank_R/\n";
  }
  std::vector<float> losses;
  for (int epoch = 1; epoch <= epochs; ++epoch)
    for (int step = 1; step <= steps_per_epoch; ++step) {
      const float l = ex.train_step(batch, opt);
      losses.push_back(l);
      if (print) {
        // Every rank's line, printed by rank 0 in rank order.
        char line[96];
        std::snprintf(line, sizeof line, "epoch: %d step: %d, loss is %.9g\n", epoch, step, double(l));
        std::vector<char> mine(sizeof line, '\0'), all(sizeof line * std::size_t(p));
        std::memcpy(mine.data(), line, sizeof line);
        world.all_gather(std::span<const char>(mine), std::span<char>(all));
        if (me == 0)
          for (int r = 0; r < p; ++r) std::cout << all.data() + r * sizeof line;
      }
    }
  return losses;
}

// Trains on `device`: the seed's run on every rank of the job, or --stand-alone on one.
template <class D>
int run(int argc, char** argv, bool verify, bool stand_alone, const std::string& save_dir, graph::search_mode search) {
  if (stand_alone) {
    any_communicator one{local_communicator{}};
    // The seed's global batch: 8 ranks x 2 samples.
    train_network<D>(one, graph::parallel_mode::stand_alone, per_rank_batch * 8, true, save_dir);
    return 0;
  }
  return tessera::run(argc, argv, [&](any_communicator& world) {
#if QUICKSTART_WITH_CUDA
    if constexpr (std::is_same_v<D, cuda_device>) cuda::select_device(world.node_local().rank());
#endif
    const index_t global_batch = per_rank_batch * world.size();
    const std::vector<float> losses =
        train_network<D>(world, graph::parallel_mode::auto_parallel, global_batch, true, save_dir, search);
    if (losses.back() >= losses.front())
      throw error("quickstart: the loss did not fall: " + std::to_string(losses.front()) + " -> " +
                  std::to_string(losses.back()));
    if (!verify) return;
    // The oracle: the same training on one rank (this process alone) gives the same losses.
    any_communicator one{local_communicator{}};
    const std::vector<float> alone = train_network<D>(one, graph::parallel_mode::stand_alone, global_batch, false, "");
    double worst = 0;
    for (std::size_t i = 0; i < losses.size(); ++i)
      worst = std::max(worst, std::abs(double(losses[i]) - alone[i]) / std::abs(double(alone[i])));
    if (world.rank() == 0)
      std::cout << "stand-alone training on 1 rank: " << alone.size() << " losses, largest relative "
                << "difference from the " << world.size() << "-rank losses " << worst << "\n";
    if (worst > 1e-5)
      throw error("quickstart: the " + std::to_string(world.size()) + "-rank losses differ from the "
                  "stand-alone losses by " + std::to_string(worst) + " (relative), more than 1e-5");
  });
}

}  // namespace

int main(int argc, char** argv) {
  bool verify = false, stand_alone = false;
  std::string save_dir, device = "cpu";
  graph::search_mode search = graph::search_mode::sharding_propagation;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--verify") == 0) verify = true;
    else if (std::strcmp(argv[i], "--stand-alone") == 0) stand_alone = true;
    else if (std::strcmp(argv[i], "--save-graphs") == 0 && i + 1 < argc) save_dir = argv[++i];
    else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
    else if (std::strcmp(argv[i], "--search") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "dynamic_programming") == 0)
      search = graph::search_mode::dynamic_programming, ++i;
    else if (std::strcmp(argv[i], "--search") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "sharding_propagation") == 0)
      search = graph::search_mode::sharding_propagation, ++i;
    else {
      std::cerr << "quickstart: unknown argument " << argv[i]
                << " (expected --verify, --stand-alone, --save-graphs DIR, --device cpu|cuda or --search "
                   "sharding_propagation|dynamic_programming)\n";
      return 2;
    }
  }
  if (device == "cpu") return run<cpu_device>(argc, argv, verify, stand_alone, save_dir, search);
  if (device != "cuda") {
    std::cerr << "quickstart: unknown device " << device << " (expected cpu or cuda)\n";
    return 2;
  }
#if QUICKSTART_WITH_CUDA
  if (!cuda::available()) {
    std::cerr << "quickstart: --device cuda: no CUDA device\n";
    return 2;
  }
  return run<cuda_device>(argc, argv, verify, stand_alone, save_dir, search);
#else
  std::cerr << "quickstart: --device cuda: this build has no CUDA (nvcc was not found)\n";
  return 2;
#endif
}
