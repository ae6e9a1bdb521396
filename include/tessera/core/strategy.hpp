// MindSpore's vocabulary for layouts: shard strategies such as ((2, 4), (4, 1)) and
// tensor maps, converted to and from tessera layouts.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/text_cursor.hpp>

namespace tessera {

/// Largest number of operator inputs a strategy can describe.
inline constexpr int max_strategy_inputs = 8;

/// One input's entry of a shard strategy: into how many pieces each tensor dim is
/// cut, e.g. (2, 4).
struct split_tuple {
  int n = 0;
  std::array<int, max_tensor_ndim> v{};

  constexpr split_tuple() = default;
  constexpr split_tuple(std::initializer_list<int> s) {
    for (int x : s) {
      if (n < max_tensor_ndim) v[n] = x;
      ++n;
    }
  }
  constexpr int size() const { return n; }
  constexpr int operator[](int d) const { return v[d]; }
  /// @pre the product fits in an int (check() verifies that it divides the device count)
  constexpr int product() const {
    int p = 1;
    for (int d = 0; d < n; ++d) p *= v[d];
    return p;
  }
  friend constexpr bool operator==(const split_tuple&, const split_tuple&) = default;
};

/// A shard strategy: one split tuple per operator input, e.g. MatMul's ((2, 4), (4, 1)).
struct strategy {
  int n = 0;
  std::array<split_tuple, max_strategy_inputs> in{};

  constexpr strategy() = default;
  constexpr strategy(std::initializer_list<split_tuple> inputs) {
    for (const split_tuple& s : inputs) {
      if (n < max_strategy_inputs) in[n] = s;
      ++n;
    }
  }
  constexpr int size() const { return n; }
  constexpr const split_tuple& operator[](int i) const { return in[i]; }
  friend constexpr bool operator==(const strategy&, const strategy&) = default;
};

/// The global shapes of an operator's inputs, one per input, e.g.
/// shape_list{extents{16, 32}, extents{32}}. A structural type (a template argument).
struct shape_list {
  int n = 0;
  std::array<extents, max_strategy_inputs> v{};

