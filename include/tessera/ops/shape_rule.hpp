// The data-movement operators' definitions: the sharding rules (constexpr) of Transpose
// (permutes the layout), Reshape and Flatten (keep shards in place where the split dims
// survive), StridedSlice (slices unsplit dims locally) and Concat (along an unsplit
// axis), and the operator types ops::transpose_op, reshape_op, flatten_op,
// strided_slice_op and concat_op. Standard library only; the forwards and backwards are
// in ops/shape.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/refine.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/elementwise_rule.hpp>
#include <tessera/ops/reduce_rule.hpp>
#include <tessera/ops/split_check.hpp>

namespace tessera {

/// A list of indices, e.g. a slice's begin {0, 2}. A structural type.
struct index_list {
  int n = 0;
  std::array<index_t, max_tensor_ndim> v{};

  constexpr index_list() = default;
  constexpr index_list(std::initializer_list<index_t> values) {
    for (index_t x : values) {
      if (n < max_tensor_ndim) v[n] = x;
      ++n;
    }
  }
  constexpr int size() const { return n; }
  constexpr index_t operator[](int i) const { return v[i]; }
  friend constexpr bool operator==(const index_list&, const index_list&) = default;
};

namespace detail {
// The first dim of `shape` whose extent is not known, or -1.
constexpr int first_dynamic_dim(const extents& shape) {
  for (int d = 0; d < shape.ndim; ++d)
    if (shape.v[d] < 0) return d;
  return -1;
}

// The checks every one-input operator of this file starts with: one split tuple with
// one entry per dim, positive splits dividing the device count, a shape whose
// extents are known and divisible by the splits.
constexpr status check_one_input(const strategy& st, int device_num, const extents& shape) {
  if (st.n != 1) return fail(errc::op_inputs, -1, -1, st.n, 1);
  if (st.in[0].n != shape.ndim) return fail(errc::op_input_ndim, 0, -1, st.in[0].n, shape.ndim);
  if (status s = check(st, device_num); !s.ok()) return s;
  if (const int d = first_dynamic_dim(shape); d >= 0) return fail(errc::negative_extent, d, -1, shape.v[d]);
  return check_divides(st.in[0], shape);
}
}  // namespace detail

// ---- Transpose -----------------------------------------------------------------------

/// The layouts of y = transpose(x, perm): y.shape[d] = x.shape[perm[d]].
struct transpose_layouts {
  mesh dev;       ///< the input's split tuple, or (replicas, ...)
  layout in;      ///< the input (and its gradient), split by the strategy
  layout out;     ///< dim d split as the input's dim perm[d]: the same shards, permuted
  dim_list perm;  ///< perm with negative entries resolved
  extents shape;  ///< the output's global shape
  friend constexpr bool operator==(const transpose_layouts&, const transpose_layouts&) = default;
};

/// Checks a Transpose strategy on `device_num` devices for an input of shape `shape`:
/// the one-input checks, and perm a permutation of the dims (negative entries count
/// from the end).
constexpr status check_transpose(const strategy& st, int device_num, const extents& shape,
                                 const dim_list& perm) {
  if (status s = detail::check_one_input(st, device_num, shape); !s.ok()) return s;
  if (perm.n != shape.ndim) return fail(errc::transpose_perm_size, -1, -1, perm.n, shape.ndim);
  unsigned seen = 0;
  for (int d = 0; d < perm.n; ++d) {
    const int p = perm.v[d] < 0 ? perm.v[d] + shape.ndim : perm.v[d];
    if (p < 0 || p >= shape.ndim || (seen >> p & 1u)) return fail(errc::transpose_perm, d, -1, perm.v[d], shape.ndim);
    seen |= 1u << p;
  }
  return {};
}

/// The rule: the output's dim d is split by the mesh axes that split the input's dim
/// perm[d]. Every rank keeps its elements: zero communication, a local transpose.
/// Example: (2, 4) on 8 devices, perm (1, 0) -> device matrix (2, 4); x split rows by
/// axis 0 and columns by axis 1; y rows by axis 1 and columns by axis 0.
/// @pre check_transpose(st, device_num, shape, perm).ok()
constexpr transpose_layouts transpose_rule(const strategy& st, int device_num, const extents& shape,
                                           const dim_list& perm) {
  transpose_layouts r;
  r.in = strategy_layout(st.in[0], device_num);
  r.dev = r.in.dev;
  r.out = r.in;
  r.perm = perm;
  r.shape = shape;
  for (int d = 0; d < shape.ndim; ++d) {
    const int p = perm.v[d] < 0 ? perm.v[d] + shape.ndim : perm.v[d];
    r.perm.v[d] = p;
    r.out.split[d] = r.in.split[p];
    r.shape.v[d] = shape.v[p];
  }
  return r;
}

/// The rule for a static strategy, shape and perm; an invalid one fails to compile.
template <strategy St, int DeviceNum, extents Shape, dim_list Perm>
inline constexpr transpose_layouts static_transpose_rule = [] {
  constexpr status s = check_transpose(St, DeviceNum, Shape, Perm);
  detail::static_require<s>();
  if constexpr (s.ok()) return transpose_rule(St, DeviceNum, Shape, Perm);
  else return transpose_layouts{};
}();

// ---- Reshape and Flatten -----------------------------------------------------------

/// The layouts of y = reshape(x, target).
struct reshape_layouts {
  mesh dev;           ///< the input's split tuple, or (replicas, ...)
  layout in;          ///< the layout the local reshape reads (and the input's gradient)
  layout out;         ///< the output: the same shards, seen in the target shape
  extents shape;      ///< the target with its -1 resolved
  bool moves = false; ///< in places x unlike the strategy's layout: x is redistributed first
  friend constexpr bool operator==(const reshape_layouts&, const reshape_layouts&) = default;
};

/// `target` with its one -1 entry (dynamic_extent) inferred from the element count of
/// `shape`. @pre check_reshape passed
constexpr extents reshape_target(const extents& shape, const extents& target) {
  extents t = target;
  index_t known = 1;
  int infer = -1;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.v[d] == -1) infer = d;
    else known *= t.v[d];
  }
  if (infer >= 0) t.v[infer] = known == 0 ? 0 : shape.size() / known;
  return t;
}

