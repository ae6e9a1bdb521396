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
#include <tessera/train/model.hpp>

#include "train_test.hpp"

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
