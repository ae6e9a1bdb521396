// Tests of kernels/cpu/optim.hpp: each fused update against numbers worked out by hand
// from the documented formulas (PyTorch's torch.optim and MindSpore's ApplyMomentum),
// step by step, and against a plain per-element transcription of those formulas over
// many elements and steps; wrong span sizes are errors naming the kernel. The
// backend's updates over many parameters against the per-parameter ones.
#include <doctest/doctest.h>

#include <cmath>
#include <span>
#include <vector>
#include <xtensor/xadapt.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/kernels/cpu/optim.hpp>

#include "finite_difference.hpp"

namespace cpu = tessera::kernels::cpu;

namespace {

std::span<double> sp(std::vector<double>& v) { return v; }
std::span<const double> csp(const std::vector<double>& v) { return v; }

std::vector<double> values(std::size_t n, std::uint64_t seed) {
  auto a = kernel_test::random_array({n}, seed);
  return std::vector<double>(a.begin(), a.end());
}

}  // namespace

TEST_CASE("sgd_update: p -= lr (g + wd p), by hand") {
  std::vector<double> p{1.0, -2.0}, g{0.5, 0.25};
  cpu::sgd_update(sp(p), csp(g), 0.1);
  CHECK(p[0] == doctest::Approx(0.95));   // 1 - 0.1 * 0.5
  CHECK(p[1] == doctest::Approx(-2.025));  // -2 - 0.1 * 0.25
  cpu::sgd_update(sp(p), csp(g), 0.1, 0.01);
  CHECK(p[0] == doctest::Approx(0.95 - 0.1 * (0.5 + 0.01 * 0.95)));
  CHECK(p[1] == doctest::Approx(-2.025 - 0.1 * (0.25 + 0.01 * -2.025)));
}

TEST_CASE("sgd_momentum_update: PyTorch's SGD with momentum, dampening and Nesterov, by hand") {
  // p = 1, g = 0.5 at every step, lr 0.1, momentum 0.9.
  std::vector<double> p{1.0}, g{0.5}, buf{123.0};  // the first step ignores buf's contents
  cpu::sgd_momentum_update(sp(p), csp(g), sp(buf), 0.1, 0.9, 0.0, 0.0, false, true);
  CHECK(buf[0] == doctest::Approx(0.5));  // buf = g
  CHECK(p[0] == doctest::Approx(0.95));
  cpu::sgd_momentum_update(sp(p), csp(g), sp(buf), 0.1, 0.9, 0.0, 0.0, false, false);
  CHECK(buf[0] == doctest::Approx(0.95));  // 0.9 * 0.5 + 0.5
  CHECK(p[0] == doctest::Approx(0.855));   // 0.95 - 0.1 * 0.95

  // Dampening 0.5: buf = 0.9 buf + 0.5 g after the first step.
  std::vector<double> q{1.0}, b2{0.0};
  cpu::sgd_momentum_update(sp(q), csp(g), sp(b2), 0.1, 0.9, 0.5, 0.0, false, true);
  CHECK(b2[0] == doctest::Approx(0.5));
  cpu::sgd_momentum_update(sp(q), csp(g), sp(b2), 0.1, 0.9, 0.5, 0.0, false, false);
  CHECK(b2[0] == doctest::Approx(0.7));  // 0.45 + 0.25
  CHECK(q[0] == doctest::Approx(0.95 - 0.07));

  // Nesterov: p -= lr (g + momentum buf).
  std::vector<double> r{1.0}, b3{0.0};
  cpu::sgd_momentum_update(sp(r), csp(g), sp(b3), 0.1, 0.9, 0.0, 0.0, true, true);
  CHECK(r[0] == doctest::Approx(1.0 - 0.1 * (0.5 + 0.9 * 0.5)));  // 0.905
  cpu::sgd_momentum_update(sp(r), csp(g), sp(b3), 0.1, 0.9, 0.0, 0.0, true, false);
  CHECK(r[0] == doctest::Approx(0.905 - 0.1 * (0.5 + 0.9 * 0.95)));

  // Weight decay enters d = g + wd p before the buffer.
  std::vector<double> s{2.0}, b4{0.0};
  cpu::sgd_momentum_update(sp(s), csp(g), sp(b4), 0.1, 0.9, 0.0, 0.1, false, true);
  CHECK(b4[0] == doctest::Approx(0.7));  // 0.5 + 0.1 * 2
  CHECK(s[0] == doctest::Approx(1.93));
}