/// Checks a Reshape strategy on `device_num` devices for an input of shape `shape`
/// reshaped to `target` (MindSpore's Reshape: one entry may be -1, inferred): the
/// one-input checks, target entries non-negative but for at most one -1, and the same
/// number of elements.
constexpr status check_reshape(const strategy& st, int device_num, const extents& shape,
                               const extents& target) {
  if (status s = detail::check_one_input(st, device_num, shape); !s.ok()) return s;
  if (target.ndim < 0 || target.ndim > max_tensor_ndim)
    return fail(errc::layout_ndim, -1, -1, target.ndim, max_tensor_ndim);
  int inferred = 0;
  index_t known = 1;
  for (int d = 0; d < target.ndim; ++d) {
    const index_t t = target.v[d];
    if (t < -1 || (t == -1 && inferred++ > 0)) return fail(errc::reshape_target, d, -1, t);
    if (t >= 0) known *= t;
  }
  const index_t n = shape.size();
  if (inferred ? (known == 0 || n % known != 0) : known != n) return fail(errc::reshape_size, -1, -1, n, known);
  return {};
}

/// The Reshape rule. Input and target dims (extent-1 dims aside) fall into groups of
/// equal products: the finest alignment of the two shapes ((4, 6) -> (2, 2, 6) has
/// the groups (4) -> (2, 2) and (6) -> (6)). A rank's shard stays in place when, in
/// each group, only the first input dim is split (s pieces, s dividing the first
/// target dim of the group): its elements are then a contiguous run of the group, the
/// same run as the target's first dim split s ways. So the output splits each group's
/// first target dim by the axes that split the group's first input dim.
/// Otherwise the input is redistributed first (`moves`), to the layout where the group's
/// axes (major first) split its first input dim, as many of them as divide both first
/// dims (an AllToAll moves a split from a later dim of the group); an axis that does
/// not fit is gathered.
/// Examples on 8 devices: (16, 6) -> (2, 8, 6) with (4, 2): groups (16) -> (2, 8) and
/// (6) -> (6); axis 0 (4 pieces) does not divide 2, so it is gathered: in [-, 1], out
/// [-, -, 1], moves. (4, 6) -> (24,) with (2, 1) (device matrix (4, 2, 1)): out [1],
/// no move. (4, 6) -> (24,) with (1, 2) (device matrix (4, 1, 2)): the split moves to
/// dim 0 (in [1.2, -], one AllToAll; axis 1 has size 1), out [2].
/// @pre check_reshape(st, device_num, shape, target).ok()
constexpr reshape_layouts reshape_rule(const strategy& st, int device_num, const extents& shape,
                                       const extents& target) {
  reshape_layouts r;
  const layout base = strategy_layout(st.in[0], device_num);
  r.dev = base.dev;
  r.shape = reshape_target(shape, target);
  // Axes of size 1 move no data: they stay where the strategy put them.
  r.in = base;
  r.out = layout::replicated(r.dev, r.shape.ndim);
  if (shape.size() == 0) {  // no elements: nothing to keep in place
    for (int d = 0; d < shape.ndim; ++d) r.in.split[d] = axis_list{};
    r.moves = !same_placement(r.in, base);
    return r;
  }
  const extents& s = shape;
  const extents& t = r.shape;
  int i = 0, j = 0;
  for (;;) {
    while (i < s.ndim && s.v[i] == 1) ++i;
    while (j < t.ndim && t.v[j] == 1) ++j;
    if (i >= s.ndim || j >= t.ndim) break;
    const int gi = i, gj = j;
    index_t pi = s.v[i++], pj = t.v[j++];
    while (pi != pj) {
      if (pi < pj) pi *= s.v[i++];
      else pj *= t.v[j++];
    }
    axis_list kept;  // the group's axes (size > 1) that fit its first dims, major first
    index_t pieces = 1;
    for (int d = gi; d < i; ++d) {
      axis_list ones;
      for (int k = 0; k < base.split[d].n; ++k) {
        const int a = base.split[d].v[k];
        const index_t next = pieces * r.dev.dims[a];
        if (r.dev.dims[a] == 1) ones.push_back(a);
        else if (s.v[gi] % next == 0 && t.v[gj] % next == 0) {
          kept.push_back(a);
          pieces = next;
        }
      }
      r.in.split[d] = ones;
    }
    for (int k = 0; k < kept.n; ++k) r.in.split[gi].push_back(kept.v[k]);
    r.out.split[gj] = (i - gi == 1 && j - gj == 1) ? r.in.split[gi] : kept;
  }
  r.moves = !same_placement(r.in, base);
  return r;
}

