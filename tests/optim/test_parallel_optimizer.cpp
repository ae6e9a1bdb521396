// Optimizer parallel (optimizer.hpp's enable_parallel_optimizer) under mpiexec (1, 2
// and 4 ranks): state_layout's rule at compile time; SGD, Momentum, Adam and AdamW
// stepping on the gradients the backward pass leaves (partial sums), their state split
// over the replicas, give the losses and parameters of the same training on one rank;
// a model-parallel layer's state is split over its replicas only; the collectives move
// the bytes of the AllReduce they replace; small parameters stay whole; train::model
// with such an optimizer runs no reducer and follows the reducer's run; the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/optim/adam.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/optim/sgd.hpp>
#include <tessera/plan/planner.hpp>
#include <tessera/train/grad.hpp>
#include <tessera/train/grad_reducer.hpp>
#include <tessera/train/model.hpp>

#include "../train/train_test.hpp"

using namespace tessera;
using namespace train_test;

// The rule, by the examples of its comment.
static_assert(optim::state_layout(layout::replicated(mesh{8}, 2), extents{512, 784}) == layout(mesh{8}, {{0}, {}}));
static_assert(optim::state_layout(layout::replicated(mesh{8}, 2), extents{6, 16}) == layout(mesh{8}, {{}, {0}}));
static_assert(optim::state_layout(layout::replicated(mesh{8}, 1), extents{10}) == layout::replicated(mesh{8}, 1));
static_assert(optim::state_layout(layout(mesh{2, 4}, {{1}, {}}), extents{16, 32}) ==
              layout(mesh{2, 4}, {{1, 0}, {}}));
// No replicas (every axis splits a dim): the parameter's own layout.
static_assert(optim::state_layout(layout(mesh{2, 4}, {{1}, {0}}), extents{16, 32}) == layout(mesh{2, 4}, {{1}, {0}}));
// One rank: nothing to split over; an axis of one rank is left out.
static_assert(optim::state_layout(layout::replicated(mesh{1}, 2), extents{4, 4}) == layout::replicated(mesh{1}, 2));
static_assert(optim::state_layout(layout(mesh{2, 1, 2}, {{2}, {}}), extents{16, 12}) ==
              layout(mesh{2, 1, 2}, {{2, 0}, {}}));

namespace {

constexpr std::size_t global_rows = 16;
using make_optimizer = std::function<std::unique_ptr<optim::optimizer<float>>(std::vector<nn::parameter<float>*>)>;

struct named_optimizer {
  std::string name;
  make_optimizer make;
};

std::vector<named_optimizer> optimizers() {
  return {
      {"sgd (momentum, weight decay, Nesterov)",
       [](auto ps) { return std::make_unique<optim::sgd<float>>(ps, 0.1f, 0.9f, 0.0f, 1e-3f, true); }},
      {"momentum (weight decay, Nesterov)",
       [](auto ps) { return std::make_unique<optim::momentum<float>>(ps, 0.1f, 0.9f, 1e-4f, true); }},
      {"adam", [](auto ps) { return std::make_unique<optim::adam<float>>(ps, 1e-2f); }},
      {"adamw", [](auto ps) { return std::make_unique<optim::adamw<float>>(ps, 1e-2f); }},
  };
}

// MatMul's strategy for the first Dense of the hybrid network: its weight's rows split
// 2 ways, the batch over the other ranks, so that the weight has replicas (p / 2 of
// them) on 4 ranks; on 2 ranks the weight is split over both (no replicas).
strategy hybrid_strategy(int p) { return p >= 2 ? strategy{{p / 2, 1}, {2, 1}} : strategy{}; }

struct run_result {
  std::vector<float> losses;
  std::vector<xt::xarray<float>> params;  // global values
};

// `steps` steps of the optimizer over the network built from `seed` on ctx's ranks;
// with optimizer parallel the gradients go to the step as the backward pass leaves
// them, else through a distributed_grad_reducer.
run_result train_run(context& ctx, const make_optimizer& make, bool parallel, bool hybrid, int steps,
                     optim::optimizer<float>::parallel_options po = {.threshold_bytes = 0},
                     std::function<void(const optim::optimizer<float>&)> inspect = {}) {
  mlp net;
  if (hybrid) net.seq.get<0>().shard(hybrid_strategy(ctx.size()));
  net.build(ctx, 21);
  nn::cross_entropy_loss<float> ce;
  std::unique_ptr<optim::optimizer<float>> opt = make(net.trainable_params());
  if (parallel) opt->enable_parallel_optimizer(ctx, po);
  std::unique_ptr<train::distributed_grad_reducer<float>> reducer;
  if (!parallel) reducer = std::make_unique<train::distributed_grad_reducer<float>>(opt->parameters(), ctx);
  auto grad_fn = train::value_and_grad([&](auto x, const dist_tensor<std::int32_t>& y) { return ce(net(x), y); },
                                       net.trainable_params(), ctx);
  run_result out;
  for (int s = 0; s < steps; ++s) {
    const auto [x, y] = split_batch(batch(s, global_rows), ctx);
    auto [loss, grads] = grad_fn(x, y);
    if (reducer) grads = (*reducer)(grads);
    (*opt)(grads);
    out.losses.push_back(train::scalar(loss, ctx));
  }
  if (inspect) inspect(*opt);
  for (nn::parameter<float>* q : net.trainable_params()) out.params.push_back(gather(q->data(), ctx));
  return out;
}

void check_same(const run_result& a, const run_result& ref) {
  REQUIRE(a.losses.size() == ref.losses.size());
  for (std::size_t s = 0; s < a.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(std::abs(double(a.losses[s]) - double(ref.losses[s])) <= 1e-5 * std::abs(double(ref.losses[s])));
  }
  REQUIRE(a.params.size() == ref.params.size());
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    CAPTURE(i);
    CHECK(max_rel_diff(a.params[i], ref.params[i]) < 1e-4);
  }
}

}  // namespace

