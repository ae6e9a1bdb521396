// Operators of the traced graph: each one's shape inference, sharding rule (strategy
// -> layouts, through the constexpr rules of ops/*_rule.hpp), default data-parallel
// strategy and candidate strategies for the search. Standard library only: the
// graph's parallel passes run without xtensor, BLAS or MPI.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/elementwise_rule.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/ops/matmul_rule.hpp>
#include <tessera/ops/reduce_rule.hpp>
#include <tessera/ops/softmax_rule.hpp>
#include <tessera/plan/cache.hpp>
#include <tessera/plan/cost.hpp>
#include <tessera/plan/planner.hpp>

namespace tessera::graph {

/// What an operator's sharding rule gives for one strategy on some number of devices:
/// its device matrix, the layout its local computation needs for each input and gives
/// for its output, and the layouts its backward works in: the gradient of each input
/// as the backward returns it (possibly partial) and the output's gradient as the
/// backward takes it. Example, MatMul ((2, 4), (4, 1)) on 8 devices: device matrix
/// (2, 4, 1); in = {[0, 1], [1, 2]}; out = [0, 2] partial sum {1}; in_grad = {[0, 1],
/// [1, 2] partial sum {0}}; out_grad = [0, 2].
struct op_layouts {
  mesh dev;
  std::vector<layout> in;
  layout out;
  std::vector<layout> in_grad;
  layout out_grad;
  friend bool operator==(const op_layouts&, const op_layouts&) = default;
};

/// A collective an operator runs inside its own computation (not a redistribution
/// between operators), for the dumps and the price of a strategy. Example:
/// SoftmaxCrossEntropyWithLogits with the class dim split combines its row maxima and
/// row sums over the class axis.
struct internal_collective {
  std::string kind;       ///< "AllReduce"
  reduce_op op = reduce_op::sum;
  mesh dev;               ///< the device matrix whose axes `axes` name
  axis_list axes;         ///< the group: ranks sharing the other coordinates
  index_t bytes = 0;      ///< bytes each rank receives
  bool backward = false;  ///< runs in the backward pass
  std::string purpose;    ///< "row maxima", ...
  bool gives_output = false;  ///< its result is the operator's output (or, backward, its input's gradient)
};

/// An operator of the graph. Implement one to add an operator: its type and arity,
/// its output shape, and its sharding rule (usually the constexpr rule of
/// ops/<name>_rule.hpp), the strategy it takes under data parallelism, and the
/// strategies sharding propagation may give it. The graph executor (graph/execute.hpp)
/// runs it by its type() through a runner (a function recording it on the autodiff tape).
class op_def {
 public:
  virtual ~op_def() = default;