/// The rule for a static strategy, shape and target; an invalid one fails to compile.
template <strategy St, int DeviceNum, extents Shape, extents Target>
inline constexpr reshape_layouts static_reshape_rule = [] {
  constexpr status s = check_reshape(St, DeviceNum, Shape, Target);
  detail::static_require<s>();
  if constexpr (s.ok()) return reshape_rule(St, DeviceNum, Shape, Target);
  else return reshape_layouts{};
}();

/// Flatten's target for an input of shape `shape`: (shape[0], the product of the rest),
/// MindSpore's Flatten (the batch dim kept). A rank-0 input gives (1,).
constexpr extents flatten_target(const extents& shape) {
  if (shape.ndim == 0) return extents{1};
  index_t rest = 1;
  for (int d = 1; d < shape.ndim; ++d) rest *= shape.v[d];
  return extents{shape.v[0], rest};
}

/// Flatten's rule for a static strategy and shape: Reshape's, to flatten_target(Shape).
template <strategy St, int DeviceNum, extents Shape>
inline constexpr reshape_layouts static_flatten_rule = static_reshape_rule<St, DeviceNum, Shape, flatten_target(Shape)>;

// ---- StridedSlice ------------------------------------------------------------------

/// The layouts of y = strided_slice(x, begin, end, strides).
struct strided_slice_layouts {
  mesh dev;            ///< the input's split tuple, or (replicas, ...)
  layout in;           ///< the strategy's layout with the cut dims unsplit (and the gradient's)
  layout out;          ///< as `in`: every split dim is taken whole, so it keeps its split
  extents shape;       ///< the slice's global shape
  unsigned cut = 0;    ///< bit d set: dim d is not taken whole (sliced on every rank alike)
  bool moves = false;  ///< the strategy split a cut dim over several ranks: x is gathered first
  friend constexpr bool operator==(const strided_slice_layouts&, const strided_slice_layouts&) = default;
};

