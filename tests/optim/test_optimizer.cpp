// Tests of optim/optimizer.hpp: the learning-rate schedules' values (PyTorch's StepLR
// and CosineAnnealingLR in closed form), the step count and the rate each step uses,
// the errors for gradients that do not fit the parameters, and the kinds of state each
// optimizer keeps.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <tessera/optim/adam.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/optim/sgd.hpp>

#include "optim_test.hpp"

using namespace tessera;
using namespace optim_test;

TEST_CASE("learning_rate: constant, step decay and cosine annealing") {
  const optim::learning_rate<double> c = 0.5;
  CHECK(c(0) == 0.5);
  CHECK(c(1000) == 0.5);

  const auto s = optim::step_lr(0.1, 30, 0.1);
  CHECK(s(0) == doctest::Approx(0.1));
  CHECK(s(29) == doctest::Approx(0.1));
  CHECK(s(30) == doctest::Approx(0.01));
  CHECK(s(65) == doctest::Approx(0.001));

  const auto k = optim::cosine_lr(1.0, 10, 0.1);
  CHECK(k(0) == doctest::Approx(1.0));
  CHECK(k(5) == doctest::Approx(0.55));  // 0.1 + 0.9 * (1 + cos(pi / 2)) / 2
  CHECK(k(10) == doctest::Approx(0.1));
  CHECK(k(25) == doctest::Approx(0.1));
  for (int t = 0; t <= 10; ++t)
    CHECK(k(t) == doctest::Approx(0.1 + 0.45 * (1 + std::cos(std::numbers::pi * t / 10))));

  CHECK_THROWS_WITH(optim::step_lr(0.1, 0, 0.5), "step_lr: step_size must be at least 1, got 0");
  CHECK_THROWS_WITH(optim::cosine_lr(0.1, -3), "cosine_lr: total_steps must be at least 1, got -3");
}

TEST_CASE("optimizer: each step uses the schedule's rate of its step number") {
  auto p = param("w", {1.0});
  optim::sgd<double> opt({&p}, optim::step_lr(1.0, 2, 0.5));
  CHECK(opt.global_step() == 0);
  CHECK(opt.current_learning_rate() == 1.0);
  const std::vector<double> expected{0.0, -1.0, -1.5, -2.0, -2.25};  // lr 1, 1, 0.5, 0.5, 0.25
  for (std::size_t s = 1; s <= expected.size(); ++s) {
    opt({grad(p, {1.0})});
    CHECK(values(p)[0] == doctest::Approx(expected[s - 1]));
    CHECK(opt.global_step() == std::int64_t(s));
  }
  CHECK(opt.current_learning_rate() == 0.25);
}

TEST_CASE("optimizer: gradients that do not fit are errors naming the parameter") {
  auto a = param("fc.weight", {1.0, 2.0});
  auto b = param("fc.bias", {0.0});
  optim::sgd<double> opt({&a, &b}, 0.1);
  CHECK_THROWS_WITH(opt({grad(a, {1.0, 1.0})}), "sgd: 1 gradients for 2 parameters");

  // A gradient still holding partial sums over the data-parallel ranks.
  nn::parameter<double> w(extents{4}, "zeros");
  w.set_name("dense.weight");
  w.build(layout::replicated(mesh{2}, 1), 0, 0);
  optim::sgd<double> opt2({&w}, 0.1);
  dist_tensor<double> partial(layout::replicated(mesh{2}, 1).with_partial(0), extents{4}, 0);
  CHECK_THROWS_WITH(opt2({partial}),
                    "sgd: the gradient of parameter 'dense.weight' is (4,) [-] partial sum {0}, the parameter (4,) "
                    "[-]: reduce gradients over the data-parallel ranks first (train::distributed_grad_reducer)");
  dist_tensor<double> wrong(layout::replicated(mesh{2}, 1), extents{3}, 0);
  CHECK_THROWS_WITH(opt2({wrong}), "sgd: the gradient of parameter 'dense.weight' is (3,) [-], the parameter (4,) [-]");
}

TEST_CASE("optimizer: the kinds of state it keeps per parameter (a memory budget's optimizer_slots)") {
  auto p = param("w", {1.0});
  CHECK(optim::sgd<double>({&p}, 0.1).state_kinds() == 0);
  CHECK(optim::sgd<double>({&p}, 0.1, 0.9).state_kinds() == 1);  // "accum"
  CHECK(optim::momentum<double>({&p}, 0.1, 0.9).state_kinds() == 1);  // "moments"
  CHECK(optim::adam<double>({&p}).state_kinds() == 2);  // "moment1", "moment2"
}
