// Tests of kernels/cpu/elementwise.hpp: broadcasting arithmetic against a naive
// multi-index loop, reduce_to_shape as the backward of every broadcast (finite
// differences), the unary maps, relu_grad, bias_add, and the fused maps with
// kernels/fused.hpp's functors (equal to their unfused chains; the activations'
// gradients against finite differences).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <type_traits>
#include <tessera/kernels/cpu/elementwise.hpp>
#include <tessera/kernels/fused.hpp>

#include "finite_difference.hpp"

namespace cpu = tessera::kernels::cpu;
using namespace kernel_test;

namespace {

using array = xt::xarray<double>;

// Broadcast shape by NumPy's rule (the test's own version).
shape_t naive_broadcast_shape(const shape_t& a, const shape_t& b) {
  const std::size_t r = std::max(a.size(), b.size());
  shape_t out(r);
  for (std::size_t d = 0; d < r; ++d) {
    const std::size_t da = d + a.size() >= r ? a[d + a.size() - r] : 1;
    const std::size_t db = d + b.size() >= r ? b[d + b.size() - r] : 1;
    out[d] = da == 1 ? db : da;
  }
  return out;
}

// The element of x (shape xs) that broadcasts to position idx of a rank-r result.
std::size_t source_index(const std::vector<std::size_t>& idx, const shape_t& xs) {
  const std::size_t lead = idx.size() - xs.size();
  std::vector<std::size_t> j(xs.size());
  for (std::size_t d = 0; d < xs.size(); ++d) j[d] = xs[d] == 1 ? 0 : idx[lead + d];
  return ravel(j, xs);
}

array naive_binary(const array& a, const array& b,
                   const std::function<double(double, double)>& op) {
  const shape_t as = shape_of(a), bs = shape_of(b);
  const shape_t out = naive_broadcast_shape(as, bs);
  array y = array::from_shape(out);
  for (std::size_t i = 0; i < count_of(out); ++i) {
    const auto idx = unravel(i, out);
    y.data()[i] = op(a.data()[source_index(idx, as)], b.data()[source_index(idx, bs)]);
  }
  return y;
}

array naive_reduce_to(const array& g, const shape_t& target) {
  array out = array::from_shape(target);
  out.fill(0.0);
  const shape_t gs = shape_of(g);
  for (std::size_t i = 0; i < g.size(); ++i)
    out.data()[source_index(unravel(i, gs), target)] += g.data()[i];
  return out;
}

// Operand shape pairs: equal, (3,1)x(1,4), scalars on either side, a missing
// leading dim, rank 3 against rank 2, 0-D with 0-D, one-element 1-D, and empty.
const std::pair<shape_t, shape_t> shape_pairs[] = {
    {{2, 3}, {2, 3}},    {{3, 1}, {1, 4}}, {{}, {2, 3}},     {{2, 3}, {}}, {{4}, {3, 4}},
    {{2, 1, 3}, {4, 1}}, {{}, {}},         {{3, 1}, {3, 4}}, {{1}, {5}},   {{0, 3}, {1, 3}}};

struct binary_op {
  const char* name;
  std::function<array(const array&, const array&)> kernel;
  std::function<double(double, double)> scalar;
  // dL/da and dL/db before reduce_to_shape, given dy = dL/dy.
  std::function<array(const array&, const array&, const array&)> local_grad_a, local_grad_b;
};

const std::vector<binary_op>& binary_ops() {
  static const std::vector<binary_op> ops = {
      {"add", [](const array& a, const array& b) { return cpu::add(a, b); },
       [](double x, double y) { return x + y; },
       [](const array& dy, const array&, const array&) { return dy; },
       [](const array& dy, const array&, const array&) { return dy; }},
      {"sub", [](const array& a, const array& b) { return cpu::sub(a, b); },
       [](double x, double y) { return x - y; },
       [](const array& dy, const array&, const array&) { return dy; },
       [](const array& dy, const array&, const array&) { return cpu::neg(dy); }},
      {"mul", [](const array& a, const array& b) { return cpu::mul(a, b); },
       [](double x, double y) { return x * y; },
       [](const array& dy, const array&, const array& b) { return cpu::mul(dy, b); },
       [](const array& dy, const array& a, const array&) { return cpu::mul(dy, a); }},
      {"div", [](const array& a, const array& b) { return cpu::div(a, b); },
       [](double x, double y) { return x / y; },
       [](const array& dy, const array&, const array& b) { return cpu::div(dy, b); },
       [](const array& dy, const array& a, const array& b) {
         return cpu::neg(cpu::div(cpu::mul(dy, a), cpu::mul(b, b)));
       }},
  };
  return ops;
}

}  // namespace