TEST_CASE("momentum_update: MindSpore's ApplyMomentum, by hand") {
  std::vector<double> p{1.0}, g{0.5}, a{0.0};
  cpu::momentum_update(sp(p), csp(g), sp(a), 0.1, 0.9);
  CHECK(a[0] == doctest::Approx(0.5));
  CHECK(p[0] == doctest::Approx(0.95));
  cpu::momentum_update(sp(p), csp(g), sp(a), 0.1, 0.9);
  CHECK(a[0] == doctest::Approx(0.95));
  CHECK(p[0] == doctest::Approx(0.855));
  // use_nesterov: p -= lr (g + momentum accum).
  std::vector<double> q{1.0}, an{0.0};
  cpu::momentum_update(sp(q), csp(g), sp(an), 0.1, 0.9, 0.0, true);
  CHECK(q[0] == doctest::Approx(0.905));
  // With zero dampening and accum starting at 0, PyTorch's SGD and MindSpore's
  // Momentum take the same steps.
  std::vector<double> x = values(64, 1), y = x, gx = values(64, 2), ax(64, 0.0), by(64, 0.0);
  for (int step = 0; step < 5; ++step) {
    cpu::momentum_update(sp(x), csp(gx), sp(ax), 0.05, 0.8, 0.01, true);
    cpu::sgd_momentum_update(sp(y), csp(gx), sp(by), 0.05, 0.8, 0.0, 0.01, true, step == 0);
  }
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(x[i] == doctest::Approx(y[i]).epsilon(1e-12));
}

TEST_CASE("adam_update: PyTorch's Adam and AdamW, by hand and over many steps") {
  // One element, g = 0.5, lr 0.1, betas (0.9, 0.999), eps 1e-8. Step 1: m = 0.05,
  // v = 0.00025, m_hat = 0.5, v_hat = 0.25, p -= 0.1 * 0.5 / (0.5 + 1e-8).
  std::vector<double> p{1.0}, g{0.5}, m{0.0}, v{0.0};
  cpu::adam_update(sp(p), csp(g), sp(m), sp(v), 0.1, 0.9, 0.999, 1e-8, 0.0, false, 1);
  CHECK(m[0] == doctest::Approx(0.05));
  CHECK(v[0] == doctest::Approx(0.00025));
  CHECK(p[0] == doctest::Approx(1.0 - 0.1 * 0.5 / (0.5 + 1e-8)).epsilon(1e-12));
  // Step 2, same gradient: m = 0.095, v = 0.00049975; m_hat = 0.5, v_hat = 0.25.
  cpu::adam_update(sp(p), csp(g), sp(m), sp(v), 0.1, 0.9, 0.999, 1e-8, 0.0, false, 2);
  CHECK(m[0] == doctest::Approx(0.095));
  CHECK(v[0] == doctest::Approx(0.00049975));
  CHECK(p[0] == doctest::Approx(0.8).epsilon(1e-7));

  // The documented algorithms, transcribed element by element.
  for (bool decoupled : {false, true}) {
    CAPTURE(decoupled);
    const double lr = 0.01, b1 = 0.8, b2 = 0.95, eps = 1e-6, wd = 0.1;
    std::vector<double> x = values(33, 3), ref = x, mx(33, 0.0), vx(33, 0.0), mr(33, 0.0), vr(33, 0.0);
    for (int t = 1; t <= 6; ++t) {
      const std::vector<double> gt = values(33, 10 + std::uint64_t(t));
      cpu::adam_update(sp(x), csp(gt), sp(mx), sp(vx), lr, b1, b2, eps, wd, decoupled, t);
      for (std::size_t i = 0; i < ref.size(); ++i) {
        double gi = gt[i];
        if (decoupled) ref[i] *= 1 - lr * wd;
        else gi += wd * ref[i];
        mr[i] = b1 * mr[i] + (1 - b1) * gi;
        vr[i] = b2 * vr[i] + (1 - b2) * gi * gi;
        const double mh = mr[i] / (1 - std::pow(b1, t)), vh = vr[i] / (1 - std::pow(b2, t));
        ref[i] -= lr * mh / (std::sqrt(vh) + eps);
      }
    }
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(x[i] == doctest::Approx(ref[i]).epsilon(1e-12));
  }
}

