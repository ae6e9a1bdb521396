// The element-wise operators' definition (Add, Sub, Mul, RealDiv, ReLU, Exp, Log, Neg,
// BiasAdd, Sigmoid, Tanh) with NumPy broadcasting: the sharding rule, from a shard strategy such as
// ((2, 4), (1, 4)) and the inputs' shapes to the operator's device matrix and the
// layouts of its inputs, output and gradients (constexpr), and the operator type
// ops::elementwise_op<K>. Standard library only; the forward and backward are in
// ops/elementwise.hpp.
#pragma once

#include <array>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>

namespace tessera {

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

namespace ops {

/// Which element-wise operator.
enum class elementwise_kind { add, sub, mul, div, relu, exp, log, neg, bias_add, sigmoid, tanh };

/// Its instance and error name: "add", "div", "bias_add", ...
constexpr std::string_view kind_name(elementwise_kind k) {
  switch (k) {
    case elementwise_kind::add: return "add";
    case elementwise_kind::sub: return "sub";
    case elementwise_kind::mul: return "mul";
    case elementwise_kind::div: return "div";
    case elementwise_kind::relu: return "relu";
    case elementwise_kind::exp: return "exp";
    case elementwise_kind::log: return "log";
    case elementwise_kind::neg: return "neg";
    case elementwise_kind::bias_add: return "bias_add";
    case elementwise_kind::sigmoid: return "sigmoid";
    case elementwise_kind::tanh: return "tanh";
  }
  return "?";
}

/// Its type as the IR prints it (MindSpore's primitive names): "Add", "RealDiv", ...
constexpr std::string_view kind_type(elementwise_kind k) {
  switch (k) {
    case elementwise_kind::add: return "Add";
    case elementwise_kind::sub: return "Sub";
    case elementwise_kind::mul: return "Mul";
    case elementwise_kind::div: return "RealDiv";
    case elementwise_kind::relu: return "ReLU";
    case elementwise_kind::exp: return "Exp";
    case elementwise_kind::log: return "Log";
    case elementwise_kind::neg: return "Neg";
    case elementwise_kind::bias_add: return "BiasAdd";
    case elementwise_kind::sigmoid: return "Sigmoid";
    case elementwise_kind::tanh: return "Tanh";
  }
  return "?";
}

/// Its number of inputs.
constexpr int kind_arity(elementwise_kind k) {
  switch (k) {
    case elementwise_kind::add:
    case elementwise_kind::sub:
    case elementwise_kind::mul:
    case elementwise_kind::div:
    case elementwise_kind::bias_add: return 2;
    default: return 1;
  }
}

/// The inputs it is linear in (ops/linear_rule.hpp): Add, Sub and BiasAdd in both
/// together (both partial alike), Mul in either factor, RealDiv in its numerator, Neg in
/// its input; ReLU, Exp and Log in none.
constexpr linearity kind_linearity(elementwise_kind k) {
  switch (k) {
    case elementwise_kind::add:
    case elementwise_kind::sub:
    case elementwise_kind::bias_add: return linearity::all(2);
    case elementwise_kind::mul: return linearity::each(2);
    case elementwise_kind::div:
    case elementwise_kind::neg: return linearity::jointly(1u);
    default: return {};
  }
}

/// An element-wise operator with a shard strategy, as `Add().shard(((2, 4), (1, 4)))`:
/// one split tuple per input (a binary operator broadcasts its inputs as NumPy does;
/// BiasAdd's strategy is ((..., c), (c,)) with c the split of the last dim); rule
/// elementwise_rule. Candidates: one per split tuple of the output (each split dividing
/// its extent, the product dividing the device count); each input takes the output's
/// splits on the dims it does not broadcast and 1 elsewhere. Data parallel: the
/// output's dim 0 split over every device.
template <elementwise_kind K>
struct elementwise_op {
  strategy st;

  static constexpr std::string_view type() { return kind_type(K); }
  static constexpr std::string_view name() { return kind_name(K); }
  static constexpr int arity = kind_arity(K);

  linearity linear() const { return kind_linearity(K); }

  /// What the backward reads (ops/definition.hpp): the inputs' values for Mul, Div, Exp,
  /// Log, Sigmoid and Tanh; for ReLU its output (y > 0 exactly where x > 0); nothing for
  /// Add, Sub, Neg and BiasAdd, whose gradients are dy's alone.
  static constexpr bool backward_reads(int) {
    using enum elementwise_kind;
    return K == mul || K == div || K == exp || K == log || K == sigmoid || K == tanh;
  }
  static constexpr bool backward_reads_output() { return K == elementwise_kind::relu; }