TEST_CASE("add, sub, mul and div broadcast as NumPy does") {
  std::uint64_t seed = 1;
  for (const auto& op : binary_ops())
    for (const auto& [as, bs] : shape_pairs) {
      CAPTURE(op.name);
      CAPTURE(as.size());
      CAPTURE(bs.size());
      const array a = random_array(as, seed++);
      const array b = random_array(bs, seed++, 0.5, 1.5);  // no division by ~0
      const array y = op.kernel(a, b);
      const array expected = naive_binary(a, b, op.scalar);
      REQUIRE(shape_of(y) == shape_of(expected));
      CHECK(relative_error(y, expected) == 0.0);
    }
  // The broadcast of (3, 1) and (1, 4) is the outer sum.
  array col = array::from_shape({3, 1}), row = array::from_shape({1, 4});
  for (std::size_t i = 0; i < 3; ++i) col(i, 0) = double(i + 1);
  for (std::size_t j = 0; j < 4; ++j) row(0, j) = 10.0 * double(j + 1);
  const array outer = cpu::add(col, row);
  REQUIRE(shape_of(outer) == shape_t{3, 4});
  CHECK(outer(2, 1) == 23.0);
  // float and int element types.
  const xt::xarray<float> f = {1.f, 2.f};
  CHECK(cpu::mul(f, xt::xarray<float>(3.f))(1) == 6.f);
  const xt::xarray<int> i = {7, 8};
  CHECK(cpu::div(i, xt::xarray<int>{2, 3})(1) == 2);
}

TEST_CASE("shapes that do not broadcast are an error naming both") {
  CHECK(thrown([] {
          cpu::add(random_array({3, 2}, 1), random_array({4}, 2));
        }) == "add: shapes do not broadcast: a is (3, 2), b is (4,)");
  CHECK(thrown([] {
          cpu::div(random_array({2, 3, 4}, 1), random_array({2, 1, 3}, 2));
        }) == "div: shapes do not broadcast: a is (2, 3, 4), b is (2, 1, 3)");
}

TEST_CASE("add_to and scale act in place, on several threads for large arrays") {
  // 2^17 + 3 elements: past the threads' grain, in pieces that do not divide evenly.
  const array a = random_array({(std::size_t(1) << 17) + 3}, 3), b = random_array({(std::size_t(1) << 17) + 3}, 4);
  array sum = a;
  cpu::add_to(sum, b);
  CHECK(sum == array(a + b));
  array scaled = a;
  cpu::scale(scaled, 0.5);
  CHECK(scaled == array(a * 0.5));
  array small = random_array({3}, 5);
  CHECK(thrown([&] { cpu::add_to(small, b); }) == "add_to: dst has 3 elements, src 131075");
}

TEST_CASE("reduce_to_shape sums a broadcast gradient back to the operand's shape") {
  const array g = random_array({2, 3, 4}, 3);
  const shape_t targets[] = {{2, 3, 4}, {3, 4}, {1, 3, 1}, {4}, {}, {2, 1, 4}, {1, 1, 1}, {1, 4}};
  for (const auto& t : targets) {
    CAPTURE(t.size());
    const array r = cpu::reduce_to_shape(g, t);
    REQUIRE(shape_of(r) == t);
    CHECK(relative_error(r, naive_reduce_to(g, t)) < 1e-15);
  }
  CHECK(cpu::reduce_to_shape(g, {})() == doctest::Approx(xt::sum(g)()));
  CHECK(thrown([&] {
          cpu::reduce_to_shape(g, {3, 2});
        }) == "reduce_to_shape: shape (3, 2) does not broadcast to the gradient's shape (2, 3, 4)");
  CHECK(thrown([&] {
          cpu::reduce_to_shape(g, {1, 2, 3, 4});
        }) ==
        "reduce_to_shape: shape (1, 2, 3, 4) does not broadcast to the gradient's shape (2, 3, 4)");
}

TEST_CASE("the gradients of broadcasting ops, through reduce_to_shape, match finite differences") {
  std::uint64_t seed = 50;
  for (const auto& op : binary_ops())
    for (const auto& [as, bs] : shape_pairs) {
      if (count_of(as) == 0 || count_of(bs) == 0) continue;
      CAPTURE(op.name);
      CAPTURE(as.size());
      CAPTURE(bs.size());
      const array a = random_array(as, seed++);
      const array b = random_array(bs, seed++, 0.5, 1.5);
      CHECK(gradient_error([&](const array& x) { return op.kernel(x, b); },
                           [&](const array& dy, const array& x) {
                             return cpu::reduce_to_shape(op.local_grad_a(dy, x, b), as);
                           },
                           a) < 1e-6);
      CHECK(gradient_error([&](const array& x) { return op.kernel(a, x); },
                           [&](const array& dy, const array& x) {
                             return cpu::reduce_to_shape(op.local_grad_b(dy, a, x), bs);
                           },
                           b) < 1e-6);
    }
}

