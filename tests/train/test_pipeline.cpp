// Tests of train/pipeline.hpp under mpiexec (1, 2 and 4 ranks): the seed's MLP cut into
// 1, 2 or 4 pipeline stages (every count that divides the ranks), trained with 1, 2 and
// 4 micro-batches by the 1F1B schedule, data parallel inside each stage (and model
// parallel in one variant), gives the losses and parameters of the whole network
// trained on one rank with the whole batch; micro-batches' gradients add up on one tape;
// and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/grad.hpp>
#include <tessera/train/pipeline.hpp>

#include "train_test.hpp"

namespace train_test_pipeline {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace train_test;

namespace {

constexpr std::size_t global_rows = 16;
constexpr int steps = 3;
using tape_t = autodiff::tape<float>;
using var_t = autodiff::var<float>;

std::vector<double> flat(const xt::xarray<float>& a) { return std::vector<double>(a.begin(), a.end()); }

// The reference: basic_mlp on one rank with the whole batches; its initial global
// parameters (weight, bias of each Dense), its losses and its final parameters.
struct reference {
  std::vector<xt::xarray<float>> initial, final_params;
  std::vector<float> losses;
};

reference train_alone() {
  any_communicator one{local_communicator{}};
  context solo(one);
  mlp net;
  net.build(solo, 21);
  reference r;
  for (nn::parameter<float>* q : net.trainable_params()) r.initial.push_back(q->data().local());
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.1f, 0.9f);
  auto grad_fn = train::value_and_grad([&](auto x, const dist_tensor<std::int32_t>& y) { return ce(net(x), y); },
                                       net.trainable_params(), solo);
  for (int s = 0; s < steps; ++s) {
    const auto [x, y] = split_batch(batch(s, global_rows), solo);
    auto [loss, grads] = grad_fn(x, y);
    opt(grads);
    r.losses.push_back(train::scalar(loss, solo));
  }
  for (nn::parameter<float>* q : net.trainable_params()) r.final_params.push_back(q->data().local());
  return r;
}

// The MLP's layers with the reference's initial values, cut into four parts: Flatten
// and Dense 1; ReLU; Dense 2 and ReLU; Dense 3. Each stage runs the parts
// [4 s / S, 4 (s + 1) / S).
struct parts_net : nn::module<float> {
  nn::flatten<float> flatten;
  nn::dense<float> fc1, fc2, fc3;
  nn::relu<float> act1, act2;
  explicit parts_net(const std::vector<xt::xarray<float>>& g)
      : fc1(IN, HID, nn::initializer::values(flat(g[0])), nn::initializer::values(flat(g[1]))),
        fc2(HID, HID, nn::initializer::values(flat(g[2])), nn::initializer::values(flat(g[3]))),
        fc3(HID, OUT, nn::initializer::values(flat(g[4])), nn::initializer::values(flat(g[5]))) {}
  void visit(nn::visitor<float>& v) override {
    v.child("fc1", fc1);
    v.child("fc2", fc2);
    v.child("fc3", fc3);
  }
  var_t part(int k, var_t x) {
    switch (k) {
      case 0: return fc1(flatten(x));
      case 1: return act1(x);
      case 2: return act2(fc2(x));
      default: return fc3(x);
    }
  }
  // The parameters of parts [k0, k1), in the reference's order, and their indices there.
  std::vector<nn::parameter<float>*> params(int k0, int k1, std::vector<int>& index) {
    std::vector<nn::parameter<float>*> out;
    const std::vector<std::pair<int, nn::dense<float>*>> owners{{0, &fc1}, {2, &fc2}, {3, &fc3}};
    int base = 0;
    for (const auto& [k, d] : owners) {
      if (k >= k0 && k < k1) {
        out.push_back(&d->weight);
        out.push_back(&d->bias);
        index.push_back(base);
        index.push_back(base + 1);
      }
      base += 2;
    }
    return out;
  }
};

// Trains the pipeline of `stages` stages with `micro` micro-batches; checks every step's
// loss and this stage's final parameters against the reference.
// `live`, when given, receives the tape's live operator outputs as each micro-batch's
// forward starts on this stage.
void check_pipeline(const reference& ref, int stages, int micro, bool model_parallel,
                    std::vector<int>* live = nullptr) {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  train::pipeline<float> pp(ctx, stages);
  CHECK(pp.stages() == stages);
  CHECK(pp.stage() == ctx.rank() / (ctx.size() / stages));
  context& sc = pp.stage_context();
  const int q = sc.size(), me = sc.rank();
  CHECK(q == ctx.size() / stages);
  parts_net net(ref.initial);
  if (model_parallel && q > 1) net.fc2.shard(strategy{{1, 1}, {q, 1}});  // fc2's output features split
  net.build(sc, 0);
  const int k0 = 4 * pp.stage() / stages, k1 = 4 * (pp.stage() + 1) / stages;
  std::vector<int> index;
  const auto params = net.params(k0, k1, index);
  optim::momentum<float> opt(params, 0.1f, 0.9f);
  nn::cross_entropy_loss<float> ce;
  for (int s = 0; s < steps; ++s) {
    const batch_t g = batch(s, global_rows);
    const index_t rows = index_t(global_rows) / micro;
    auto r = pp.step(params, micro, [&](tape_t& tp, int m, std::optional<var_t> x) -> var_t {
      if (live && s == 0) live->push_back(tp.live_values());
      var_t v = x ? *x : var_t{};
      if (!x) {  // the first stage: this rank's rows of micro-batch m
        const xt::xarray<float> mx = block(g.first, m, micro);  // micro-batch m
        v = tp.leaf(dist_tensor<float>(layout(mesh{q}, {{0}, {}, {}}), extents{rows, 3, 4}, me, block(mx, me, q)),
                    false);
      }
      for (int k = k0; k < k1; ++k) v = net.part(k, v);
      if (!pp.last_stage()) return v;
      const xt::xarray<std::int32_t> my = block(g.second, m, micro);
      return ce(v, dist_tensor<std::int32_t>(layout(mesh{q}, {{0}}), extents{rows}, me, block(my, me, q)));
    });
    CAPTURE(s);
    CHECK(std::abs(double(r.loss) - double(ref.losses[std::size_t(s)])) <=
          1e-5 * std::abs(double(ref.losses[std::size_t(s)])));
    REQUIRE(r.grads.size() == params.size());
    opt(r.grads);
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    CAPTURE(params[i]->name());
    CHECK(max_rel_diff(gather(params[i]->data(), sc), ref.final_params[std::size_t(index[i])]) < 1e-4);
  }
}

}  // namespace

