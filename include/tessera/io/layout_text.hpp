// Parsers for the text forms of meshes, shapes, split tuples and layouts that
// core/format.hpp and core/strategy.hpp print: what checkpoint metadata and strategy
// files store, read back exactly. All of them read through core/text_cursor.hpp, the
// tokenizer parse_strategy uses.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/core/text_cursor.hpp>

namespace tessera::io {

namespace detail {

/// Reads a tuple as Python prints it, "(2, 4)", "(8,)", "()" (a trailing comma is
/// optional), through the one text cursor (core/text_cursor.hpp): at most
/// `max_entries` entries, each a non-negative integer no larger than `limit`, or '?'
/// (stored as -1) when `allow_dynamic`. Returns the number of entries.
inline int read_tuple(std::string_view text, std::string_view fn, std::string_view what, std::int64_t limit,
                      bool allow_dynamic, int max_entries, std::string_view too_many, std::int64_t* out) {
  text_cursor c(text, fn);
  const int n = c.tuple([&](int i) {
    if (i >= max_entries) c.fail("more than " + std::string(too_many));
    out[i] = allow_dynamic && c.accept('?') ? -1 : c.number(what, limit);
  });
  c.finish("tuple");
  return n;
}

}  // namespace detail

/// Reads a mesh as to_string(mesh) prints it: "(2, 4)", "(8,)"; "(8)" and "(2, 4,)"
/// too. Errors give the position, or the rule a parsed mesh breaks:
/// `parse_mesh: expected ',' or ')', found ';' at character 2 in "(2; 4)"`.
/// @post parse_mesh(to_string(m)) == m for every valid mesh m
inline mesh parse_mesh(std::string_view text) {
  std::int64_t v[max_mesh_ndim];
  const std::string too_many = "max_mesh_ndim = " + std::to_string(max_mesh_ndim) + " axes";
  const int n = detail::read_tuple(text, "parse_mesh", "a mesh axis size", 1 << 30, false, max_mesh_ndim, too_many, v);
  mesh m;
  m.ndim = n;
  for (int a = 0; a < n; ++a) m.dims[a] = int(v[a]);
  if (status s = check(m); !s.ok()) throw error(s, "parse_mesh", "in \"" + std::string(text) + "\"");
  return m;
}

/// Reads a shape as to_string(extents) prints it: "(16, 32)", "(8,)", "()" (a scalar),
/// "(?, 32)" (a dynamic extent). Extents are at most 2^62.
/// @post parse_extents(to_string(e)) == e
inline extents parse_extents(std::string_view text) {
  std::int64_t v[max_tensor_ndim];
  const std::string too_many = "max_tensor_ndim = " + std::to_string(max_tensor_ndim) + " dims";
  const int n =
      detail::read_tuple(text, "parse_extents", "an extent", std::int64_t(1) << 62, true, max_tensor_ndim, too_many, v);
  extents e;
  e.ndim = n;
  for (int d = 0; d < n; ++d) e.v[d] = v[d] < 0 ? dynamic_extent : v[d];
  return e;
}

/// Reads one input's split tuple as to_string(split_tuple) prints it: "(2, 4)", "(8,)".
/// The same reader as parse_strategy's inputs; splits must be positive.
/// @post parse_split_tuple(to_string(s)) == s for every split tuple s whose splits lie
///       in [1, 2^30]
inline split_tuple parse_split_tuple(std::string_view text) {
  text_cursor c(text, "parse_split_tuple");
  const split_tuple s = tessera::detail::read_split_tuple(c, false);
  c.finish("tuple");
  if (status st = check_splits(s, 0); !st.ok())
    throw error(st, "parse_split_tuple", "in \"" + std::string(text) + "\"");
  return s;
}

/// Reads a layout on mesh `m` as to_string(layout) prints it (core/format.hpp):
///
///     "[0, -]"                  dim 0 split by mesh axis 0, dim 1 whole
///     "[1.0, -]"                dim 0 split by axes 1 (major) and 0
///     "[0, -] partial sum {1}"  ... holding partial sums over mesh axis 1
///     "[]"                      a scalar, replicated
///
/// Grammar: '[' [entry {',' entry} [',']] ']' ['partial' ('sum'|'max'|'min') '{' axis {',' axis} '}'],
/// entry = '-' | axis {'.' axis}; spaces between tokens are free. Malformed text is an
/// error with the position (core/text_cursor.hpp). The result is checked
/// (check(layout)): an axis out of range or used twice, or a partial axis that also
/// splits, is an error with the rule and the numbers.
/// @post parse_layout(l.dev, to_string(l)) == l for every valid layout l
inline layout parse_layout(const mesh& m, std::string_view text) {
  text_cursor c(text, "parse_layout");
  if (status s = check(m); !s.ok()) throw error(s, "parse_layout", "mesh " + to_string(m));
  layout l = layout::replicated(m, 0);
  c.list('[', ']', [&](int d) {
    c.skip_space();
    if (d >= max_tensor_ndim) c.fail("more than max_tensor_ndim = " + std::to_string(max_tensor_ndim) + " dims");
    l.ndim = d + 1;
    axis_list& split = l.split[d];
    if (c.accept('-')) return;
    do {
      c.skip_space();
      if (split.n >= max_mesh_ndim) c.fail("more than " + std::to_string(max_mesh_ndim) + " axes split one dim");
      if (!c.at_digit()) c.fail("expected a mesh axis number or '-', found " + c.here());
      split.push_back(int(c.number("a mesh axis number", 1000)));
    } while (c.accept('.'));
  });
  if (c.accept_word("partial")) {
    if (c.accept_word("sum")) l.op = reduce_op::sum;
    else if (c.accept_word("max")) l.op = reduce_op::max;
    else if (c.accept_word("min")) l.op = reduce_op::min;
    else if (c.accept_word("mean")) l.op = reduce_op::mean;
    else c.fail("expected sum, max or min after 'partial', found " + c.here());
    c.expect('{', "'{'");
    do {
      c.skip_space();
      const std::size_t at = c.position();
      const std::int64_t a = c.number("a partial mesh axis number", 30);
      if (l.partial >> a & 1u) c.fail_at(at, "partial mesh axis " + std::to_string(a) + " is listed twice");
      l.partial |= 1u << a;
    } while (c.accept(','));
    c.expect('}', "',' or '}'");
  }
  c.finish("layout");
  if (status s = check(l); !s.ok())
    throw error(s, "parse_layout", "in \"" + std::string(text) + "\" on mesh " + to_string(m));
  return l;
}

}  // namespace tessera::io
