// Parsers for the text forms of meshes, shapes, split tuples and layouts that
// core/format.hpp and core/strategy.hpp print: what checkpoint metadata and strategy
// files store, read back exactly.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/strategy.hpp>

namespace tessera::io {

namespace detail {

/// A cursor over a text form with the error message every parser here throws:
/// "<fn>: <what> at character <i> in \"<text>\"".
class text_cursor {
 public:
  text_cursor(std::string_view text, std::string_view fn) : s_(text), fn_(fn) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw error(std::string(fn_) + ": " + what + " at character " + std::to_string(pos_) + " in \"" +
                std::string(s_) + "\"");
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
  }
  bool done() {
    skip_ws();
    return pos_ >= s_.size();
  }
  /// Skips spaces; true (and consumed) when the next character is c.
  bool accept(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c, std::string_view what) {
    if (!accept(c)) fail("expected " + std::string(what) + ", found " + here());
  }
  bool accept_word(std::string_view w) {
    skip_ws();
    if (s_.substr(pos_, w.size()) == w) {
      pos_ += w.size();
      return true;
    }
    return false;
  }
  bool at_digit() {
    skip_ws();
    return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9';
  }
  /// A non-negative decimal integer no larger than `limit`.
  std::int64_t number(std::string_view what, std::int64_t limit) {
    skip_ws();
    const std::size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    if (pos_ == start) fail("expected " + std::string(what) + ", found " + here());
    std::int64_t v = 0;
    const auto r = std::from_chars(s_.data() + start, s_.data() + pos_, v);
    if (r.ec != std::errc() || v > limit) {
      const std::string digits(s_.substr(start, pos_ - start));
      pos_ = start;
      fail(std::string(what) + " " + digits + " exceeds " + std::to_string(limit));
    }
    return v;
  }
  std::string here() const {
    if (pos_ >= s_.size()) return "the end";
    return std::string("'") + s_[pos_] + "'";
  }
  std::string_view text() const { return s_; }

 private:
  std::string_view s_;
  std::string_view fn_;
  std::size_t pos_ = 0;
};

/// A parenthesised tuple as Python prints it: "(2, 4)", "(8,)", "()" (a trailing
/// comma is optional). Entries are
/// non-negative integers no larger than `limit`, or '?' (returned as -1) when
/// `allow_dynamic`.
inline std::vector<std::int64_t> parse_tuple(std::string_view text, std::string_view fn, std::string_view what,
                                             std::int64_t limit, bool allow_dynamic) {
  text_cursor c(text, fn);
  std::vector<std::int64_t> out;
  c.expect('(', "'('");
  if (!c.accept(')')) {
    while (true) {
      if (allow_dynamic && c.accept('?')) out.push_back(-1);
      else out.push_back(c.number(what, limit));
      if (c.accept(')')) break;
      c.expect(',', "',' or ')'");
      if (c.accept(')')) break;  // a trailing comma, as in "(8,)"
    }
  }
  if (!c.done()) c.fail("unexpected " + c.here() + " after the tuple");
  return out;
}

}  // namespace detail

/// Reads a mesh as to_string(mesh) prints it: "(2, 4)", "(8,)".
/// @post parse_mesh(to_string(m)) == m for every valid mesh m
inline mesh parse_mesh(std::string_view text) {
  const std::vector<std::int64_t> v = detail::parse_tuple(text, "parse_mesh", "a mesh axis size", 1 << 30, false);
  if (v.empty() || v.size() > std::size_t(max_mesh_ndim))
    throw error(fail(errc::mesh_ndim, -1, -1, std::int64_t(v.size()), max_mesh_ndim),
                "parse_mesh", "in \"" + std::string(text) + "\"");
  mesh m;
  m.ndim = int(v.size());
  for (std::size_t a = 0; a < v.size(); ++a) m.dims[a] = int(v[a]);
  if (status s = check(m); !s.ok()) throw error(s, "parse_mesh", "in \"" + std::string(text) + "\"");
  return m;
}

