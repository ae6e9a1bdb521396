// Tests of kernels/cpu/blas.hpp and matmul.hpp: every product and gradient against a
// naive triple loop or central finite differences, for all four transpose flags.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <tessera/kernels/cpu/matmul.hpp>

#include "finite_difference.hpp"

namespace cpu = tessera::kernels::cpu;
using namespace kernel_test;

namespace {

constexpr bool flags[] = {false, true};

// op(A) op(B) by the definition, accumulated in double.
template <class T>
xt::xarray<T> naive_matmul(const xt::xarray<T>& a, const xt::xarray<T>& b, bool ta, bool tb) {
  const std::size_t m = ta ? a.shape()[1] : a.shape()[0];
  const std::size_t k = ta ? a.shape()[0] : a.shape()[1];
  const std::size_t n = tb ? b.shape()[0] : b.shape()[1];
  xt::xarray<T> c = xt::xarray<T>::from_shape({m, n});
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::size_t p = 0; p < k; ++p)
        s += double(ta ? a(p, i) : a(i, p)) * double(tb ? b(j, p) : b(p, j));
      c(i, j) = T(s);
    }
  return c;
}

// The stored shape of an operand whose op() is rows x cols.
shape_t stored(std::size_t rows, std::size_t cols, bool trans) {
  return trans ? shape_t{cols, rows} : shape_t{rows, cols};
}

// Entry i of a 3-D array, or the 2-D array itself (a shared operand).
xt::xarray<double> entry(const xt::xarray<double>& x, std::size_t i) {
  if (x.dimension() == 2) return x;
  const std::size_t r = x.shape()[1], c = x.shape()[2];
  xt::xarray<double> e = xt::xarray<double>::from_shape({r, c});
  std::copy_n(x.data() + i * r * c, r * c, e.data());
  return e;
}

}  // namespace

TEST_CASE_TEMPLATE("matmul equals the naive product for every transpose and shape", T, float,
                   double) {
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  // (m, n, k), including empty products (k = 0 gives zeros) and empty results.
  const std::size_t dims[][3] = {{5, 7, 3}, {1, 1, 1}, {16, 9, 33},
                                 {4, 6, 0}, {0, 3, 2}, {3, 0, 2}};
  std::uint64_t seed = 1;
  for (const auto& d : dims)
    for (bool ta : flags)
      for (bool tb : flags) {
        CAPTURE(d[0]);
        CAPTURE(d[1]);
        CAPTURE(d[2]);
        CAPTURE(ta);
        CAPTURE(tb);
        const auto a = random_array<T>(stored(d[0], d[2], ta), seed++);
        const auto b = random_array<T>(stored(d[2], d[1], tb), seed++);
        const auto c = cpu::matmul(a, b, ta, tb);
        REQUIRE(c.shape() == typename xt::xarray<T>::shape_type{d[0], d[1]});
        CHECK(relative_error(c, naive_matmul(a, b, ta, tb)) < tol);
        if (d[2] == 0)
          for (std::size_t i = 0; i < c.size(); ++i) CHECK(c.data()[i] == T(0));
      }
}

TEST_CASE("matmul_into scales c by beta and adds the product") {
  for (bool ta : flags)
    for (bool tb : flags) {
      CAPTURE(ta);
      CAPTURE(tb);
      const auto a = random_array(stored(4, 3, ta), 11);
      const auto b = random_array(stored(3, 5, tb), 12);
      const auto c0 = random_array({4, 5}, 13);
      const auto prod = naive_matmul(a, b, ta, tb);
      for (double beta : {0.0, 1.0, 0.5}) {
        CAPTURE(beta);
        xt::xarray<double> c = c0;
        cpu::matmul_into(c, a, b, ta, tb, beta);
        xt::xarray<double> expected = prod;
        for (std::size_t i = 0; i < c.size(); ++i) expected.data()[i] += beta * c0.data()[i];
        CHECK(relative_error(c, expected) < 1e-13);
      }
      // The default beta accumulates; beta 0 overwrites even NaN.
      xt::xarray<double> acc = c0;
      cpu::matmul_into(acc, a, b, ta, tb);
      cpu::matmul_into(acc, a, b, ta, tb);
      xt::xarray<double> twice = c0;
      for (std::size_t i = 0; i < acc.size(); ++i) twice.data()[i] += 2 * prod.data()[i];
      CHECK(relative_error(acc, twice) < 1e-13);
      xt::xarray<double> nan = xt::xarray<double>::from_shape({4, 5});
      nan.fill(std::numeric_limits<double>::quiet_NaN());
      cpu::matmul_into(nan, a, b, ta, tb, 0.0);
      CHECK(relative_error(nan, prod) < 1e-13);
    }
}