  constexpr shape_list() = default;
  constexpr shape_list(std::initializer_list<extents> shapes) {
    for (const extents& e : shapes) {
      if (n < max_strategy_inputs) v[n] = e;
      ++n;
    }
  }
  constexpr int size() const { return n; }
  constexpr const extents& operator[](int i) const { return v[i]; }
  friend constexpr bool operator==(const shape_list&, const shape_list&) = default;
};

/// Checks the entries of one split tuple (input `input`): at most max_tensor_ndim
/// of them, each positive.
constexpr status check_splits(const split_tuple& s, int input = 0) {
  if (s.n < 0 || s.n > max_tensor_ndim) return fail(errc::strategy_ndim, input, -1, s.n);
  for (int d = 0; d < s.n; ++d)
    if (s.v[d] < 1) return fail(errc::strategy_split, input, d, s.v[d]);
  return {};
}

/// Checks one split tuple (input `input`) against a device count: entries positive,
/// and their product divides the device count (the quotient is the number of
/// replicas, MindSpore's repeated calculation). The product is computed in 64 bits,
/// saturating, so that no split tuple overflows it.
constexpr status check(const split_tuple& s, int device_num, int input = 0) {
  if (status st = check_splits(s, input); !st.ok()) return st;
  std::int64_t p = 1;
  for (int d = 0; d < s.n; ++d)
    p = p > INT64_MAX / s.v[d] ? INT64_MAX : p * s.v[d];
  if (device_num < 1 || device_num % p != 0) return fail(errc::strategy_device_num, input, -1, p, device_num);
  return {};
}

/// Checks every input of a strategy against a device count.
constexpr status check(const strategy& st, int device_num) {
  if (st.n > max_strategy_inputs) return fail(errc::strategy_inputs, -1, -1, st.n, max_strategy_inputs);
  for (int i = 0; i < st.n; ++i)
    if (status s = check(st.in[i], device_num, i); !s.ok()) return s;
  return {};
}

/// The split tuple of a layout: pieces per dim. Partial and replica axes do not
/// appear (they are what MindSpore calls repeated calculation).
constexpr split_tuple to_split_tuple(const layout& l) {
  split_tuple s;
  s.n = l.ndim;
  for (int d = 0; d < l.ndim; ++d) s.v[d] = l.pieces(d);
  return s;
}

/// The layout of one tensor sharded by `s` over `device_num` devices, as MindSpore
/// builds it: the device matrix is the split tuple itself, preceded by a replica
/// axis of size device_num / product when the splits use fewer devices, and dim d is
/// split by its own device-matrix axis. Example: (2, 1) on 8 devices -> mesh
/// (4, 2, 1), dim 0 split by axis 1, dim 1 by axis 2 (of size 1); ranks 0 and 1
/// hold rows 0..n/2 and n/2..n. A scalar (empty tuple) always gets the replica axis,
/// so that the mesh has at least one axis: () on 1 device -> mesh (1,).
/// @pre check(s, device_num).ok()
constexpr layout strategy_layout(const split_tuple& s, int device_num) {
  layout l;
  const int replicas = device_num / s.product();
  const int first = replicas > 1 || s.n == 0 ? 1 : 0;
  l.dev.ndim = first + s.n;
  if (first) l.dev.dims[0] = replicas;
  l.ndim = s.n;
  for (int d = 0; d < s.n; ++d) {
    l.dev.dims[first + d] = s.v[d];
    l.split[d] = axis_list{first + d};
  }
  return l;
}

/// The layout of a static split tuple on `DeviceNum` devices; an invalid strategy
/// fails to compile with the rule as the message (and the numbers in the note).
template <split_tuple S, int DeviceNum>
inline constexpr layout shard_layout = [] {
  constexpr status s = check(S, DeviceNum);
  detail::static_require<s>();
  if constexpr (s.ok()) return strategy_layout(S, DeviceNum);
  else return layout{};
}();

// ---- tensor maps ------------------------------------------------------------------
//
// MindSpore describes a layout by a device matrix and a tensor map: entry d of the map
// names the device-matrix axis that splits tensor dim d, counting axes from the RIGHT
// (map value 0 is the last, fastest axis; -1 means not split). With device matrix
// (2, 4, 1), MatMul ((2, 4), (4, 1)) maps A by (2, 1) and B by (1, 0). A map entry may
// also list several values (the dim is split by several axes, major first).
// tessera's axis index is counted from the left: axis = ndim - 1 - value.

/// One entry of a tensor map: a single map value (-1 = not split), or a braced list of
/// values for a dim split by several axes ({} = not split).
struct map_entry {
  axis_list values;
  constexpr map_entry(int value) {  // NOLINT: implicit, so tensor_map{2, 1} reads naturally
    if (value != -1) values.push_back(value);
  }
  constexpr map_entry(std::initializer_list<int> list) : values(list) {}
};

/// A tensor map in MindSpore's right-to-left numbering: tensor_map{2, 1},
/// tensor_map{{2, 1}, -1} (dim 0 split by two axes), tensor_map{{}, 0}.
struct tensor_map {
  int ndim = 0;
  std::array<axis_list, max_tensor_ndim> v{};  // map values per dim; empty = -1

