// ranks: 2 4
// docs/training.md's pipeline parallel by hand (train/pipeline.hpp): an MLP cut into two
// stages, a body (two Dense 12 -> 16 -> 16 with ReLU) on the first half of the ranks and
// a head (Dense 16 -> 4 and the loss) on the second, trained with 4 micro-batches a step
// in the 1F1B order, data parallel inside each stage. Checks that stage s holds ranks
// [s q, (s + 1) q) and that every step's loss is that of the whole network trained on
// one rank with the whole batches (a loss that falls).
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <xtensor/xview.hpp>
#include <tessera/comm/launch.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/grad.hpp>
#include <tessera/train/pipeline.hpp>
using namespace tessera;

constexpr std::size_t batch_rows = 16;  // a global batch
constexpr int micro = 4;                // micro-batches a step
constexpr int steps = 4;

struct body_net : nn::module<float> {
  nn::dense<float> fc1{12, 16, {}, {}, true, nn::activation::relu}, fc2{16, 16, {}, {}, true, nn::activation::relu};
  void visit(nn::visitor<float>& v) override {
    v.child("fc1", fc1);
    v.child("fc2", fc2);
  }
  template <class V>
  V operator()(V x) {
    return fc2(fc1(x));
  }
};

struct head_net : nn::module<float> {
  nn::dense<float> out{16, 4};
  void visit(nn::visitor<float>& v) override { v.child("out", out); }
  template <class V>
  V operator()(V x) {
    return out(x);
  }
};

// Global batch s: inputs (16, 12) in [-1, 1), each label the index of the largest of
// the row's first 4 inputs (something to learn).
std::pair<xt::xarray<float>, xt::xarray<int>> global_batch(int s) {
  xt::xarray<float> x = xt::xarray<float>::from_shape({batch_rows, 12});
  xt::xarray<int> y = xt::xarray<int>::from_shape({batch_rows});
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint64_t h = (std::uint64_t(s) * 1000 + i + 1) * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ull;
    x.data()[i] = float((h ^ (h >> 29)) % 20000) / 10000.0f - 1.0f;
  }
  for (std::size_t i = 0; i < batch_rows; ++i) {
    y(i) = 0;
    for (int k = 1; k < 4; ++k)
      if (x(i, k) > x(i, y(i))) y(i) = k;
  }
  return {x, y};
}

// Rows [first, first + n) of `a`.
template <class T>
xt::xarray<T> rows_of(const xt::xarray<T>& a, std::size_t first, std::size_t n) {
  return xt::view(a, xt::range(first, first + n));
}

// This rank's rows of micro-batch m of global batch s, split over the ranks of `sc`.
dist_tensor<float> images(int s, int m, context& sc) {
  const std::size_t per_micro = batch_rows / micro, mine = per_micro / std::size_t(sc.size());
  const std::size_t first = std::size_t(m) * per_micro + std::size_t(sc.rank()) * mine;
  return dist_tensor<float>(layout(mesh{sc.size()}, {{0}, {}}), extents{index_t(per_micro), 12}, sc.rank(),
                            rows_of(global_batch(s).first, first, mine));
}
dist_tensor<int> labels(int s, int m, context& sc) {
  const std::size_t per_micro = batch_rows / micro, mine = per_micro / std::size_t(sc.size());
  const std::size_t first = std::size_t(m) * per_micro + std::size_t(sc.rank()) * mine;
  return dist_tensor<int>(layout(mesh{sc.size()}, {{0}}), extents{index_t(per_micro)}, sc.rank(),
                          rows_of(global_batch(s).second, first, mine));
}

// The two stages on the ranks of ctx: each step's loss.
std::vector<float> train_pipelined(context& ctx) {
  std::vector<float> losses;
  // [pipeline]
  train::pipeline<float> pp(ctx, 2);  // on 4 ranks: 2 stages of 2
  context& sc = pp.stage_context();
  body_net body;
  head_net head;
  if (pp.first_stage()) body.build(sc); else head.build(sc);
  const auto params = pp.first_stage() ? body.trainable_params() : head.trainable_params();
  optim::momentum<float> opt(params, 0.1f, 0.9f);
  nn::cross_entropy_loss<float> loss_fn;
  for (int s = 0; s < steps; ++s) {
    auto r = pp.step(params, 4, [&](autodiff::tape<float>& tape, int m, std::optional<autodiff::var<float>> x) {
      if (pp.first_stage()) return body(tape.leaf(images(s, m, sc), false));  // micro-batch m's inputs
      return loss_fn(head(*x), labels(s, m, sc));                             // the last stage: a loss
    });
    opt(r.grads);              // this stage's parameters
    losses.push_back(r.loss);  // the batch's loss, on every rank
  }
  // [/pipeline]
  const int q = ctx.size() / 2;
  if (pp.stage() != ctx.rank() / q || sc.size() != q)
    throw error("training_pipeline: rank " + std::to_string(ctx.rank()) + " is on stage " +
                std::to_string(pp.stage()) + " of " + std::to_string(sc.size()) + " ranks");
  return losses;
}

// The whole network on one rank, the whole batches: each step's loss.
std::vector<float> train_alone() {
  any_communicator one{local_communicator{}};
  context solo(one);
  body_net body;
  head_net head;
  body.build(solo);
  head.build(solo);
  std::vector<nn::parameter<float>*> params = body.trainable_params();
  for (nn::parameter<float>* q : head.trainable_params()) params.push_back(q);
  optim::momentum<float> opt(params, 0.1f, 0.9f);
  nn::cross_entropy_loss<float> loss_fn;
  auto grad_fn = train::value_and_grad(
      [&](auto x, const dist_tensor<int>& y) { return loss_fn(head(body(x)), y); }, params, solo);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = global_batch(s);
    const index_t n = index_t(batch_rows);
    auto [loss, grads] = grad_fn(dist_tensor<float>(layout::replicated(mesh{1}, 2), extents{n, 12}, 0, std::move(x)),
                                 dist_tensor<int>(layout::replicated(mesh{1}, 1), extents{n}, 0, std::move(y)));
    opt(grads);
    losses.push_back(train::scalar(loss, solo));
  }
  return losses;
}

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](any_communicator& world) {
    context ctx(world);
    const std::vector<float> got = train_pipelined(ctx), want = train_alone();
    for (int s = 0; s < steps; ++s)
      if (std::abs(got[std::size_t(s)] - want[std::size_t(s)]) > 1e-5f * std::abs(want[std::size_t(s)]))
        throw error("training_pipeline: step " + std::to_string(s + 1) + ": the pipeline's loss is " +
                    std::to_string(got[std::size_t(s)]) + ", one rank's " + std::to_string(want[std::size_t(s)]));
    if (!(want.back() < want.front()))
      throw error("training_pipeline: the loss did not fall: " + std::to_string(want.front()) + " to " +
                  std::to_string(want.back()));
  });
}
