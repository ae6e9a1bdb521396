// Tests of kernels/cpu/shape.hpp: transpose, strided_slice, concat, split and reshape
// against naive index loops, and the backward of each against finite differences.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <tessera/kernels/cpu/shape.hpp>

#include "finite_difference.hpp"

namespace cpu = tessera::kernels::cpu;
using namespace kernel_test;
using tessera::index_t;

namespace {

using array = xt::xarray<double>;

constexpr index_t big = std::numeric_limits<index_t>::max();
constexpr index_t small = std::numeric_limits<index_t>::min();

// 0, 1, 2, ... in the given shape.
array iota(const shape_t& shape) {
  array x = array::from_shape(shape);
  std::iota(x.begin(), x.end(), 0.0);
  return x;
}

array zeros(const shape_t& shape) {
  array x = array::from_shape(shape);
  x.fill(0.0);
  return x;
}

// The indices Python's range(n)[b:e:s] visits.
std::vector<std::size_t> python_slice(index_t n, index_t b, index_t e, index_t s) {
  if (b < 0) b += n;
  if (e < 0) e += n;
  std::vector<std::size_t> out;
  if (s > 0) {
    b = std::clamp<index_t>(b, 0, n);
    e = std::clamp<index_t>(e, 0, n);
    for (index_t i = b; i < e; i += s) out.push_back(std::size_t(i));
  } else {
    b = std::clamp<index_t>(b, -1, n - 1);
    e = std::clamp<index_t>(e, -1, n - 1);
    for (index_t i = b; i > e; i += s) out.push_back(std::size_t(i));
  }
  return out;
}

struct slice_case {
  shape_t shape;
  std::vector<index_t> begin, end, strides;
};

// x[...] by gathering the cartesian product of each dim's visited indices.
array naive_slice(const array& x, const slice_case& c) {
  const shape_t xs = shape_of(x);
  std::vector<std::vector<std::size_t>> picks(xs.size());
  shape_t out(xs.size());
  for (std::size_t d = 0; d < xs.size(); ++d) {
    if (d < c.begin.size())
      picks[d] =
          python_slice(index_t(xs[d]), c.begin[d], c.end[d], c.strides.empty() ? 1 : c.strides[d]);
    else
      for (std::size_t i = 0; i < xs[d]; ++i) picks[d].push_back(i);
    out[d] = picks[d].size();
  }
  array y = array::from_shape(out);
  for (std::size_t i = 0; i < y.size(); ++i) {
    auto idx = unravel(i, out);
    for (std::size_t d = 0; d < idx.size(); ++d) idx[d] = picks[d][idx[d]];
    y.data()[i] = x.data()[ravel(idx, xs)];
  }
  return y;
}

}  // namespace

TEST_CASE("transpose moves dim perm[d] of x to dim d, for every permutation") {
  const array x = iota({2, 3, 4});
  std::vector<int> perm = {0, 1, 2};
  do {
    CAPTURE(perm[0]);
    CAPTURE(perm[1]);
    const array y = cpu::transpose(x, perm);
    const shape_t ys = {x.shape()[std::size_t(perm[0])], x.shape()[std::size_t(perm[1])],
                        x.shape()[std::size_t(perm[2])]};
    REQUIRE(shape_of(y) == ys);
    for (std::size_t i = 0; i < y.size(); ++i) {
      const auto idx = unravel(i, ys);
      std::vector<std::size_t> j(3);
      for (std::size_t d = 0; d < 3; ++d) j[std::size_t(perm[d])] = idx[d];
      CHECK(y.data()[i] == x.data()[ravel(j, shape_of(x))]);
    }
    CHECK(cpu::transpose_grad(y, perm) == x);
    CHECK(
        gradient_error([&](const array& v) { return cpu::transpose(v, perm); },
                       [&](const array& dy, const array&) { return cpu::transpose_grad(dy, perm); },
                       random_array({2, 3, 4}, 1)) < 1e-6);
  } while (std::next_permutation(perm.begin(), perm.end()));
  CHECK(cpu::transpose(x, {-1, 0, 1}) == cpu::transpose(x, {2, 0, 1}));
  CHECK(cpu::transpose(array(4.0), {})() == 4.0);
  CHECK(thrown([] {
          cpu::transpose(iota({3, 4}), {0, 0});
        }) == "transpose: perm [0, 0] is not a permutation of the 2 dims of (3, 4)");
  CHECK(thrown([] {
          cpu::transpose(iota({3, 4}), {1, 0, 2});
        }) == "transpose: perm [1, 0, 2] is not a permutation of the 2 dims of (3, 4)");
  CHECK(thrown([] {
          cpu::transpose(iota({3, 4}), {0, 2});
        }) == "transpose: perm [0, 2] is not a permutation of the 2 dims of (3, 4)");
}

