// Tests of kernels/cpu/softmax.hpp: softmax and log_softmax along every axis against
// a naive loop (including inputs whose exp would overflow), one_hot, the cross-entropy
// losses, and every gradient against central finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <tessera/kernels/cpu/softmax.hpp>

#include "finite_difference.hpp"

namespace cpu = tessera::kernels::cpu;
using namespace kernel_test;

namespace {

using array = xt::xarray<double>;

// softmax along `axis` by its definition, in long double: exp(x_i) / sum_j exp(x_j)
// with the slice's maximum subtracted first.
array naive_softmax(const array& x, std::size_t axis, bool log) {
  const shape_t xs = shape_of(x);
  array y = array::from_shape(xs);
  for (std::size_t i = 0; i < x.size(); ++i) {
    auto idx = unravel(i, xs);
    long double m = -INFINITY, sum = 0;
    for (std::size_t j = 0; j < xs[axis]; ++j) {
      idx[axis] = j;
      m = std::max(m, (long double)x.data()[ravel(idx, xs)]);
    }
    for (std::size_t j = 0; j < xs[axis]; ++j) {
      idx[axis] = j;
      sum += std::exp((long double)x.data()[ravel(idx, xs)] - m);
    }
    const long double v = (long double)x.data()[i] - m;
    y.data()[i] = double(log ? v - std::log(sum) : std::exp(v) / sum);
  }
  return y;
}

// Each row of w (rows,) scales the matching row of g (rows, classes): the gradient of
// sum_r w_r * loss_r from the per-row gradient.
array scale_rows(const array& g, const array& w) {
  array out = g;
  const std::size_t c = g.shape().back();
  for (std::size_t i = 0; i < g.size(); ++i) out.data()[i] *= w.data()[i / c];
  return out;
}

}  // namespace

TEST_CASE("softmax and log_softmax equal the definition along every axis") {
  const std::pair<shape_t, int> cases[] = {{{3, 4}, 0},    {{3, 4}, 1},    {{3, 4}, -1},
                                           {{2, 3, 4}, 0}, {{2, 3, 4}, 1}, {{2, 3, 4}, -1},
                                           {{5}, 0},       {{4, 1}, 1}};
  std::uint64_t seed = 1;
  for (const auto& [shape, axis] : cases) {
    CAPTURE(shape.size());
    CAPTURE(axis);
    const array x = random_array(shape, seed++, -3.0, 3.0);
    const std::size_t ax = std::size_t(axis < 0 ? axis + int(shape.size()) : axis);
    CHECK(relative_error(cpu::softmax(x, axis), naive_softmax(x, ax, false)) < 1e-14);
    CHECK(relative_error(cpu::log_softmax(x, axis), naive_softmax(x, ax, true)) < 1e-14);
  }
  // Stability: exp(1000) overflows, softmax does not; log_softmax stays finite where
  // softmax underflows to 0.
  const array big = {{1000.0, 1001.0, 999.0}, {-2000.0, 0.0, -1.0}};
  const array y = cpu::softmax(big);
  const array ly = cpu::log_softmax(big);
  for (std::size_t i = 0; i < y.size(); ++i) {
    CHECK(std::isfinite(y.data()[i]));
    CHECK(std::isfinite(ly.data()[i]));
  }
  CHECK(relative_error(y, naive_softmax(big, 1, false)) < 1e-14);
  CHECK(ly(1, 0) == doctest::Approx(-2000.0 - std::log(1.0 + std::exp(-1.0))));
  // float
  const xt::xarray<float> f = {1.f, 2.f, 3.f};
  CHECK(cpu::softmax(f)(2) ==
        doctest::Approx(std::exp(1.0) / (std::exp(-1.0) + 1 + std::exp(1.0))));
  CHECK(thrown([] {
          cpu::softmax(random_array({3, 4}, 1), 2);
        }) == "softmax: axis 2 is out of range for a tensor of rank 2");
  CHECK(thrown([] { cpu::log_softmax(array(1.0)); }) ==
        "log_softmax: axis -1 is out of range for a tensor of rank 0");
}

TEST_CASE("softmax_grad and log_softmax_grad match finite differences") {
  for (int axis : {0, 1, -1}) {
    CAPTURE(axis);
    const array x = random_array({2, 3, 4}, 10 + std::uint64_t(axis + 1), -2.0, 2.0);
    CHECK(gradient_error([&](const array& v) { return cpu::softmax(v, axis); },
                         [&](const array& dy, const array& v) {
                           return cpu::softmax_grad(dy, cpu::softmax(v, axis), axis);
                         },
                         x) < 1e-6);
    CHECK(gradient_error([&](const array& v) { return cpu::log_softmax(v, axis); },
                         [&](const array& dy, const array& v) {
                           return cpu::log_softmax_grad(dy, cpu::log_softmax(v, axis), axis);
                         },
                         x) < 1e-6);
  }
  CHECK(thrown([] { cpu::softmax_grad(random_array({3}, 1), random_array({4}, 2)); }) ==
        "softmax_grad: shapes differ: dy is (3,), y is (4,)");
}

