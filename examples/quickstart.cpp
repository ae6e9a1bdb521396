// The quickstart of the seeds: a 32 -> 16 -> 16 MLP (weights w and w2, MatMul, ReLU,
// MatMul) trained with an MSE loss and Momentum(0.2, 0.1) for 5 epochs of 4 steps, 2
// samples per rank, on every rank of the job. The first MatMul has the seed's strategy
// ((2, 4), (4, 1)); the other operators get the strategies sharding propagation gives
// them in the seed (ReLU (2, 4), MatMul2 ((2, 4), (4, 1)), the loss split by the batch
// as the data-parallel dataset is). Each rank prints `epoch: E step: S, loss is L`.
//
//   mpiexec -n 8 quickstart            # the seed's run
//   mpiexec -n 8 quickstart --verify   # also trains stand-alone on each rank and compares
//   quickstart --stand-alone           # the same training (global batch 16) on one rank
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>
#include <tessera/tessera.hpp>
#include <tessera/optim/momentum.hpp>

using namespace tessera;

namespace {

constexpr index_t per_rank_batch = 2, in_dim = 32, hidden_dim = 16, out_dim = 16;
constexpr int epochs = 5, steps_per_epoch = 4;
constexpr float learning_rate = 0.2f, momentum_factor = 0.1f;

// The seed's random dataset: one batch of uniform [0, 1) inputs and labels from a fixed
// seed, yielded at every step. `global_batch` rows, the same on every rank.
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

dist_tensor<float> shard_of(const xt::xarray<float>& g, const layout& l, int rank) {
  dist_tensor<float> t(l, extents{index_t(g.shape()[0]), index_t(g.shape()[1])}, rank);
  t.fill_global([&](const auto& i) { return g(i[0], i[1]); });
  return t;
}

// The strategies of the network's operators on `p` ranks.
struct strategies {
  strategy matmul, relu, matmul2, sub, mul, mean;
  static strategies on(int p) {
    const int a = p % 2 == 0 ? 2 : 1, b = p / a;  // (2, 4) on 8 ranks
    return {{{a, b}, {b, 1}}, {{a, b}}, {{a, b}, {b, 1}}, {{p, 1}, {p, 1}}, {{p, 1}, {p, 1}}, {{p, 1}}};
  }
};

// Trains the network on the ranks of `world` with a global batch of `global_batch`
// samples; returns the loss of every step.
template <class C>
std::vector<float> train_network(C& world, index_t global_batch, bool print) {
  device_context<C> ctx(world);
  const int p = world.size(), me = world.rank();
  const strategies s = strategies::on(p);
  const ops::matmul_op matmul{s.matmul}, matmul2{s.matmul2};
  const ops::relu_op relu{s.relu};
  const ops::sub_op sub{s.sub};
  const ops::mul_op mul{s.mul};
  const ops::reduce_mean_op mean{s.mean, {}, false};

  // dataset_strategy "data_parallel": each rank reads its slice of the batch.
  if (global_batch % p != 0)
    throw error("quickstart: a global batch of " + std::to_string(global_batch) + " does not split over " +
                std::to_string(p) + " ranks");
  const dataset data(global_batch);
  const mesh ranks{p};
  const dist_tensor<float> x = shard_of(data.input, layout(ranks, {{0}, {}}), me);
  const dist_tensor<float> y = shard_of(data.label, layout(ranks, {{0}, {}}), me);
  std::vector<dist_tensor<float>> params = {
      shard_of(normal_init(in_dim, hidden_dim, 2), matmul.rule(p).b, me),
      shard_of(normal_init(hidden_dim, out_dim, 3), matmul2.rule(p).b, me)};
  optim::momentum<float> opt(learning_rate, momentum_factor);

  if (print && me == 0) {
    std::cout << "quickstart on " << p << (p == 1 ? " rank" : " ranks") << ": MatMul "
              << to_string(s.matmul) << " (device matrix " << to_string(matmul.rule(p).dev)
              << "), ReLU " << to_string(s.relu) << ", MatMul2 " << to_string(s.matmul2)
              << ", MSE loss " << to_string(s.sub) << "\n"
              << "  w shard " << to_string(params[0].local_shape()) << ", w2 shard "
              << to_string(params[1].local_shape()) << ", input shard " << to_string(x.local_shape())
              << " on each rank\n";
  }
  std::vector<float> losses;
  for (int epoch = 1; epoch <= epochs; ++epoch)
    for (int step = 1; step <= steps_per_epoch; ++step) {
      auto [loss, grads] = autodiff::value_and_grad(
          [&](autodiff::tape<float, C>& tp, const auto& w) {
            const auto in = tp.leaf(x, false), label = tp.leaf(y, false);
            const auto h = autodiff::relu(relu, autodiff::matmul(matmul, in, w[0]));
            const auto out = autodiff::matmul(matmul2, h, w[1]);
            const auto d = autodiff::sub(sub, out, label);
            return autodiff::reduce_mean(mean, autodiff::mul(mul, d, d));
          },
          params, ctx);
      opt.step(params, grads);
      const float l = redistribute(loss, layout::replicated(ranks, 0), ctx).local()();
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

}  // namespace

int main(int argc, char** argv) {
  bool verify = false, stand_alone = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--verify") == 0) verify = true;
    else if (std::strcmp(argv[i], "--stand-alone") == 0) stand_alone = true;
    else {
      std::cerr << "quickstart: unknown argument " << argv[i] << " (expected --verify or --stand-alone)\n";
      return 2;
    }
  }
  if (stand_alone) {
    local_communicator one;
    train_network(one, per_rank_batch * 8, true);  // the seed's global batch: 8 ranks x 2 samples
    return 0;
  }
  return run_mpi(argc, argv, [&](mpi_communicator& world) {
    const index_t global_batch = per_rank_batch * world.size();
    const std::vector<float> losses = train_network(world, global_batch, true);
    if (losses.back() >= losses.front())
      throw error("quickstart: the loss did not fall: " + std::to_string(losses.front()) + " -> " +
                  std::to_string(losses.back()));
    if (!verify) return;
    // The oracle: the same training on one rank (this process alone) gives the same losses.
    local_communicator one;
    const std::vector<float> alone = train_network(one, global_batch, false);
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
