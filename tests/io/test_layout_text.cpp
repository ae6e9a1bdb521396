// Tests of io/layout_text.hpp: for every layout of tensors of rank 0 to 3 on every
// small mesh (partial sums, maxima and minima included), parse_layout reads back
// exactly what to_string printed; meshes, shapes and split tuples round-trip too; and
// malformed or invalid text (overflow, missing commas, empty or trailing text,
// nesting, negative numbers) is an error naming the position or the broken rule.
#include <doctest/doctest.h>

#include <array>
#include <string>
#include <vector>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/io/layout_text.hpp>
#include "error_text.hpp"

using namespace tessera;
using namespace tessera::io;

namespace {

using testing::error_of;

std::vector<mesh> meshes() {
  return {mesh{1}, mesh{2}, mesh{4}, mesh{8}, mesh{2, 2}, mesh{2, 4}, mesh{4, 2}, mesh{2, 2, 2}, mesh{3, 1, 2, 1}};
}

}  // namespace

TEST_CASE("parse_layout: round-trips to_string for every layout on small meshes") {
  long count = 0;
  for (const mesh& m : meshes())
    for (int ndim = 0; ndim <= 3; ++ndim)
      for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min})
        for_each_layout(
            m, ndim, true,
            [&](const layout& l) {
              const std::string text = to_string(l);
              const layout back = parse_layout(m, text);
              if (!(back == l)) FAIL_CHECK("layout " << text << " on mesh " << to_string(m) << " reads back as " << to_string(back));
              ++count;
            },
            op);
  CHECK(count > 5000);
  // whitespace between tokens is free
  CHECK(parse_layout(mesh{2, 4}, " [ 1 . 0 ,- ] ") == layout(mesh{2, 4}, {{1, 0}, {}}));
  CHECK(parse_layout(mesh{2, 4}, "[- , 0]partial  max{ 1 }") == layout(mesh{2, 4}, {{}, {0}}).with_partial(1, reduce_op::max));
  CHECK(parse_layout(mesh{2, 4}, "[0, 1]") == layout(mesh{2, 4}, {{0}, {1}}));
  CHECK(parse_layout(mesh{2, 4}, "[-, -] partial sum {0, 1}") == layout::replicated(mesh{2, 4}, 2).with_partial({0, 1}));
  CHECK(parse_layout(mesh{8}, "[]") == layout::replicated(mesh{8}, 0));
}

TEST_CASE("parse_mesh, parse_extents, parse_split_tuple: round-trip the printed forms") {
  for (const mesh& m : meshes()) CHECK(parse_mesh(to_string(m)) == m);
  // every mesh of 1 to 4 axes with sizes 1, 2, 3 and 7, and the largest sizes
  for (int ndim = 1; ndim <= 4; ++ndim) {
    int combos = 1;
    for (int a = 0; a < ndim; ++a) combos *= 4;
    for (int k = 0; k < combos; ++k) {
      mesh m;
      m.ndim = ndim;
      for (int a = 0, r = k; a < ndim; ++a, r /= 4) m.dims[a] = std::array<int, 4>{1, 2, 3, 7}[std::size_t(r % 4)];
      CHECK(parse_mesh(to_string(m)) == m);
    }
  }
  CHECK(parse_mesh(to_string(mesh{1 << 30})) == mesh{1 << 30});
  CHECK(parse_mesh(to_string(mesh{1, 1, 1, 1, 1, 1})) == mesh{1, 1, 1, 1, 1, 1});
  for (const extents& e : {extents{}, extents{8}, extents{16, 32}, extents{1, 2, 3, 4, 5, 6}, extents{0, 7},
                           extents{dynamic_extent, 4}, extents{index_t(1) << 40}, extents{index_t(1) << 62},
                           extents{dynamic_extent, dynamic_extent, 0}, extents{0}})
    CHECK(parse_extents(to_string(e)) == e);
  for (const split_tuple& s : {split_tuple{}, split_tuple{2}, split_tuple{2, 4}, split_tuple{1, 1, 8},
                               split_tuple{1, 1, 1, 1, 1, 1}, split_tuple{1 << 30}})
    CHECK(parse_split_tuple(to_string(s)) == s);
  CHECK(parse_mesh("(2,4,)") == mesh{2, 4});
  CHECK(parse_mesh("(8)") == mesh{8});
  CHECK(parse_mesh("\n(2,\r\n 4)\t") == mesh{2, 4});
  CHECK(parse_extents(" ( 3 , 5 ) ") == extents{3, 5});
  CHECK(parse_extents("(?,)") == extents{dynamic_extent});
  CHECK(parse_layout(mesh{2, 4}, "[0, 1,]") == layout(mesh{2, 4}, {{0}, {1}}));
}