TEST_CASE("strided_slice follows Python slicing; its gradient scatters into zeros") {
  const std::vector<slice_case> cases = {
      {{6}, {4}, {-7}, {-2}},               // 4, 2, 0
      {{4, 5, 6}, {1, 0}, {3, 5}, {1, 2}},  // the last dim whole
      {{4, 5, 6}, {-1, 4, 5}, {small, -6, 0}, {-1, -2, -3}},
      {{4, 5, 6}, {0, 0, 0}, {big, big, big}, {}},  // everything
      {{4, 5, 6}, {3}, {1}, {1}},                   // empty
      {{4, 5, 6}, {10, -10}, {20, 2}, {1, 1}},      // clamped: empty dim 0, dim 1 = 0, 1
      {{4, 5, 6}, {}, {}, {}},
      {{3, 7}, {2, 1}, {-5, big}, {-1, 3}},
  };
  std::uint64_t seed = 1;
  for (const auto& c : cases) {
    CAPTURE(c.shape.size());
    CAPTURE(c.begin.size());
    const array x = iota(c.shape);
    const array y = cpu::strided_slice(x, c.begin, c.end, c.strides);
    const array expected = naive_slice(x, c);
    REQUIRE(shape_of(y) == shape_of(expected));
    CHECK(y == expected);
    const array dy = random_array(shape_of(y), seed++);
    const array dx = cpu::strided_slice_grad(dy, x.shape(), c.begin, c.end, c.strides);
    // Each sliced position gets its dy, the rest 0: slicing the gradient gives dy
    // back, and it holds no more than dy does.
    CHECK(cpu::strided_slice(dx, c.begin, c.end, c.strides) == dy);
    double total = 0, total_dy = 0;
    for (double v : dx) total += std::abs(v);
    for (double v : dy) total_dy += std::abs(v);
    CHECK(total == doctest::Approx(total_dy));
    if (y.size() == 0) continue;
    CHECK(gradient_error(
              [&](const array& v) { return cpu::strided_slice(v, c.begin, c.end, c.strides); },
              [&](const array& g, const array& v) {
                return cpu::strided_slice_grad(g, v.shape(), c.begin, c.end, c.strides);
              },
              random_array(c.shape, seed++)) < 1e-6);
  }
  CHECK(cpu::strided_slice(iota({6}), {4}, {-7}, {-2}) == array{4.0, 2.0, 0.0});
  CHECK(thrown([] {
          cpu::strided_slice(iota({4, 5}), {0, 0}, {2, 2}, {1, 0});
        }) == "strided_slice: strides [1, 0] has 0 at dim 1");
  CHECK(thrown([] {
          cpu::strided_slice(iota({4, 5}), {0, 0}, {2}, {});
        }) ==
        "strided_slice: begin, end and strides must have the same length: begin [0, 0], end [2], "
        "strides []");
  CHECK(thrown([] {
          cpu::strided_slice(iota({4}), {0, 0}, {2, 2});
        }) == "strided_slice: begin [0, 0] slices 2 dims, x (4,) has rank 1");
  CHECK(thrown([] { cpu::strided_slice_grad(iota({3}), {6}, {0}, {2}); }) ==
        "strided_slice_grad: dy is (3,), expected (2,), the slice's shape for input (6,)");
}

