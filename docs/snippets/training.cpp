// docs/training.md's opening example: seed 002's MNIST network trained the two ways the
// seeds train, seed 002's hand-written loop (value_and_grad, the gradient reducer, SGD)
// and seeds 001 and 003's train::model with a loss monitor, on generated digits. Checks
// that the loop gives the one-rank losses of the global batches, that train::model's
// printed losses are the loop's, the parameter names and what eval counts.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>
#include <tessera/comm/launch.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/data/synthetic.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/sgd.hpp>
#include <tessera/train/grad.hpp>
#include <tessera/train/grad_reducer.hpp>
#include <tessera/train/model.hpp>
using namespace tessera;

// One rank's rows of a global batch: images (rows, 1, 28, 28) and labels.
using digit_batch = std::pair<xt::xarray<float>, xt::xarray<int>>;

// `count` global batches of `rows` generated digits (data::synthetic_images: each class
// a fixed pattern plus noise), rescaled and normalized as seed 002's pipeline does; of
// each, the block of rows of rank `rank` of `ranks`.
std::vector<digit_batch> digits(std::size_t count, std::size_t rows, std::uint64_t seed, int rank, int ranks) {
  const std::size_t pixels = 28 * 28, mine = rows / std::size_t(ranks);
  const data::labelled_images all = data::synthetic_images(count * rows, 28, 28, 1, 10, seed);
  std::vector<digit_batch> out;
  for (std::size_t b = 0; b < count; ++b) {
    const std::size_t first = b * rows + std::size_t(rank) * mine;
    xt::xarray<float> x = xt::xarray<float>::from_shape({mine, 1, 28, 28});
    xt::xarray<int> y = xt::xarray<int>::from_shape({mine});
    for (std::size_t i = 0; i < mine * pixels; ++i)
      x.data()[i] = (float(all.images.data()[first * pixels + i]) / 255.0f - 0.1307f) / 0.3081f;
    for (std::size_t i = 0; i < mine; ++i) y(i) = int(all.labels(first + i));
    out.emplace_back(std::move(x), std::move(y));
  }
  return out;
}

// [seeds]
// Seed 002's network (examples/mnist_data_parallel.cpp) as modules.
struct network : nn::module<float> {
  nn::flatten<float> flatten;
  nn::sequential<nn::dense<float>, nn::relu<float>, nn::dense<float>, nn::relu<float>, nn::dense<float>>
      dense_relu_sequential{nn::dense<float>(784, 512, "normal", "zeros"), nn::relu<float>(),
                            nn::dense<float>(512, 512, "normal", "zeros"), nn::relu<float>(),
                            nn::dense<float>(512, 10, "normal", "zeros")};
  void visit(nn::visitor<float>& v) override {  // names: dense_relu_sequential.0.weight, ...
    v.child("flatten", flatten);
    v.child("dense_relu_sequential", dense_relu_sequential);
  }
  template <class V>
  V operator()(V x) {
    return dense_relu_sequential(flatten(x));
  }
};

// Seed 002: the hand-written loop. `dataset`: (images, labels) pairs of xt::xarray, this
// rank's rows of each global batch.
std::vector<float> train_by_hand(context& ctx, const std::vector<digit_batch>& dataset) {
  network net;
  net.build(ctx);  // every rank: its shard of the same global draw
  nn::cross_entropy_loss<float> loss_fn;
  optim::sgd<float> optimizer(net.trainable_params(), 1e-2f);
  auto forward_fn = [&](auto data, const dist_tensor<int>& label) { return loss_fn(net(data), label); };
  auto grad_fn = train::value_and_grad(forward_fn, net.trainable_params(), ctx);
  train::distributed_grad_reducer<float> grad_reducer(optimizer.parameters(), ctx);
  const int p = ctx.size(), r = ctx.rank();
  std::vector<float> losses;
  for (const auto& [x, y] : dataset) {
    const index_t rows = index_t(y.size()) * p;  // the global batch, its rows split over the ranks
    dist_tensor<float> data(layout(mesh{p}, {{0}, {}, {}, {}}), extents{rows, 1, 28, 28}, r, xt::xarray<float>(x));
    dist_tensor<int> label(layout(mesh{p}, {{0}}), extents{rows}, r, xt::xarray<int>(y));
    auto [loss, grads] = grad_fn(data, label);
    grads = grad_reducer(grads);
    optimizer(grads);
    losses.push_back(train::scalar(loss, ctx));  // the global batch's loss, on every rank
  }
  return losses;
}