TEST_CASE("optimizer parallel: each optimizer's split state gives the one-rank training, data parallel") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  any_communicator one{local_communicator{}};
  context solo(one);
  const int p = ctx.size();
  for (const named_optimizer& o : optimizers()) {
    CAPTURE(o.name);
    std::size_t split = 0;
    const run_result r = train_run(ctx, o.make, true, false, 8, {.threshold_bytes = 0},
                                   [&](const optim::optimizer<float>& opt) {
                                     CHECK(opt.reduces_gradients());
                                     for (std::size_t i = 0; i < opt.parameters().size(); ++i) {
                                       const nn::parameter<float>& q = *opt.parameters()[i];
                                       const layout sl = opt.state_layout(i);
                                       CHECK(sl == optim::state_layout(q.layout(), q.shape()));
                                       if (!(sl == q.layout())) {
                                         ++split;
                                         CHECK(local_shape(sl, q.shape()).size() * p == q.shape().size());
                                       }
                                     }
                                   });
    // Every weight and bias of the 12-16-16-4 network divides into 1, 2 and 4 pieces.
    CHECK(split == (p > 1 ? 6u : 0u));
    const run_result ref = train_run(solo, o.make, false, false, 8);
    check_same(r, ref);
    CHECK(ref.losses.back() < ref.losses.front());  // it learned: the comparison is of moving values
    // And the reducer's run on these ranks.
    check_same(train_run(ctx, o.make, false, false, 8), ref);
  }
}

TEST_CASE("optimizer parallel: a model-parallel layer's state is split over its replicas only") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  any_communicator one{local_communicator{}};
  context solo(one);
  const int p = ctx.size();
  const make_optimizer make = [](auto ps) { return std::make_unique<optim::adam<float>>(ps, 1e-2f); };
  const run_result r = train_run(ctx, make, true, true, 6, {.threshold_bytes = 0}, [&](const optim::optimizer<float>& opt) {
    const nn::parameter<float>& w = *opt.parameters()[0];  // the first Dense's weight (16, 12)
    REQUIRE(w.shape() == extents{HID, IN});
    const layout sl = opt.state_layout(0);
    if (p == 4) {
      // The weight's rows are split 2 ways by one mesh axis (device matrix (2, 1, 2));
      // the state's rows 4 ways, by that axis and the one holding the weight's 2
      // replicas.
      CHECK(w.layout().pieces(0) == 2);
      CHECK(group_size(w.layout().dev, axis_list{0}) == 2);
      CHECK((w.layout().replica_axes() & 1u) == 1u);
      CHECK(sl == w.layout().with_split(0, axis_list{2, 0}));
    } else if (p == 2) {
      CHECK(w.layout().pieces(0) == 2);  // split over both ranks: nothing to split further
      CHECK(sl == w.layout());
    }
  });
  check_same(r, train_run(solo, make, false, true, 6));
}

TEST_CASE("optimizer parallel: its collectives move the bytes of the AllReduce they replace") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  for (const bool hybrid : {false, true}) {
    CAPTURE(hybrid);
    mlp net;
    if (hybrid) net.seq.get<0>().shard(hybrid_strategy(ctx.size()));
    net.build(ctx, 3);
    optim::sgd<float> opt(net.trainable_params(), 0.1f);
    opt.enable_parallel_optimizer(ctx, {.threshold_bytes = 0});
    for (std::size_t i = 0; i < opt.parameters().size(); ++i) {
      const nn::parameter<float>& q = *opt.parameters()[i];
      const layout l = q.layout(), sl = opt.state_layout(i);
      const layout partial = l.with_partial(train::detail::replica_axis_list(l));  // the backward pass's gradient
      const index_t all_reduce = plan_redistribution(partial, l, q.shape(), 4).bytes_per_rank();
      const index_t scatter = plan_redistribution(partial, sl, q.shape(), 4).bytes_per_rank();
      const index_t gather = plan_redistribution(sl, l, q.shape(), 4).bytes_per_rank();
      CAPTURE(q.name());
      CHECK(scatter + gather == all_reduce);
      if (!(sl == l)) CHECK(scatter > 0);
    }
  }
}

