// Tests of nn/loss.hpp under mpiexec (1, 2 and 4 ranks): CrossEntropyLoss with class
// labels and MSELoss, mean and sum, equal their hand-computed values and gradients
// (softmax minus one-hot over the batch; 2 (x - t) / n) and central finite differences,
// with the batch split, replicated, or (cross entropy) the class dim split through
// ops::sparse_softmax_cross_entropy; bad labels and shapes are errors. The losses'
// paths for devices other than the host, run with the host's kernels, give the same.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/nn/loss.hpp>

#include "nn_test.hpp"

namespace nn_test_loss {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace nn_test;
using ctx_t = context;
using tape_t = autodiff::tape<double>;
using arr = xt::xarray<double>;

namespace {

constexpr std::size_t B = 8, C = 4;

xt::xarray<std::int32_t> labels() {
  xt::xarray<std::int32_t> y = xt::xarray<std::int32_t>::from_shape({B});
  for (std::size_t i = 0; i < B; ++i) y(i) = std::int32_t((i * 3 + 1) % C);
  return y;
}

// The loss and d loss / d logits, computed directly.
std::pair<double, arr> ce_reference(const arr& x, const xt::xarray<std::int32_t>& y, bool mean) {
  double loss = 0;
  arr g = arr::from_shape({B, C});
  const double k = mean ? 1.0 / B : 1.0;
  for (std::size_t i = 0; i < B; ++i) {
    double s = 0;
    for (std::size_t j = 0; j < C; ++j) s += std::exp(x(i, j));
    loss += k * (std::log(s) - x(i, std::size_t(y(i))));
    for (std::size_t j = 0; j < C; ++j) g(i, j) = k * (std::exp(x(i, j)) / s - (j == std::size_t(y(i)) ? 1.0 : 0.0));
  }
  return {loss, g};
}

struct run_result {
  double loss;
  arr grad;
};
template <class Loss, class Target>
run_result run(Loss& loss_fn, const arr& x, const layout& xl, const Target& target, ctx_t& ctx) {
  tape_t tp(ctx);
  const auto xv = tp.leaf(shard_of(x, xl, ctx.rank()), true);
  const auto l = loss_fn(xv, target);
  tp.backward(l);
  return {gather(l.value(), ctx)(), gather(tp.grad(xv), ctx)};
}

std::vector<layout> logits_layouts(int p) {
  std::vector<layout> ls{layout(mesh{p}, {{0}, {}}), layout::replicated(mesh{p}, 2), layout(mesh{p}, {{}, {0}})};
  if (p == 4) ls.push_back(layout(mesh{2, 2}, {{0}, {1}}));
  return ls;
}

}  // namespace

TEST_CASE("cross_entropy_loss: the mean (and sum) of -log softmax at the label, and its gradient") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const int p = world.size();
  const arr x = pattern<double>({B, C}, 1) * 3.0;
  const auto y = labels();
  for (bool mean : {true, false}) {
    const auto [ref_loss, ref_grad] = ce_reference(x, y, mean);
    nn::cross_entropy_loss<double> ce(mean ? nn::reduction::mean : nn::reduction::sum);
    for (const layout& xl : logits_layouts(p))
      for (const layout& yl : {layout(mesh{p}, {{0}}), layout::replicated(mesh{p}, 1)}) {
        CAPTURE(mean);
        CAPTURE(to_string(xl));
        CAPTURE(to_string(yl));
        const run_result r = run(ce, x, xl, shard_of(y, yl, world.rank()), ctx);
        CHECK(r.loss == doctest::Approx(ref_loss).epsilon(1e-12));
        CHECK(close(r.grad, ref_grad, 1e-12));
      }
  }
}

TEST_CASE("cross_entropy_loss: the gradient equals central finite differences") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const int p = world.size();
  arr x = pattern<double>({B, C}, 2);
  const auto yt = shard_of(labels(), layout(mesh{p}, {{0}}), world.rank());
  nn::cross_entropy_loss<double> ce;
  const run_result r = run(ce, x, layout(mesh{p}, {{0}, {}}), yt, ctx);
  const double h = 1e-6;
  for (std::size_t k : {std::size_t(0), std::size_t(5), std::size_t(B * C - 1)}) {
    const double keep = x.data()[k];
    x.data()[k] = keep + h;
    const double up = run(ce, x, layout(mesh{p}, {{0}, {}}), yt, ctx).loss;
    x.data()[k] = keep - h;
    const double down = run(ce, x, layout(mesh{p}, {{0}, {}}), yt, ctx).loss;
    x.data()[k] = keep;
    CHECK((up - down) / (2 * h) == doctest::Approx(r.grad.data()[k]).epsilon(1e-6));
  }
}

