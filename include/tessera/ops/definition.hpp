// What an operator's one definition provides, and the pieces every layer above reads
// through it: the layouts of a strategy in one form for every operator (op_layouts),
// the collectives an operator runs inside itself with their sizes
// (internal_collective), partial sums passed through linear operators, and the
// enumeration of candidate strategies the searches start from. Standard library only.
//
// An operator is one type in ops/<name>_rule.hpp (its attributes, its strategy, its
// constexpr rule and everything the graph needs to plan it; the `operator_definition`
// concept below), with its forward and backward through kernels::backend<D> in
// ops/<name>.hpp, found by argument-dependent lookup:
//
//     tensor_on<T, D> forward(const Op& op, op_inputs<T, D> x, device_context<C>& ctx);
//     op_grads<T, D> backward(const Op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
//                             const tensor_on<T, D>& y, device_context<C>& ctx);
//
// A backward that can skip the work of gradients nobody reads (a convolution's dx where
// x is data) takes one more argument, the inputs whose gradients are wanted
// (ops/run.hpp's grads_wanted), and may return nullopt for the others.
//
// ops/ runs it eagerly, autodiff::apply records it on a tape, graph/ traces, prices and
// runs it, all through that type (ops/operators.hpp lists the library's own).
#pragma once

#include <algorithm>
#include <concepts>
#include <functional>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/plan/cost.hpp>

namespace tessera {

/// What an operator's rule gives for one strategy on some number of devices: its
/// device matrix, the layout its local computation needs for each input and gives for
/// its output, and the layouts its backward works in: the gradient of each input as the
/// backward returns it (possibly partial) and the output's gradient as the backward
/// takes it. Example, MatMul ((2, 4), (4, 1)) on 8 devices: device matrix (2, 4, 1);
/// in = {[0, 1], [1, 2]}; out = [0, 2] partial sum {1}; in_grad = {[0, 1], [1, 2]
/// partial sum {0}}; out_grad = [0, 2].
struct op_layouts {
  mesh dev;
  std::vector<layout> in;
  layout out;
  std::vector<layout> in_grad;
  layout out_grad;
  friend bool operator==(const op_layouts&, const op_layouts&) = default;
};

/// A collective an operator runs inside its own computation (not a redistribution
/// between operators). Its size is the number of elements of each rank's buffer: the
/// operator hands the collective exactly that many (ops::run_internal checks it), and
/// the graph prices it from the same number (price()), so the two cannot drift.
/// Example: SoftmaxCrossEntropyWithLogits with its class dim split combines its row
/// maxima (one element per local row) over the class axis.
///
/// A "NeighborExchange" (the halo of a convolution or pooling window over a split
/// height or width) sends each rank's border rows to its neighbours along one axis;
/// what a rank receives depends on its place (the first and last have one neighbour),
/// so `rank_elements` lists the elements each rank of `dev` receives, and `bytes` is
/// the most any rank receives (what the searches compare).
struct internal_collective {
  std::string kind = "AllReduce";
  reduce_op op = reduce_op::sum;
  mesh dev;                   ///< the device matrix whose axes `axes` name
  axis_list axes;             ///< the group: ranks sharing the other coordinates
  index_t elements = 0;       ///< each rank's buffer, in elements
  index_t element_bytes = 0;  ///< 0: the operator's element size; else fixed (8: int64 indices)
  bool backward = false;      ///< runs in the backward pass
  std::string purpose;        ///< "row maxima", ...
  bool gives_output = false;  ///< its result is the operator's output (or, backward, its input's gradient)
  index_t bytes = 0;          ///< bytes each rank receives, once priced (price())
  std::vector<index_t> rank_elements;  ///< a neighbour exchange: the elements rank r of dev receives
  index_t unit_bytes = 0;              ///< once priced: the bytes of one element

  /// Whether this is a neighbour exchange (rank_elements) rather than an AllReduce.
  bool exchange() const { return kind == "NeighborExchange"; }