TEST_CASE("concat joins along an axis and split cuts back") {
  const array a = random_array({2, 3, 4}, 1), b = random_array({2, 1, 4}, 2),
              c = random_array({2, 5, 4}, 3);
  const array y = cpu::concat({a, b, c}, 1);
  REQUIRE(shape_of(y) == shape_t{2, 9, 4});
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t k = 0; k < 4; ++k) {
      for (std::size_t j = 0; j < 3; ++j) CHECK(y(i, j, k) == a(i, j, k));
      CHECK(y(i, 3, k) == b(i, 0, k));
      for (std::size_t j = 0; j < 5; ++j) CHECK(y(i, 4 + j, k) == c(i, j, k));
    }
  const auto parts = cpu::split(y, {3, 1, 5}, 1);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0] == a);
  CHECK(parts[1] == b);
  CHECK(parts[2] == c);
  // Axis 0 and the last axis (negative), from a vector of inputs.
  const std::vector<array> rows = {random_array({1, 3}, 4), random_array({2, 3}, 5)};
  const array r = cpu::concat(rows, 0);
  CHECK(cpu::split(r, {1, 2}) == rows);
  const std::vector<array> cols = {random_array({2, 2}, 6), random_array({2, 0}, 7),
                                   random_array({2, 1}, 8)};
  const array cc = cpu::concat(cols, -1);
  CHECK(shape_of(cc) == shape_t{2, 3});
  CHECK(cc(1, 2) == cols[2](1, 0));
  CHECK(cpu::split(cc, {2, 0, 1}, -1) == cols);
  // The backward of concat is split, and of split is concat.
  CHECK(gradient_error(
            [&](const array& v) {
              return cpu::concat({a, v, c}, 1);
            },
            [&](const array& dy, const array&) {
              return cpu::split(dy, {3, 1, 5}, 1)[1];
            },
            b) < 1e-6);
  CHECK(gradient_error(
            [&](const array& v) {
              return cpu::split(v, {3, 1, 5}, 1)[2];
            },
            [&](const array& dy, const array&) {
              return cpu::concat({zeros({2, 3, 4}), zeros({2, 1, 4}), dy}, 1);
            },
            y) < 1e-6);
  const auto thirds = cpu::split_equal(y, 3, 1);
  REQUIRE(thirds.size() == 3);
  CHECK(cpu::concat(thirds, 1) == y);
  CHECK(
      thrown([&] {
        cpu::concat({a, random_array({2, 3, 5}, 9)}, 1);
      }) ==
      "concat: input 1 is (2, 3, 5), input 0 is (2, 3, 4): the dims other than axis 1 must agree");
  CHECK(thrown([&] {
          cpu::concat({a, random_array({2, 3}, 9)}, 0);
        }) ==
        "concat: input 1 is (2, 3), input 0 is (2, 3, 4): the dims other than axis 0 must agree");
  CHECK(thrown([&] { cpu::concat(std::vector<array>{}, 0); }) ==
        "concat: needs at least one input");
  CHECK(thrown([&] { cpu::concat({a}, 3); }) ==
        "concat: axis 3 is out of range for a tensor of rank 3");
  CHECK(thrown([&] {
          cpu::split(random_array({4, 6}, 1), {2, 3});
        }) == "split: sizes [2, 3] add up to 5, x (4, 6) has extent 4 at axis 0");
  CHECK(thrown([&] {
          cpu::split_equal(random_array({4, 6}, 1), 4, 1);
        }) == "split_equal: extent 6 at axis 1 of x (4, 6) does not split into 4 equal pieces");
}

TEST_CASE("reshape keeps the row-major order; one dim may be -1") {
  const array x = iota({2, 3, 4});
  const array y = cpu::reshape(x, {6, -1});
  REQUIRE(shape_of(y) == shape_t{6, 4});
  CHECK(std::equal(x.begin(), x.end(), y.begin()));
  CHECK(shape_of(cpu::reshape(x, {24})) == shape_t{24});
  CHECK(shape_of(cpu::reshape(array(1.0), {1, 1})) == shape_t{1, 1});
  CHECK(shape_of(cpu::reshape(iota({1, 1}), {})) == shape_t{});
  // An rvalue keeps its buffer.
  array moved = iota({2, 3, 4});
  const double* data = moved.data();
  const array r = cpu::reshape(std::move(moved), {4, -1, 2});
  CHECK(shape_of(r) == shape_t{4, 3, 2});
  CHECK(r.data() == data);
  CHECK(thrown([&] {
          cpu::reshape(iota({2, 3}), {4, 2});
        }) == "reshape: cannot reshape (2, 3) (6 elements) to [4, 2] (8 elements)");
  CHECK(thrown([&] {
          cpu::reshape(iota({2, 3}), {4, -1});
        }) ==
        "reshape: cannot reshape (2, 3) (6 elements) to [4, -1]: no extent for the -1 dim gives 6 "
        "elements");
  CHECK(thrown([&] {
          cpu::reshape(iota({2, 3}), {-1, -1});
        }) == "reshape: cannot reshape (2, 3) (6 elements) to [-1, -1]: at most one dim may be -1");
  CHECK(thrown([&] {
          cpu::reshape(iota({2, 3}), {-2, -3});
        }) == "reshape: cannot reshape (2, 3) (6 elements) to [-2, -3]: a dim is negative");
}
