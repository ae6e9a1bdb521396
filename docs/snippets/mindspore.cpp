// docs/mindspore.md: the seeds' quickstart (seed 000) in tessera, each line beside the
// MindSpore call it stands for (examples/quickstart.cpp checks its losses against one rank).
// ranks: 8
#include <random>
#include <utility>
#include <vector>
#include <tessera/tessera.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/model.hpp>
#include <xtensor/xview.hpp>

namespace {
// The seed's random data: rows [first, first + count) of one global batch (inputs and
// targets uniform in [0, 1)), the same at each of 4 steps.
std::vector<std::pair<xt::xarray<float>, xt::xarray<float>>> dataset(std::size_t global, std::size_t first,
                                                                      std::size_t count) {
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  xt::xarray<float> x = xt::xarray<float>::from_shape({global, 32}), y = xt::xarray<float>::from_shape({global, 16});
  for (float& v : x) v = u(gen);
  for (float& v : y) v = u(gen);
  return std::vector(4, std::pair{xt::xarray<float>(xt::view(x, xt::range(first, first + count))),
                                  xt::xarray<float>(xt::view(y, xt::range(first, first + count)))});
}

}  // namespace

// [quickstart]
using namespace tessera;
template <class D>
struct net : nn::module<float, D> {                        // class Net(nn.Cell)
  nn::parameter<float, D> w{extents{32, 16}, nn::initializer::normal(0.01)};
  nn::parameter<float, D> w2{extents{16, 16}, nn::initializer::normal(0.01)};
  ops::matmul_op matmul, matmul2;
  void visit(nn::visitor<float, D>& v) override { v.param("w", w); v.param("w2", w2); }
  template <class V> V operator()(V x) {                    // construct()
    V out = nn::apply_named("matmul", matmul, x, w.on(x));
    out = nn::apply_named("relu", ops::relu_op{}, out);
    return nn::apply_named("matmul2", matmul2, out, w2.on(x));
  }
};
int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](any_communicator& world) {    // init()
    context ctx(world);
    net<cpu_device> network;
    network.matmul.st = strategy{{2, 4}, {4, 1}};                  // matmul.shard(((2, 4), (4, 1))), 8 ranks
    nn::mse_loss<float> loss_fn;
    optim::momentum<float> opt(network.trainable_params(), 0.2f, 0.1f);
    train::model<net<cpu_device>, nn::mse_loss<float>>::options o;  // set_auto_parallel_context(...)
    o.parallel.mode = graph::parallel_mode::auto_parallel;
    o.parallel.search = graph::search_mode::sharding_propagation;  // dataset_strategy data_parallel: default
    train::model model(network, loss_fn, opt, ctx, o);              // Model(net, loss_fn, opt)
    train::loss_monitor<float> loss_cb;                             // LossMonitor()
    auto data = dataset(16, 2 * world.rank(), 2);                   // this rank's 2 rows of 16
    model.train(5, data, {&loss_cb});                               // 5 epochs of 4 steps
  });
}
// [/quickstart]