/// One dim of a slice with Python semantics: `count` elements from `start`, `step` apart.
struct slice_range {
  index_t start = 0, step = 1, count = 0;
  friend constexpr bool operator==(const slice_range&, const slice_range&) = default;
};

/// Python's x[b:e:s] on a dim of extent n: negative begin or end count from the end and
/// both are clamped to the dim, so INT64_MAX (INT64_MIN for a negative step) means "to
/// the end". Example: n 6, b 4, e -7, s -2 gives start 4, step -2, count 3 (4, 2, 0).
/// @pre s != 0
constexpr slice_range python_slice(index_t n, index_t b, index_t e, index_t s) {
  const index_t lo = s > 0 ? 0 : -1, hi = s > 0 ? n : n - 1;
  auto place = [&](index_t i) {
    const index_t k = i < 0 ? (i < -n ? lo : i + n) : i;
    return k < lo ? lo : (k > hi ? hi : k);
  };
  const index_t first = place(b), last = place(e);
  const index_t span = s > 0 ? last - first : first - last, step = s > 0 ? s : -s;
  return slice_range{first, s, span > 0 ? (span + step - 1) / step : 0};
}

/// Checks a StridedSlice strategy on `device_num` devices for an input of shape `shape`:
/// the one-input checks; begin, end and strides (or no strides: all 1) of the same
/// length, at most the input's rank (later dims are taken whole); no stride 0.
constexpr status check_strided_slice(const strategy& st, int device_num, const extents& shape,
                                     const index_list& begin, const index_list& end,
                                     const index_list& strides) {
  if (status s = detail::check_one_input(st, device_num, shape); !s.ok()) return s;
  if (end.n != begin.n) return fail(errc::slice_lengths, -1, -1, begin.n, end.n);
  if (strides.n != 0 && strides.n != begin.n) return fail(errc::slice_lengths, -1, -1, begin.n, strides.n);
  if (begin.n > shape.ndim) return fail(errc::slice_rank, -1, -1, begin.n, shape.ndim);
  for (int d = 0; d < strides.n; ++d)
    if (strides.v[d] == 0) return fail(errc::slice_stride, d);
  return {};
}

/// The StridedSlice rule: a dim taken whole (start 0, step 1, every element) keeps the
/// strategy's split, and each rank slices nothing there; any other dim is cut, which
/// needs the whole dim on every rank: a cut dim that the strategy splits is gathered
/// first (`moves`), as MindSpore's redistribution would. The output keeps the input's
/// splits (a whole dim keeps its extent, so they still divide).
/// Example: (8, 16) with (2, 4) on 8 devices, begin (0, 2), end (8, 10), strides (1, 2):
/// dim 0 whole, dim 1 cut; in [0, -], out (8, 4) [0, -].
/// @pre check_strided_slice(st, device_num, shape, begin, end, strides).ok()
constexpr strided_slice_layouts strided_slice_rule(const strategy& st, int device_num, const extents& shape,
                                                   const index_list& begin, const index_list& end,
                                                   const index_list& strides) {
  strided_slice_layouts r;
  const layout base = strategy_layout(st.in[0], device_num);
  r.dev = base.dev;
  r.in = base;
  r.shape = shape;
  for (int d = 0; d < begin.n; ++d) {
    const slice_range sr = python_slice(shape.v[d], begin.v[d], end.v[d], strides.n ? strides.v[d] : 1);
    r.shape.v[d] = sr.count;
    if (!(sr.start == 0 && sr.step == 1 && sr.count == shape.v[d])) {
      r.cut |= 1u << d;
      r.in.split[d] = axis_list{};
    }
  }
  r.out = r.in;
  r.moves = !same_placement(r.in, base);
  return r;
}