/// Reads a shape as to_string(extents) prints it: "(16, 32)", "(8,)", "()" (a scalar),
/// "(?, 32)" (a dynamic extent).
/// @post parse_extents(to_string(e)) == e
inline extents parse_extents(std::string_view text) {
  const std::vector<std::int64_t> v =
      detail::parse_tuple(text, "parse_extents", "an extent", std::int64_t(1) << 62, true);
  if (v.size() > std::size_t(max_tensor_ndim))
    throw error(fail(errc::layout_ndim, -1, -1, std::int64_t(v.size()), max_tensor_ndim),
                "parse_extents", "in \"" + std::string(text) + "\"");
  extents e;
  e.ndim = int(v.size());
  for (std::size_t d = 0; d < v.size(); ++d) e.v[d] = v[d] < 0 ? dynamic_extent : v[d];
  return e;
}

/// Reads one input's split tuple as to_string(split_tuple) prints it: "(2, 4)", "(8,)".
inline split_tuple parse_split_tuple(std::string_view text) {
  const std::vector<std::int64_t> v =
      detail::parse_tuple(text, "parse_split_tuple", "a split", 1 << 30, false);
  if (v.size() > std::size_t(max_tensor_ndim))
    throw error(fail(errc::strategy_ndim, 0, -1, std::int64_t(v.size())), "parse_split_tuple",
                "in \"" + std::string(text) + "\"");
  split_tuple s;
  s.n = int(v.size());
  for (std::size_t d = 0; d < v.size(); ++d) {
    if (v[d] < 1)
      throw error(fail(errc::strategy_split, 0, int(d), v[d]), "parse_split_tuple",
                  "in \"" + std::string(text) + "\"");
    s.v[d] = int(v[d]);
  }
  return s;
}

/// Reads a layout on mesh `m` as to_string(layout) prints it (core/format.hpp):
///
///     "[0, -]"                  dim 0 split by mesh axis 0, dim 1 whole
///     "[1.0, -]"                dim 0 split by axes 1 (major) and 0
///     "[0, -] partial sum {1}"  ... holding partial sums over mesh axis 1
///     "[]"                      a scalar, replicated
///
/// Grammar: '[' [entry {',' entry}] ']' ['partial' ('sum'|'max'|'min') '{' axis {',' axis} '}'],
/// entry = '-' | axis {'.' axis}; spaces between tokens are free. The result is checked
/// (check(layout)): an axis out of range or used twice, or a partial axis that also
/// splits, is an error with the rule and the numbers.
/// @post parse_layout(l.dev, to_string(l)) == l for every valid layout l
inline layout parse_layout(const mesh& m, std::string_view text) {
  detail::text_cursor c(text, "parse_layout");
  if (status s = check(m); !s.ok()) throw error(s, "parse_layout", "mesh " + to_string(m));
  layout l = layout::replicated(m, 0);
  c.expect('[', "'['");
  if (!c.accept(']')) {
    while (true) {
      c.skip_ws();
      if (l.ndim >= max_tensor_ndim)
        c.fail("more than max_tensor_ndim = " + std::to_string(max_tensor_ndim) + " dims");
      axis_list& split = l.split[l.ndim++];
      if (!c.accept('-')) {
        while (true) {
          if (split.n >= max_mesh_ndim) c.fail("more than " + std::to_string(max_mesh_ndim) + " axes split one dim");
          split.push_back(int(c.number("a mesh axis number or '-'", 1000)));
          if (!c.accept('.')) break;
        }
      }
      if (c.accept(']')) break;
      c.expect(',', "',' or ']'");
    }
  }
  if (c.accept_word("partial")) {
    if (c.accept_word("sum")) l.op = reduce_op::sum;
    else if (c.accept_word("max")) l.op = reduce_op::max;
    else if (c.accept_word("min")) l.op = reduce_op::min;
    else if (c.accept_word("mean")) l.op = reduce_op::mean;
    else c.fail("expected sum, max or min after 'partial', found " + c.here());
    c.expect('{', "'{'");
    do {
      const std::int64_t a = c.number("a partial mesh axis number", 1000);
      if (a >= 31) c.fail("partial mesh axis " + std::to_string(a) + " is out of range");
      if (l.partial >> a & 1u) c.fail("partial mesh axis " + std::to_string(a) + " is listed twice");
      l.partial |= 1u << a;
    } while (c.accept(','));
    c.expect('}', "',' or '}'");
  }
  if (!c.done()) c.fail("unexpected " + c.here() + " after the layout");
  if (status s = check(l); !s.ok())
    throw error(s, "parse_layout", "in \"" + std::string(text) + "\" on mesh " + to_string(m));
  return l;
}

}  // namespace tessera::io