  /// The bytes each rank receives (the most, for an exchange) when the operator's
  /// elements have `elem_bytes` bytes.
  index_t received(index_t elem_bytes) const {
    const index_t e = element_bytes ? element_bytes : elem_bytes;
    if (exchange()) {
      index_t most = 0;
      for (index_t n : rank_elements) most = std::max(most, n);
      return most * e;
    }
    return cost::all_reduce(elements * e, group_size(dev, axes));
  }
  /// This collective with `bytes` filled in.
  internal_collective price(index_t elem_bytes) const {
    internal_collective c = *this;
    c.bytes = received(elem_bytes);
    c.unit_bytes = element_bytes ? element_bytes : elem_bytes;
    return c;
  }
  /// The bytes rank `rank` of dev receives, once priced: `bytes` for an AllReduce (every
  /// member receives alike), its own count for an exchange.
  index_t bytes_on(int rank) const {
    if (!exchange()) return bytes;
    return rank >= 0 && std::size_t(rank) < rank_elements.size() ? rank_elements[std::size_t(rank)] * unit_bytes : 0;
  }
};

/// The layouts `l` with partial sums passed through as `p` says (partial_pass).
inline op_layouts apply_pass(const op_layouts& l, const partial_pass& p) {
  if (!p.passes()) return l;
  op_layouts r = l;
  r.dev = p.dev;
  for (std::size_t i = 0; i < l.in.size(); ++i) {
    r.in[i] = p.input(l.in[i], int(i));
    r.in_grad[i] = p.input_grad(l.in_grad[i], int(i));
  }
  r.out = p.output(l.out);
  r.out_grad = p.output_grad(l.out_grad);
  return r;
}

/// The layouts `l` of a strategy when the inputs arrive in `actual`, for an operator
/// linear as `lin` says: where the inputs of one of its linear groups arrive as partial
/// sums over mesh axes on which every layout of `l` holds replicas, they stay partial,
/// and so does the output (partial_pass, ops/linear_rule.hpp); otherwise `l`. The eager
/// operators and the graph make this one decision.
inline op_layouts pass_layouts(const linearity& lin, const op_layouts& l, const std::vector<layout>& actual) {
  return apply_pass(l, pass_partial(lin, actual.data(), l.in.data(), int(l.in.size()), l.out));
}

namespace ops {

/// One operator's definition: a copyable value holding its attributes and its strategy
/// `st` (MindSpore's `shard`; empty until given), with
///
///     static constexpr std::string_view type();   // as the IR prints it: "MatMul"
///     static constexpr std::string_view name();   // instance names, errors: "matmul"
///     static constexpr int arity;                 // inputs; -1: any number (Concat)
///     extents output_shape(const shape_list& in) const;        // throws on bad shapes
///     status check(const strategy&, int device_num, const shape_list& in) const;
///     op_layouts layouts(const strategy&, int device_num, const shape_list& in) const;
///     std::vector<strategy> candidates(int device_num, const shape_list& in) const;
///     strategy data_parallel(int device_num, const shape_list& in) const;
///
/// and optionally (defaults below): linear(), differentiable(i), attributes(),
/// check_form(st, in), collectives(st, device_num, in), forward_work(l, in, out),
/// backward_reads(i), backward_reads_output().
/// `layouts` is called only for strategies `check` accepts; `candidates` lists every
/// strategy the searches consider, all passing `check`, in order of preference for ties.
template <class Op>
concept operator_definition =
    std::copyable<Op> && std::same_as<decltype(Op::st), strategy> &&
    requires(const Op& op, const strategy& st, int n, const shape_list& in) {
      { Op::type() } -> std::convertible_to<std::string_view>;
      { Op::name() } -> std::convertible_to<std::string_view>;
      { Op::arity } -> std::convertible_to<int>;
      { op.output_shape(in) } -> std::same_as<extents>;
      { op.check(st, n, in) } -> std::same_as<status>;
      { op.layouts(st, n, in) } -> std::same_as<op_layouts>;
      { op.candidates(n, in) } -> std::same_as<std::vector<strategy>>;
      { op.data_parallel(n, in) } -> std::same_as<strategy>;
    };

/// The inputs `op` is linear in (ops/linear_rule.hpp): none unless it says.
template <class Op>
linearity linear_of(const Op& op) {
  if constexpr (requires { { op.linear() } -> std::same_as<linearity>; }) return op.linear();
  else return {};
}

/// Whether input `i` of `op` gets a gradient: every input unless it says (labels, indices).
template <class Op>
bool differentiable_in(const Op& op, int i) {
  if constexpr (requires { { op.differentiable(i) } -> std::convertible_to<bool>; }) return op.differentiable(i);
  else return true;
}

/// Whether `op`'s backward reads the values of input `i`, not only its shape and layout:
/// every input unless it says (Add reads none, ReLU reads its output instead). The
/// graph executor frees a value that no backward reads as soon as the forward pass is
/// done with it (a residual block's batch-norm output once the Add has read it).
template <class Op>
bool backward_reads_input(const Op& op, int i) {
  if constexpr (requires { { op.backward_reads(i) } -> std::convertible_to<bool>; }) return op.backward_reads(i);
  else return true;
}

/// Whether `op`'s backward reads its output's values: yes unless it says.
template <class Op>
bool backward_reads_output_of(const Op& op) {
  if constexpr (requires { { op.backward_reads_output() } -> std::convertible_to<bool>; })
    return op.backward_reads_output();
  else return true;
}

/// Whether `op` has a backward at all (OneHot and ArgMax give data).
template <class Op>
bool has_backward(const Op& op, int inputs) {
  for (int i = 0; i < inputs; ++i)
    if (differentiable_in(op, i)) return true;
  return false;
}

/// The attributes the IR prints: "transpose_a: false, transpose_b: true"; none unless it says.
template <class Op>
std::string attributes_of(const Op& op) {
  if constexpr (requires { { op.attributes() } -> std::convertible_to<std::string>; }) return op.attributes();
  else return {};
}

/// Checks a strategy's form before the device count is known (`shard` calls it): one
/// split tuple per input, one entry per dim of the input, every split positive; the
/// operator's own check_form where it has one (OneHot splits its output).
template <class Op>
status check_form_of(const Op& op, const strategy& st, const shape_list& in) {
  if constexpr (requires { { op.check_form(st, in) } -> std::same_as<status>; }) {
    return op.check_form(st, in);
  } else {
    if (st.n != in.n) return fail(errc::op_inputs, -1, -1, st.n, in.n);
    for (int i = 0; i < st.n; ++i) {
      if (st.in[i].n != in[i].ndim) return fail(errc::op_input_ndim, i, -1, st.in[i].n, in[i].ndim);
      for (int d = 0; d < st.in[i].n; ++d)
        if (st.in[i].v[d] < 1) return fail(errc::strategy_split, i, d, st.in[i].v[d]);
    }
    return {};
  }
}

/// The collectives `op` runs inside its computation under a strategy, priced for
/// elements of `elem_bytes` bytes; none unless it says.
template <class Op>
std::vector<internal_collective> collectives_of(const Op& op, const strategy& st, int device_num,
                                                const shape_list& in, index_t elem_bytes) {
  std::vector<internal_collective> out;
  if constexpr (requires { { op.collectives(st, device_num, in) } -> std::same_as<std::vector<internal_collective>>; })
    for (const internal_collective& c : op.collectives(st, device_num, in)) out.push_back(c.price(elem_bytes));
  return out;
}

/// The floating-point operations of one rank's forward computation under layouts `l`
/// (the dynamic_programming search's compute cost). By default one per element of the
/// rank's input and output shards: what an element-wise operator, a reduction or a copy
/// touches. The products count their multiply-adds.
template <class Op>
double forward_work_of(const Op& op, const op_layouts& l, const shape_list& in, const extents& out) {
  if constexpr (requires { { op.forward_work(l, in, out) } -> std::convertible_to<double>; }) {
    return op.forward_work(l, in, out);
  } else {
    double w = double(local_shape(l.out, out).size());
    for (int i = 0; i < in.n; ++i) w += double(local_shape(l.in[i], in[i]).size());
    return w;
  }
}

// ---- building definitions ------------------------------------------------------------

/// A split tuple of `n` ones.
constexpr split_tuple ones(int n) {
  split_tuple t;
  t.n = n;
  for (int d = 0; d < n; ++d) t.v[d] = 1;
  return t;
}

/// The all-ones strategy for inputs of shapes `in`: every input whole, one device.
constexpr strategy all_ones(const shape_list& in) {
  strategy st;
  st.n = in.n;
  for (int i = 0; i < in.n; ++i) st.in[i] = ones(in[i].ndim);
  return st;
}

/// Throws the status of a shape check made without a strategy (output_shape).
inline void require_shapes(const status& s) {
  if (!s.ok()) throw error(s);
}

/// Throws the status of operator `op`'s rule as its error: "<op>: <rule>: <numbers>;
/// <where>", without the prefix when the rule's text already starts with the operator's
/// name: "reduce_sum: reduce: each axis must name a dim of the input: axis 2, input rank
/// 2; strategy ((2, 4),)".
inline void require_rule(const status& s, std::string_view op, std::string_view where) {
  if (s.ok()) return;
  const bool own = what_must_hold(s.code).starts_with(std::string(op) + ":");
  throw error(s, own ? std::string_view{} : op, where);
}
/// As above, where the strategy: "; strategy ((2, 4),)".
inline void require_rule(const status& s, std::string_view op, const strategy& st) {
  require_rule(s, op, "strategy " + to_string(st));
}

/// "true" or "false", for attributes.
inline std::string bool_text(bool b) { return b ? "true" : "false"; }

/// "(1, 0)", "(3,)": a list as the IR prints it.
template <class List>
std::string tuple_text(const List& l) {
  std::string s = "(";
  for (int i = 0; i < l.n; ++i) s += (i ? ", " : "") + std::to_string(l.v[i]);
  return s + (l.n == 1 ? ",)" : ")");
}

/// Calls f(t) for every split tuple t of shape.ndim entries where each entry divides its
/// extent and the product divides device_num.
template <class F>
void for_each_split(const extents& shape, int device_num, F&& f) {
  split_tuple t = ones(shape.ndim);
  std::function<void(int, int)> rec = [&](int d, int used) {
    if (d == shape.ndim) {
      f(static_cast<const split_tuple&>(t));
      return;
    }
    for (int s = 1; used * s <= device_num; ++s) {
      if (device_num % (used * s) != 0) continue;
      if (shape.v[d] % s != 0) continue;
      t.v[d] = s;
      rec(d + 1, used * s);
    }
    t.v[d] = 1;
  };
  rec(0, 1);
}

namespace detail {
// The concatenated splits of a strategy, for ordering.
inline std::vector<int> flat_splits(const strategy& st) {
  std::vector<int> v;
  for (int i = 0; i < st.n; ++i)
    for (int d = 0; d < st.in[i].n; ++d) v.push_back(st.in[i].v[d]);
  return v;
}
}  // namespace detail

/// Orders candidates: more devices doing distinct work first (fewer replicas), then the
/// concatenated splits in descending lexicographic order (earlier dims, the batch first,
/// split more). `devices` gives the number of devices a strategy's device matrix uses.
template <class Devices>
void order_candidates(std::vector<strategy>& c, Devices devices) {
  std::stable_sort(c.begin(), c.end(), [&](const strategy& x, const strategy& y) {
    const int dx = devices(x), dy = devices(y);
    if (dx != dy) return dx > dy;
    return detail::flat_splits(x) > detail::flat_splits(y);
  });
}

/// Every strategy of one input of `shape` (each split dividing its extent, the product
/// dividing the device count), ordered.
inline std::vector<strategy> one_input_candidates(const extents& shape, int device_num) {
  std::vector<strategy> c;
  for_each_split(shape, device_num, [&](const split_tuple& t) { c.push_back(strategy{t}); });
  order_candidates(c, [](const strategy& st) { return st.in[0].product(); });
  return c;
}

/// The strategy of one input of `shape` with dim `d` split `n` ways and the others whole.
inline strategy split_dim(const extents& shape, int d, int n) {
  split_tuple t = ones(shape.ndim);
  if (d >= 0 && d < t.n) t.v[d] = n;
  return strategy{t};
}

/// The number of vectors along dim `axis` in a rank's shard of `shape` under `l`: the
/// row arrays the softmax-like operators combine over their axis group.
inline index_t local_rows(const layout& l, const extents& shape, int axis) {
  index_t rows = 1;
  for (int d = 0; d < shape.ndim; ++d)
    if (d != axis) rows *= shape[d] / l.pieces(d);
  return rows;
}

/// One AllReduce of `elements` per rank over `axes` of `dev` (an internal collective).
inline internal_collective all_reduce_of(reduce_op op, const mesh& dev, const axis_list& axes, index_t elements,
                                         std::string purpose, bool backward = false) {
  internal_collective c;
  c.op = op;
  c.dev = dev;
  c.axes = axes;
  c.elements = elements;
  c.purpose = std::move(purpose);
  c.backward = backward;
  return c;
}

}  // namespace ops

}  // namespace tessera