TEST_CASE("relu, exp, log and neg act elementwise; relu_grad matches finite differences") {
  const array x = random_array({3, 5}, 9, -2.0, 2.0);
  const array pos = random_array({3, 5}, 10, 0.1, 3.0);
  const array r = cpu::relu(x), e = cpu::exp(x), l = cpu::log(pos), n = cpu::neg(x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(r.data()[i] == std::max(x.data()[i], 0.0));
    CHECK(e.data()[i] == std::exp(x.data()[i]));
    CHECK(l.data()[i] == std::log(pos.data()[i]));
    CHECK(n.data()[i] == -x.data()[i]);
  }
  CHECK(shape_of(cpu::exp(array(2.0))) == shape_t{});
  const array away = random_away_from_zero({4, 3}, 11);
  CHECK(gradient_error([](const array& v) { return cpu::relu(v); },
                       [](const array& dy, const array& v) { return cpu::relu_grad(dy, v); },
                       away) < 1e-6);
  CHECK(gradient_error([](const array& v) { return cpu::exp(v); },
                       [](const array& dy, const array& v) { return cpu::mul(dy, cpu::exp(v)); },
                       x) < 1e-6);
  CHECK(cpu::relu_grad(array{1.0, 1.0, 1.0}, array{-1.0, 0.0, 2.0}) == array{0.0, 0.0, 1.0});
  // The mask drops whatever dy holds where x <= 0, infinities and NaN included.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(cpu::relu_grad(array{inf, nan, -inf, 2.0}, array{-1.0, 0.0, -3.0, 1.0}) == array{0.0, 0.0, 0.0, 2.0});
  CHECK(cpu::relu_grad(xt::xarray<float>{1e30f, 3.0f}, xt::xarray<float>{-1.0f, 5.0f}) == xt::xarray<float>{0.0f, 3.0f});
  CHECK(thrown([] { cpu::relu_grad(random_array({3}, 1), random_array({4}, 2)); }) ==
        "relu_grad: shapes differ: dy is (3,), x is (4,)");
}

TEST_CASE("bias_add adds along the last dim; bias_add_grad_bias sums the rest") {
  for (const shape_t& xs : {shape_t{2, 3, 4}, shape_t{4}, shape_t{5, 4}, shape_t{0, 4}}) {
    CAPTURE(xs.size());
    const array x = random_array(xs, 20);
    const array bias = random_array({4}, 21);
    const array y = cpu::bias_add(x, bias);
    CHECK(relative_error(y, naive_binary(x, bias, std::plus<>())) == 0.0);
    const array dy = random_array(xs, 22);
    CHECK(relative_error(cpu::bias_add_grad_bias(dy), naive_reduce_to(dy, {4})) < 1e-15);
    if (count_of(xs) == 0) continue;
    CHECK(gradient_error([&](const array& b) { return cpu::bias_add(x, b); },
                         [](const array& g, const array&) { return cpu::bias_add_grad_bias(g); },
                         bias) < 1e-6);
    CHECK(gradient_error([&](const array& v) { return cpu::bias_add(v, bias); },
                         [](const array& g, const array&) { return g; }, x) < 1e-6);
  }
  CHECK(thrown([] {
          cpu::bias_add(random_array({2, 4}, 1), random_array({5}, 2));
        }) == "bias_add: bias is (5,), expected (4,) for x (2, 4)");
  CHECK(thrown([] {
          cpu::bias_add(random_array({2, 4}, 1), random_array({1, 4}, 2));
        }) == "bias_add: bias is (1, 4), expected (4,) for x (2, 4)");
  CHECK(thrown([] { cpu::bias_add(array(1.0), random_array({1}, 2)); }) ==
        "bias_add: x must have at least one dim, x is ()");
  CHECK(thrown([] { cpu::bias_add_grad_bias(array(1.0)); }) ==
        "bias_add_grad_bias: dy must have at least one dim, dy is ()");
}