TEST_CASE("cross_entropy_loss: a large logit does not overflow") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  arr x = xt::zeros<double>({B, C});
  x(0, 1) = 1000.0;  // label of sample 0 is 1: loss term ~0
  x(1, 0) = 1000.0;  // label of sample 1 is 0: loss term ~0
  nn::cross_entropy_loss<double> ce;
  const run_result r = run(ce, x, layout(mesh{world.size()}, {{0}, {}}),
                           shard_of(labels(), layout(mesh{world.size()}, {{0}}), world.rank()), ctx);
  CHECK(std::isfinite(r.loss));
  CHECK(r.loss == doctest::Approx(6 * std::log(4.0) / B));
}

TEST_CASE("cross_entropy_loss: bad labels and shapes are errors") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const int p = world.size();
  nn::cross_entropy_loss<double> ce;
  auto y = labels();
  y(3) = 12;
  tape_t tp(ctx);
  const auto xv = tp.leaf(shard_of(pattern<double>({B, C}, 3), layout::replicated(mesh{p}, 2), world.rank()), true);
  CHECK_THROWS_WITH(ce(xv, shard_of(y, layout::replicated(mesh{p}, 1), world.rank())),
                    "cross_entropy_loss: label 12 of sample 3 is out of range for 4 classes");
  const auto y5 = shard_of(xt::xarray<std::int32_t>(xt::zeros<std::int32_t>({std::size_t(4)})), layout::replicated(mesh{p}, 1),
                           world.rank());
  CHECK_THROWS_WITH(ce(xv, y5), "cross_entropy_loss: the labels are (4,), expected (8,) for logits (8, 4)");
  const auto x3 = tp.leaf(dist_tensor<double>(layout::replicated(mesh{p}, 3), extents{8, 2, 2}, world.rank()), true);
  CHECK_THROWS_WITH(ce(x3, shard_of(labels(), layout::replicated(mesh{p}, 1), world.rank())),
                    "cross_entropy_loss: the logits must be (batch, classes), got (8, 2, 2)");
}

TEST_CASE("cross_entropy_loss: labels in any layout give the same loss and gradient") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const int p = world.size();
  const arr x = pattern<double>({B, C}, 1) * 3.0;
  const auto y = labels();
  for (bool mean : {true, false}) {
    const auto [ref_loss, ref_grad] = ce_reference(x, y, mean);
    nn::cross_entropy_loss<double> ce(mean ? nn::reduction::mean : nn::reduction::sum);
    for (const layout& xl : logits_layouts(p))
      for (const layout& yl : {layout(mesh{p}, {{0}}), layout::replicated(mesh{p}, 1)}) {
        CAPTURE(mean);
        CAPTURE(to_string(xl));
        CAPTURE(to_string(yl));
        const run_result r = run(ce, x, xl, shard_of(y, yl, world.rank()), ctx);
        CHECK(r.loss == doctest::Approx(ref_loss).epsilon(1e-12));
        CHECK(close(r.grad, ref_grad, 1e-12));
      }
  }
}

TEST_CASE("mse_loss: mean and sum of squared differences, gradient 2 (x - t) / n") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const int p = world.size();
  const arr x = pattern<double>({B, C}, 4), t = pattern<double>({B, C}, 5);
  for (bool mean : {true, false}) {
    double ref = 0;
    arr g = arr::from_shape({B, C});
    const double k = mean ? 1.0 / (B * C) : 1.0;
    for (std::size_t i = 0; i < B * C; ++i) {
      const double d = x.data()[i] - t.data()[i];
      ref += k * d * d;
      g.data()[i] = 2 * k * d;
    }
    nn::mse_loss<double> mse(mean ? nn::reduction::mean : nn::reduction::sum);
    for (const layout& xl : logits_layouts(p)) {
      CAPTURE(to_string(xl));
      const run_result r = run(mse, x, xl, shard_of(t, layout(mesh{p}, {{0}, {}}), world.rank()), ctx);
      CHECK(r.loss == doctest::Approx(ref).epsilon(1e-12));
      CHECK(close(r.grad, g, 1e-12));
    }
  }
  nn::mse_loss<double> mse;
  tape_t tp(ctx);
  const auto xv = tp.leaf(shard_of(x, layout::replicated(mesh{p}, 2), world.rank()), true);
  CHECK_THROWS_WITH(mse(xv, dist_tensor<double>(layout::replicated(mesh{p}, 2), extents{8, 3}, world.rank())),
                    "mse_loss: the target is (8, 3), the input (8, 4)");
}
}  // namespace nn_test_loss
