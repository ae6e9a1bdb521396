// Tests of train/grad.hpp under mpiexec (1 and 2 ranks): value_and_grad over a
// network's parameters returns the loss and the gradients of the same network on one
// rank (the batch split over the ranks, gradients partial sums that add up to the
// one-rank ones), the auxiliary output with has_aux, zeros for a parameter the forward
// pass does not use, and hands each gradient to the parameter's listener as soon as
// the backward pass is done with it: the last layer's first.
#include <doctest/doctest.h>

#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/optim/sgd.hpp>
#include <tessera/train/grad.hpp>
#include <tessera/train/grad_reducer.hpp>

#include "train_test.hpp"

namespace train_test_grad {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace train_test;

namespace {

// Records what a training step hands over.
struct recorder final : nn::grad_listener<float> {
  std::vector<std::string> names;
  std::vector<int> nodes_left;
  int begins = 0;
  void backward_begin() override { ++begins; }
  void grad_ready(nn::parameter<float>& p, dist_tensor<float>&, int left) override {
    names.push_back(p.name());
    nodes_left.push_back(left);
  }
};

}  // namespace

TEST_CASE("value_and_grad: the loss and gradients of the one-rank network; partial sums on N ranks") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  any_communicator one{local_communicator{}};
  context solo(one);
  const int p = world.size();

  mlp net, ref;
  net.build(ctx, 11);
  ref.build(solo, 11);
  nn::cross_entropy_loss<float> ce;
  auto fwd = [&](auto x, const dist_tensor<std::int32_t>& y) { return ce(net(x), y); };
  auto fwd_ref = [&](auto x, const dist_tensor<std::int32_t>& y) { return ce(ref(x), y); };
  auto grad_fn = train::value_and_grad(fwd, net.trainable_params(), ctx);
  auto grad_ref = train::value_and_grad(fwd_ref, ref.trainable_params(), solo);

  const auto g = batch(3, 16);
  const auto [x, y] = split_batch(g, ctx);
  const auto [x1, y1] = split_batch(g, solo);
  auto [loss, grads] = grad_fn(x, y);
  auto [loss1, grads1] = grad_ref(x1, y1);
  CHECK(train::scalar(loss, ctx) == doctest::Approx(train::scalar(loss1, solo)).epsilon(1e-6));
  REQUIRE(grads.size() == 6);
  const auto params = net.trainable_params();
  for (std::size_t i = 0; i < grads.size(); ++i) {
    CAPTURE(params[i]->name());
    CHECK(grads[i].global_shape() == params[i]->shape());
    // Data parallel: each rank holds its rows' share, partial over the ranks.
    CHECK(grads[i].layout().has_partial() == (p > 1));
    CHECK(grads[i].layout().without_partial() == params[i]->layout());
    CHECK(max_rel_diff(gather(grads[i], ctx), grads1[i].local()) < 1e-4);
  }
}

TEST_CASE("value_and_grad: has_aux, unused parameters and the order gradients become final") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  mlp net;
  net.build(ctx, 2);
  nn::dense<float> unused(3, 3);
  unused.build(ctx);
  nn::cross_entropy_loss<float> ce;

  auto params = net.trainable_params();
  params.push_back(&unused.weight);
  recorder rec;
  for (auto* q : params) q->set_listener(&rec);
  auto grad_fn = train::value_and_grad(
      [&](auto x, const dist_tensor<std::int32_t>& y) {
        const auto logits = net(x);
        return std::pair(ce(logits, y), logits);
      },
      params, ctx);
  const auto [x, y] = split_batch(batch(0, 8), ctx);
  auto [out, grads] = grad_fn(x, y);
  const auto& [loss, logits] = out;
  CHECK(loss.ndim() == 0);
  CHECK(logits.global_shape() == extents{8, OUT});
  // Zeros, in the parameter's layout, for the parameter the forward pass did not use.
  CHECK(grads.back().layout() == unused.weight.layout());
  for (float v : grads.back().data()) CHECK(v == 0.0f);
  // The backward pass finishes the last layer first; the unused parameter comes last.
  CHECK(rec.begins == 1);
  CHECK(rec.names == std::vector<std::string>{"seq.4.bias", "seq.4.weight", "seq.2.bias", "seq.2.weight",
                                              "seq.0.bias", "seq.0.weight", "weight"});
  for (std::size_t i = 1; i < rec.nodes_left.size(); ++i) CHECK(rec.nodes_left[i] <= rec.nodes_left[i - 1]);
  CHECK(rec.nodes_left[1] > rec.nodes_left[5]);
  for (auto* q : params) q->set_listener(nullptr);
  CHECK_THROWS_WITH(train::value_and_grad(
                        [&](auto x2, const dist_tensor<std::int32_t>& y2) { return ce(net(x2), y2); },
                        std::vector<nn::parameter<float>*>{nullptr}, ctx),
                    "value_and_grad: parameter 0 is null");
}

TEST_CASE("value_and_grad: after the optimizer's step, the next step's gradients reuse the same storage") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  mlp net;
  net.build(ctx, 5);
  nn::cross_entropy_loss<float> ce;
  optim::sgd<float> opt(net.trainable_params(), 0.01f);
  train::distributed_grad_reducer<float> reducer(opt.parameters(), ctx);
  auto grad_fn = train::value_and_grad([&](auto x, const dist_tensor<std::int32_t>& y) { return ce(net(x), y); },
                                       net.trainable_params(), ctx);
  std::vector<const float*> before;
  for (int step = 0; step < 3; ++step) {
    const auto [x, y] = split_batch(batch(step, 8), ctx);
    auto [loss, grads] = grad_fn(x, y);
    grads = reducer(grads);
    std::vector<const float*> now;
    for (const auto& g : grads) now.push_back(g.data().data());
    if (step > 0) CHECK(now == before);
    before = now;
    opt(grads);
    CHECK(grads.empty());  // the storage went back to the parameters
  }
}
}  // namespace train_test_grad