/// The rule for a static strategy, shape and slice; an invalid one fails to compile.
template <strategy St, int DeviceNum, extents Shape, index_list Begin, index_list End,
          index_list Strides = index_list{}>
inline constexpr strided_slice_layouts static_strided_slice_rule = [] {
  constexpr status s = check_strided_slice(St, DeviceNum, Shape, Begin, End, Strides);
  detail::static_require<s>();
  if constexpr (s.ok()) return strided_slice_rule(St, DeviceNum, Shape, Begin, End, Strides);
  else return strided_slice_layouts{};
}();

// ---- Concat ------------------------------------------------------------------------

/// The layouts of y = concat((x0, x1, ...), axis).
struct concat_layouts {
  mesh dev;       ///< the inputs' split tuple, or (replicas, ...)
  layout in;      ///< every input (and its gradient), split by the strategy
  layout out;     ///< as the inputs: the concat axis is unsplit, the others keep their splits
  extents shape;  ///< the output's global shape
  int axis = 0;   ///< the concat axis, in [0, rank)
  friend constexpr bool operator==(const concat_layouts&, const concat_layouts&) = default;
};

/// Checks a Concat strategy on `device_num` devices for inputs of the given shapes: 1 to
/// max_strategy_inputs inputs of one rank, agreeing on every dim but the axis; one split
/// tuple per input, one entry per dim, positive splits whose product divides the device
/// count; the axis unsplit and every input split alike (MindSpore's Concat).
/// Example: (8, 4) and (8, 12) along axis 1 on 8 devices: ((8, 1), (8, 1)) is valid;
/// ((2, 4), (2, 4)) splits the concat axis.
constexpr status check_concat(const strategy& st, int device_num, const shape_list& shapes, int axis) {
  if (shapes.n < 1 || shapes.n > max_strategy_inputs) return fail(errc::concat_inputs, -1, -1, shapes.n);
  if (st.n != shapes.n) return fail(errc::op_inputs, -1, -1, st.n, shapes.n);
  const int rank = shapes.v[0].ndim;
  for (int i = 1; i < shapes.n; ++i)
    if (shapes.v[i].ndim != rank) return fail(errc::concat_rank, i, -1, shapes.v[i].ndim, rank);
  for (int i = 0; i < st.n; ++i)
    if (st.in[i].n != rank) return fail(errc::op_input_ndim, i, -1, st.in[i].n, rank);
  if (status s = check(st, device_num); !s.ok()) return s;
  if (axis < -rank || axis >= rank) return fail(errc::concat_axis, -1, -1, axis, rank);
  const int ax = axis < 0 ? axis + rank : axis;
  for (int i = 1; i < shapes.n; ++i)
    for (int d = 0; d < rank; ++d)
      if (d != ax && shapes.v[i].v[d] != shapes.v[0].v[d])
        return fail(errc::concat_shapes, i, d, shapes.v[i].v[d], shapes.v[0].v[d]);
  for (int i = 0; i < st.n; ++i)
    if (st.in[i].v[ax] != 1) return fail(errc::concat_axis_split, i, ax, st.in[i].v[ax]);
  for (int i = 1; i < st.n; ++i)
    for (int d = 0; d < rank; ++d)
      if (st.in[i].v[d] != st.in[0].v[d])
        return fail(errc::concat_split_mismatch, i, d, st.in[i].v[d], st.in[0].v[d]);
  return {};
}