TEST_CASE("optimizer kernels: spans of different sizes are errors naming the kernel") {
  std::vector<double> p(4, 0.0), g(3, 0.0), s(4, 0.0);
  CHECK_THROWS_WITH(cpu::sgd_update(sp(p), csp(g), 0.1),
                    "sgd_update: the gradient has 3 elements, the parameter 4");
  CHECK_THROWS_WITH(cpu::momentum_update(sp(p), csp(s), sp(g), 0.1, 0.9),
                    "momentum_update: the accumulator has 3 elements, the parameter 4");
  CHECK_THROWS_WITH(cpu::adam_update(sp(p), csp(s), sp(s), sp(g), 0.1, 0.9, 0.999, 1e-8, 0.0, false, 1),
                    "adam_update: the second moment has 3 elements, the parameter 4");
  CHECK_THROWS_WITH(cpu::adam_update(sp(p), csp(s), sp(s), sp(s), 0.1, 0.9, 0.999, 1e-8, 0.0, false, 0),
                    "adam_update: the step t counts from 1, got 0");
}

TEST_CASE("backend<cpu_device>'s updates over many parameters: each parameter's own update; lists of unequal length are errors") {
  using K = tessera::kernels::backend<tessera::cpu_device>;
  using arr = xt::xarray<double>;
  std::vector<arr> p, a, g, p1, a1;
  for (std::size_t j = 0; j < 5; ++j) {
    const std::vector<double> pv = values(3 * j + 1, 10 + j), gv = values(3 * j + 1, 20 + j);
    p.push_back(xt::adapt(pv, {pv.size()}));
    a.push_back(xt::zeros<double>({pv.size()}));
    g.push_back(xt::adapt(gv, {gv.size()}));
  }
  p1 = p;
  a1 = a;
  std::vector<arr*> pp, ap;
  std::vector<const arr*> gp;
  for (std::size_t j = 0; j < p.size(); ++j) {
    pp.push_back(&p[j]);
    ap.push_back(&a[j]);
    gp.push_back(&g[j]);
  }
  for (int t = 0; t < 2; ++t) {
    K::momentum_update_many<double>(pp, ap, gp, 0.1, 0.9, 0.01, true);
    for (std::size_t j = 0; j < p.size(); ++j) K::momentum_update(p1[j], a1[j], g[j], 0.1, 0.9, 0.01, true);
  }
  for (std::size_t j = 0; j < p.size(); ++j) {
    CHECK(p[j] == p1[j]);
    CHECK(a[j] == a1[j]);
  }
  gp.pop_back();
  CHECK_THROWS_WITH(K::momentum_update_many<double>(pp, ap, gp, 0.1, 0.9, 0.0, false),
                    "momentum_update: 4 gradient arrays for 5 parameters");
  CHECK_THROWS_WITH(K::adam_update_many<double>(pp, gp, ap, ap, 0.1, 0.9, 0.999, 1e-8, 0.0, false, 1),
                    "adam_update: 4 gradient arrays for 5 parameters");
}
