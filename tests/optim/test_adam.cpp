// Tests of optim/adam.hpp: Adam (L2 decay in the gradient) and AdamW (decoupled decay)
// step by step against PyTorch's documented algorithms (torch.optim.Adam, AdamW)
// transcribed in the test, the first step by hand, and the errors for bad settings.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <vector>
#include <tessera/optim/adam.hpp>

#include "optim_test.hpp"

using namespace tessera;
using namespace optim_test;

TEST_CASE("adam: the first step moves each element by about lr against its gradient's sign") {
  auto p = param("p", {1.0, -1.0});
  optim::adam<double> opt({&p}, 0.1);
  opt({grad(p, {0.5, -3.0})});
  // m_hat = g, v_hat = g^2: p -= 0.1 * g / (|g| + 1e-8).
  CHECK(values(p)[0] == doctest::Approx(0.9).epsilon(1e-7));
  CHECK(values(p)[1] == doctest::Approx(-0.9).epsilon(1e-7));
}

TEST_CASE("adam and adamw: torch.optim.Adam and torch.optim.AdamW, step by step") {
  for (bool decoupled : {false, true}) {
    CAPTURE(decoupled);
    const double lr = 0.02, b1 = 0.85, b2 = 0.99, eps = 1e-7, wd = 0.05;
    std::vector<double> ref{0.4, -1.2, 0.0, 2.5}, m(4, 0.0), v(4, 0.0);
    auto p = param("p", ref);
    std::unique_ptr<optim::optimizer<double>> opt;
    if (decoupled) opt = std::make_unique<optim::adamw<double>>(std::vector{&p}, lr, b1, b2, eps, wd);
    else opt = std::make_unique<optim::adam<double>>(std::vector{&p}, lr, b1, b2, eps, wd);
    for (int t = 1; t <= 7; ++t) {
      const std::vector<double> g{0.3 * t, -0.1, std::sin(double(t)), 1.0 / t};
      (*opt)({grad(p, g)});
      for (std::size_t i = 0; i < 4; ++i) {
        double gi = g[i];
        if (decoupled) ref[i] *= 1 - lr * wd;  // AdamW: theta <- theta - gamma lambda theta
        else gi += wd * ref[i];                // Adam: g <- g + lambda theta
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
        ref[i] -= lr * mh / (std::sqrt(vh) + eps);
        CHECK(values(p)[i] == doctest::Approx(ref[i]).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("adam: bad settings are errors") {
  auto p = param("p", {1.0});
  CHECK_THROWS_WITH(optim::adam<double>({&p}, 0.1, 1.0), "adam: beta1 and beta2 must be in [0, 1), got 1.000000 and 0.999000");
  CHECK_THROWS_WITH(optim::adamw<double>({&p}, 0.1, 0.9, 0.999, 0.0), "adamw: eps must be positive, got 0.000000");
}

TEST_CASE("adam and adamw: over bare tensors (step(params, grads)) they take the parameter objects' steps") {
  for (bool decoupled : {false, true}) {
    CAPTURE(decoupled);
    const std::vector<double> init{0.4, -1.2, 0.0, 2.5};
    auto p = param("p", init);
    std::unique_ptr<optim::optimizer<double>> by_param;
    std::unique_ptr<optim::adam<double>> bare;
    if (decoupled) {
      by_param = std::make_unique<optim::adamw<double>>(std::vector{&p}, 0.02, 0.85, 0.99, 1e-7, 0.05);
      bare = std::make_unique<optim::adamw<double>>(0.02, 0.85, 0.99, 1e-7, 0.05);
    } else {
      by_param = std::make_unique<optim::adam<double>>(std::vector{&p}, 0.02, 0.85, 0.99, 1e-7, 0.05);
      bare = std::make_unique<optim::adam<double>>(0.02, 0.85, 0.99, 1e-7, 0.05);
    }
    std::vector<dist_tensor<double>> params{grad(p, init)};
    for (int t = 1; t <= 5; ++t) {
      const std::vector<double> g{0.3 * t, -0.1, std::sin(double(t)), 1.0 / t};
      (*by_param)({grad(p, g)});
      bare->step(params, {grad(p, g)});
    }
    for (std::size_t i = 0; i < init.size(); ++i) CHECK(params[0].data()[i] == values(p)[i]);
  }
  optim::adamw<double> opt(0.1);
  std::vector<dist_tensor<double>> params;
  params.emplace_back(layout::replicated(mesh{1}, 1), extents{2}, 0);
  CHECK_THROWS_WITH(opt.step(params, {}), "adamw: 0 gradients for 1 parameters");
}