/// The Concat rule: inputs and output in strategy_layout's layout of the (shared) split
/// tuple; the concat axis is whole on every rank, so each rank concatenates its shards.
/// No communication.
/// Example: (8, 4) and (8, 12) along axis 1 with ((2, 1), (2, 1)) on 8 devices ->
/// device matrix (4, 2, 1); rows split by axis 1; y (8, 16) split alike.
/// @pre check_concat(st, device_num, shapes, axis).ok()
constexpr concat_layouts concat_rule(const strategy& st, int device_num, const shape_list& shapes, int axis) {
  concat_layouts r;
  r.in = strategy_layout(st.in[0], device_num);
  r.out = r.in;
  r.dev = r.in.dev;
  r.axis = axis < 0 ? axis + shapes.v[0].ndim : axis;
  r.shape = shapes.v[0];
  for (int i = 1; i < shapes.n; ++i) r.shape.v[r.axis] += shapes.v[i].v[r.axis];
  return r;
}

/// The rule for a static strategy, shapes and axis; an invalid one fails to compile.
template <strategy St, int DeviceNum, shape_list Shapes, int Axis>
inline constexpr concat_layouts static_concat_rule = [] {
  constexpr status s = check_concat(St, DeviceNum, Shapes, Axis);
  detail::static_require<s>();
  if constexpr (s.ok()) return concat_rule(St, DeviceNum, Shapes, Axis);
  else return concat_layouts{};
}();

namespace ops {

/// Transpose with a shard strategy for its input, as `Transpose().shard(((2, 4),))`
/// applied with `perm`; rule transpose_rule: the shards are permuted in place, no
/// communication. Linear. Candidates: every split tuple of the input. Data parallel: the
/// input's dim perm[0] (the output's dim 0).
struct transpose_op {
  strategy st;
  dim_list perm;

  static constexpr std::string_view type() { return "Transpose"; }
  static constexpr std::string_view name() { return "transpose"; }
  static constexpr int arity = 1;
  /// The backward transposes dy back: it reads neither x nor y (ops/definition.hpp).
  static constexpr bool backward_reads(int) { return false; }
  static constexpr bool backward_reads_output() { return false; }

