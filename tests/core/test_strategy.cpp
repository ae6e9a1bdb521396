// Tests of core/strategy.hpp: split tuples and strategies (checks, exact error text),
// the layouts MindSpore builds from them, tensor maps both ways, and the text form
// of a strategy: every value form round-trips through to_string and parse_strategy,
// and malformed text (overflow, missing commas, nesting, trailing text, negative
// numbers) is an error with the position.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/strategy.hpp>

namespace core_test_strategy {  // the file's own scope in its test group's translation unit

using namespace tessera;

namespace {

std::string text(const status& s) { return error(s).what(); }

// Every split tuple of 0..max_dims entries, each a divisor of n, whose product divides n.
std::vector<split_tuple> tuples_dividing(int n, int max_dims) {
  std::vector<int> divisors;
  for (int k = 1; k <= n; ++k)
    if (n % k == 0) divisors.push_back(k);
  std::vector<split_tuple> out{split_tuple{}};
  std::vector<split_tuple> frontier{split_tuple{}};
  for (int dims = 1; dims <= max_dims; ++dims) {
    std::vector<split_tuple> next;
    for (const split_tuple& s : frontier)
      for (int k : divisors)
        if (n % (s.product() * k) == 0) {
          split_tuple t = s;
          t.v[t.n++] = k;
          next.push_back(t);
        }
    out.insert(out.end(), next.begin(), next.end());
    frontier = next;
  }
  return out;
}

// The message of the tessera::error that f throws ("" if none).
template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- split tuples and strategies ------------------------------------------------------

TEST_CASE("split_tuple and strategy: construction") {
  const split_tuple s{2, 4};
  CHECK(s.size() == 2);
  CHECK(s[0] == 2);
  CHECK(s[1] == 4);
  CHECK(s.product() == 8);
  CHECK(split_tuple{}.product() == 1);
  const strategy st{{2, 4}, {4, 1}};
  CHECK(st.size() == 2);
  CHECK(st[0] == split_tuple{2, 4});
  CHECK(st[1] == split_tuple{4, 1});
  CHECK_FALSE(st == strategy{{2, 4}, {1, 4}});
}

TEST_CASE("split_tuple and strategy: check") {
  CHECK(check(split_tuple{2, 4}, 8).ok());
  CHECK(check(split_tuple{2, 1}, 8).ok());
  CHECK(check(split_tuple{}, 1).ok());
  CHECK(check(strategy{{2, 4}, {4, 1}}, 8).ok());
  CHECK(check(strategy{{8, 1}, {1, 1}}, 8).ok());

  SUBCASE("a zero split") {
    const status s = check(split_tuple{2, 0}, 8);
    CHECK(s == fail(errc::strategy_split, 0, 1, 0));
    CHECK(text(s) == "strategy: every split must be positive: input 0, dim 1: split 0");
    CHECK(text(check(strategy{{2, 4}, {-1, 1}}, 8)) ==
          "strategy: every split must be positive: input 1, dim 0: split -1");
  }
  SUBCASE("a product that does not divide the device count") {
    const status s = check(split_tuple{2, 3}, 8);
    CHECK(s == fail(errc::strategy_device_num, 0, -1, 6, 8));
    CHECK(text(s) == "strategy: the product of an input's splits must divide the device count: "
                     "input 0: product of splits 6, device count 8");
    CHECK(text(check(strategy{{2, 4}, {3, 1}}, 8)) ==
          "strategy: the product of an input's splits must divide the device count: "
          "input 1: product of splits 3, device count 8");
    CHECK(text(check(split_tuple{2, 4}, 4)) ==
          "strategy: the product of an input's splits must divide the device count: "
          "input 0: product of splits 8, device count 4");
    CHECK(check(split_tuple{1}, 0).code == errc::strategy_device_num);
  }
  SUBCASE("a product beyond an int: computed in 64 bits, saturating") {
    const int big = 1 << 30;
    CHECK(check(split_tuple{big, 4}, 8) == fail(errc::strategy_device_num, 0, -1, std::int64_t(big) * 4, 8));
    CHECK(check(split_tuple{big, big, big}, 8) == fail(errc::strategy_device_num, 0, -1, INT64_MAX, 8));
    CHECK(check(split_tuple{big, 1}, big).ok());
  }
  SUBCASE("too many entries") {
    CHECK(text(check(split_tuple{1, 1, 1, 1, 1, 1, 1}, 8)) ==
          "strategy: each input's split tuple must have between 0 and max_tensor_ndim entries: "
          "input 0 has 7 entries");
  }
}

// ---- strategy <-> layout --------------------------------------------------------------

TEST_CASE("strategy_layout: the header's examples") {
  SUBCASE("(2, 1) on 8 devices: a replica axis first") {
    const layout l = strategy_layout(split_tuple{2, 1}, 8);
    CHECK(l.dev == mesh{4, 2, 1});
    CHECK(l == layout(mesh{4, 2, 1}, {{1}, {2}}));
    CHECK(check(l).ok());
    CHECK(l.replica_axes() == 1u);
    const extents g{16, 4};
    CHECK(local_offset(l, g, 0) == extents{0, 0});
    CHECK(local_offset(l, g, 1) == extents{8, 0});
    CHECK(local_offset(l, g, 2) == extents{0, 0});
    CHECK(local_shape(l, g) == extents{8, 4});
  }
  SUBCASE("(2, 4) on 8 devices: no replica axis") {
    const layout l = strategy_layout(split_tuple{2, 4}, 8);
    CHECK(l == layout(mesh{2, 4}, {{0}, {1}}));
    CHECK(l.replica_axes() == 0u);
  }
  SUBCASE("more shapes") {
    CHECK(strategy_layout(split_tuple{8, 1}, 8) == layout(mesh{8, 1}, {{0}, {1}}));
    CHECK(strategy_layout(split_tuple{1}, 8) == layout(mesh{8, 1}, {{1}}));
    CHECK(strategy_layout(split_tuple{4, 1}, 8) == layout(mesh{2, 4, 1}, {{1}, {2}}));
    CHECK(strategy_layout(split_tuple{}, 8) == layout::replicated(mesh{8}, 0));
    CHECK(strategy_layout(split_tuple{1, 1}, 1) == layout(mesh{1, 1}, {{0}, {1}}));
  }
  SUBCASE("a scalar on one device still gets a mesh") {
    const layout l = strategy_layout(split_tuple{}, 1);
    CHECK(check(l).ok());
    CHECK(l.dev.size() == 1);
    CHECK(l.ndim == 0);
  }
}

TEST_CASE("strategy_layout: round trip for every tuple whose product divides 8") {
  for (int n : {1, 2, 4, 8}) {
    for (const split_tuple& s : tuples_dividing(n, 3)) {
      CAPTURE(n);
      CAPTURE(to_string(s));
      REQUIRE(check(s, n).ok());
      const layout l = strategy_layout(s, n);
      CHECK(check(l).ok());
      CHECK(l.dev.size() == n);
      CHECK(l.ndim == s.n);
      CHECK(to_split_tuple(l) == s);
      CHECK_FALSE(l.has_partial());
      // A shape of 8 per dim: shards of size 8 / split, and n / product replicas.
      extents g;
      g.ndim = s.n;
      for (int d = 0; d < s.n; ++d) g.v[d] = 8;
      REQUIRE(check(l, g).ok());
      for (int d = 0; d < s.n; ++d) CHECK(local_shape(l, g).v[d] == 8 / s.v[d]);
      int replicas = 1;
      for (int a = 0; a < l.dev.ndim; ++a)
        if (l.replica_axes() >> a & 1u) replicas *= l.dev.dims[a];
      CHECK(replicas == n / s.product());
    }
  }
  CHECK(tuples_dividing(8, 3).size() == 1 + 4 + 10 + 20);
}

TEST_CASE("to_split_tuple: pieces per dim of any layout") {
  const mesh m{2, 4};
  CHECK(to_split_tuple(layout(m, {{1, 0}, {}})) == split_tuple{8, 1});
  CHECK(to_split_tuple(layout(m, {{}, {0}}).with_partial(1)) == split_tuple{1, 2});
  CHECK(to_split_tuple(layout::replicated(m, 3)) == split_tuple{1, 1, 1});
}

// ---- tensor maps --------------------------------------------------------------------

TEST_CASE("tensor_map: the MindSpore MatMul example") {
  // MatMul().shard(((2, 4), (4, 1))) on 8 devices: device matrix (2, 4, 1),
  // A (m x k) mapped by (2, 1), B (k x n) by (1, 0).
  const mesh dm{2, 4, 1};
  const layout a = from_tensor_map(dm, tensor_map{2, 1});
  const layout b = from_tensor_map(dm, tensor_map{1, 0});
  CHECK(a == layout(dm, {{0}, {1}}));
  CHECK(b == layout(dm, {{1}, {2}}));
  CHECK(to_split_tuple(a) == split_tuple{2, 4});
  CHECK(to_split_tuple(b) == split_tuple{4, 1});
  CHECK(to_tensor_map(a) == tensor_map{2, 1});
  CHECK(to_tensor_map(b) == tensor_map{1, 0});
  CHECK(check(tensor_map{2, 1}, dm).ok());
  CHECK(check(tensor_map{1, 0}, dm).ok());
  // The contraction dim k is split by the same device-matrix axis in A and B.
  CHECK(a.split[1] == b.split[0]);
}

TEST_CASE("tensor_map: unsplit and multi-value entries") {
  const mesh dm{2, 4};
  CHECK(from_tensor_map(dm, tensor_map{-1, 0}) == layout(dm, {{}, {1}}));
  CHECK(to_tensor_map(layout(dm, {{}, {1}})) == tensor_map{-1, 0});
  CHECK(tensor_map{-1, 0} == tensor_map{{}, {0}});
  CHECK(tensor_map{{}, {1}} == tensor_map{-1, 1});  // {} is "not split", never the value 0
  CHECK(tensor_map{{2, 1}, -1}.v[0] == axis_list{2, 1});
  CHECK(tensor_map{-1, -1}.v[0].empty());

  // Several values per dim: the dim is split by several axes, major first.
  const mesh dm3{2, 4, 1};
  CHECK(from_tensor_map(dm3, tensor_map{{2, 1}, {}}) == layout(dm3, {{0, 1}, {}}));
  CHECK(from_tensor_map(dm3, tensor_map{{1, 2}, {}}) == layout(dm3, {{1, 0}, {}}));
  CHECK(to_tensor_map(layout(dm, {{1, 0}, {}})) == tensor_map{{0, 1}, {}});
  CHECK(to_split_tuple(from_tensor_map(dm, tensor_map{{0, 1}, {}})) == split_tuple{8, 1});
  CHECK(check(tensor_map{{2, 1}, {}}, dm3).ok());
}

TEST_CASE("tensor_map: round trip for every layout on (2, 4) and (2, 2, 2)") {
  for (const mesh& m : {mesh{2, 4}, mesh{2, 2, 2}}) {
    for (int ndim = 0; ndim <= 3; ++ndim) {
      int count = 0;
      for_each_layout(m, ndim, false, [&](const layout& l) {
        CAPTURE(to_string(m));
        CAPTURE(to_string(l));
        const tensor_map map = to_tensor_map(l);
        CHECK(map.ndim == ndim);
        CHECK(check(map, m).ok());
        CHECK(from_tensor_map(m, map) == l);
        CHECK(to_tensor_map(from_tensor_map(m, map)) == map);
        // Map value v names axis ndim - 1 - v.
        for (int d = 0; d < ndim; ++d)
          for (int i = 0; i < map.v[d].n; ++i) CHECK(l.split[d].v[i] == m.ndim - 1 - map.v[d].v[i]);
        ++count;
      });
      CHECK(count > 0);
    }
  }
  // Partial axes are not part of a tensor map.
  const layout p = layout(mesh{2, 4}, {{0}, {}}).with_partial(1);
  CHECK(to_tensor_map(p) == tensor_map{1, -1});
  CHECK(from_tensor_map(p.dev, to_tensor_map(p)) == p.without_partial());
}

TEST_CASE("tensor_map: check errors") {
  const mesh dm{2, 4};
  const status s = check(tensor_map{2, 0}, dm);
  CHECK(s == fail(errc::tensor_map_value, 0, -1, 2, 2));
  CHECK(text(s) == "tensor_map: each entry must be -1 or name a device-matrix axis: "
                   "dim 0 maps to 2, device matrix has 2 axes");
  CHECK(text(check(tensor_map{0, -2}, dm)) ==
        "tensor_map: each entry must be -1 or name a device-matrix axis: "
        "dim 1 maps to -2, device matrix has 2 axes");
  CHECK(text(check(tensor_map{{1, 5}, {}}, dm)) ==
        "tensor_map: each entry must be -1 or name a device-matrix axis: "
        "dim 0 maps to 5, device matrix has 2 axes");
  CHECK(check(tensor_map{0}, mesh{}).code == errc::mesh_ndim);
  CHECK(check(tensor_map{0, 0, 0, 0, 0, 0, 0}, dm).code == errc::layout_ndim);
}

// ---- text form ------------------------------------------------------------------------

TEST_CASE("strategy: to_string") {
  CHECK(to_string(split_tuple{2, 4}) == "(2, 4)");
  CHECK(to_string(split_tuple{1}) == "(1,)");
  CHECK(to_string(split_tuple{}) == "()");
  CHECK(to_string(strategy{{2, 4}, {4, 1}}) == "((2, 4), (4, 1))");
  CHECK(to_string(strategy{{1}}) == "((1,),)");
  CHECK(to_string(strategy{}) == "()");
}

TEST_CASE("strategy: parse_strategy and to_string round trip") {
  for (const char* s : {"((2, 4), (4, 1))", "((8, 1), (1, 1))", "((1,),)", "((2, 4),)",
                        "((16, 1, 2), (1,), (4, 4))", "()", "((),)", "((), ())", "((1, 1, 1, 1, 1, 1),)",
                        "((1073741824,),)", "((1,), (1,), (1,), (1,), (1,), (1,), (1,), (1,))"}) {
    CAPTURE(s);
    CHECK(to_string(parse_strategy(s)) == s);
  }
  CHECK(parse_strategy("((2, 4), (4, 1))") == strategy{{2, 4}, {4, 1}});
  CHECK(parse_strategy("((1,),)") == strategy{{1}});
  CHECK(parse_strategy("[[2, 4], [4, 1]]") == strategy{{2, 4}, {4, 1}});
  CHECK(parse_strategy("([2, 4], (4, 1))") == strategy{{2, 4}, {4, 1}});
  CHECK(parse_strategy("((2,4),(4,1))") == strategy{{2, 4}, {4, 1}});
  CHECK(parse_strategy(" ( (2,\t4) ,\n(4, 1,) ) ") == strategy{{2, 4}, {4, 1}});
  CHECK(parse_strategy("\r\n((10, 12),)\n") == strategy{{10, 12}});
  CHECK(parse_strategy("((8))") == strategy{{8}});  // without trailing commas: Python's (8) is 8, tessera reads a tuple
  CHECK(parse_strategy("((007, 1),)") == strategy{{7, 1}});
  // Every value form survives the text form: strategies of 0 to 3 inputs built from
  // the split tuples of 0 to 3 dims that divide 8 or 12.
  for (int n : {8, 12}) {
    const std::vector<split_tuple> ts = tuples_dividing(n, 3);
    CHECK(parse_strategy(to_string(strategy{})) == strategy{});
    for (std::size_t i = 0; i < ts.size(); ++i) {
      CHECK(parse_strategy(to_string(strategy{ts[i]})) == strategy{ts[i]});
      for (std::size_t j = 0; j < ts.size(); j += 3) {
        const strategy two{ts[i], ts[j]};
        CHECK(parse_strategy(to_string(two)) == two);
        const strategy three{ts[j], ts[i], ts[(i + j) % ts.size()]};
        CHECK(parse_strategy(to_string(three)) == three);
      }
    }
  }
}

TEST_CASE("strategy: parse errors give the position") {
  struct bad {
    const char* text;
    const char* message;
  };
  const bad cases[] = {
      // empty text, missing and extra brackets, trailing text
      {"", "parse_strategy: expected '(' or '[', found the end at character 0 in \"\""},
      {"   ", "parse_strategy: expected '(' or '[', found the end at character 3 in \"   \""},
      {"((2, 4), (4, 1)", "parse_strategy: expected ',' or ')', found the end at character 15 in \"((2, 4), (4, 1)\""},
      {"((2, 4)))", "parse_strategy: unexpected ')' after the strategy at character 8 in \"((2, 4)))\""},
      {"((2, 4)) x", "parse_strategy: unexpected 'x' after the strategy at character 9 in \"((2, 4)) x\""},
      {"((2, 4),) ((1,),)", "parse_strategy: unexpected '(' after the strategy at character 10 in \"((2, 4),) ((1,),)\""},
      {"((2, 4])", "parse_strategy: expected ',' or ')', found ']' at character 6 in \"((2, 4])\""},
      {"[(2, 4))", "parse_strategy: expected ',' or ']', found ')' at character 7 in \"[(2, 4))\""},
      // missing or doubled commas
      {"((2 4))", "parse_strategy: expected ',' or ')', found '4' at character 4 in \"((2 4))\""},
      {"((2, 4) (4, 1))", "parse_strategy: expected ',' or ')', found '(' at character 8 in \"((2, 4) (4, 1))\""},
      {"((2,, 4),)", "parse_strategy: expected a split, found ',' at character 4 in \"((2,, 4),)\""},
      {"((,),)", "parse_strategy: expected a split, found ',' at character 2 in \"((,),)\""},
      {"(,)", "parse_strategy: expected a split tuple such as (2, 4), found ',' at character 1 in \"(,)\""},
      // not numbers
      {"((2, x))", "parse_strategy: expected a split, found 'x' at character 5 in \"((2, x))\""},
      {"((two, 4),)", "parse_strategy: expected a split, found 't' at character 2 in \"((two, 4),)\""},
      {"((2.5,),)", "parse_strategy: expected ',' or ')', found '.' at character 3 in \"((2.5,),)\""},
      {"((2,\x01),)", "parse_strategy: expected a split, found byte 0x01 at character 4 in \"((2,\x01),)\""},
      // nesting
      {"(((2, 4)))", "parse_strategy: tuples nested deeper than two levels: expected a split, found '(' at character 2 in "
                     "\"(((2, 4)))\""},
      {"((2, (4,)),)", "parse_strategy: tuples nested deeper than two levels: expected a split, found '(' at character 5 in "
                       "\"((2, (4,)),)\""},
      {"(2, 4)", "parse_strategy: expected a split tuple such as (2, 4), found '2' at character 1 in \"(2, 4)\""},
      {"2", "parse_strategy: expected '(' or '[', found '2' at character 0 in \"2\""},
      // negative numbers, zero
      {"((2, -4),)", "parse_strategy: expected a split, found the negative number -4 at character 5 in \"((2, -4),)\""},
      {"((-1,),)", "parse_strategy: expected a split, found the negative number -1 at character 2 in \"((-1,),)\""},
      {"((2, -),)", "parse_strategy: expected a split, found '-' at character 5 in \"((2, -),)\""},
      {"((2, 0),)", "parse_strategy: strategy: every split must be positive: input 0, dim 1: split 0; in \"((2, 0),)\""},
      {"((1,), (0, 1))",
       "parse_strategy: strategy: every split must be positive: input 1, dim 0: split 0; in \"((1,), (0, 1))\""},
      // overflow: no split wraps around
      {"((3000000000,))",
       "parse_strategy: expected a split no larger than 1073741824, found 3000000000 at character 2 in \"((3000000000,))\""},
      {"((2, 1073741825),)",
       "parse_strategy: expected a split no larger than 1073741824, found 1073741825 at character 5 in \"((2, 1073741825),)\""},
      {"((99999999999999999999999999,),)",
       "parse_strategy: expected a split no larger than 1073741824, found 99999999999999999999999999 at character 2 in "
       "\"((99999999999999999999999999,),)\""},
      // limits
      {"((1, 1, 1, 1, 1, 1, 1),)",
       "parse_strategy: more than max_tensor_ndim = 6 dims in one split tuple at character 20 in \"((1, 1, 1, 1, 1, 1, 1),)\""},
      {"((1,), (1,), (1,), (1,), (1,), (1,), (1,), (1,), (1,))",
       "parse_strategy: more than max_strategy_inputs = 8 inputs at character 49 in \"((1,), (1,), (1,), (1,), (1,), "
       "(1,), (1,), (1,), (1,))\""},
  };
  for (const bad& b : cases) {
    CAPTURE(b.text);
    CHECK(thrown([&] { parse_strategy(b.text); }) == b.message);
  }
  CHECK(thrown([] { parse_strategy("((2, 4), (4, 1))"); }).empty());
  // Huge splits that parse are still checked without overflow.
  const strategy huge = parse_strategy("((1073741824, 1073741824, 1073741824),)");
  CHECK(text(check(huge, 8)) == "strategy: the product of an input's splits must divide the device count: input 0: "
                                "product of splits 9223372036854775807, device count 8");
  CHECK(thrown([] { parse_strategy(std::string(100000, '(')); }) ==
        "parse_strategy: tuples nested deeper than two levels: expected a split, found '(' at character 2 in \"" +
            std::string(100000, '(') + "\"");
}

TEST_CASE("strategy: constexpr") {
  static_assert(check(split_tuple{2, 4}, 8).ok());
  static_assert(check(split_tuple{2, 3}, 8).code == errc::strategy_device_num);
  static_assert(strategy_layout(split_tuple{2, 1}, 8).dev == mesh{4, 2, 1});
  static_assert(shard_layout<split_tuple{2, 4}, 8> == layout(mesh{2, 4}, {{0}, {1}}));
  static_assert(from_tensor_map(mesh{2, 4, 1}, tensor_map{2, 1}) == layout(mesh{2, 4, 1}, {{0}, {1}}));
}
}  // namespace core_test_strategy
