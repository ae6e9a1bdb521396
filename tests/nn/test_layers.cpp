// Tests of nn/layers.hpp under mpiexec (1, 2 and 4 ranks): Dense's output and its
// weight, bias and input gradients equal hand-computed ones (plain loops on the global
// arrays) and central finite differences, data parallel and under model-parallel
// strategies (the output features split; the contraction split, through ops::), with
// and without its fused activation (ReLU, Sigmoid, Tanh); the Sigmoid and Tanh layers; ReLU
// and Flatten in a network; Dropout's mask (its rate and scale, the identity in eval
// mode, the same on every rank for replicated data, the one-rank mask's pieces for
// split data; the factors a device multiplies by equal the host's mask); Sequential's
// order; and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>

#include "nn_test.hpp"

namespace nn_test_layers {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace nn_test;
using ctx_t = context;
using tape_t = autodiff::tape<double>;
using arr = xt::xarray<double>;

namespace {

constexpr std::size_t B = 8, IN = 6, OUT = 4;

std::vector<double> flat(const arr& a) { return std::vector<double>(a.begin(), a.end()); }

// The activation's value and its derivative at z, by the textbook formulas.
double act_value(nn::activation a, double z) {
  switch (a) {
    case nn::activation::relu: return z > 0 ? z : 0;
    case nn::activation::sigmoid: return 1 / (1 + std::exp(-z));
    case nn::activation::tanh: return std::tanh(z);
    default: return z;
  }
}
double act_slope(nn::activation a, double z) {
  switch (a) {
    case nn::activation::relu: return z > 0 ? 1 : 0;
    case nn::activation::sigmoid: return act_value(a, z) * (1 - act_value(a, z));
    case nn::activation::tanh: return 1 - std::tanh(z) * std::tanh(z);
    default: return 1;
  }
}

// y = act(x w^T + b), and for loss = mean((y - t)^2): dy = 2 (y - t) / (B OUT),
// dz = dy act'(z), dw = dz^T x, db = column sums of dz, dx = dz w.
struct dense_reference {
  arr y, dw, db, dx;
  double loss = 0;
  dense_reference(const arr& x, const arr& w, const arr& b, const arr& t, nn::activation act = nn::activation::none) {
    y = arr::from_shape({B, OUT});
    arr z = arr::from_shape({B, OUT});
    dw = xt::zeros<double>({OUT, IN});
    db = xt::zeros<double>({OUT});
    dx = xt::zeros<double>({B, IN});
    for (std::size_t i = 0; i < B; ++i)
      for (std::size_t o = 0; o < OUT; ++o) {
        double s = b(o);
        for (std::size_t k = 0; k < IN; ++k) s += x(i, k) * w(o, k);
        z(i, o) = s;
        y(i, o) = act_value(act, s);
        loss += (y(i, o) - t(i, o)) * (y(i, o) - t(i, o)) / double(B * OUT);
      }
    for (std::size_t i = 0; i < B; ++i)
      for (std::size_t o = 0; o < OUT; ++o) {
        const double dz = 2 * (y(i, o) - t(i, o)) / double(B * OUT) * act_slope(act, z(i, o));
        db(o) += dz;
        for (std::size_t k = 0; k < IN; ++k) {
          dw(o, k) += dz * x(i, k);
          dx(i, k) += dz * w(o, k);
        }
      }
  }
};

// The loss, the parameters' gradients (resolved to their layouts, gathered) and the
// input's gradient of mse(fc(x), t) on the ranks of ctx.
struct dense_run {
  double loss;
  arr y, dw, db, dx;
};
dense_run run_dense(nn::dense<double>& fc, const arr& x, const arr& t, ctx_t& ctx, const layout& xl) {
  tape_t tp(ctx);
  fc.weight.expect_grad(tp.serial(), 0);
  fc.bias.expect_grad(tp.serial(), 1);
  const auto xv = tp.leaf(shard_of(x, xl, ctx.rank()), true);
  const auto y = fc(xv);
  nn::mse_loss<double> mse;
  const auto loss = mse(y, shard_of(t, layout::replicated(mesh{ctx.size()}, 2), ctx.rank()));
  tp.backward(loss);
  dense_run r;
  r.loss = gather(loss.value(), ctx)();
  r.y = gather(y.value(), ctx);
  r.dw = gather(tp.grad({&tp, fc.weight.leaf_id(tp.serial())}), ctx);
  if (fc.has_bias()) r.db = gather(tp.grad({&tp, fc.bias.leaf_id(tp.serial())}), ctx);
  r.dx = gather(tp.grad(xv), ctx);
  fc.weight.unbind();
  fc.bias.unbind();
  return r;
}

// mse(fc(x), t) without gradients.
double loss_of(nn::dense<double>& fc, const arr& x, const arr& t, ctx_t& ctx) {
  tape_t tp(ctx);
  const int p = ctx.size();
  const auto y = fc(tp.leaf(shard_of(x, layout(mesh{p}, {{0}, {}}), ctx.rank()), false));
  nn::mse_loss<double> mse;
  return gather(mse(y, shard_of(t, layout(mesh{p}, {{0}, {}}), ctx.rank())).value(), ctx)();
}

}  // namespace

TEST_CASE("dense: output and gradients equal the hand-computed ones, data parallel and sharded") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const int p = world.size();
  const arr x = pattern<double>({B, IN}, 1), w = pattern<double>({OUT, IN}, 2), b = pattern<double>({OUT}, 3),
            t = pattern<double>({B, OUT}, 4);
  const dense_reference ref(x, w, b, t);