  /// The operator's type as the IR prints it, e.g. "MatMul". Also the key of its runner.
  virtual std::string type() const = 0;
  /// The instance name given when the user gives none, e.g. "matmul".
  virtual std::string default_name() const = 0;
  /// The number of inputs.
  virtual int arity() const = 0;
  /// The output's global shape for inputs of shapes `in`; throws tessera::error whose
  /// text says why the shapes do not fit (without the operator's name; the graph adds it).
  virtual extents output_shape(const shape_list& in) const = 0;
  /// Checks a strategy's form before the device count is known (shard() calls it): one
  /// split tuple per input, one entry per dim of the input, every split positive.
  virtual status check_form(const strategy& st, const shape_list& in) const {
    if (st.n != in.n) return fail(errc::op_inputs, -1, -1, st.n, in.n);
    for (int i = 0; i < st.n; ++i) {
      if (st.in[i].n != in[i].ndim) return fail(errc::op_input_ndim, i, -1, st.in[i].n, in[i].ndim);
      for (int d = 0; d < st.in[i].n; ++d)
        if (st.in[i].v[d] < 1) return fail(errc::strategy_split, i, d, st.in[i].v[d]);
    }
    return {};
  }
  /// Checks a strategy on `device_num` devices for inputs of shapes `in` (the rule's
  /// own checks; the graph checks the divisibility of every layout afterwards).
  virtual status check(const strategy& st, int device_num, const shape_list& in) const = 0;
  /// The layouts of a strategy. @pre check(st, device_num, in).ok()
  virtual op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const = 0;
  /// Every strategy sharding propagation considers, in order of preference for ties
  /// (see graph/propagate.hpp); all pass check() and split every dim evenly.
  virtual std::vector<strategy> candidates(int device_num, const shape_list& in) const = 0;
  /// The strategy under data parallelism: the batch (the output's dim 0) split over
  /// every device, everything else whole.
  virtual strategy data_parallel(int device_num, const shape_list& in) const = 0;
  /// Attributes printed in the IR, e.g. "transpose_a: false, transpose_b: false".
  virtual std::string attributes() const { return {}; }
  /// The inputs the operator is linear in (ops/linear_rule.hpp): partial sums arriving
  /// there may stay partial through it (see pass_layouts). None by default.
  virtual linearity linear() const { return {}; }
  /// Whether input `i` gets a gradient (labels do not).
  virtual bool differentiable(int i) const {
    (void)i;
    return true;
  }
  /// The collectives the operator runs inside its computation for a strategy.
  virtual std::vector<internal_collective> collectives(const strategy& st, int device_num,
                                                       const shape_list& in, index_t elem_bytes) const {
    (void)st, (void)device_num, (void)in, (void)elem_bytes;
    return {};
  }
  /// The floating-point operations of one rank's forward computation under layouts
  /// `l` (the dynamic_programming search's compute cost; graph/parallel.hpp). By
  /// default one per element of the rank's input and output shards: what an
  /// element-wise operator, a reduction or a copy touches. The products count their
  /// multiply-adds (matmul_def).
  virtual double forward_work(const op_layouts& l, const shape_list& in, const extents& out) const {
    double w = double(local_shape(l.out, out).size());
    for (int i = 0; i < in.n; ++i) w += double(local_shape(l.in[i], in[i]).size());
    return w;
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

/// The layouts `l` of one of `op`'s strategies when its inputs arrive in `actual`: where
/// the inputs of one of its linear groups arrive as partial sums over mesh axes on which
/// every layout of `l` holds replicas, they stay partial, and so does the output
/// (partial_pass, ops/linear_rule.hpp: everything written on the common refinement of
/// the device matrices; the backward takes the output's gradient without those axes, and
/// the inputs outside the group get their gradients partial over them). Otherwise `l`.
/// The operators of ops/ make the same decision from the layouts their inputs arrive in.
inline op_layouts pass_layouts(const op_def& op, const op_layouts& l, const std::vector<layout>& actual) {
  return apply_pass(l, pass_partial(op.linear(), actual.data(), l.in.data(), int(l.in.size()), l.out));
}

/// The variants of layouts `l` (one strategy of `op`) that keep partial sums: for each
/// linear group of `op` and each layout in `arriving[i]` that input i of the group may
/// arrive in (a producer's possible output layouts), the layouts when every input of the
/// group arrives partial like it (pass_layouts); distinct, and none equal to `l`. A group
/// with an input that cannot arrive partial gives none.
/// Sharding propagation weighs them against `l` itself; an input of a variant that takes
/// partial sums must get them from its producer (an operator never masks a whole value
/// into partial sums).
inline std::vector<op_layouts> partial_variants(const op_def& op, const op_layouts& l,
                                                const std::vector<std::vector<layout>>& arriving) {
  std::vector<op_layouts> out;
  const linearity lin = op.linear();
  auto some_partial = [&](std::size_t j) {
    if (j >= arriving.size()) return false;
    for (const layout& x : arriving[j])
      if (x.has_partial()) return true;
    return false;
  };
  for (int g = 0; g < lin.n; ++g) {
    bool fed = true;  // every input of the group may arrive partial
    for (std::size_t j = 0; j < l.in.size(); ++j)
      if ((lin.groups[g] >> j & 1u) && !some_partial(j)) fed = false;
    if (!fed) continue;
    for (std::size_t i = 0; i < l.in.size() && i < arriving.size(); ++i) {
      if (!(lin.groups[g] >> i & 1u)) continue;
      for (const layout& x : arriving[i]) {
        if (!x.has_partial()) continue;
        std::vector<layout> actual = l.in;
        for (std::size_t j = 0; j < actual.size(); ++j)
          if (lin.groups[g] >> j & 1u) actual[j] = x;
        const partial_pass p = pass_partial_group(lin.groups[g], actual.data(), l.in.data(), int(l.in.size()), l.out);
        if (!p.passes()) continue;
        op_layouts v = apply_pass(l, p);
        if (!(v == l) && std::find(out.begin(), out.end(), v) == out.end()) out.push_back(std::move(v));
      }
    }
  }
  return out;
}

// ---- candidate enumeration -----------------------------------------------------------

namespace detail {

// Calls f(t) for every split tuple t of shape.ndim entries where each entry divides its
// extent and the product divides device_num.
template <class F>
void for_each_split(const extents& shape, int device_num, F&& f) {
  split_tuple t;
  t.n = shape.ndim;
  for (int d = 0; d < t.n; ++d) t.v[d] = 1;
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

// The concatenated splits of a strategy, for ordering.
inline std::vector<int> flat_splits(const strategy& st) {
  std::vector<int> v;
  for (int i = 0; i < st.n; ++i)
    for (int d = 0; d < st.in[i].n; ++d) v.push_back(st.in[i].v[d]);
  return v;
}

// Orders candidates: more devices doing distinct work first (fewer replicas), then the
// concatenated splits in descending lexicographic order (earlier dims, the batch first,
// split more). `devices` gives the number of devices a strategy's device matrix uses.
template <class Devices>
void order_candidates(std::vector<strategy>& c, Devices devices) {
  std::stable_sort(c.begin(), c.end(), [&](const strategy& x, const strategy& y) {
    const int dx = devices(x), dy = devices(y);
    if (dx != dy) return dx > dy;
    return flat_splits(x) > flat_splits(y);
  });
}

inline split_tuple ones(int n) {
  split_tuple t;
  t.n = n;
  for (int d = 0; d < n; ++d) t.v[d] = 1;
  return t;
}

inline std::string bool_text(bool b) { return b ? "true" : "false"; }

// The bytes per rank that resolve a partial layout (its reduction into the layout
// without partial axes), as the planner prices it (planned once per process).
inline index_t resolve_bytes(const layout& partial, const extents& shape, index_t elem_bytes) {
  return cached_plan(partial, partial.without_partial(), shape, elem_bytes)->p.bytes_per_rank();
}

// The number of vectors along dim `axis` in a rank's shard of `shape` under `l`.
inline index_t local_rows(const layout& l, const extents& shape, int axis) {
  index_t rows = 1;
  for (int d = 0; d < shape.ndim; ++d)
    if (d != axis) rows *= shape[d] / l.pieces(d);
  return rows;
}

}  // namespace detail

// ---- MatMul --------------------------------------------------------------------------

/// MatMul(transpose_a, transpose_b): C = op(A) op(B) of two matrices; rule
/// ops/matmul_rule.hpp. Candidates: every ((m, k), (k, n)) (swapped for a transposed
/// operand) with m, k, n dividing C's rows, the contraction and C's columns and m k n
/// dividing the device count. Data parallel: m = device count.
class matmul_def : public op_def {
 public:
  bool transpose_a = false;
  bool transpose_b = false;

  explicit matmul_def(bool ta = false, bool tb = false) : transpose_a(ta), transpose_b(tb) {}

  std::string type() const override { return "MatMul"; }
  std::string default_name() const override { return "matmul"; }
  int arity() const override { return 2; }
  linearity linear() const override { return linearity::each(2); }
  /// 2 m k n / (the devices that split them): each rank's product of its shards.
  double forward_work(const op_layouts& l, const shape_list& in, const extents& out) const override {
    const extents a = local_shape(l.in[0], in[0]);
    return 2.0 * double(local_shape(l.out, out).size()) * double(transpose_a ? a[0] : a[1]);
  }
  std::string attributes() const override {
    return "transpose_a: " + detail::bool_text(transpose_a) + ", transpose_b: " + detail::bool_text(transpose_b);
  }

  extents output_shape(const shape_list& in) const override {
    const extents& a = in[0];
    const extents& b = in[1];
    if (a.ndim != 2 || b.ndim != 2 || (transpose_a ? a[0] : a[1]) != (transpose_b ? b[1] : b[0]))
      throw error("shapes " + to_string(a) + " and " + to_string(b) + " do not multiply (transpose_a " +
                  detail::bool_text(transpose_a) + ", transpose_b " + detail::bool_text(transpose_b) + ")");
    return extents{transpose_a ? a[1] : a[0], transpose_b ? b[0] : b[1]};
  }
  status check(const strategy& st, int device_num, const shape_list&) const override {
    return check_matmul(st, device_num, transpose_a, transpose_b);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list&) const override {
    const matmul_layouts r = matmul_rule(st, device_num, transpose_a, transpose_b);
    return {r.dev, {r.a, r.b}, r.c, {r.grad_a, r.grad_b}, r.c.without_partial()};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    const extents c = output_shape(in);
    const index_t k = transpose_a ? in[0][0] : in[0][1];
    std::vector<strategy> out;
    detail::for_each_split(extents{c[0], k, c[1]}, device_num, [&](const split_tuple& t) {
      out.push_back(make(t[0], t[1], t[2]));
    });
    detail::order_candidates(out, [&](const strategy& st) { return devices(st); });
    return out;
  }
  strategy data_parallel(int device_num, const shape_list&) const override { return make(device_num, 1, 1); }

  /// The strategy of row, contraction and column splits (m, k, n).
  strategy make(int m, int k, int n) const {
    return strategy{transpose_a ? split_tuple{k, m} : split_tuple{m, k},
                    transpose_b ? split_tuple{n, k} : split_tuple{k, n}};
  }

 private:
  int devices(const strategy& st) const {
    return st.in[0].product() * (transpose_b ? st.in[1].v[0] : st.in[1].v[1]);
  }
};

// ---- element-wise operators ----------------------------------------------------------

/// An element-wise operator with NumPy broadcasting (Add, Sub, Mul, RealDiv, ReLU, Exp,
/// Log, Neg, BiasAdd); rule ops/elementwise_rule.hpp. Candidates: one per split tuple
/// of the output (each split dividing its extent, the product dividing the device
/// count); each input takes the output's splits on the dims it does not broadcast and
/// 1 elsewhere. Data parallel: the output's dim 0 split over every device.
class elementwise_def : public op_def {
 public:
  /// `type` as printed ("Add"), `name` the default instance name ("add").
  /// `lin`: the inputs it is linear in (ops::linear_in of its kind).
  elementwise_def(std::string type, std::string name, int arity, bool bias_add = false, linearity lin = {})
      : type_(std::move(type)), name_(std::move(name)), arity_(arity), bias_add_(bias_add), lin_(lin) {}

  std::string type() const override { return type_; }
  std::string default_name() const override { return name_; }
  int arity() const override { return arity_; }
  linearity linear() const override { return lin_; }
  bool is_bias_add() const { return bias_add_; }

  extents output_shape(const shape_list& in) const override {
    if (bias_add_) {
      const extents& x = in[0];
      const extents& b = in[1];
      if (x.ndim < 1 || b.ndim != 1 || b[0] != x[x.ndim - 1])
        throw error("bias is " + to_string(b) + ", expected (" +
                    (x.ndim > 0 ? std::to_string(x[x.ndim - 1]) : std::string("?")) + ",) for x " + to_string(x));
    }
    strategy st;
    st.n = in.n;
    for (int i = 0; i < in.n; ++i) st.in[i] = detail::ones(in[i].ndim);
    if (const status s = check_elementwise(st, 1, in); !s.ok()) throw error(s);
    return elementwise_shape(in);
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_elementwise(st, device_num, in);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const elementwise_layouts r = elementwise_rule(st, device_num, in);
    op_layouts l{r.dev, {}, r.out, {}, r.out};
    for (int i = 0; i < r.n; ++i) {
      l.in.push_back(r.in[i]);
      l.in_grad.push_back(r.grad[i]);
    }
    return l;
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    const extents out = elementwise_shape(in);
    std::vector<strategy> c;
    detail::for_each_split(out, device_num, [&](const split_tuple& t) { c.push_back(from_output(t, in)); });
    detail::order_candidates(c, [&](const strategy& st) { return output_split(st, in).product(); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list& in) const override {
    split_tuple t = detail::ones(elementwise_shape(in).ndim);
    if (t.n > 0) t.v[0] = device_num;
    return from_output(t, in);
  }

  /// The strategy whose output is split by `t`: every input takes t's splits on the
  /// dims it does not broadcast. Example: Add (16, 32) + (32,) with output splits
  /// (2, 4) -> ((2, 4), (4,)).
  strategy from_output(const split_tuple& t, const shape_list& in) const {
    const extents out = elementwise_shape(in);
    strategy st;
    st.n = in.n;
    for (int i = 0; i < in.n; ++i) {
      st.in[i] = detail::ones(in[i].ndim);
      for (int d = 0; d < in[i].ndim; ++d) {
        const int j = d + out.ndim - in[i].ndim;
        if (in[i][d] == out[j] && (in[i][d] != 1)) st.in[i].v[d] = t[j];
      }
    }
    return st;
  }
  /// The output's splits under a strategy (the inverse of from_output).
  split_tuple output_split(const strategy& st, const shape_list& in) const {
    const extents out = elementwise_shape(in);
    split_tuple t = detail::ones(out.ndim);
    for (int i = 0; i < in.n; ++i)
      for (int d = 0; d < in[i].ndim; ++d) {
        const int j = d + out.ndim - in[i].ndim;
        if (st.in[i].v[d] > 1) t.v[j] = st.in[i].v[d];
      }
    return t;
  }

 private:
  std::string type_, name_;
  int arity_;
  bool bias_add_;
  linearity lin_;
};

/// The element-wise operators by name.
/// Linearity as ops::linear_in gives it: Add, Sub, BiasAdd in both inputs together, Mul
/// in either, RealDiv in the numerator, Neg in its input.
inline std::shared_ptr<const op_def> add_def() {
  return std::make_shared<elementwise_def>("Add", "add", 2, false, linearity::all(2));
}
inline std::shared_ptr<const op_def> sub_def() {
  return std::make_shared<elementwise_def>("Sub", "sub", 2, false, linearity::all(2));
}
inline std::shared_ptr<const op_def> mul_def() {
  return std::make_shared<elementwise_def>("Mul", "mul", 2, false, linearity::each(2));
}
inline std::shared_ptr<const op_def> div_def() {
  return std::make_shared<elementwise_def>("RealDiv", "div", 2, false, linearity::jointly(1u));
}
inline std::shared_ptr<const op_def> bias_add_def() {
  return std::make_shared<elementwise_def>("BiasAdd", "bias_add", 2, true, linearity::all(2));
}
inline std::shared_ptr<const op_def> relu_def() { return std::make_shared<elementwise_def>("ReLU", "relu", 1); }
inline std::shared_ptr<const op_def> exp_def() { return std::make_shared<elementwise_def>("Exp", "exp", 1); }
inline std::shared_ptr<const op_def> log_def() { return std::make_shared<elementwise_def>("Log", "log", 1); }
inline std::shared_ptr<const op_def> neg_def() {
  return std::make_shared<elementwise_def>("Neg", "neg", 1, false, linearity::jointly(1u));
}

// ---- reductions ----------------------------------------------------------------------

/// ReduceSum, ReduceMean, ReduceMax or ReduceMin over `dims` (empty: every dim), with keep_dims;
/// rule ops/reduce_rule.hpp (a split reduced dim leaves the output partial).
/// Candidates: every split tuple of the input (each split dividing its extent, the
/// product dividing the device count). Data parallel: the input's dim 0 split over
/// every device.
class reduce_def : public op_def {
 public:
  reduce_op how = reduce_op::sum;  ///< sum, mean, max or min
  dim_list dims;
  bool keep_dims = false;

  reduce_def(reduce_op h, dim_list d, bool keep) : how(h), dims(d), keep_dims(keep) {}

  std::string type() const override {
    switch (how) {
      case reduce_op::mean: return "ReduceMean";
      case reduce_op::max: return "ReduceMax";
      case reduce_op::min: return "ReduceMin";
      default: return "ReduceSum";
    }
  }
  std::string default_name() const override {
    switch (how) {
      case reduce_op::mean: return "reduce_mean";
      case reduce_op::max: return "reduce_max";
      case reduce_op::min: return "reduce_min";
      default: return "reduce_sum";
    }
  }
  int arity() const override { return 1; }
  linearity linear() const override { return reduction_linearity(how); }
  std::string attributes() const override {
    std::string s = "axis: (";
    for (int i = 0; i < dims.n; ++i) s += (i ? ", " : "") + std::to_string(dims.v[i]);
    return s + (dims.n == 1 ? ",)" : ")") + ", keep_dims: " + detail::bool_text(keep_dims);
  }

  extents output_shape(const shape_list& in) const override {
    const strategy st{detail::ones(in[0].ndim)};
    if (const status s = check_reduce(st, 1, in[0], dims); !s.ok()) throw error(s);
    return reduce_rule(st, 1, in[0], dims, keep_dims, how).shape;
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_reduce(st, device_num, in[0], dims);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const reduce_layouts r = reduce_rule(st, device_num, in[0], dims, keep_dims, how);
    return {r.dev, {r.in}, r.out, {r.in}, r.out.without_partial()};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    std::vector<strategy> c;
    detail::for_each_split(in[0], device_num, [&](const split_tuple& t) { c.push_back(strategy{t}); });
    detail::order_candidates(c, [](const strategy& st) { return st.in[0].product(); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list& in) const override {
    split_tuple t = detail::ones(in[0].ndim);
    if (t.n > 0) t.v[0] = device_num;
    return strategy{t};
  }
  /// The backward of ReduceMax (ReduceMin) resolves the partial maxima (minima) and the
  /// counts of ties over the axes of split reduced dims: two reductions of the output's
  /// shard, priced by the planner.
  std::vector<internal_collective> collectives(const strategy& st, int device_num, const shape_list& in,
                                               index_t elem_bytes) const override {
    if (how != reduce_op::max && how != reduce_op::min) return {};
    const reduce_layouts r = reduce_rule(st, device_num, in[0], dims, keep_dims, how);
    if (!r.out.has_partial()) return {};
    axis_list axes;
    for (int a = 0; a < r.dev.ndim; ++a)
      if (r.out.is_partial(a)) axes.push_back(a);
    layout counts = r.out;
    counts.op = reduce_op::sum;
    return {{"AllReduce", how, r.dev, axes, detail::resolve_bytes(r.out, r.shape, elem_bytes), true,
             how == reduce_op::max ? "the maxima" : "the minima"},
            {"AllReduce", reduce_op::sum, r.dev, axes, detail::resolve_bytes(counts, r.shape, elem_bytes), true,
             "the counts of ties"}};
  }
};

// ---- SoftmaxCrossEntropyWithLogits ---------------------------------------------------

/// The per-sample loss (B,) of logits (B, C) against labels (B, C); rule
/// ops/softmax_rule.hpp. Labels get no gradient. Candidates: every ((b, c), (b, c)) with
/// b | B, c | C and b c dividing the device count. Data parallel: b = device count.
/// With the class dim split (c > 1) it combines row maxima and row sums over the class
/// axis, forward and backward.
class softmax_cross_entropy_def : public op_def {
 public:
  std::string type() const override { return "SoftmaxCrossEntropyWithLogits"; }
  std::string default_name() const override { return "softmax_cross_entropy"; }
  int arity() const override { return 2; }
  bool differentiable(int i) const override { return i == 0; }

  extents output_shape(const shape_list& in) const override {
    const strategy st{detail::ones(in[0].ndim), detail::ones(in[1].ndim)};
    if (const status s = check_softmax_cross_entropy(st, 1, in[0], in[1]); !s.ok()) throw error(s);
    return extents{in[0][0]};
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_softmax_cross_entropy(st, device_num, in[0], in[1]);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const cross_entropy_layouts r = softmax_cross_entropy_rule(st, device_num, in[0]);
    return {r.dev, {r.logits, r.labels}, r.out, {r.logits, r.labels}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    std::vector<strategy> c;
    detail::for_each_split(in[0], device_num, [&](const split_tuple& t) { c.push_back(strategy{t, t}); });
    detail::order_candidates(c, [](const strategy& st) { return st.in[0].product(); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list&) const override {
    return strategy{{device_num, 1}, {device_num, 1}};
  }
  std::vector<internal_collective> collectives(const strategy& st, int device_num, const shape_list& in,
                                               index_t elem_bytes) const override {
    const cross_entropy_layouts r = softmax_cross_entropy_rule(st, device_num, in[0]);
    if (r.class_split <= 1) return {};
    const index_t rows = in[0][0] / st.in[0].v[0];
    const axis_list axes{r.class_axis};
    const index_t one = cost::all_reduce(rows * elem_bytes, r.class_split);
    const index_t three = cost::all_reduce(3 * rows * elem_bytes, r.class_split);
    return {{"AllReduce", reduce_op::max, r.dev, axes, one, false, "row maxima"},
            {"AllReduce", reduce_op::sum, r.dev, axes, three, false, "row sums"},
            {"AllReduce", reduce_op::max, r.dev, axes, one, true, "row maxima"},
            {"AllReduce", reduce_op::sum, r.dev, axes, three, true, "row sums"}};
  }
};

// ---- AllReduce (hybrid parallel) -----------------------------------------------------

/// An AllReduce (sum) the user places in a hybrid-parallel network: every rank gets the
/// sum of the ranks' tensors, over all ranks or over the group of some mesh axes. Its
/// gradient is the AllReduce (sum) of the gradients over the same group. Only
/// hybrid_parallel runs it; its strategy is all ones (each rank's tensor is whole).
class all_reduce_def : public op_def {
 public:
  /// The group: empty for every rank; else the ranks sharing this rank's coordinates
  /// on the mesh axes other than `axes` of `group_mesh` (whose size must be the device count).
  std::optional<mesh> group_mesh;
  axis_list axes;

  all_reduce_def() = default;
  all_reduce_def(const mesh& m, const axis_list& a) : group_mesh(m), axes(a) {}

  std::string type() const override { return "AllReduce"; }
  std::string default_name() const override { return "all_reduce"; }
  int arity() const override { return 1; }
  std::string attributes() const override {
    if (!group_mesh) return "op: sum, group: all ranks";
    std::string s = "op: sum, group: mesh " + to_string(*group_mesh) + " axes (";
    for (int i = 0; i < axes.n; ++i) s += (i ? ", " : "") + std::to_string(axes.v[i]);
    return s + (axes.n == 1 ? ",)" : ")");
  }
  extents output_shape(const shape_list& in) const override { return in[0]; }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    if (st.n != 1) return fail(errc::op_inputs, -1, -1, st.n, 1);
    if (st.in[0].n != in[0].ndim) return fail(errc::op_input_ndim, 0, -1, st.in[0].n, in[0].ndim);
    return tessera::check(st, device_num);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const layout l = strategy_layout(st.in[0], device_num);
    (void)in;
    return {l.dev, {l}, l, {l}, l};
  }
  std::vector<strategy> candidates(int, const shape_list& in) const override {
    return {strategy{detail::ones(in[0].ndim)}};
  }
  strategy data_parallel(int, const shape_list& in) const override { return strategy{detail::ones(in[0].ndim)}; }
  /// The AllReduce itself, and its gradient's in the backward.
  std::vector<internal_collective> collectives(const strategy&, int device_num, const shape_list& in,
                                               index_t elem_bytes) const override {
    const auto [m, a] = group(device_num);
    const index_t b = cost::all_reduce(in[0].size() * elem_bytes, group_size(m, a));
    return {{"AllReduce", reduce_op::sum, m, a, b, false, "the sum over the group", true},
            {"AllReduce", reduce_op::sum, m, a, b, true, "the gradients' sum over the group", true}};
  }

  /// The group's mesh and axes on `device_num` devices.
  std::pair<mesh, axis_list> group(int device_num) const {
    if (group_mesh) return {*group_mesh, axes};
    return {mesh{device_num}, axis_list{0}};
  }
};

}  // namespace tessera::graph