  constexpr tensor_map() = default;
  constexpr tensor_map(std::initializer_list<map_entry> entries) {
    for (const map_entry& e : entries) {
      if (ndim < max_tensor_ndim) v[ndim] = e.values;
      ++ndim;
    }
  }
  friend constexpr bool operator==(const tensor_map&, const tensor_map&) = default;
};

/// Checks a tensor map against a device matrix: each value names an axis.
constexpr status check(const tensor_map& map, const mesh& device_matrix) {
  if (status s = check(device_matrix); !s.ok()) return s;
  if (map.ndim < 0 || map.ndim > max_tensor_ndim)
    return fail(errc::layout_ndim, -1, -1, map.ndim, max_tensor_ndim);
  for (int d = 0; d < map.ndim; ++d)
    for (int i = 0; i < map.v[d].n; ++i)
      if (map.v[d].v[i] < 0 || map.v[d].v[i] >= device_matrix.ndim)
        return fail(errc::tensor_map_value, d, -1, map.v[d].v[i], device_matrix.ndim);
  return {};
}

/// The layout that a device matrix and a tensor map describe (no partial axes).
/// @pre check(map, device_matrix).ok()
constexpr layout from_tensor_map(const mesh& device_matrix, const tensor_map& map) {
  layout l;
  l.dev = device_matrix;
  l.ndim = map.ndim;
  for (int d = 0; d < map.ndim; ++d)
    for (int i = 0; i < map.v[d].n; ++i) l.split[d].push_back(device_matrix.ndim - 1 - map.v[d].v[i]);
  return l;
}

/// The tensor map of a layout (its partial axes are not part of a tensor map).
constexpr tensor_map to_tensor_map(const layout& l) {
  tensor_map map;
  map.ndim = l.ndim;
  for (int d = 0; d < l.ndim; ++d)
    for (int i = 0; i < l.split[d].n; ++i) map.v[d].push_back(l.dev.ndim - 1 - l.split[d].v[i]);
  return map;
}

// ---- text form ---------------------------------------------------------------------

/// "(2, 4)"
inline std::string to_string(const split_tuple& s) {
  std::string out = "(";
  for (int d = 0; d < s.n; ++d) {
    out += d ? ", " : "";
    out += std::to_string(s.v[d]);
  }
  return out + (s.n == 1 ? ",)" : ")");
}

/// "((2, 4), (4, 1))"
inline std::string to_string(const strategy& st) {
  std::string out = "(";
  for (int i = 0; i < st.n; ++i) {
    out += i ? ", " : "";
    out += to_string(st.in[i]);
  }
  return out + (st.n == 1 ? ",)" : ")");
}

namespace detail {

/// The largest split the text forms accept.
inline constexpr std::int64_t max_text_split = std::int64_t(1) << 30;

/// Reads one split tuple at the cursor, "(2, 4)" (or "[2, 4]" when `square_too`): at
/// most max_tensor_ndim splits, each in [0, 2^30] (positive splits are check_splits'
/// business, which reports the input and the dim).
inline split_tuple read_split_tuple(text_cursor& c, bool square_too) {
  if (!c.at('(') && !(square_too && c.at('[')))
    c.fail("expected a split tuple such as (2, 4), found " + c.here());
  split_tuple s;
  c.tuple(
      [&](int d) {
        if (c.at('(') || c.at('[')) c.fail("tuples nested deeper than two levels: expected a split, found " + c.here());
        if (d >= max_tensor_ndim)
          c.fail("more than max_tensor_ndim = " + std::to_string(max_tensor_ndim) + " dims in one split tuple");
        s.v[d] = int(c.number("a split", max_text_split));
        s.n = d + 1;
      },
      square_too);
  return s;
}

}  // namespace detail

/// Reads a strategy written as nested tuples, "((2, 4), (4, 1))", as to_string prints
/// it; also accepts brackets, "[[2, 4], [4, 1]]", trailing commas and free spaces.
/// Malformed text is an error with the position, a split that is not positive an
/// error naming the input and the dim:
///
///     parse_strategy: expected ',' or ')', found '4' at character 4 in "((2 4))"
///     parse_strategy: strategy: every split must be positive: input 0, dim 1: split 0; in "((2, 0),)"
///
/// @post parse_strategy(to_string(st)) == st for every strategy st whose splits lie in
///       [1, 2^30]
inline strategy parse_strategy(std::string_view text) {
  text_cursor c(text, "parse_strategy");
  strategy st;
  c.tuple(
      [&](int i) {
        if (i >= max_strategy_inputs)
          c.fail("more than max_strategy_inputs = " + std::to_string(max_strategy_inputs) + " inputs");
        st.in[i] = detail::read_split_tuple(c, true);
        st.n = i + 1;
      },
      true);
  c.finish("strategy");
  for (int i = 0; i < st.n; ++i)
    if (status s = check_splits(st.in[i], i); !s.ok())
      throw error(s, "parse_strategy", "in \"" + std::string(text) + "\"");
  return st;
}

}  // namespace tessera