  std::vector<std::pair<std::string, strategy>> strategies{{"data parallel", strategy{}}};
  if (p > 1) {
    strategies.push_back({"output features split", strategy{{1, 1}, {p, 1}}});
    strategies.push_back({"batch and features split", strategy{{2, 1}, {p / 2, 1}}});
    strategies.push_back({"contraction split (ops::matmul, ops::bias_add)", strategy{{1, 2}, {p / 2, 2}}});
  }
  for (const auto& [name, st] : strategies) {
    CAPTURE(name);
    nn::dense<double> fc(IN, OUT, nn::initializer::values(flat(w)), nn::initializer::values(flat(b)));
    if (st.n) fc.shard(st);
    fc.build(ctx);
    for (const layout& xl : {layout(mesh{p}, {{0}, {}}), layout::replicated(mesh{p}, 2)}) {
      CAPTURE(to_string(xl));
      const dense_run r = run_dense(fc, x, t, ctx, xl);
      CHECK(r.loss == doctest::Approx(ref.loss).epsilon(1e-12));
      CHECK(close(r.y, ref.y, 1e-12));
      CHECK(close(r.dw, ref.dw, 1e-12));
      CHECK(close(r.db, ref.db, 1e-12));
      CHECK(close(r.dx, ref.dx, 1e-12));
    }
  }
}