TEST_CASE("matmul errors name both shapes and the flags") {
  const auto a = random_array({8, 8}, 1);
  const auto b = random_array({4, 16}, 2);
  CHECK(thrown([&] { cpu::matmul(a, b); }) ==
        "matmul: contraction dims differ: a is (8, 8) with trans_a false, b is (4, 16) with "
        "trans_b false");
  CHECK(thrown([&] { cpu::matmul(b, a, true, true); }) ==
        "matmul: contraction dims differ: a is (4, 16) with trans_a true, b is (8, 8) with "
        "trans_b true");
  CHECK(thrown([&] { cpu::matmul(b, b, false, true); }) == "");
  CHECK(thrown([&] {
          cpu::matmul(random_array({2, 3, 4}, 3), a);
        }) == "matmul: a must be 2-D, a is (2, 3, 4)");
  CHECK(thrown([&] { cpu::matmul(a, random_array({8}, 3)); }) ==
        "matmul: b must be 2-D, b is (8,)");
  xt::xarray<double> c = random_array({8, 15}, 4);
  CHECK(thrown([&] { cpu::matmul_into(c, a, a); }) == "matmul_into: c is (8, 15), expected (8, 8)");
  xt::xarray<double> self = a;
  CHECK(thrown([&] { cpu::matmul_into(self, self, a); }) == "matmul_into: c must not be a or b");
  CHECK(thrown([&] {
          cpu::matmul_grad_a(random_array({8, 9}, 5), a, a);
        }) == "matmul_grad_a: dc is (8, 9), expected (8, 8)");
  CHECK(thrown([&] {
          cpu::matmul_grad_b(random_array({8, 8}, 5), a, b);
        }) ==
        "matmul_grad_b: contraction dims differ: a is (8, 8) with trans_a false, b is (4, 16) "
        "with trans_b false");
}

TEST_CASE("gemm honours leading dims larger than the matrices and checks them") {
  // A is the top-left 3 x 4 block of a 5 x 6 buffer; B the 4 x 2 block of a 4 x 3 one.
  const auto abuf = random_array({5, 6}, 21);
  const auto bbuf = random_array({4, 3}, 22);
  xt::xarray<double> cbuf = xt::xarray<double>::from_shape({3, 7});
  cbuf.fill(-1.0);
  cpu::gemm(false, false, 3, 2, 4, 2.0, abuf.data(), 6, bbuf.data(), 3, 0.0, cbuf.data(), 7);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 7; ++j) {
      double s = 0;  // columns 2.. of each row of C lie outside the product
      for (std::size_t p = 0; p < 4 && j < 2; ++p) s += abuf(i, p) * bbuf(p, j);
      CHECK(cbuf(i, j) == doctest::Approx(j < 2 ? 2 * s : -1.0).epsilon(1e-13));
    }
  float f = 0;
  CHECK(thrown([&] { cpu::gemm(false, false, 3, 2, 4, 1.f, &f, 3, &f, 2, 0.f, &f, 2); }) ==
        "gemm: lda must be at least max(1, k) = 4 (trans_a false): lda 3");
  CHECK(thrown([&] { cpu::gemm(true, true, 3, 2, 4, 1.f, &f, 3, &f, 3, 0.f, &f, 2); }) ==
        "gemm: ldb must be at least max(1, k) = 4 (trans_b true): ldb 3");
  CHECK(thrown([&] { cpu::gemm(false, false, 3, 2, 4, 1.f, &f, 4, &f, 2, 0.f, &f, 1); }) ==
        "gemm: ldc must be at least max(1, n) = 2: ldc 1");
  CHECK(thrown([&] { cpu::gemm(false, false, -1, 2, 4, 1.f, &f, 4, &f, 2, 0.f, &f, 2); }) ==
        "gemm: m, n and k must not be negative: m -1, n 2, k 4");
}

TEST_CASE("matmul_grad_a and matmul_grad_b match finite differences for every transpose") {
  std::uint64_t seed = 100;
  for (bool ta : flags)
    for (bool tb : flags) {
      CAPTURE(ta);
      CAPTURE(tb);
      const auto a = random_array(stored(4, 3, ta), seed++);
      const auto b = random_array(stored(3, 5, tb), seed++);
      CHECK(gradient_error(
                [&](const auto& x) { return cpu::matmul(x, b, ta, tb); },
                [&](const auto& dc, const auto& x) { return cpu::matmul_grad_a(dc, x, b, ta, tb); },
                a) < 1e-6);
      CHECK(gradient_error(
                [&](const auto& x) { return cpu::matmul(a, x, ta, tb); },
                [&](const auto& dc, const auto& x) { return cpu::matmul_grad_b(dc, a, x, ta, tb); },
                b) < 1e-6);
      // Float: the same gemm with the same flags.
      const auto af = random_array<float>(stored(4, 3, ta), seed);
      const auto bf = random_array<float>(stored(3, 5, tb), seed + 1);
      const auto dcf = random_array<float>({4, 5}, seed + 2);
      CHECK(cpu::matmul_grad_a(dcf, af, bf, ta, tb).shape() == af.shape());
      CHECK(cpu::matmul_grad_b(dcf, af, bf, ta, tb).shape() == bf.shape());
    }
}