  linearity linear() const { return linearity::jointly(1u); }
  std::string attributes() const { return "perm: " + tuple_text(perm); }
  extents output_shape(const shape_list& in) const {
    require_shapes(check_transpose(all_ones(in), 1, in[0], perm));
    return transpose_rule(all_ones(in), 1, in[0], perm).shape;
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_transpose(s, device_num, in[0], perm);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const transpose_layouts r = transpose_rule(s, device_num, in[0], perm);
    return {r.dev, {r.in}, r.out, {r.in}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    return one_input_candidates(in[0], device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const {
    const int p0 = perm.n > 0 ? (perm.v[0] < 0 ? perm.v[0] + in[0].ndim : perm.v[0]) : 0;
    return split_dim(in[0], p0, device_num);
  }

  /// The rule; throws tessera::error with the rule broken, the numbers and the strategy:
  /// "transpose: perm must be a permutation of the input's dims: entry 1 is 0, input
  /// rank 2; strategy ((2, 4),)".
  transpose_layouts rule(int device_num, const extents& shape) const {
    require_rule(check_transpose(st, device_num, shape, perm), name(), st);
    return transpose_rule(st, device_num, shape, perm);
  }
  std::vector<int> perm_vector(const transpose_layouts& r) const {
    return std::vector<int>(r.perm.v.begin(), r.perm.v.begin() + r.perm.n);
  }
};

namespace detail {
// Reshape's and Flatten's definition, from the target each gives for an input shape.
template <class Op>
struct reshape_definition {
  static constexpr int arity = 1;
  /// The backward reshapes dy back: it reads neither x nor y (ops/definition.hpp).
  static constexpr bool backward_reads(int) { return false; }
  static constexpr bool backward_reads_output() { return false; }
  linearity linear() const { return linearity::jointly(1u); }
  extents output_shape(const shape_list& in) const {
    require_shapes(check_reshape(all_ones(in), 1, in[0], self().target_of(in[0])));
    return reshape_rule(all_ones(in), 1, in[0], self().target_of(in[0])).shape;
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_reshape(s, device_num, in[0], self().target_of(in[0]));
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const reshape_layouts r = reshape_rule(s, device_num, in[0], self().target_of(in[0]));
    return {r.dev, {r.in}, r.out, {r.in}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    return one_input_candidates(in[0], device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const { return split_dim(in[0], 0, device_num); }
  /// The rule; throws tessera::error with the rule broken, the numbers and the strategy:
  /// "reshape: the target shape must have the input's number of elements: the input
  /// has 128 elements, the target 96; strategy ((2, 1),)".
  reshape_layouts rule(int device_num, const extents& shape) const {
    require_rule(check_reshape(self().st, device_num, shape, self().target_of(shape)), Op::name(), self().st);
    return reshape_rule(self().st, device_num, shape, self().target_of(shape));
  }

 private:
  const Op& self() const { return static_cast<const Op&>(*this); }
};
}  // namespace detail

/// Reshape with a shard strategy for its input, as `Reshape().shard(((2, 1),))` applied
/// with `target` (one entry may be -1, inferred); rule reshape_rule: the shards stay in
/// place when only the first dim of each group of dims is split, else the input is
/// redistributed first (the rule's `in`). Linear. Candidates: every split tuple of the
/// input. Data parallel: dim 0.
struct reshape_op : detail::reshape_definition<reshape_op> {
  strategy st;
  extents target;

  reshape_op() = default;
  reshape_op(strategy s, extents t) : st(s), target(t) {}

  static constexpr std::string_view type() { return "Reshape"; }
  static constexpr std::string_view name() { return "reshape"; }
  std::string attributes() const {
    std::string s = "shape: (";
    for (int d = 0; d < target.ndim; ++d) s += (d ? ", " : "") + std::to_string(target.v[d]);
    return s + (target.ndim == 1 ? ",)" : ")");
  }
  extents target_of(const extents&) const { return target; }
};

/// Flatten with a shard strategy for its input: reshape to (shape[0], the product of the
/// other dims), as reshape_op.
struct flatten_op : detail::reshape_definition<flatten_op> {
  strategy st;

  flatten_op() = default;
  explicit flatten_op(strategy s) : st(s) {}

  static constexpr std::string_view type() { return "Flatten"; }
  static constexpr std::string_view name() { return "flatten"; }
  extents target_of(const extents& shape) const { return flatten_target(shape); }
  reshape_op as_reshape(const extents& shape) const { return reshape_op{st, flatten_target(shape)}; }
};

/// StridedSlice with a shard strategy for its input, as `StridedSlice().shard(((2, 1),))`
/// applied with begin, end and strides (Python slice semantics on the leading dims; no
/// strides: all 1); rule strided_slice_rule: a dim taken whole keeps its split, a cut dim
/// is whole on every rank (gathered first when the strategy splits it). Linear.
/// Candidates: every split tuple of the input. Data parallel: dim 0.
struct strided_slice_op {
  strategy st;
  index_list begin, end, strides;

  static constexpr std::string_view type() { return "StridedSlice"; }
  static constexpr std::string_view name() { return "strided_slice"; }
  static constexpr int arity = 1;

  linearity linear() const { return linearity::jointly(1u); }
  std::string attributes() const {
    return "begin: " + tuple_text(begin) + ", end: " + tuple_text(end) + ", strides: " + tuple_text(strides);
  }
  extents output_shape(const shape_list& in) const {
    require_shapes(check_strided_slice(all_ones(in), 1, in[0], begin, end, strides));
    return strided_slice_rule(all_ones(in), 1, in[0], begin, end, strides).shape;
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_strided_slice(s, device_num, in[0], begin, end, strides);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const strided_slice_layouts r = strided_slice_rule(s, device_num, in[0], begin, end, strides);
    return {r.dev, {r.in}, r.out, {r.in}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    return one_input_candidates(in[0], device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const { return split_dim(in[0], 0, device_num); }

  /// The rule; throws tessera::error with the rule broken, the numbers and the strategy:
  /// "strided_slice: a stride must not be 0: dim 1; strategy ((2, 4),)".
  strided_slice_layouts rule(int device_num, const extents& shape) const {
    require_rule(check_strided_slice(st, device_num, shape, begin, end, strides), name(), st);
    return strided_slice_rule(st, device_num, shape, begin, end, strides);
  }

  /// The slice each rank applies to its shard: the cut dims as given (they are whole
  /// on every rank), the whole dims taken whole.
  struct local_slice {
    std::vector<index_t> begin, end, strides;
  };
  local_slice local(const strided_slice_layouts& r) const {
    local_slice s;
    for (int d = 0; d < begin.n; ++d) {
      const bool cut = (r.cut >> d & 1u) != 0;
      s.begin.push_back(cut ? begin.v[d] : 0);
      s.end.push_back(cut ? end.v[d] : std::numeric_limits<index_t>::max());
      s.strides.push_back(cut && strides.n ? strides.v[d] : 1);
    }
    return s;
  }
};

/// Concat with a shard strategy, as `Concat(axis).shard(((2, 1), (2, 1)))`: one split
/// tuple per input, all alike, the axis unsplit; rule concat_rule: each rank joins its
/// shards. Linear in every input together. Candidates: every split tuple of the inputs
/// with the axis unsplit, given to each. Data parallel: dim 0 split over every device
/// (whole when dim 0 is the axis).
struct concat_op {
  strategy st;
  int axis = 0;

  static constexpr std::string_view type() { return "Concat"; }
  static constexpr std::string_view name() { return "concat"; }
  static constexpr int arity = -1;

  linearity linear() const { return linearity::all(max_strategy_inputs); }
  std::string attributes() const { return "axis: " + std::to_string(axis); }
  extents output_shape(const shape_list& in) const {
    require_shapes(check_concat(all_ones(in), 1, in, axis));
    return concat_rule(all_ones(in), 1, in, axis).shape;
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_concat(s, device_num, in, axis);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const concat_layouts r = concat_rule(s, device_num, in, axis);
    op_layouts l{r.dev, {}, r.out, {}, r.out};
    for (int i = 0; i < in.n; ++i) {
      l.in.push_back(r.in);
      l.in_grad.push_back(r.in);
    }
    return l;
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    extents s = in[0];
    s.v[resolved_axis(s)] = 1;  // the axis stays whole
    std::vector<strategy> c;
    for_each_split(s, device_num, [&](const split_tuple& t) { c.push_back(all(t, in)); });
    order_candidates(c, [](const strategy& x) { return x.in[0].product(); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list& in) const {
    split_tuple t = ones(in[0].ndim);
    if (t.n > 0 && resolved_axis(in[0]) != 0) t.v[0] = device_num;
    return all(t, in);
  }

  /// The rule; throws tessera::error with the rule broken, the numbers and the strategy:
  /// "concat: the concat axis cannot be split: input 0 splits dim 1 4 ways; strategy
  /// ((2, 4), (2, 4))".
  concat_layouts rule(int device_num, const shape_list& shapes) const {
    require_rule(check_concat(st, device_num, shapes, axis), name(), st);
    return concat_rule(st, device_num, shapes, axis);
  }

 private:
  int resolved_axis(const extents& s) const { return axis < 0 ? axis + s.ndim : axis; }
  static strategy all(const split_tuple& t, const shape_list& in) {
    strategy s;
    for (int i = 0; i < in.n; ++i) s.in[s.n++] = t;
    return s;
  }
};

}  // namespace ops

}  // namespace tessera