TEST_CASE("dense with a fused activation: output and gradients equal the hand-computed ones, every strategy") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const int p = world.size();
  const arr x = pattern<double>({B, IN}, 1), w = pattern<double>({OUT, IN}, 2), b = pattern<double>({OUT}, 3),
            t = pattern<double>({B, OUT}, 4);
  std::vector<strategy> strategies{strategy{}};
  if (p > 1) {
    strategies.push_back(strategy{{1, 1}, {p, 1}});
    strategies.push_back(strategy{{1, 2}, {p / 2, 2}});  // the contraction split: ops::, then the activation
  }
  for (const nn::activation act : {nn::activation::relu, nn::activation::sigmoid, nn::activation::tanh}) {
    CAPTURE(std::string(kernels::fused::name(act)));
    const dense_reference ref(x, w, b, t, act);
    for (const bool has_bias : {true, false}) {
      CAPTURE(has_bias);
      const dense_reference ref_nb(x, w, xt::zeros<double>({OUT}), t, act);
      const dense_reference& want = has_bias ? ref : ref_nb;
      for (const strategy& st : strategies) {
        CAPTURE(to_string(st));
        nn::dense<double> fc(IN, OUT, nn::initializer::values(flat(w)), nn::initializer::values(flat(b)), has_bias,
                             act);
        CHECK(fc.act() == act);
        if (st.n) fc.shard(st);
        fc.build(ctx);
        const dense_run r = run_dense(fc, x, t, ctx, layout(mesh{p}, {{0}, {}}));
        CHECK(r.loss == doctest::Approx(want.loss).epsilon(1e-12));
        CHECK(close(r.y, want.y, 1e-12));
        CHECK(close(r.dw, want.dw, 1e-12));
        if (has_bias) CHECK(close(r.db, want.db, 1e-12));
        CHECK(close(r.dx, want.dx, 1e-12));
      }
    }
  }
}

TEST_CASE("sigmoid and tanh layers: the values and gradients of the formulas, in the input's layout") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const int p = world.size();
  const arr x = pattern<double>({B, OUT}, 8);
  auto run = [&](auto& layer, nn::activation act) {
    CAPTURE(std::string(kernels::fused::name(act)));
    tape_t tp(ctx);
    const layout xl(mesh{p}, {{0}, {}});
    const auto xv = tp.leaf(shard_of(x, xl, ctx.rank()), true);
    const auto y = layer(xv);
    CHECK(y.value().layout() == xl);
    nn::mse_loss<double> mse;
    const arr t = xt::zeros<double>({B, OUT});
    tp.backward(mse(y, shard_of(t, xl, ctx.rank())));
    const arr gy = gather(y.value(), ctx), gdx = gather(tp.grad(xv), ctx);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double v = act_value(act, x.data()[i]);
      CHECK(gy.data()[i] == doctest::Approx(v).epsilon(1e-15));
      CHECK(gdx.data()[i] == doctest::Approx(2 * v / double(B * OUT) * act_slope(act, x.data()[i])).epsilon(1e-12));
    }
  };
  nn::sigmoid<double> sig;
  nn::tanh<double> th;
  run(sig, nn::activation::sigmoid);
  run(th, nn::activation::tanh);
}

TEST_CASE("dense: gradients equal central finite differences of the loss") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const arr x = pattern<double>({B, IN}, 5), t = pattern<double>({B, OUT}, 6);
  nn::dense<double> fc(IN, OUT, "xavier_uniform", "uniform");
  fc.build(ctx, 3);
  const dense_run r = run_dense(fc, x, t, ctx, layout(mesh{world.size()}, {{0}, {}}));
  const double h = 1e-6;
  auto wl = fc.weight.data().data();  // replicated: every rank perturbs the same element
  for (std::size_t k : {std::size_t(0), std::size_t(7), std::size_t(OUT * IN - 1)}) {
    const double keep = wl[k];
    wl[k] = keep + h;
    const double up = loss_of(fc, x, t, ctx);
    wl[k] = keep - h;
    const double down = loss_of(fc, x, t, ctx);
    wl[k] = keep;
    CHECK((up - down) / (2 * h) == doctest::Approx(r.dw.data()[k]).epsilon(1e-6));
  }
  auto bl = fc.bias.data().data();
  const double keep = bl[1];
  bl[1] = keep + h;
  const double up = loss_of(fc, x, t, ctx);
  bl[1] = keep - h;
  const double down = loss_of(fc, x, t, ctx);
  bl[1] = keep;
  CHECK((up - down) / (2 * h) == doctest::Approx(r.db(1)).epsilon(1e-6));
}

