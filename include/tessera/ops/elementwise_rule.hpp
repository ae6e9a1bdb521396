// The sharding rule of element-wise operators (Add, Sub, Mul, Div, ReLU, Exp, ...,
// BiasAdd) with NumPy broadcasting: from a shard strategy such as ((2, 4), (1, 4)) and
// the inputs' shapes to the operator's device matrix and the layouts of its inputs,
// output and gradients. Standard library only and constexpr.
#pragma once

#include <array>
#include <initializer_list>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/strategy.hpp>

namespace tessera {

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

/// The layouts of y = f(x0, x1, ...) applied element by element with broadcasting.
struct elementwise_layouts {
  mesh dev;                                          ///< the operator's device matrix
  int n = 0;                                         ///< number of inputs
  std::array<layout, max_strategy_inputs> in{};      ///< the inputs as the local op needs them
  layout out;                                        ///< the output
  std::array<layout, max_strategy_inputs> grad{};    ///< dx_i: in[i], partial over the output
                                                     ///< axes along which x_i is broadcast
  extents shape;                                     ///< the output's global shape
  friend constexpr bool operator==(const elementwise_layouts&, const elementwise_layouts&) = default;
};

namespace detail {

// Input i's dim that lines up with output dim j of an output of rank r (inputs align on
// the right), or -1 when the input is too short to have it.
constexpr int elementwise_input_dim(const extents& in, int r, int j) {
  const int d = j - (r - in.ndim);
  return d >= 0 ? d : -1;
}

// The output rank: the largest input rank.
constexpr int elementwise_rank(const shape_list& shapes) {
  int r = 0;
  for (int i = 0; i < shapes.n; ++i) r = shapes.v[i].ndim > r ? shapes.v[i].ndim : r;
  return r;
}

// True when input i is stretched along output dim j: it lacks the dim, or has extent 1
// where the output does not.
constexpr bool elementwise_broadcasts(const extents& in, const extents& out, int j) {
  const int d = elementwise_input_dim(in, out.ndim, j);
  return d < 0 || (in.v[d] == 1 && out.v[j] != 1);
}

}  // namespace detail

/// The broadcast shape of the inputs (NumPy's rule: align on the right; a missing dim or
/// an extent of 1 stretches). A dynamic extent stands for a full dim.
/// @pre check_elementwise(...) passed the shape checks
constexpr extents elementwise_shape(const shape_list& shapes) {
  extents out;
  out.ndim = detail::elementwise_rank(shapes);
  for (int j = 0; j < out.ndim; ++j) {
    index_t e = 1;
    for (int i = 0; i < shapes.n; ++i) {
      const int d = detail::elementwise_input_dim(shapes.v[i], out.ndim, j);
      if (d < 0) continue;
      const index_t x = shapes.v[i].v[d];
      if (x != 1 && (e == 1 || e == dynamic_extent)) e = x;
    }
    out.v[j] = e;
  }
  return out;
}

/// Checks an element-wise strategy on `device_num` devices for inputs of the given
/// shapes: one split tuple per input with one entry per input dim, positive splits whose
/// product divides the device count, shapes that broadcast, a dim that an input
/// broadcasts (extent 1) unsplit in that input, every input that has an output dim (not
/// broadcast) splitting it alike, and an output split tuple whose product divides the
/// device count. Example: Add of (16, 32) and (1, 32): ((2, 4), (1, 4)) is valid;
/// ((2, 4), (2, 4)) splits a broadcast dim; ((2, 4), (1, 2)) splits dim 1 unlike input 0.
constexpr status check_elementwise(const strategy& st, int device_num, const shape_list& shapes) {
  if (st.n != shapes.n) return fail(errc::op_inputs, -1, -1, st.n, shapes.n);
  for (int i = 0; i < st.n; ++i)
    if (st.in[i].n != shapes.v[i].ndim) return fail(errc::op_input_ndim, i, -1, st.in[i].n, shapes.v[i].ndim);
  if (status s = check(st, device_num); !s.ok()) return s;
  for (int i = 0; i < shapes.n; ++i)
    for (int d = 0; d < shapes.v[i].ndim; ++d)
      if (shapes.v[i].v[d] < 0 && shapes.v[i].v[d] != dynamic_extent)
        return fail(errc::negative_extent, d, -1, shapes.v[i].v[d]);
  const int r = detail::elementwise_rank(shapes);
  for (int j = 0; j < r; ++j) {
    index_t extent = 1;  // the first extent other than 1 along output dim j
    for (int i = 0; i < shapes.n; ++i) {
      const int d = detail::elementwise_input_dim(shapes.v[i], r, j);
      if (d < 0) continue;
      const index_t x = shapes.v[i].v[d];
      if (x == 1) continue;
      if (extent == 1 || extent == dynamic_extent) extent = x;
      else if (x != dynamic_extent && x != extent)
        return fail(errc::elementwise_shapes, i, j, x, extent);
    }
  }
  const extents out = elementwise_shape(shapes);
  int out_product = 1;
  for (int j = 0; j < r; ++j) {
    int split = 0;  // 0: no input has dim j unbroadcast yet
    for (int i = 0; i < st.n; ++i) {
      const int d = detail::elementwise_input_dim(shapes.v[i], r, j);
      if (d < 0) continue;
      const int s = st.in[i].v[d];
      if (detail::elementwise_broadcasts(shapes.v[i], out, j) || shapes.v[i].v[d] == 1) {
        if (s != 1) return fail(errc::broadcast_dim_split, i, d, s);
        continue;
      }
      if (split == 0) split = s;
      else if (s != split) return fail(errc::elementwise_split_mismatch, i, j, s, split);
    }
    out_product *= split == 0 ? 1 : split;
  }
  if (device_num % out_product != 0) return fail(errc::op_device_num, -1, -1, out_product, device_num);
  return {};
}

/// The element-wise rule, as MindSpore's: the device matrix is the output's split tuple
/// (per output dim, the split of the inputs that have that dim), preceded by a replica
/// axis when it uses fewer devices than there are (strategy_layout's convention). The
/// output's dim j is split by its own device-matrix axis; each input's dims by the
/// axes of the output dims they line up with, except the dims it broadcasts (unsplit,
/// so the input is replicated over those axes). The gradient of an input is summed
/// over the dims it broadcasts; where such a dim's axis splits the output, the local
/// sums are partial over that axis.
/// Example: Add (16, 32) + (32,) with ((2, 4), (4,)) on 16 devices -> device matrix
/// (2, 2, 4); the output and x0 are split rows by axis 1, columns by axis 2; x1 is
/// split by axis 2 and replicated over axes 0 and 1; dx1 is partial over axis 1.
/// @pre check_elementwise(st, device_num, shapes).ok()
constexpr elementwise_layouts elementwise_rule(const strategy& st, int device_num,
                                               const shape_list& shapes) {
  elementwise_layouts r;
  r.n = st.n;
  r.shape = elementwise_shape(shapes);
  const int rank = r.shape.ndim;
  split_tuple out_split;
  out_split.n = rank;
  for (int j = 0; j < rank; ++j) {
    out_split.v[j] = 1;
    for (int i = 0; i < st.n; ++i) {
      const int d = detail::elementwise_input_dim(shapes.v[i], rank, j);
      if (d >= 0 && !detail::elementwise_broadcasts(shapes.v[i], r.shape, j) && st.in[i].v[d] > 1)
        out_split.v[j] = st.in[i].v[d];
    }
  }
  r.out = strategy_layout(out_split, device_num);
  r.dev = r.out.dev;
  const int first = r.dev.ndim - rank;
  for (int i = 0; i < st.n; ++i) {
    const extents& x = shapes.v[i];
    layout l = layout::replicated(r.dev, x.ndim);
    layout g = l;
    for (int j = 0; j < rank; ++j) {
      const int d = detail::elementwise_input_dim(x, rank, j);
      if (d >= 0 && !detail::elementwise_broadcasts(x, r.shape, j)) {
        l.split[d] = axis_list{first + j};
      } else if (out_split.v[j] > 1) {
        g = g.with_partial(first + j);
      }
    }
    for (int d = 0; d < x.ndim; ++d) g.split[d] = l.split[d];
    r.in[i] = l;
    r.grad[i] = g;
  }
  return r;
}

/// The rule for a static strategy and static shapes; an invalid one fails to compile
/// with the rule it breaks as the message.
template <strategy St, int DeviceNum, shape_list Shapes>
inline constexpr elementwise_layouts static_elementwise_rule = [] {
  constexpr status s = check_elementwise(St, DeviceNum, Shapes);
  detail::static_require<s>();
  if constexpr (s.ok()) return elementwise_rule(St, DeviceNum, Shapes);
  else return elementwise_layouts{};
}();

}  // namespace tessera