  /// The output's shape; throws when the shapes do not broadcast, or for BiasAdd when
  /// the bias is not (c,) for x (..., c): "bias is (3,), expected (32,) for x (16, 32)".
  extents output_shape(const shape_list& in) const {
    if (in.n != arity) throw error(std::string(name()) + ": takes " + std::to_string(arity) + " inputs, got " + std::to_string(in.n));
    if constexpr (K == elementwise_kind::bias_add) {
      const extents& x = in[0];
      const extents& b = in[1];
      if (x.ndim < 1 || b.ndim != 1 || b[0] != x[x.ndim - 1])
        throw error("bias is " + to_string(b) + ", expected (" +
                    (x.ndim > 0 ? std::to_string(x[x.ndim - 1]) : std::string("?")) + ",) for x " + to_string(x));
    }
    require_shapes(check_elementwise(all_ones(in), 1, in));
    return elementwise_shape(in);
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_elementwise(s, device_num, in);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const elementwise_layouts r = elementwise_rule(s, device_num, in);
    op_layouts l{r.dev, {}, r.out, {}, r.out};
    for (int i = 0; i < r.n; ++i) {
      l.in.push_back(r.in[i]);
      l.in_grad.push_back(r.grad[i]);
    }
    return l;
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    const extents out = elementwise_shape(in);
    std::vector<strategy> c;
    for_each_split(out, device_num, [&](const split_tuple& t) { c.push_back(from_output(t, in)); });
    order_candidates(c, [&](const strategy& s) { return output_split(s, in).product(); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list& in) const {
    split_tuple t = ones(elementwise_shape(in).ndim);
    if (t.n > 0) t.v[0] = device_num;
    return from_output(t, in);
  }

  /// The strategy whose output is split by `t`: every input takes t's splits on the
  /// dims it does not broadcast. Example: Add (16, 32) + (32,) with output splits
  /// (2, 4) -> ((2, 4), (4,)).
  static strategy from_output(const split_tuple& t, const shape_list& in) {
    const extents out = elementwise_shape(in);
    strategy s;
    s.n = in.n;
    for (int i = 0; i < in.n; ++i) {
      s.in[i] = ones(in[i].ndim);
      for (int d = 0; d < in[i].ndim; ++d) {
        const int j = d + out.ndim - in[i].ndim;
        if (in[i][d] == out[j] && (in[i][d] != 1)) s.in[i].v[d] = t[j];
      }
    }
    return s;
  }
  /// The output's splits under a strategy (the inverse of from_output).
  static split_tuple output_split(const strategy& s, const shape_list& in) {
    const extents out = elementwise_shape(in);
    split_tuple t = ones(out.ndim);
    for (int i = 0; i < in.n; ++i)
      for (int d = 0; d < in[i].ndim; ++d) {
        const int j = d + out.ndim - in[i].ndim;
        if (s.in[i].v[d] > 1) t.v[j] = s.in[i].v[d];
      }
    return t;
  }

  /// The rule on `device_num` devices for inputs of the given global shapes; throws
  /// tessera::error naming the operator, the rule broken, the numbers and the strategy:
  /// "add: elementwise: a broadcast dim cannot be split: input 1, dim 0 has extent 1 and
  /// split 2; strategy ((2, 4), (2, 4))".
  elementwise_layouts rule(int device_num, const shape_list& shapes) const {
    if constexpr (K == elementwise_kind::bias_add) {
      const extents& x = shapes[0];
      const extents& b = shapes[1];
      if (shapes.n != 2 || x.ndim < 1 || b.ndim != 1 || b[0] != x[x.ndim - 1])
        throw error("bias_add: bias is " + (shapes.n > 1 ? to_string(b) : std::string("missing")) +
                    ", expected (" + (x.ndim > 0 ? std::to_string(x[x.ndim - 1]) : std::string("?")) +
                    ",) for x " + to_string(x));
    }
    require_rule(check_elementwise(st, device_num, shapes), name(), st);
    return elementwise_rule(st, device_num, shapes);
  }
};

using add_op = elementwise_op<elementwise_kind::add>;
using sub_op = elementwise_op<elementwise_kind::sub>;
using mul_op = elementwise_op<elementwise_kind::mul>;
using div_op = elementwise_op<elementwise_kind::div>;
using relu_op = elementwise_op<elementwise_kind::relu>;
using exp_op = elementwise_op<elementwise_kind::exp>;
using log_op = elementwise_op<elementwise_kind::log>;
using neg_op = elementwise_op<elementwise_kind::neg>;
using bias_add_op = elementwise_op<elementwise_kind::bias_add>;
using sigmoid_op = elementwise_op<elementwise_kind::sigmoid>;
using tanh_op = elementwise_op<elementwise_kind::tanh>;

}  // namespace ops

}  // namespace tessera