TEST_CASE("flatten, relu and sequential: a small network equals its hand-computed forward and backward") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const int p = world.size();
  const arr x = pattern<double>({B, 2, 3}, 7), w = pattern<double>({OUT, IN}, 8), b = pattern<double>({OUT}, 9),
            t = pattern<double>({B, OUT}, 10);
  auto net = nn::sequential(nn::flatten<double>(), nn::relu<double>(),
                            nn::dense<double>(IN, OUT, nn::initializer::values(flat(w)), nn::initializer::values(flat(b))),
                            nn::relu<double>());
  net.build(ctx);
  CHECK(net.named_parameters()[0].first == "2.weight");

  // Reference: h = relu(flatten(x)); y = relu(h w^T + b); loss = mean((y - t)^2).
  arr h = arr::from_shape({B, IN}), z = arr::from_shape({B, OUT});
  for (std::size_t i = 0; i < B * IN; ++i) h.data()[i] = std::max(0.0, x.data()[i]);
  double loss = 0;
  arr dz = arr::from_shape({B, OUT});
  for (std::size_t i = 0; i < B; ++i)
    for (std::size_t o = 0; o < OUT; ++o) {
      double s = b(o);
      for (std::size_t k = 0; k < IN; ++k) s += h(i, k) * w(o, k);
      z(i, o) = s;
      const double y = std::max(0.0, s);
      loss += (y - t(i, o)) * (y - t(i, o)) / double(B * OUT);
      dz(i, o) = s > 0 ? 2 * (y - t(i, o)) / double(B * OUT) : 0.0;
    }
  arr dx = xt::zeros<double>(std::vector<std::size_t>{B, 2, 3});
  for (std::size_t i = 0; i < B; ++i)
    for (std::size_t k = 0; k < IN; ++k) {
      double s = 0;
      for (std::size_t o = 0; o < OUT; ++o) s += dz(i, o) * w(o, k);
      dx.data()[i * IN + k] = x.data()[i * IN + k] > 0 ? s : 0.0;
    }

  tape_t tp(ctx);
  const auto xv = tp.leaf(shard_of(x, layout(mesh{p}, {{0}, {}, {}}), world.rank()), true);
  nn::mse_loss<double> mse;
  const auto l = mse(net(xv), shard_of(t, layout(mesh{p}, {{0}, {}}), world.rank()));
  tp.backward(l);
  CHECK(gather(l.value(), ctx)() == doctest::Approx(loss).epsilon(1e-12));
  CHECK(close(gather(tp.grad(xv), ctx), dx, 1e-12));
}