TEST_CASE("batch_matmul equals per-entry products; a 2-D operand is shared by the batch") {
  // (a batched, b batched): both 3-D, 3-D with a shared b (the folded gemm when
  // trans_a is false), and a shared a.
  const std::pair<bool, bool> batched[] = {{true, true}, {true, false}, {false, true}};
  const std::size_t batch = 3, m = 4, n = 5, k = 2;
  std::uint64_t seed = 200;
  for (auto [ab, bb] : batched)
    for (bool ta : flags)
      for (bool tb : flags) {
        CAPTURE(ab);
        CAPTURE(bb);
        CAPTURE(ta);
        CAPTURE(tb);
        shape_t as = stored(m, k, ta), bs = stored(k, n, tb);
        if (ab) as.insert(as.begin(), batch);
        if (bb) bs.insert(bs.begin(), batch);
        const auto a = random_array(as, seed++);
        const auto b = random_array(bs, seed++);
        const auto c = cpu::batch_matmul(a, b, ta, tb);
        REQUIRE(c.shape() == xt::xarray<double>::shape_type{batch, m, n});
        for (std::size_t i = 0; i < batch; ++i)
          CHECK(relative_error(entry(c, i), naive_matmul(entry(a, i), entry(b, i), ta, tb)) <
                1e-13);
        CHECK(gradient_error([&](const auto& x) { return cpu::batch_matmul(x, b, ta, tb); },
                             [&](const auto& dc, const auto& x) {
                               return cpu::batch_matmul_grad_a(dc, x, b, ta, tb);
                             },
                             a) < 1e-6);
        CHECK(gradient_error([&](const auto& x) { return cpu::batch_matmul(a, x, ta, tb); },
                             [&](const auto& dc, const auto& x) {
                               return cpu::batch_matmul_grad_b(dc, a, x, ta, tb);
                             },
                             b) < 1e-6);
      }
}

TEST_CASE("batch_matmul errors") {
  const auto a = random_array({2, 3, 4}, 1);
  CHECK(thrown([&] {
          cpu::batch_matmul(a, random_array({3, 4, 5}, 2));
        }) == "batch_matmul: batch dims differ: a is (2, 3, 4), b is (3, 4, 5)");
  CHECK(thrown([&] {
          cpu::batch_matmul(a, random_array({2, 5, 4}, 2));
        }) ==
        "batch_matmul: contraction dims differ: a is (2, 3, 4) with trans_a false, b is (2, 5, 4) "
        "with trans_b false");
  CHECK(thrown([&] {
          cpu::batch_matmul(random_array({3, 4}, 1), random_array({4, 5}, 2));
        }) == "batch_matmul: a or b must be 3-D (batch, rows, cols): a is (3, 4), b is (4, 5)");
  CHECK(thrown([&] {
          cpu::batch_matmul(random_array({1, 2, 3, 4}, 1), a);
        }) == "batch_matmul: a must be 2-D or 3-D, a is (1, 2, 3, 4)");
  CHECK(thrown([&] {
          cpu::batch_matmul_grad_a(random_array({2, 3, 4}, 3), a, random_array({4, 5}, 2));
        }) == "batch_matmul_grad_a: dc is (2, 3, 4), expected (2, 3, 5)");
  // An empty batch: a shared operand's gradient is zero.
  const auto empty = random_array({0, 3, 4}, 1);
  const auto w = random_array({4, 5}, 2);
  CHECK(cpu::batch_matmul(empty, w).shape() == xt::xarray<double>::shape_type{0, 3, 5});
  for (bool ta : flags) {  // the folded gemm and the per-entry loop
    const auto shared = random_array(ta ? shape_t{3, 5} : shape_t{4, 5}, 2);
    const auto dc = random_array(ta ? shape_t{0, 4, 5} : shape_t{0, 3, 5}, 3);
    const auto gw = cpu::batch_matmul_grad_b(dc, empty, shared, ta, false);
    REQUIRE(gw.shape() == shared.shape());
    for (double v : gw) CHECK(v == 0.0);
  }
}
