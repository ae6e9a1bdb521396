// Tests of train/model.hpp under mpiexec (1, 2 and 4 ranks): Model.train with
// callbacks (the loss monitor's lines, the hooks' order and counts, request_stop)
// learns a learnable task, gives on N ranks the losses of one rank with the same
// global batches, and eval's accuracy counts every sample once; ranks that run out
// of batches at different steps, or hold batches of different sizes, get an error
// (not a hang).
#include <doctest/doctest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/train/model.hpp>

#include "train_test.hpp"

namespace train_test_model {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace train_test;

namespace {

// Records the hooks it sees and each step's loss.
struct recorder : train::callback<float> {
  std::string hooks;
  std::vector<double> losses;
  int stop_at = -1;
  void on_train_begin(train::run_context<float>&) override { hooks += "T"; }
  void on_epoch_begin(train::run_context<float>&) override { hooks += "E"; }
  void on_step_begin(train::run_context<float>&) override { hooks += "s"; }
  void on_step_end(train::run_context<float>& rc) override {
    hooks += "S";
    losses.push_back(rc.loss);
    if (rc.step == stop_at) rc.request_stop();
  }
  void on_epoch_end(train::run_context<float>&) override { hooks += "e"; }
  void on_train_end(train::run_context<float>&) override { hooks += "t"; }
};

}  // namespace

TEST_CASE("model.train: callbacks, learning, and the one-rank losses on N ranks") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = world.size(), r = world.rank();
  const std::size_t rows = 32;
  auto data = shard(6, rows, r, p);

  mlp net;
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
  train::model model(net, ce, opt, ctx);
  std::ostringstream log;
  train::loss_monitor<float> lm(3, log);
  recorder rec;
  model.train(4, data, {&lm, &rec});
  CHECK(rec.hooks == "TEsSsSsSsSsSsSeEsSsSsSsSsSsSeEsSsSsSsSsSsSeEsSsSsSsSsSsSet");
  const std::string lines = log.str();
  CHECK(lines.rfind("epoch: 1 step: 3, loss is ", 0) == 0);
  CHECK(std::count(lines.begin(), lines.end(), '\n') == 8);  // steps 3 and 6 of 4 epochs
  CHECK(lines.find("\nepoch: 4 step: 6, loss is ") != std::string::npos);
  CHECK(rec.losses.back() < 0.75 * rec.losses.front());
  CHECK(opt.global_step() == 24);

  // The same training on one rank (this process) with the whole global batches.
  any_communicator one{local_communicator{}};
  context solo(one);
  auto all = shard(6, rows, 0, 1);
  mlp ref;
  optim::momentum<float> opt_ref(ref.trainable_params(), 0.1f, 0.9f);
  train::model model_ref(ref, ce, opt_ref, solo);
  recorder rec_ref;
  model_ref.train(4, all, {&rec_ref});
  REQUIRE(rec_ref.losses.size() == rec.losses.size());
  for (std::size_t i = 0; i < rec.losses.size(); ++i)
    CHECK(rec.losses[i] == doctest::Approx(rec_ref.losses[i]).epsilon(1e-5));

  // eval: accuracy over every rank's rows, each sample counted once.
  auto test = shard(2, rows, r, p, 100);
  const train::eval_result m = model.eval(test);
  auto test_all = shard(2, rows, 0, 1, 100);
  const train::eval_result m1 = model_ref.eval(test_all);
  CHECK(m.samples == std::int64_t(2 * rows));
  CHECK(m.accuracy == doctest::Approx(m1.accuracy));
  CHECK(m.loss == doctest::Approx(m1.loss).epsilon(1e-5));
  CHECK(m.accuracy > 0.5);
  CHECK(net.training());  // eval restores the mode
}