TEST_CASE("dropout: rate, scale, eval identity; the one-rank mask, and equal on replicas") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const int p = world.size();
  const std::size_t rows = 64, cols = 50;
  const arr x = xt::ones<double>({rows, cols});

  auto make = [] {
    nn::dropout<double> d(0.3);
    d.named("net.drop", 5);
    return d;
  };
  // The one-rank mask of call 0, from the module's own rule.
  nn::dropout<double> ref = make();
  std::size_t kept = 0;
  for (std::size_t i = 0; i < rows * cols; ++i) kept += ref.keep(0, i);
  CHECK(double(kept) / double(rows * cols) == doctest::Approx(0.7).epsilon(0.05));

  // Split rows: each rank's shard is its piece of the one-rank result; dx = mask dy / 0.7.
  {
    nn::dropout<double> d = make();
    tape_t tp(ctx);
    const auto xv = tp.leaf(shard_of(x, layout(mesh{p}, {{0}, {}}), world.rank()), true);
    const auto y = d(xv);
    const arr yg = gather(y.value(), ctx);
    for (std::size_t i = 0; i < rows * cols; ++i) CHECK(yg.data()[i] == (ref.keep(0, i) ? 1.0 / 0.7 : 0.0));
    nn::mse_loss<double> mse;
    tp.backward(mse(y, shard_of(xt::xarray<double>(xt::zeros<double>({rows, cols})), layout(mesh{p}, {{0}, {}}), world.rank())));
    const arr dx = gather(tp.grad(xv), ctx);
    for (std::size_t i = 0; i < rows * cols; ++i) {
      const double dy = 2 * yg.data()[i] / double(rows * cols);
      CHECK(dx.data()[i] == doctest::Approx(ref.keep(0, i) ? dy / 0.7 : 0.0));
    }
    CHECK(d.calls() == 1);
    // The next call draws another mask.
    const arr y2 = gather(d(xv).value(), ctx);
    std::size_t same = 0;
    for (std::size_t i = 0; i < rows * cols; ++i) same += (y2.data()[i] != 0) == (yg.data()[i] != 0);
    CHECK(same < rows * cols);
  }
  // Replicated data: every rank draws the same whole mask.
  {
    nn::dropout<double> d = make();
    tape_t tp(ctx);
    const auto y = d(tp.leaf(shard_of(x, layout::replicated(mesh{p}, 2), world.rank()), false));
    std::vector<double> mine(y.value().data().begin(), y.value().data().end()), all(mine.size() * std::size_t(p));
    world.all_gather(std::span<const double>(mine), std::span<double>(all));
    for (int r = 0; r < p; ++r)
      for (std::size_t i = 0; i < mine.size(); ++i) CHECK(all[std::size_t(r) * mine.size() + i] == mine[i]);
    for (std::size_t i = 0; i < mine.size(); ++i) CHECK(mine[i] == (ref.keep(0, i) ? 1.0 / 0.7 : 0.0));
  }
  // Evaluation mode: the identity.
  {
    nn::dropout<double> d = make();
    d.set_train(false);
    tape_t tp(ctx);
    const auto xv = tp.leaf(shard_of(x, layout(mesh{p}, {{0}, {}}), world.rank()), false);
    CHECK(d(xv).id == xv.id);
  }
  CHECK_THROWS_WITH(nn::dropout<double>(1.0), "dropout: p must be in [0, 1): got 1.000000");
}

TEST_CASE("dropout: the factors a device multiplies by are drawn on the host as the host's mask") {
  // A GPU's dropout multiplies by these factors (copied to the device): on every shard
  // x times them is the host path's output, exactly.
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  const int p = world.size();
  const arr x = pattern<double>({12, 12}, 3);
  for (const layout& l : {layout(mesh{p}, {{0}, {}}), layout(mesh{p}, {{}, {0}}), layout::replicated(mesh{p}, 2)}) {
    CAPTURE(to_string(l));
    nn::dropout<double> d(0.4);
    d.named("drop", 9);
    tape_t tp(ctx);
    const auto xv = tp.leaf(shard_of(x, l, world.rank()), false);
    const arr y = d(xv).value().local();
    ops::dropout_op first = d.op();
    first.call = 0;
    const arr f = ops::dropout_factors<double>(first, l, extents{12, 12}, world.rank());
    const arr fx = kernels::backend<cpu_device>::mul(xv.value().local(), f);
    REQUIRE(fx.size() == y.size());
    std::size_t dropped = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      CHECK(fx.data()[i] == y.data()[i]);
      dropped += f.data()[i] == 0.0;
    }
    CHECK(dropped > 0);
    CHECK(dropped < y.size());
  }
}

TEST_CASE("layers: bad input is an error naming the layer") {
  any_communicator world(mpi_communicator::world());
  ctx_t ctx(world);
  nn::dense<double> fc(IN, OUT);
  tape_t tp(ctx);
  const auto xv = tp.leaf(dist_tensor<double>(layout::replicated(mesh{world.size()}, 2), extents{4, 5}, world.rank()), false);
  CHECK_THROWS_WITH(fc(xv), "dense: the input is (4, 5), expected (batch, 6)");
  const auto ok = tp.leaf(dist_tensor<double>(layout::replicated(mesh{world.size()}, 2), extents{4, 6}, world.rank()), false);
  CHECK_THROWS_WITH(fc(ok), "dense: not placed yet: call build(ctx) on the network first");
}
}  // namespace nn_test_layers
