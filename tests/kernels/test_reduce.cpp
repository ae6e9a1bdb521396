// Tests of kernels/cpu/reduce.hpp: sum, mean, max and min over every subset of axes
// (with and without keep_dims) against a naive loop, and their gradients against
// central finite differences.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <tessera/kernels/cpu/reduce.hpp>

#include "finite_difference.hpp"

namespace cpu = tessera::kernels::cpu;
using namespace kernel_test;

namespace {

using array = xt::xarray<double>;

// Every subset of the dims of a rank-3 tensor, some written with negative axes; {}
// means every dim.
const std::vector<std::vector<int>> axis_lists = {{},      {0},    {1},          {-1},     {0, 1},
                                                  {0, -1}, {2, 1}, {-3, -2, -1}, {1, 0, 2}};

std::vector<bool> naive_mask(const std::vector<int>& axes, std::size_t r) {
  std::vector<bool> m(r, axes.empty());
  for (int a : axes) m[std::size_t(a < 0 ? a + int(r) : a)] = true;
  return m;
}

// The reduction by its definition: every element combined into the result element
// whose index is its own with the reduced dims removed (or set to 0 with keep_dims).
array naive_reduce(const array& x, const std::vector<int>& axes, bool keep, double init,
                   const std::function<double(double, double)>& combine) {
  const shape_t xs = shape_of(x);
  const auto mask = naive_mask(axes, xs.size());
  shape_t kept = xs, out;
  for (std::size_t d = 0; d < xs.size(); ++d) {
    if (mask[d]) kept[d] = 1;
    if (!mask[d] || keep) out.push_back(kept[d]);
  }
  array y = array::from_shape(out);
  y.fill(init);
  for (std::size_t i = 0; i < x.size(); ++i) {
    auto idx = unravel(i, xs);
    for (std::size_t d = 0; d < xs.size(); ++d)
      if (mask[d]) idx[d] = 0;
    double& slot = y.data()[ravel(idx, kept)];
    slot = combine(slot, x.data()[i]);
  }
  return y;
}

std::size_t reduced_count(const shape_t& xs, const std::vector<int>& axes) {
  const auto mask = naive_mask(axes, xs.size());
  std::size_t n = 1;
  for (std::size_t d = 0; d < xs.size(); ++d)
    if (mask[d]) n *= xs[d];
  return n;
}

// Distinct values at least 0.03 apart, in a seeded random order (max and min have
// one arg-max; a finite-difference step cannot reorder them).
array distinct_values(const shape_t& shape, std::uint64_t seed) {
  array x = array::from_shape(shape);
  std::vector<double> v(x.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.05 * double(i) - 0.5;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  std::copy(v.begin(), v.end(), x.data());
  return x;
}

const shape_t x_shape = {2, 3, 4};

}  // namespace

TEST_CASE("reduce_sum, reduce_mean, reduce_max and reduce_min equal naive loops") {
  const array x = random_array(x_shape, 1);
  const double inf = std::numeric_limits<double>::infinity();
  auto plus = [](double a, double b) { return a + b; };
  auto mx = [](double a, double b) { return std::max(a, b); };
  auto mn = [](double a, double b) { return std::min(a, b); };
  for (const auto& axes : axis_lists)
    for (bool keep : {false, true}) {
      CAPTURE(axes.size());
      CAPTURE(keep);
      const array sum = naive_reduce(x, axes, keep, 0.0, plus);
      array mean = sum;
      for (double& v : mean) v /= double(reduced_count(x_shape, axes));
      const array s = cpu::reduce_sum(x, axes, keep);
      REQUIRE(shape_of(s) == shape_of(sum));
      CHECK(relative_error(s, sum) < 1e-15);
      CHECK(relative_error(cpu::reduce_mean(x, axes, keep), mean) < 1e-15);
      CHECK(relative_error(cpu::reduce_max(x, axes, keep), naive_reduce(x, axes, keep, -inf, mx)) ==
            0.0);
      CHECK(relative_error(cpu::reduce_min(x, axes, keep), naive_reduce(x, axes, keep, inf, mn)) ==
            0.0);
    }
  // Shapes: (2, 3, 4) over [0, -1] is (3,), or (1, 3, 1) with keep_dims; [] is 0-D.
  CHECK(shape_of(cpu::reduce_sum(x, {0, -1})) == shape_t{3});
  CHECK(shape_of(cpu::reduce_sum(x, {0, -1}, true)) == shape_t{1, 3, 1});
  CHECK(shape_of(cpu::reduce_sum(x)) == shape_t{});
  CHECK(shape_of(cpu::reduce_max(x, {}, true)) == shape_t{1, 1, 1});
  // A 0-D input reduces to itself; an empty reduction sums to 0.
  CHECK(cpu::reduce_sum(array(2.5))() == 2.5);
  CHECK(cpu::reduce_sum(random_array({2, 0}, 1), {1}) == array{0.0, 0.0});
  // Integers and NaN.
  const xt::xarray<int> ints = {{1, 5}, {7, 3}};
  CHECK(cpu::reduce_max(ints, {1}) == xt::xarray<int>{5, 7});
  CHECK(cpu::reduce_min(ints, {0}) == xt::xarray<int>{1, 3});
  const array with_nan = {1.0, std::nan(""), 3.0};
  CHECK(std::isnan(cpu::reduce_max(with_nan)()));
  CHECK(std::isnan(cpu::reduce_min(with_nan)()));
}

TEST_CASE("the reduction gradients match finite differences for every axis list") {
  const array x = random_array(x_shape, 2);
  const array xd = distinct_values(x_shape, 3);
  for (const auto& axes : axis_lists)
    for (bool keep : {false, true}) {
      CAPTURE(axes.size());
      CAPTURE(keep);
      CHECK(gradient_error([&](const array& v) { return cpu::reduce_sum(v, axes, keep); },
                           [&](const array& dy, const array& v) {
                             return cpu::reduce_sum_grad(dy, v.shape(), axes, keep);
                           },
                           x) < 1e-6);
      CHECK(gradient_error([&](const array& v) { return cpu::reduce_mean(v, axes, keep); },
                           [&](const array& dy, const array& v) {
                             return cpu::reduce_mean_grad(dy, v.shape(), axes, keep);
                           },
                           x) < 1e-6);
      CHECK(gradient_error([&](const array& v) { return cpu::reduce_max(v, axes, keep); },
                           [&](const array& dy, const array& v) {
                             return cpu::reduce_max_grad(dy, v, cpu::reduce_max(v, axes, keep),
                                                         axes, keep);
                           },
                           xd) < 1e-6);
      CHECK(gradient_error([&](const array& v) { return cpu::reduce_min(v, axes, keep); },
                           [&](const array& dy, const array& v) {
                             return cpu::reduce_min_grad(dy, v, cpu::reduce_min(v, axes, keep),
                                                         axes, keep);
                           },
                           xd) < 1e-6);
    }
}

TEST_CASE("reduce_max_grad splits the gradient equally among tied maxima") {
  const array x = {{1.0, 3.0, 3.0}, {2.0, 2.0, 2.0}};
  const array y = cpu::reduce_max(x, {1});
  const array dx = cpu::reduce_max_grad(array{6.0, 3.0}, x, y, {1});
  CHECK(dx == array{{0.0, 3.0, 3.0}, {1.0, 1.0, 1.0}});
  // The split gradient sums back to dy.
  CHECK(cpu::reduce_sum(dx, {1}) == array{6.0, 3.0});
}

TEST_CASE("reduction errors") {
  const array x = random_array(x_shape, 4);
  CHECK(thrown([&] { cpu::reduce_sum(x, {3}); }) ==
        "reduce_sum: axis 3 is out of range for a tensor of rank 3");
  CHECK(thrown([&] { cpu::reduce_mean(x, {-4}); }) ==
        "reduce_mean: axis -4 is out of range for a tensor of rank 3");
  CHECK(thrown([&] {
          cpu::reduce_sum(x, {1, -2});
        }) == "reduce_sum: axes [1, -2] name dim 1 twice");
  CHECK(thrown([&] {
          cpu::reduce_max(random_array({2, 0}, 1), {1});
        }) == "reduce_max: cannot reduce over an empty dim: dim 1 of x (2, 0) has extent 0");
  CHECK(thrown([&] { cpu::reduce_max(random_array({2, 0}, 1), {0}); }) == "");
  CHECK(thrown([&] {
          cpu::reduce_sum_grad(random_array({4}, 1), {3, 4}, {1});
        }) ==
        "reduce_sum_grad: dy is (4,), expected (3,) (the reduction of (3, 4) over axes [1] with "
        "keep_dims false)");
  CHECK(thrown([&] {
          cpu::reduce_mean_grad(random_array({3}, 1), {3, 4}, {1}, true);
        }) ==
        "reduce_mean_grad: dy is (3,), expected (3, 1) (the reduction of (3, 4) over axes [1] "
        "with keep_dims true)");
  const array y = cpu::reduce_max(x, {0});
  CHECK(thrown([&] { cpu::reduce_max_grad(y, x, cpu::reduce_max(x, {1}), {0}); }) ==
        "reduce_max_grad: y is (2, 4), expected (3, 4), the shape of dy");
}