TEST_CASE("one_hot puts `on` at each index and `off` elsewhere") {
  const xt::xarray<std::int32_t> i32 = {{0, 2}, {-1, 3}};
  const auto h = cpu::one_hot(i32, 3);
  static_assert(std::is_same_v<decltype(h), const xt::xarray<float>>);
  REQUIRE(h.shape() == xt::xarray<float>::shape_type{2, 2, 3});
  const xt::xarray<float> expected = {{{1, 0, 0}, {0, 0, 1}}, {{0, 0, 0}, {0, 0, 0}}};
  CHECK(h == expected);
  const xt::xarray<std::int64_t> i64 = {1, 0};
  CHECK(cpu::one_hot<double>(i64, 2, 5.0, -1.0) == array{{-1.0, 5.0}, {5.0, -1.0}});
  CHECK(cpu::one_hot<double>(i64, 0).shape() == array::shape_type{2, 0});
  CHECK(thrown([&] { cpu::one_hot(i64, -2); }) == "one_hot: depth must not be negative: depth -2");
}

TEST_CASE("softmax_cross_entropy: loss by definition, gradient by finite differences") {
  // Rows: a distribution, one-hot, all zero (an ignored sample), a row summing to 2.
  array labels = random_array({4, 5}, 20, 0.0, 1.0);
  for (std::size_t j = 0; j < 5; ++j) {
    labels(1, j) = j == 3 ? 1.0 : 0.0;
    labels(2, j) = 0.0;
  }
  double s0 = 0, s3 = 0;
  for (std::size_t j = 0; j < 5; ++j) s0 += labels(0, j), s3 += labels(3, j);
  for (std::size_t j = 0; j < 5; ++j) labels(0, j) /= s0, labels(3, j) *= 2.0 / s3;

  const array logits = random_array({4, 5}, 21, -3.0, 3.0);
  const auto r = cpu::softmax_cross_entropy(logits, labels);
  REQUIRE(shape_of(r.loss) == shape_t{4});
  const array ls = naive_softmax(logits, 1, true);
  for (std::size_t i = 0; i < 4; ++i) {
    double loss = 0;
    for (std::size_t j = 0; j < 5; ++j) loss -= labels(i, j) * ls(i, j);
    CHECK(r.loss(i) == doctest::Approx(loss).epsilon(1e-14));
  }
  CHECK(r.loss(2) == 0.0);
  // softmax - labels on rows that sum to 1.
  const array sm = cpu::softmax(logits);
  for (std::size_t j = 0; j < 5; ++j) {
    CHECK(r.grad(0, j) == doctest::Approx(sm(0, j) - labels(0, j)).epsilon(1e-14));
    CHECK(r.grad(1, j) == doctest::Approx(sm(1, j) - labels(1, j)).epsilon(1e-14));
    CHECK(r.grad(2, j) == 0.0);
  }
  CHECK(gradient_error([&](const array& v) { return cpu::softmax_cross_entropy(v, labels).loss; },
                       [&](const array& w, const array& v) {
                         return scale_rows(cpu::softmax_cross_entropy(v, labels).grad, w);
                       },
                       logits) < 1e-6);
  // Rows along leading dims: (2, 3, 5) -> (2, 3); (5,) -> 0-D.
  const array l3 = random_array({2, 3, 5}, 22);
  const array t3 = cpu::softmax(random_array({2, 3, 5}, 23));
  CHECK(shape_of(cpu::softmax_cross_entropy(l3, t3).loss) == shape_t{2, 3});
  CHECK(gradient_error([&](const array& v) { return cpu::softmax_cross_entropy(v, t3).loss; },
                       [&](const array& w, const array& v) {
                         return scale_rows(cpu::softmax_cross_entropy(v, t3).grad, w);
                       },
                       l3) < 1e-6);
  CHECK(shape_of(cpu::softmax_cross_entropy(random_array({5}, 1), random_array({5}, 2)).loss) ==
        shape_t{});
  CHECK(thrown([] {
          cpu::softmax_cross_entropy(random_array({4, 5}, 1), random_array({4, 4}, 2));
        }) == "softmax_cross_entropy: shapes differ: logits is (4, 5), labels is (4, 4)");
  CHECK(thrown([] { cpu::softmax_cross_entropy(array(1.0), array(1.0)); }) ==
        "softmax_cross_entropy: logits must have a class dim, logits is ()");
}

TEST_CASE("sparse_softmax_cross_entropy equals the dense loss with one_hot labels") {
  const array logits = random_array({4, 5}, 30, -3.0, 3.0);
  const xt::xarray<std::int64_t> labels = {1, 0, 4, 2};
  const auto sparse = cpu::sparse_softmax_cross_entropy(logits, labels);
  const auto dense = cpu::softmax_cross_entropy(logits, cpu::one_hot<double>(labels, 5));
  CHECK(relative_error(sparse.loss, dense.loss) < 1e-15);
  CHECK(relative_error(sparse.grad, dense.grad) < 1e-15);
  CHECK(gradient_error(
            [&](const array& v) { return cpu::sparse_softmax_cross_entropy(v, labels).loss; },
            [&](const array& w, const array& v) {
              return scale_rows(cpu::sparse_softmax_cross_entropy(v, labels).grad, w);
            },
            logits) < 1e-6);
  const xt::xarray<std::int32_t> bad = {1, 0, 7, 2};
  CHECK(thrown([&] { cpu::sparse_softmax_cross_entropy(logits, bad); }) ==
        "sparse_softmax_cross_entropy: label 7 at row 2 is out of range [0, 5)");
  const xt::xarray<std::int32_t> short_labels = {1, 0};
  CHECK(thrown([&] { cpu::sparse_softmax_cross_entropy(logits, short_labels); }) ==
        "sparse_softmax_cross_entropy: labels is (2,), expected (4,) for logits (4, 5)");
}