TEST_CASE("optimizer parallel: parameters below the threshold keep their whole state") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  any_communicator one{local_communicator{}};
  context solo(one);
  const make_optimizer make = [](auto ps) { return std::make_unique<optim::momentum<float>>(ps, 0.1f, 0.9f); };
  // 16 x 16 floats (1 KiB) and more are split; the rest (the biases, the 4 x 16 last
  // weight, 256 bytes) stay whole and are all-reduced.
  const run_result r = train_run(ctx, make, true, false, 5, {.threshold_bytes = 1024},
                                 [&](const optim::optimizer<float>& opt) {
                                   for (std::size_t i = 0; i < opt.parameters().size(); ++i) {
                                     const nn::parameter<float>& q = *opt.parameters()[i];
                                     const bool big = q.shape().size() * 4 >= 1024;
                                     CAPTURE(q.name());
                                     CHECK((opt.state_layout(i) == q.layout()) == (!big || ctx.size() == 1));
                                   }
                                 });
  check_same(r, train_run(solo, make, false, false, 5));
}

TEST_CASE("optimizer parallel: train::model runs no reducer and follows the reducer's run") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = ctx.size(), r = ctx.rank();
  auto data = shard(4, global_rows, r, p);
  nn::cross_entropy_loss<float> ce;
  mlp a, b;
  optim::adam<float> opt_a(a.trainable_params(), 1e-2f), opt_b(b.trainable_params(), 1e-2f);
  opt_a.enable_parallel_optimizer(ctx, {.threshold_bytes = 0});
  a.build(ctx, 5);  // after enabling: the layouts are taken at the first step
  b.build(ctx, 5);
  train::model ma(a, ce, opt_a, ctx), mb(b, ce, opt_b, ctx);
  ma.train(2, data);
  mb.train(2, data);
  CHECK(ma.reducer() == nullptr);
  CHECK(mb.reducer() != nullptr);
  const auto pa = a.trainable_params(), pb = b.trainable_params();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(i);
    CHECK(max_rel_diff(gather(pa[i]->data(), ctx), gather(pb[i]->data(), ctx)) < 1e-5);
  }
  // gradients_mean = false has no meaning for it: refused.
  mlp c;
  optim::adam<float> opt_c(c.trainable_params(), 1e-2f);
  opt_c.enable_parallel_optimizer(ctx);
  train::model mc(c, ce, opt_c, ctx, {.gradients_mean = false});
  CHECK_THROWS_WITH(mc.train(1, data), doctest::Contains("model.train: gradients_mean = false with optimizer parallel"));
}

TEST_CASE("optimizer parallel: errors") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  mlp net;
  net.build(ctx, 1);
  optim::sgd<float> opt(net.trainable_params(), 0.1f);
  auto grad_fn = train::value_and_grad(
      [&](auto x, const dist_tensor<std::int32_t>& y) { return nn::cross_entropy_loss<float>{}(net(x), y); },
      net.trainable_params(), ctx);
  const auto [x, y] = split_batch(batch(0, global_rows), ctx);
  {
    optim::sgd<float> late(net.trainable_params(), 0.1f);
    train::distributed_grad_reducer<float> reducer(late.parameters(), ctx);
    auto [loss, grads] = grad_fn(x, y);
    late(reducer(grads));
    CHECK_THROWS_WITH(late.enable_parallel_optimizer(ctx),
                      "sgd: enable_parallel_optimizer after 1 steps: the state is already whole on every rank; "
                      "enable it before the first step");
  }
  opt.enable_parallel_optimizer(ctx);
  auto [loss, grads] = grad_fn(x, y);
  std::vector<dist_tensor<float>> wrong;
  for (const auto& g : grads) wrong.push_back(g);
  wrong[0] = dist_tensor<float>(layout::replicated(mesh{ctx.size()}, 2), extents{HID, IN + 1}, ctx.rank());
  CHECK_THROWS_WITH(opt(wrong), doctest::Contains("sgd: the gradient of parameter 'seq.0.weight' is (16, 13)"));
  CHECK_THROWS_WITH(opt(wrong), doctest::Contains("optimizer parallel needs the parameter's shape over the same ranks"));
  CHECK_THROWS_WITH(opt.state_layout(99), "sgd: state_layout: parameter 99 of 6");
}
