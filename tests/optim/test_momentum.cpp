// Tests of optim/momentum.hpp: MindSpore's Momentum (accum = mu accum + g; p -= lr
// accum, or with use_nesterov p -= lr (g + mu accum)) with weight decay, step by step
// against the formula; the same update over bare tensors (step(params, grads)); and
// with zero dampening it takes PyTorch's SGD-with-momentum steps.
#include <doctest/doctest.h>

#include <vector>
#include <tessera/optim/momentum.hpp>
#include <tessera/optim/sgd.hpp>

#include "optim_test.hpp"

using namespace tessera;
using namespace optim_test;

TEST_CASE("momentum: MindSpore's ApplyMomentum, step by step") {
  for (bool nesterov : {false, true})
    for (double wd : {0.0, 0.1}) {
      CAPTURE(nesterov);
      CAPTURE(wd);
      std::vector<double> ref{1.0, -2.0, 0.5}, acc(3, 0.0);
      auto p = param("p", ref);
      optim::momentum<double> opt({&p}, 0.1, 0.9, wd, nesterov);
      for (int t = 0; t < 5; ++t) {
        const std::vector<double> g{0.5, -0.25 * t, 1.0};
        opt({grad(p, g)});
        for (std::size_t i = 0; i < 3; ++i) {
          const double d = g[i] + wd * ref[i];
          acc[i] = 0.9 * acc[i] + d;
          ref[i] -= 0.1 * (nesterov ? d + 0.9 * acc[i] : acc[i]);
          CHECK(values(p)[i] == doctest::Approx(ref[i]).epsilon(1e-12));
        }
      }
    }
  // By hand: p = 1, g = 0.5: 0.95, then 0.855.
  auto q = param("q", {1.0});
  optim::momentum<double> opt({&q}, 0.1, 0.9);
  opt({grad(q, {0.5})});
  CHECK(values(q)[0] == doctest::Approx(0.95));
  opt({grad(q, {0.5})});
  CHECK(values(q)[0] == doctest::Approx(0.855));
}

TEST_CASE("momentum: over bare tensors, as the quickstart uses it") {
  std::vector<dist_tensor<double>> params;
  params.emplace_back(layout::replicated(mesh{1}, 1), extents{2}, 0);
  params[0].data()[0] = 1.0;
  params[0].data()[1] = 2.0;
  std::vector<dist_tensor<double>> grads;
  grads.emplace_back(layout::replicated(mesh{1}, 1), extents{2}, 0);
  grads[0].data()[0] = 0.5;
  grads[0].data()[1] = -1.0;
  optim::momentum<double> opt(0.1, 0.9);
  opt.step(params, grads);
  opt.step(params, grads);
  CHECK(params[0].data()[0] == doctest::Approx(0.855));
  CHECK(params[0].data()[1] == doctest::Approx(2.0 + 0.1 + 0.19));
  grads.pop_back();
  CHECK_THROWS_WITH(opt.step(params, grads), "momentum: 0 gradients for 1 parameters");
}

TEST_CASE("momentum: equals SGD with momentum and zero dampening") {
  std::vector<double> init{0.3, -0.7, 1.1};
  auto a = param("a", init);
  auto b = param("b", init);
  optim::momentum<double> m({&a}, 0.05, 0.8, 0.01, true);
  optim::sgd<double> s({&b}, 0.05, 0.8, 0.0, 0.01, true);
  for (int t = 0; t < 5; ++t) {
    const std::vector<double> g{0.2 * t, -0.5, 0.1};
    m({grad(a, g)});
    s({grad(b, g)});
  }
  for (std::size_t i = 0; i < init.size(); ++i) CHECK(values(a)[i] == doctest::Approx(values(b)[i]).epsilon(1e-12));
}
