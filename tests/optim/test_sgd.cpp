// Tests of optim/sgd.hpp: MindSpore's SGD(params, 1e-2) and SGD with momentum,
// dampening, Nesterov and weight decay, step by step against PyTorch's documented
// algorithm (torch.optim.SGD) transcribed in the test; invalid settings are errors.
#include <doctest/doctest.h>

#include <vector>
#include <tessera/optim/sgd.hpp>

#include "optim_test.hpp"

using namespace tessera;
using namespace optim_test;

namespace {

// torch.optim.SGD's algorithm: d = g + wd p; b = first ? d : mu b + (1 - tau) d;
// d = nesterov ? d + mu b : b; p -= lr d.
struct reference_sgd {
  double lr, mu, tau, wd;
  bool nesterov;
  std::vector<double> b;
  void step(std::vector<double>& p, const std::vector<double>& g, bool first) {
    b.resize(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + wd * p[i];
      if (mu != 0) {
        b[i] = first ? d : mu * b[i] + (1 - tau) * d;
        d = nesterov ? d + mu * b[i] : b[i];
      }
      p[i] -= lr * d;
    }
  }
};

}  // namespace

TEST_CASE("sgd: the seed's SGD(params, 1e-2) is p -= 0.01 g") {
  auto w = param("w", {1.0, -1.0, 0.5});
  auto b = param("b", {0.25});
  optim::sgd<double> opt({&w, &b}, 1e-2);
  opt({grad(w, {1.0, 2.0, -4.0}), grad(b, {8.0})});
  CHECK(values(w)[0] == doctest::Approx(0.99));
  CHECK(values(w)[1] == doctest::Approx(-1.02));
  CHECK(values(w)[2] == doctest::Approx(0.54));
  CHECK(values(b)[0] == doctest::Approx(0.17));
  CHECK(opt.parameters().size() == 2);
}

TEST_CASE("sgd: momentum, dampening, Nesterov and weight decay follow torch.optim.SGD") {
  struct setting {
    double mu, tau, wd;
    bool nesterov;
  };
  for (const setting s : {setting{0.0, 0.0, 0.0, false}, setting{0.0, 0.0, 0.05, false},
                          setting{0.9, 0.0, 0.0, false}, setting{0.9, 0.3, 0.01, false},
                          setting{0.8, 0.0, 0.02, true}}) {
    CAPTURE(s.mu);
    CAPTURE(s.tau);
    CAPTURE(s.wd);
    CAPTURE(s.nesterov);
    std::vector<double> ref{0.3, -0.7, 1.1, 0.0};
    auto p = param("p", ref);
    optim::sgd<double> opt({&p}, 0.05, s.mu, s.tau, s.wd, s.nesterov);
    reference_sgd r{0.05, s.mu, s.tau, s.wd, s.nesterov, {}};
    for (int t = 0; t < 6; ++t) {
      const std::vector<double> g{0.1 * t - 0.2, 0.5, -0.3 * t, 1.0 / (t + 1)};
      opt({grad(p, g)});
      r.step(ref, g, t == 0);
      for (std::size_t i = 0; i < ref.size(); ++i) CHECK(values(p)[i] == doctest::Approx(ref[i]).epsilon(1e-12));
    }
  }
}

TEST_CASE("sgd: invalid settings are errors") {
  auto p = param("p", {1.0});
  CHECK_THROWS_WITH(optim::sgd<double>({&p}, 0.1, -0.5), "sgd: momentum must not be negative, got -0.500000");
  CHECK_THROWS_WITH(optim::sgd<double>({&p}, 0.1, 0.0, 0.0, 0.0, true),
                    "sgd: nesterov needs a positive momentum and zero dampening, got momentum 0.000000 and "
                    "dampening 0.000000");
  CHECK_THROWS_WITH(optim::sgd<double>({nullptr}, 0.1), "sgd: parameter 0 is null");
}

TEST_CASE("sgd: over bare tensors (step(params, grads)) it takes the parameter objects' steps") {
  struct setting {
    double mu, tau, wd;
    bool nesterov;
  };
  for (const setting s : {setting{0.0, 0.0, 0.05, false}, setting{0.9, 0.3, 0.01, false},
                          setting{0.8, 0.0, 0.02, true}}) {
    CAPTURE(s.mu);
    const std::vector<double> init{0.3, -0.7, 1.1};
    auto p = param("p", init);
    optim::sgd<double> by_param({&p}, 0.05, s.mu, s.tau, s.wd, s.nesterov);
    optim::sgd<double> bare(0.05, s.mu, s.tau, s.wd, s.nesterov);
    std::vector<dist_tensor<double>> params{grad(p, init)};  // a tensor in p's layout holding init
    for (int t = 0; t < 4; ++t) {
      const std::vector<double> g{0.2 * t, -0.5, 0.1 * t * t};
      by_param({grad(p, g)});
      bare.step(params, {grad(p, g)});
    }
    CHECK(bare.global_step() == 4);
    for (std::size_t i = 0; i < init.size(); ++i) CHECK(params[0].data()[i] == values(p)[i]);
  }
  optim::sgd<double> opt(0.1);
  std::vector<dist_tensor<double>> params;
  params.emplace_back(layout::replicated(mesh{1}, 1), extents{2}, 0);
  std::vector<dist_tensor<double>> grads;
  grads.emplace_back(layout::replicated(mesh{1}, 1), extents{3}, 0);
  CHECK_THROWS_WITH(opt.step(params, grads), "sgd: the gradient of parameter 0 is (3,) [-], the parameter (2,) [-]");
  grads.clear();
  CHECK_THROWS_WITH(opt.step(params, grads), "sgd: 0 gradients for 1 parameters");
}
