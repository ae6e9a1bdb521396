// The README's example: an MLP whose first layer is split over the ranks (semi-auto
// parallel), trained on each rank's share of the batch. mpiexec -n 4 train_sharded
#include <tessera/tessera.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/model.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>
using namespace tessera;

struct mlp : nn::module<float> {
  nn::dense<float> fc{32, 64, {}, {}, true, nn::activation::relu}, out{64, 10};
  void visit(nn::visitor<float>& v) override { v.child("fc", fc); v.child("out", out); }
  template <class V> V operator()(V x) { return out(fc(x)); }
};

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](any_communicator& world) {
    context ctx(world);
    const std::size_t n = world.size(), rows = 64 / n, first = world.rank() * rows;
    mlp net;
    net.fc.shard(strategy{{1, 1}, {int(n), 1}});  // fc's weight: rows split over the ranks
    nn::cross_entropy_loss<float> loss;
    optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
    train::model<mlp, nn::cross_entropy_loss<float>>::options o;
    o.parallel.mode = graph::parallel_mode::semi_auto_parallel;
    train::model model(net, loss, opt, ctx, o);
    xt::random::seed(1);  // one global batch of 64 rows; each rank reads its 64 / n
    xt::xarray<float> x = xt::random::randn<float>({64, 32});
    xt::xarray<int> y = xt::random::randint<int>({64}, 0, 10);
    std::vector data(8, std::pair{xt::xarray<float>(xt::view(x, xt::range(first, first + rows))),
                                  xt::xarray<int>(xt::view(y, xt::range(first, first + rows)))});
    train::loss_monitor<float> monitor(4);
    model.train(2, data, {&monitor});
    if (model.eval(data).accuracy < 0.2) throw error("train_sharded: the network did not learn");
  });
}