TEST_CASE("layout text: malformed or invalid text is an error with the position or the rule") {
  const mesh m{2, 4};
  CHECK(error_of([&] { parse_layout(m, "0, 1]"); }) ==
        "parse_layout: expected '[', found '0' at character 0 in \"0, 1]\"");
  CHECK(error_of([&] { parse_layout(m, "[0, x]"); }) ==
        "parse_layout: expected a mesh axis number or '-', found 'x' at character 4 in \"[0, x]\"");
  CHECK(error_of([&] { parse_layout(m, "[0 1]"); }) ==
        "parse_layout: expected ',' or ']', found '1' at character 3 in \"[0 1]\"");
  CHECK(error_of([&] { parse_layout(m, "[0, -"); }) ==
        "parse_layout: expected ',' or ']', found the end at character 5 in \"[0, -\"");
  CHECK(error_of([&] { parse_layout(m, "[0, -] partial avg {1}"); }) ==
        "parse_layout: expected sum, max or min after 'partial', found 'a' at character 15 in \"[0, -] partial avg {1}\"");
  CHECK(error_of([&] { parse_layout(m, "[0, -] partial sum {}"); }) ==
        "parse_layout: expected a partial mesh axis number, found '}' at character 20 in \"[0, -] partial sum {}\"");
  CHECK(error_of([&] { parse_layout(m, "[0, -] partial sum {1, 1}"); }) ==
        "parse_layout: partial mesh axis 1 is listed twice at character 23 in \"[0, -] partial sum {1, 1}\"");
  CHECK(error_of([&] { parse_layout(m, "[0, -] partial sum {1,}"); }) ==
        "parse_layout: expected a partial mesh axis number, found '}' at character 22 in \"[0, -] partial sum {1,}\"");
  CHECK(error_of([&] { parse_layout(m, "[0, -] partial sum {1 0}"); }) ==
        "parse_layout: expected ',' or '}', found '0' at character 22 in \"[0, -] partial sum {1 0}\"");
  CHECK(error_of([&] { parse_layout(m, "[0, -] partial sum {31}"); }) ==
        "parse_layout: expected a partial mesh axis number no larger than 30, found 31 at character 20 in \"[0, -] "
        "partial sum {31}\"");
  CHECK(error_of([&] { parse_layout(m, "[0, -] partialsum {1}"); }) ==
        "parse_layout: unexpected 'p' after the layout at character 7 in \"[0, -] partialsum {1}\"");
  CHECK(error_of([&] { parse_layout(m, "[0, -] extra"); }) ==
        "parse_layout: unexpected 'e' after the layout at character 7 in \"[0, -] extra\"");
  CHECK(error_of([&] { parse_layout(m, "[0, -] partial sum {1} [0]"); }) ==
        "parse_layout: unexpected '[' after the layout at character 23 in \"[0, -] partial sum {1} [0]\"");
  CHECK(error_of([&] { parse_layout(m, ""); }) == "parse_layout: expected '[', found the end at character 0 in \"\"");
  CHECK(error_of([&] { parse_layout(m, "[[0], -]"); }) ==
        "parse_layout: expected a mesh axis number or '-', found '[' at character 1 in \"[[0], -]\"");
  CHECK(error_of([&] { parse_layout(m, "[0.]"); }) ==
        "parse_layout: expected a mesh axis number or '-', found ']' at character 3 in \"[0.]\"");
  CHECK(error_of([&] { parse_layout(m, "[-1, 0]"); }) ==
        "parse_layout: expected ',' or ']', found '1' at character 2 in \"[-1, 0]\"");
  CHECK(error_of([&] { parse_layout(m, "[-, -, -, -, -, -, -]"); }) ==
        "parse_layout: more than max_tensor_ndim = 6 dims at character 19 in \"[-, -, -, -, -, -, -]\"");
  CHECK(error_of([&] { parse_layout(mesh{1, 1, 1, 1, 1, 1}, "[0.1.2.3.4.5.0]"); }) ==
        "parse_layout: more than 6 axes split one dim at character 13 in \"[0.1.2.3.4.5.0]\"");
  CHECK(error_of([&] { parse_layout(m, "[99999999999, -]"); }) ==
        "parse_layout: expected a mesh axis number no larger than 1000, found 99999999999 at character 1 in "
        "\"[99999999999, -]\"");
  CHECK(error_of([&] { parse_layout(m, "[0, 99999999999999999999999999999]"); }) ==
        "parse_layout: expected a mesh axis number no larger than 1000, found 99999999999999999999999999999 at "
        "character 4 in \"[0, 99999999999999999999999999999]\"");
  // syntactically fine, but the layout breaks a rule of core/layout.hpp
  CHECK(error_of([&] { parse_layout(m, "[2, -]"); }) ==
        "parse_layout: layout: a mesh axis index is out of range: dim 0 names mesh axis 2, mesh has 2 axes; "
        "in \"[2, -]\" on mesh (2, 4)");
  CHECK(error_of([&] { parse_layout(m, "[0, 0]"); }) ==
        "parse_layout: layout: a mesh axis splits more than one tensor dim, or one dim twice: mesh axis 0 is used "
        "again at dim 1; in \"[0, 0]\" on mesh (2, 4)");
  CHECK(error_of([&] { parse_layout(m, "[0, -] partial sum {0}"); }) ==
        "parse_layout: layout: a partial mesh axis cannot also split a tensor dim: mesh axis 0 is partial and splits "
        "dim 0; in \"[0, -] partial sum {0}\" on mesh (2, 4)");
  CHECK(error_of([&] { parse_layout(m, "[0, -] partial sum {5}"); }) ==
        "parse_layout: layout: a partial mesh axis is out of range: partial mesh axis 5, mesh has 2 axes; in \"[0, "
        "-] partial sum {5}\" on mesh (2, 4)");
  CHECK(error_of([&] { parse_layout(m, "[0, -] partial mean {1}"); }) ==
        "parse_layout: layout: a partial layout reduces with sum, max or min; in \"[0, -] partial mean {1}\" on mesh (2, 4)");
  CHECK(error_of([&] { parse_mesh("()"); }) ==
        "parse_mesh: mesh: the number of mesh axes must be between 1 and max_mesh_ndim: mesh has 0 axes, limit 6; in \"()\"");
  CHECK(error_of([&] { parse_mesh("(2, 0)"); }) ==
        "parse_mesh: mesh: every mesh axis size must be positive: mesh axis 1 has size 0; in \"(2, 0)\"");
  CHECK(error_of([&] { parse_mesh("(2; 4)"); }) == "parse_mesh: expected ',' or ')', found ';' at character 2 in \"(2; 4)\"");
  CHECK(error_of([&] { parse_mesh("(2 4)"); }) == "parse_mesh: expected ',' or ')', found '4' at character 3 in \"(2 4)\"");
  CHECK(error_of([&] { parse_mesh(""); }) == "parse_mesh: expected '(', found the end at character 0 in \"\"");
  CHECK(error_of([&] { parse_mesh("(2, 4) (1,)"); }) ==
        "parse_mesh: unexpected '(' after the tuple at character 7 in \"(2, 4) (1,)\"");
  CHECK(error_of([&] { parse_mesh("((2, 4))"); }) ==
        "parse_mesh: expected a mesh axis size, found '(' at character 1 in \"((2, 4))\"");
  CHECK(error_of([&] { parse_mesh("(2, -4)"); }) ==
        "parse_mesh: expected a mesh axis size, found the negative number -4 at character 4 in \"(2, -4)\"");
  CHECK(error_of([&] { parse_mesh("(3000000000,)"); }) ==
        "parse_mesh: expected a mesh axis size no larger than 1073741824, found 3000000000 at character 1 in "
        "\"(3000000000,)\"");
  CHECK(error_of([&] { parse_mesh("(1, 1, 1, 1, 1, 1, 1)"); }) ==
        "parse_mesh: more than max_mesh_ndim = 6 axes at character 19 in \"(1, 1, 1, 1, 1, 1, 1)\"");
  CHECK(error_of([&] { parse_mesh("[2, 4]"); }) == "parse_mesh: expected '(', found '[' at character 0 in \"[2, 4]\"");
  CHECK(error_of([&] { parse_extents("(1, 2, 3, 4, 5, 6, 7)"); }) ==
        "parse_extents: more than max_tensor_ndim = 6 dims at character 19 in \"(1, 2, 3, 4, 5, 6, 7)\"");
  CHECK(error_of([&] { parse_extents("(-1,)"); }) ==
        "parse_extents: expected an extent, found the negative number -1 at character 1 in \"(-1,)\"");
  CHECK(error_of([&] { parse_extents("(4611686018427387905,)"); }) ==
        "parse_extents: expected an extent no larger than 4611686018427387904, found 4611686018427387905 at character "
        "1 in \"(4611686018427387905,)\"");
  CHECK(error_of([&] { parse_extents("(99999999999999999999,)"); }) ==
        "parse_extents: expected an extent no larger than 4611686018427387904, found 99999999999999999999 at character "
        "1 in \"(99999999999999999999,)\"");
  CHECK(error_of([&] { parse_extents("(?, ? ?)"); }) ==
        "parse_extents: expected ',' or ')', found '?' at character 6 in \"(?, ? ?)\"");
  CHECK(error_of([&] { parse_extents("(,)"); }) == "parse_extents: expected an extent, found ',' at character 1 in \"(,)\"");
  CHECK(error_of([&] { parse_extents("(16, 32"); }) ==
        "parse_extents: expected ',' or ')', found the end at character 7 in \"(16, 32\"");
  CHECK(error_of([&] { parse_split_tuple("(2, ?)"); }) ==
        "parse_split_tuple: expected a split, found '?' at character 4 in \"(2, ?)\"");
  CHECK(error_of([&] { parse_split_tuple("((2,),)"); }) ==
        "parse_split_tuple: tuples nested deeper than two levels: expected a split, found '(' at character 1 in "
        "\"((2,),)\"");
  CHECK(error_of([&] { parse_split_tuple("[2, 4]"); }) ==
        "parse_split_tuple: expected a split tuple such as (2, 4), found '[' at character 0 in \"[2, 4]\"");
  CHECK(error_of([&] { parse_split_tuple("(2, 4),"); }) ==
        "parse_split_tuple: unexpected ',' after the tuple at character 6 in \"(2, 4),\"");
  CHECK(error_of([&] { parse_split_tuple("(3000000000,)"); }) ==
        "parse_split_tuple: expected a split no larger than 1073741824, found 3000000000 at character 1 in "
        "\"(3000000000,)\"");
  CHECK(error_of([&] { parse_split_tuple("(1, 1, 1, 1, 1, 1, 1)"); }) ==
        "parse_split_tuple: more than max_tensor_ndim = 6 dims in one split tuple at character 19 in \"(1, 1, 1, 1, "
        "1, 1, 1)\"");
  CHECK(error_of([&] { parse_split_tuple("(2, 0)"); }) ==
        "parse_split_tuple: strategy: every split must be positive: input 0, dim 1: split 0; in \"(2, 0)\"");
}
