// The quickstart of the seeds (seed 000): the seed's Net written as a module (its
// parameters w (32, 16) and w2 (16, 16) from the normal initializer, MatMul, ReLU,
// MatMul) with an MSE loss, trained by train::model with Momentum(0.2, 0.1) for 5
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
//   mpiexec -n 8 quickstart --search dynamic_programming   # every strategy by dynamic programming
//                                                          # over bytes and work, none configured
//   mpiexec -n 8 quickstart --search recursive_programming # every strategy by the double-recursive
//                                                          # search, none configured
//
// Built by nvcc where CMake finds it (then --device cuda works), else by the host compiler.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <tessera/tessera.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/model.hpp>
#include <xtensor/xview.hpp>
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

// [net]
// The seed's Net: ops.MatMul().shard(((2, 4), (4, 1))), ReLU, MatMul, over the
// parameters "w" and "w2". `matmul`'s strategy is set for the run (none: the search's).
template <class D>
struct net : nn::module<float, D> {
  nn::parameter<float, D> w{extents{in_dim, hidden_dim}, nn::initializer::normal(0.01)};
  nn::parameter<float, D> w2{extents{hidden_dim, out_dim}, nn::initializer::normal(0.01)};
  ops::matmul_op matmul, matmul2;

  void visit(nn::visitor<float, D>& v) override {
    v.param("w", w);
    v.param("w2", w2);
  }
  template <class V>
  V operator()(V x) {
    V out = nn::apply_named("matmul", matmul, x, w.on(x));
    out = nn::apply_named("relu", ops::relu_op{}, out);
    return nn::apply_named("matmul2", matmul2, out, w2.on(x));
  }
};
// [/net]

// The seed's random dataset: one batch of uniform [0, 1) inputs and labels from a fixed
// seed, yielded at every step: rows [first, first + count) of the global batch.
std::vector<std::pair<xt::xarray<float>, xt::xarray<float>>> dataset(index_t global_batch, index_t first,
                                                                      index_t count) {
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  xt::xarray<float> input = xt::xarray<float>::from_shape({std::size_t(global_batch), std::size_t(in_dim)});
  xt::xarray<float> label = xt::xarray<float>::from_shape({std::size_t(global_batch), std::size_t(out_dim)});
  for (float& x : input) x = u(gen);
  for (float& x : label) x = u(gen);
  xt::xarray<float> x = xt::view(input, xt::range(first, first + count), xt::all());
  xt::xarray<float> y = xt::view(label, xt::range(first, first + count), xt::all());
  return std::vector<std::pair<xt::xarray<float>, xt::xarray<float>>>(steps_per_epoch, {x, y});
}

// Every rank's `epoch: E step: S, loss is L`, gathered over the host communicator
// `world` and printed by rank 0 in rank order; the losses kept.
class loss_lines : public train::callback<float> {
 public:
  loss_lines(any_communicator& world, bool print) : world_(&world), print_(print) {}
  void on_step_end(train::run_context<float>& rc) override {
    losses.push_back(float(rc.loss));
    if (!print_) return;
    constexpr std::size_t n = 96;
    std::vector<char> mine(n, '\0'), all(n * std::size_t(world_->size()));
    std::snprintf(mine.data(), n, "epoch: %d step: %lld, loss is %.9g\n", rc.epoch,
                  static_cast<long long>(rc.step_in_epoch), rc.loss);
    world_->all_gather(std::span<const char>(mine), std::span<char>(all));
    if (world_->rank() == 0)
      for (int r = 0; r < world_->size(); ++r) std::cout << all.data() + r * n;
  }
  std::vector<float> losses;

 private:
  any_communicator* world_;
  bool print_;
};

// Trains the network on the ranks of `world` with its shards on device D, in `mode`
// (each rank reading its rows of the global batch, or all of them stand-alone); returns
// the loss of every step.
template <class D>
std::vector<float> train_network(any_communicator& world, graph::parallel_mode mode, index_t global_batch, bool print,
                                 const std::string& save_dir,
                                 graph::search_mode search = graph::search_mode::sharding_propagation) {
  // [device]
  any_communicator comm = device_communicator(world, D{});  // D's buffers over the host world
  context ctx(comm);
  const int p = world.size(), me = world.rank();
  net<D> network;
  if (mode == graph::parallel_mode::auto_parallel && search == graph::search_mode::sharding_propagation) {
    const int a = p % 2 == 0 ? 2 : 1, k = p / a;  // the seed's (2, 4) on 8 ranks
    network.matmul.st = strategy{{a, k}, {k, 1}};
  }
  nn::mse_loss<float, D> loss_fn;
  optim::momentum<float, D> opt(network.trainable_params(), learning_rate, momentum_factor);
  typename train::model<net<D>, nn::mse_loss<float, D>>::options o;
  o.parallel.mode = mode;
  o.parallel.search = search;
  o.seed = 2;
  train::model model(network, loss_fn, opt, ctx, o);
  const bool alone = mode == graph::parallel_mode::stand_alone;
  auto data = dataset(global_batch, alone ? 0 : me * per_rank_batch, alone ? global_batch : per_rank_batch);
  loss_lines lines(world, print);
  model.train(epochs, data, {&lines});
  // [/device]
  if (!save_dir.empty()) model.save_graphs(save_dir);

  const graph::parallel_graph& pg = model.plan();
  if (print && me == 0) {
    std::cout << "quickstart on " << p << (p == 1 ? " rank" : " ranks") << " (" << D::name << "), " << to_string(mode)
              << (mode == graph::parallel_mode::auto_parallel ? " with " + std::string(to_string(search)) : "")
              << ", dataset_strategy data_parallel; rank 0's shards:\n";
    const graph::traced_graph& g = pg.traced();
    for (int id = 0; id < g.size(); ++id) {
      if (g.at(id).kind != graph::node_kind::op) continue;
      const graph::op_plan& op = pg.op(id);
      std::string shapes;
      for (std::size_t s = 0; s < g.at(id).inputs.size(); ++s)
        shapes += (s ? " x " : "") + to_string(local_shape(op.lay.in[s], g.at(g.at(id).inputs[s]).shape));
      std::cout << "  " << g.describe(id) << " " << to_string(op.st) << " (" << to_string(op.source) << "): " << shapes
                << " -> " << to_string(pg.local_shape(id)) << "\n";
    }
    std::cout << "  communication per step: " << pg.bytes_for_rank(0) << " bytes received by rank 0\n";
    if (!save_dir.empty()) std::cout << "  graphs saved under " << save_dir << "/rank_R/\n";
  }
  return lines.losses;
}

// Trains on `device`: the seed's run on every rank of the job, or --stand-alone on one.
template <class D>
int run(int argc, char** argv, bool verify, bool stand_alone, const std::string& save_dir, graph::search_mode search) {
  any_communicator one{local_communicator{}};  // this process alone
  if (stand_alone) {  // the seed's global batch: 8 ranks x 2 samples
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
    else if (std::strcmp(argv[i], "--search") == 0 && i + 1 < argc) {
      try {
        search = graph::parse_search_mode(argv[++i]);
      } catch (const error& e) {
        std::cerr << "quickstart: " << e.what() << "\n";
        return 2;
      }
    } else {
      std::cerr << "quickstart: unknown argument " << argv[i]
                << " (expected --verify, --stand-alone, --save-graphs DIR, --device cpu|cuda or --search "
                   "sharding_propagation|dynamic_programming|recursive_programming)\n";
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