// Seeds 001 and 003: Model.train with callbacks, the network traced and run as a graph.
train::eval_result train_with_model(context& ctx, std::vector<digit_batch>& dataset,
                                    std::vector<digit_batch>& test_set) {
  network net;  // the model builds it at its first step
  nn::cross_entropy_loss<float> loss_fn;
  optim::sgd<float> optimizer(net.trainable_params(), 1e-2f);
  train::model model(net, loss_fn, optimizer, ctx);  // data parallel; options: parallel (mode, search,
                                                     // dataset strategy), gradients_mean, bucket_bytes,
                                                     // parameter_broadcast, seed
  train::loss_monitor<float> loss_cb;                // "epoch: 1 step: 1, loss is 2.30205..."
  model.train(1, dataset, {&loss_cb});
  return model.eval(test_set);  // accuracy, loss, samples
}
// [/seeds]

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw error("training: " + what);
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-5 * std::abs(b); }

// std::cout's output goes to `to` while it lives.
struct capture_cout {
  std::streambuf* old;
  explicit capture_cout(std::ostringstream& to) : old(std::cout.rdbuf(to.rdbuf())) {}
  ~capture_cout() { std::cout.rdbuf(old); }
};

}  // namespace

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](any_communicator& world) {
    context ctx(world);
    const int p = ctx.size(), r = ctx.rank();
    std::vector<digit_batch> dataset = digits(6, 32, 1, r, p), test_set = digits(2, 32, 2, r, p);

    // The loop on p ranks gives the losses of the same loop on one rank, whole batches.
    const std::vector<float> by_hand = train_by_hand(ctx, dataset);
    any_communicator one{local_communicator{}};
    context solo(one);
    const std::vector<float> alone = train_by_hand(solo, digits(6, 32, 1, 0, 1));
    check(by_hand.size() == 6 && alone.size() == 6, "6 steps expected");
    for (std::size_t s = 0; s < 6; ++s)
      check(close(by_hand[s], alone[s]), "step " + std::to_string(s + 1) + ": the loss on " + std::to_string(p) +
                                             " ranks is " + std::to_string(by_hand[s]) + ", on one rank " +
                                             std::to_string(alone[s]));

    // train::model prints "epoch: 1 step: S, loss is L" each step, L the loop's loss.
    std::ostringstream log;
    train::eval_result m;
    {
      capture_cout c(log);
      m = train_with_model(ctx, dataset, test_set);
    }
    std::cout << log.str();
    std::istringstream lines(log.str());
    std::string line;
    std::size_t s = 0;
    for (; std::getline(lines, line); ++s) {
      const std::string head = "epoch: 1 step: " + std::to_string(s + 1) + ", loss is ";
      check(s < 6 && line.rfind(head, 0) == 0, "loss_monitor printed \"" + line + "\"");
      const double l = std::stod(line.substr(head.size()));
      check(close(l, by_hand[s]), "train::model's loss at step " + std::to_string(s + 1) + " is " +
                                      line.substr(head.size()) + ", the loop's " + std::to_string(by_hand[s]));
    }
    check(s == 6, "loss_monitor printed " + std::to_string(s) + " lines, not 6");
    check(std::abs(by_hand[0] - 2.30205) < 5e-6, "the first loss is " + std::to_string(by_hand[0]) + ", not 2.30205");
    check(m.samples == 64 && m.accuracy >= 0 && m.accuracy <= 1,
          "eval counted " + std::to_string(m.samples) + " samples, not the 64 of the test set");

    network net;
    net.name_all();
    std::string names;
    for (auto& [name, q] : net.named_parameters()) names += name + " ";
    check(names ==
              "dense_relu_sequential.0.weight dense_relu_sequential.0.bias dense_relu_sequential.2.weight "
              "dense_relu_sequential.2.bias dense_relu_sequential.4.weight dense_relu_sequential.4.bias ",
          "the parameters are named " + names);
  });
}