TEST_CASE("model.train: seed 003's SoftmaxCrossEntropyExpand(sparse) in auto_parallel gives the one-rank losses") {
  // Twelve small operators and two graph constants, each operator's strategy searched;
  // the same losses as CrossEntropyLoss's fused operator on one rank (1e-24 added inside
  // the Log moves nothing at float precision).
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = world.size(), r = world.rank();
  const std::size_t rows = 16;
  any_communicator one{local_communicator{}};
  context solo(one);
  auto all = shard(3, rows, 0, 1);
  mlp ref;
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt_ref(ref.trainable_params(), 0.1f, 0.9f);
  train::model model_ref(ref, ce, opt_ref, solo);
  recorder rec_ref;
  model_ref.train(2, all, {&rec_ref});

  for (graph::search_mode search : {graph::search_mode::dynamic_programming, graph::search_mode::sharding_propagation}) {
    CAPTURE(to_string(search));
    auto data = shard(3, rows, r, p);
    mlp net;
    nn::softmax_cross_entropy_expand<float> expand(true);
    optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
    train::model<mlp, nn::softmax_cross_entropy_expand<float>>::options mo;
    mo.parallel.mode = graph::parallel_mode::auto_parallel;
    mo.parallel.search = search;
    train::model model(net, expand, opt, ctx, mo);
    recorder rec;
    model.train(2, data, {&rec});
    REQUIRE(rec.losses.size() == rec_ref.losses.size());
    for (std::size_t i = 0; i < rec.losses.size(); ++i)
      CHECK(rec.losses[i] == doctest::Approx(rec_ref.losses[i]).epsilon(1e-5));
    // The loss's operators and its constants are in the plan.
    const graph::traced_graph& g = model.plan().traced();
    CHECK(g.at(g.find("one_hot")).op->type() == "OneHot");
    CHECK(g.at(g.find("eps")).kind == graph::node_kind::constant);
    CHECK(g.at(g.find("minus_one")).constant == -1.0);
  }
}

TEST_CASE("softmax_cross_entropy_expand: eager, split as the logits, equals cross_entropy_loss; bad labels") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = world.size();
  const index_t b = 8, c = 4;
  dist_tensor<float> x(layout(mesh{p}, {{0}, {}}), extents{b, c}, ctx.rank());
  x.fill_global([](const auto& i) { return float((i[0] * 7 + i[1] * 3) % 11) / 5.0f - 1.0f; });
  dist_tensor<std::int32_t> y(layout(mesh{p}, {{0}}), extents{b}, ctx.rank());
  y.fill_global([](const auto& i) { return std::int32_t(i[0] * 3 % c); });
  auto loss_of = [&](auto& fn) {
    autodiff::tape<float> t(ctx);
    auto lx = t.leaf(dist_tensor<float>(x), true);
    auto l = fn(lx, y);
    t.backward(l);
    const dist_tensor<float> g = redistribute(*t.take_grad(lx.id), layout(mesh{p}, {{}, {}}), ctx);
    return std::pair{double(redistribute(l.value(), layout(mesh{p}, {}), ctx).local()()), xt::xarray<float>(g.local())};
  };
  nn::softmax_cross_entropy_expand<float> expand;
  nn::cross_entropy_loss<float> ce;
  const auto [le, ge] = loss_of(expand);
  const auto [lc, gc] = loss_of(ce);
  CHECK(le == doctest::Approx(lc).epsilon(1e-6));
  REQUIRE(ge.size() == gc.size());
  for (std::size_t i = 0; i < ge.size(); ++i) CHECK(ge.data()[i] == doctest::Approx(gc.data()[i]).epsilon(1e-5));
  // Label rows need sparse = false, class indices sparse = true.
  nn::softmax_cross_entropy_expand<float> dense(false);
  autodiff::tape<float> t(ctx);
  CHECK_THROWS_WITH(dense(t.leaf(dist_tensor<float>(x), true), y),
                    doctest::Contains("class-index labels need sparse = true"));
}

TEST_CASE("model.train: request_stop ends the training after that step") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  auto data = shard(4, 8, world.rank(), world.size());
  mlp net;
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.05f, 0.9f);
  train::model model(net, ce, opt, ctx);
  recorder rec;
  rec.stop_at = 6;
  model.train(3, data, {&rec});
  CHECK(rec.losses.size() == 6);
  CHECK(rec.hooks == "TEsSsSsSsSeEsSsSet");
}

TEST_CASE("model.train: batches that differ across ranks are an error on every rank") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = world.size(), r = world.rank();
  if (p == 1) return;
  mlp net;
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.05f, 0.9f);
  train::model model(net, ce, opt, ctx);
  auto uneven = shard(r == 0 ? 3 : 2, 8, r, p);
  CHECK_THROWS_WITH(model.train(1, uneven),
                    "model.train: the ranks ran out of batches at different steps (shard the dataset into equal "
                    "parts and batch with drop_remainder)");
  auto sizes = shard(1, 8, r, p);
  if (r == 0) sizes.push_back(batch_t{block(batch(9, 16).first, 0, p), block(batch(9, 16).second, 0, p)});
  else sizes.push_back(batch_t{block(batch(9, 8).first, 0, p), block(batch(9, 8).second, 0, p)});
  CHECK_THROWS_WITH(model.train(1, sizes), doctest::Contains("model.train: the ranks' batches differ in size"));
}
}  // namespace train_test_model
