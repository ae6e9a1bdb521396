// Tests of nn/init.hpp: the counter-based stream (deterministic, addressed by
// position, uniform and normal with the right moments, independent per name and
// seed), fans, each initializer's range or spread as MindSpore defines it, names, and
// the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <tessera/nn/init.hpp>

using namespace tessera;
using namespace tessera::nn;

namespace {

struct moments {
  double mean = 0, var = 0, lo = 1e300, hi = -1e300;
};
moments draw(const initializer& init, const extents& shape, std::uint64_t key, std::uint64_t n) {
  const auto d = init.draw(shape, key);
  moments m;
  double s = 0, s2 = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const double x = d(i);
    s += x;
    s2 += x * x;
    m.lo = std::min(m.lo, x);
    m.hi = std::max(m.hi, x);
  }
  m.mean = s / double(n);
  m.var = s2 / double(n) - m.mean * m.mean;
  return m;
}

}  // namespace

TEST_CASE("random_stream: a function of (key, position)") {
  const random_stream a(stream_key(1, "fc.weight")), b(stream_key(1, "fc.weight"));
  for (std::uint64_t i : {0ull, 1ull, 77ull, 1ull << 40}) {
    CHECK(a.bits(i) == b.bits(i));
    CHECK(a.uniform01(i) == b.uniform01(i));
  }
  CHECK(stream_key(1, "fc.weight") != stream_key(1, "fc.bias"));
  CHECK(stream_key(1, "fc.weight") != stream_key(2, "fc.weight"));
  std::set<std::uint64_t> seen;
  for (std::uint64_t i = 0; i < 1000; ++i) seen.insert(a.bits(i));
  CHECK(seen.size() == 1000);
  // Two streams do not move together: their uniforms are uncorrelated.
  const random_stream c(stream_key(1, "fc.bias"));
  double sab = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) sab += (a.uniform01(std::uint64_t(i)) - 0.5) * (c.uniform01(std::uint64_t(i)) - 0.5);
  CHECK(std::abs(sab / n) < 0.002);  // 1/12 would be full correlation
}

TEST_CASE("random_stream: uniform in [0, 1) and standard normal") {
  const random_stream s(42);
  const int n = 400000;
  double su = 0, su2 = 0, sn = 0, sn2 = 0, sn4 = 0;
  double lo = 1, hi = 0;
  for (int i = 0; i < n; ++i) {
    const double u = s.uniform01(std::uint64_t(i)), z = s.normal(std::uint64_t(i));
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    su += u;
    su2 += u * u;
    sn += z;
    sn2 += z * z;
    sn4 += z * z * z * z;
  }
  CHECK(lo >= 0.0);
  CHECK(hi < 1.0);
  CHECK(su / n == doctest::Approx(0.5).epsilon(0.005));
  CHECK(su2 / n - (su / n) * (su / n) == doctest::Approx(1.0 / 12).epsilon(0.01));
  CHECK(std::abs(sn / n) < 0.005);
  CHECK(sn2 / n == doctest::Approx(1.0).epsilon(0.01));
  CHECK(sn4 / n == doctest::Approx(3.0).epsilon(0.03));  // a normal's kurtosis
}

TEST_CASE("compute_fans: MindSpore's fan_in and fan_out") {
  CHECK(compute_fans(extents{512, 784}, "x").in == 784);
  CHECK(compute_fans(extents{512, 784}, "x").out == 512);
  CHECK(compute_fans(extents{64, 3, 5, 5}, "x").in == 75);
  CHECK(compute_fans(extents{64, 3, 5, 5}, "x").out == 1600);
  CHECK_THROWS_WITH(initializer::xavier_uniform().draw(extents{512}, 0),
                    "xavier_uniform: fan_in and fan_out need a tensor of at least 2 dims, got (512,)");
}

TEST_CASE("initializers: constants, normal, uniform, Xavier and He as MindSpore defines them") {
  const extents w{300, 200};  // fan_in 200, fan_out 300
  const std::uint64_t n = 60000;
  CHECK(draw(initializer::zeros(), w, 1, 100).hi == 0.0);
  CHECK(draw(initializer::ones(), w, 1, 100).lo == 1.0);
  CHECK(draw(initializer::constant(2.5), w, 1, 100).mean == 2.5);

  const moments nm = draw("normal", w, 3, n);  // N(0, 0.01^2)
  CHECK(std::abs(nm.mean) < 2e-4);
  CHECK(std::sqrt(nm.var) == doctest::Approx(0.01).epsilon(0.02));
  const moments nm2 = draw(initializer::normal(2.0, 1.0), w, 3, n);
  CHECK(nm2.mean == doctest::Approx(1.0).epsilon(0.02));
  CHECK(std::sqrt(nm2.var) == doctest::Approx(2.0).epsilon(0.02));

  auto check_uniform = [&](const initializer& i, double bound) {
    const moments m = draw(i, w, 5, n);
    CHECK(m.lo >= -bound);
    CHECK(m.hi < bound);
    CHECK(m.hi > 0.99 * bound);
    CHECK(m.var == doctest::Approx(bound * bound / 3).epsilon(0.02));
  };
  check_uniform("uniform", 0.07);
  check_uniform(initializer::xavier_uniform(), std::sqrt(6.0 / 500));
  check_uniform(initializer::xavier_uniform(2.0), 2 * std::sqrt(6.0 / 500));
  check_uniform("he_uniform", std::sqrt(2.0) * std::sqrt(3.0 / 200));
  check_uniform(initializer::he_uniform(std::sqrt(5.0)), 1 / std::sqrt(200.0));  // Dense's default
  check_uniform(initializer::he_uniform(0, false), std::sqrt(2.0) * std::sqrt(3.0 / 300));

  auto check_normal = [&](const initializer& i, double sigma) {
    const moments m = draw(i, w, 7, n);
    CHECK(std::abs(m.mean) < 0.02 * sigma);
    CHECK(std::sqrt(m.var) == doctest::Approx(sigma).epsilon(0.02));
  };
  check_normal("xavier_normal", std::sqrt(2.0 / 500));
  check_normal("he_normal", std::sqrt(2.0) / std::sqrt(200.0));
  check_normal(initializer::he_normal(1.0), 1 / std::sqrt(200.0));
}

TEST_CASE("initializers: values, names and errors") {
  const auto d = initializer::values({1, 2, 3, 4, 5, 6}).draw(extents{2, 3}, 9);
  for (int i = 0; i < 6; ++i) CHECK(d(std::uint64_t(i)) == i + 1);
  CHECK_THROWS_WITH(initializer::values({1, 2}).draw(extents{2, 3}, 0),
                    "initializer: values: 2 values for a tensor of shape (2, 3) (6 elements)");
  CHECK(initializer("zeros").type() == initializer::kind::constant);
  CHECK(initializer("he_normal").type() == initializer::kind::he_normal);
  CHECK_THROWS_WITH(initializer("gaussian"),
                    "initializer: unknown name 'gaussian'; expected zeros, ones, normal, uniform, xavier_uniform, "
                    "xavier_normal, he_uniform or he_normal");
}