TEST_CASE("fused_map runs a chain in one pass with the chain's values; shapes must agree") {
  namespace fz = tessera::kernels::fused;
  const array dy = random_array({3, 5}, 30), a = random_array({3, 5}, 31), b = random_away_from_zero({3, 5}, 32);
  // Div's divisor gradient and Exp's gradient equal their unfused chains exactly.
  CHECK(cpu::fused_map("t", fz::div_grad_divisor{}, dy, a, b) == cpu::neg(cpu::div(cpu::mul(dy, a), cpu::mul(b, b))));
  CHECK(cpu::fused_map("t", fz::exp_grad{}, dy, a) == cpu::mul(dy, cpu::exp(a)));
  // A unary map, and a 0-D array.
  CHECK(cpu::fused_map("t", fz::act_value<fz::activation::relu>{}, a) == cpu::relu(a));
  CHECK(cpu::fused_map("t", [](double v) { return 2 * v; }, array(1.5)) == array(3.0));
  CHECK(thrown([&] { cpu::fused_map("div_backward", fz::div_grad_divisor{}, dy, a, random_array({5}, 1)); }) ==
        "div_backward: shapes differ: operand 0 is (3, 5), operand 2 is (5,)");
}

TEST_CASE("fused_map over an rvalue writes over its storage, with the same values; an operand may be it") {
  namespace fz = tessera::kernels::fused;
  const array dy = random_array({3, 5}, 33), a = random_array({3, 5}, 34);
  array d = dy;
  const double* storage = d.data();
  const array r = cpu::fused_map("t", fz::exp_grad{}, std::move(d), a);
  CHECK(r.data() == storage);
  CHECK(r == cpu::fused_map("t", fz::exp_grad{}, dy, a));
  // ReLU's gradient of a over a itself: a where a > 0, in a's own storage.
  array s = a;
  const double* own = s.data();
  const array g = cpu::fused_map("t", fz::act_grad<fz::activation::relu>{}, std::move(s), s);
  CHECK(g.data() == own);
  CHECK(g == cpu::relu(a));
  CHECK(cpu::fused_map("t", fz::neg_grad{}, array(dy)) == cpu::neg(dy));
  CHECK(cpu::fused_map("t", fz::log_grad{}, array(dy), a) == cpu::div(dy, a));
  array wrong = dy;
  CHECK(thrown([&] { cpu::fused_map("log_backward", fz::log_grad{}, std::move(wrong), random_array({5}, 1)); }) ==
        "log_backward: shapes differ: operand 0 is (3, 5), operand 1 is (5,)");
}

TEST_CASE("the activations: values, gradients from the output against finite differences") {
  namespace fz = tessera::kernels::fused;
  const array x = random_array({4, 6}, 40, -3.0, 3.0);
  auto check = [&](auto A, double (*f)(double)) {
    using act = fz::act<decltype(A)::value>;
    CAPTURE(fz::name(decltype(A)::value));
    auto value = [](const array& v) { return cpu::fused_map("value", fz::act_value<decltype(A)::value>{}, v); };
    const array y = value(x);
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(y.data()[i] == doctest::Approx(f(x.data()[i])).epsilon(1e-15));
    CHECK(act{}.value(0.5) == doctest::Approx(f(0.5)).epsilon(1e-15));
    CHECK(gradient_error(value,
                         [&](const array& dy, const array& v) {
                           return cpu::fused_map("grad", fz::act_grad<decltype(A)::value>{}, dy, value(v));
                         },
                         random_away_from_zero({4, 6}, 41)) < 1e-6);
  };
  using fz::activation;
  check(std::integral_constant<activation, activation::none>{}, [](double v) { return v; });
  check(std::integral_constant<activation, activation::relu>{}, [](double v) { return v > 0 ? v : 0.0; });
  check(std::integral_constant<activation, activation::sigmoid>{}, [](double v) { return 1 / (1 + std::exp(-v)); });
  check(std::integral_constant<activation, activation::tanh>{}, [](double v) { return std::tanh(v); });
}

TEST_CASE("fused_bias_map: the bias and an activation in one pass over x's storage") {
  namespace fz = tessera::kernels::fused;
  const array x = random_array({5, 4}, 50), bias = random_array({4}, 51);
  array moved = x;
  const double* storage = moved.data();
  const array y = cpu::fused_bias_map("dense", std::move(moved), bias, fz::bias_act<fz::activation::tanh>{});
  CHECK(y.data() == storage);  // written in place
  const array want = cpu::fused_map("t", fz::act_value<fz::activation::tanh>{}, cpu::bias_add(x, bias));
  CHECK(y == want);
  CHECK(cpu::fused_bias_map("t", x, bias, fz::bias_act<fz::activation::none>{}) == cpu::bias_add(x, bias));
  CHECK(thrown([&] { cpu::fused_bias_map("dense", x, random_array({3}, 1), fz::bias_act<fz::activation::relu>{}); }) ==
        "dense: bias is (3,), expected (4,) for x (5, 4)");
}