TEST_CASE("pipeline: every stage count and micro-batch count gives the one-rank training") {
  const reference ref = train_alone();
  CHECK(ref.losses.back() < ref.losses.front());  // it learns: the comparison is of moving values
  const int p = mpi_communicator::world().size();
  for (const int stages : {1, 2, 4}) {
    if (p % stages != 0) continue;
    for (const int micro : {1, 2, 4}) {
      CAPTURE(stages);
      CAPTURE(micro);
      check_pipeline(ref, stages, micro, false);
    }
  }
}

TEST_CASE("pipeline: 1F1B keeps the activations of the micro-batches in flight only") {
  // 2 stages, 8 micro-batches: the first stage has one micro-batch in flight when each
  // later forward starts (the one before released by its backward pass), the last only
  // the input it has just received: the tape's live values stay level instead of
  // growing with m.
  const reference ref = train_alone();
  const int p = mpi_communicator::world().size();
  if (p % 2 != 0) return;
  std::vector<int> live;
  check_pipeline(ref, 2, 8, false, &live);
  REQUIRE(live.size() == 8);
  const bool first = mpi_communicator::world().rank() < p / 2;
  CHECK(live[0] == (first ? 0 : 1));
  for (std::size_t m = 1; m < live.size(); ++m) {
    CAPTURE(m);
    CHECK(live[m] == (first ? live[1] : 1));
  }
  if (first) CHECK(live[1] > 1);
}

TEST_CASE("pipeline: a model-parallel layer inside a stage") {
  const reference ref = train_alone();
  const int p = mpi_communicator::world().size();
  check_pipeline(ref, p >= 2 ? 2 : 1, 2, true);
}

TEST_CASE("tape: backward passes from several outputs add up at the leaves") {
  // y_m = sum(w * x_m) for two x: one tape, two passes (dy 1 and 2) give w the gradient
  // x_0 + 2 x_1; each operator's backward runs once, and its value is released.
  any_communicator one{local_communicator{}};
  context solo(one);
  autodiff::tape<float> tp(solo);
  const layout l = layout::replicated(mesh{1}, 1);
  const dist_tensor<float> w(l, extents{3}, 0, xt::xarray<float>{1, 2, 3});
  const auto wv = tp.leaf(w);
  std::vector<autodiff::var<float>> ys;
  for (const xt::xarray<float>& xs : {xt::xarray<float>{1, 0, 2}, xt::xarray<float>{0, 5, 1}}) {
    const auto xv = tp.leaf(dist_tensor<float>(l, extents{3}, 0, xt::xarray<float>(xs)), false);
    ys.push_back(autodiff::apply(ops::reduce_sum_op{strategy{{1}}, {}, false},
                                      autodiff::apply(ops::mul_op{strategy{{1}, {1}}}, wv, xv)));
  }
  dist_tensor<float> one_(layout::replicated(mesh{1}, 0), extents{}, 0), two(layout::replicated(mesh{1}, 0), extents{}, 0);
  one_.local()() = 1;
  two.local()() = 2;
  CHECK(tp.live_values() == 7);  // w, the two x, the two products and the two sums
  tp.backward(ys[0], one_);
  CHECK(tp.live_values() == 5);  // the first pass released its product and sum
  tp.backward(ys[1], two);
  CHECK(tp.live_values() == 3);
  const xt::xarray<float> gw = tp.grad(wv).local();
  CHECK(gw(0) == 1.0f);
  CHECK(gw(1) == 10.0f);
  CHECK(gw(2) == 4.0f);
  CHECK_THROWS_WITH(ys[0].value(), "autodiff: value 3 was released (by a consuming backward pass or release())");
}

TEST_CASE("pipeline: errors") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = ctx.size();
  const std::string bad = "pipeline: " + std::to_string(p + 1) + " stages do not divide " + std::to_string(p) +
                          " ranks into stages of equal size";
  using pipeline_t = train::pipeline<float>;
  CHECK_THROWS_WITH(pipeline_t(ctx, p + 1), bad.c_str());
  train::pipeline<float> pp(ctx, 1);
  CHECK_THROWS_WITH(pp.step({}, 0, [](tape_t&, int, std::optional<var_t>) -> var_t { return {}; }),
                    "pipeline: the number of micro-batches must be in [1, 4096], got 0");
  // One stage is the last: its function must return a scalar loss.
  context& sc = pp.stage_context();
  CHECK_THROWS_WITH(pp.step({}, 1,
                            [&](tape_t& tp, int, std::optional<var_t>) {
                              return tp.leaf(dist_tensor<float>(layout::replicated(mesh{sc.size()}, 1), extents{2},
                                                                sc.rank()),
                                             false);
                            }),
                    "pipeline: the last stage must return micro-batch 0's loss, a scalar; it returned shape (2,)");
}
}  // namespace train_test_pipeline
