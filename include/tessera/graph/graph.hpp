// The traced operator graph of a network (MindSpore's graph mode): inputs, named
// parameters and operator applications with global shapes, built by a small tracing
// API whose operators return symbolic values; `.shard(strategy)` configures an
// operator as MindSpore's `Primitive.shard` does. Standard library only.
#pragma once

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/graph/op_def.hpp>
#include <tessera/ops/operators.hpp>

namespace tessera::graph {

/// What a node of the graph is.
enum class node_kind { input, parameter, op, constant };

/// One node: a data input (fed by the dataset), a parameter (trained), a scalar
/// constant (MindSpore's value nodes: the 1e-24 a loss adds before its Log, the -1 it
/// multiplies by) or the application of an operator to earlier nodes. Node ids are
/// positions in the graph, in the order of tracing, so every node comes after its inputs.
struct node {
  node_kind kind = node_kind::op;
  std::string name;                       ///< unique instance name: "input", "w", "matmul"
  extents shape;                          ///< the global shape of its value
  std::vector<int> inputs;                ///< ids of the nodes it reads (operators)
  std::shared_ptr<const op_def> op;       ///< the operator (operators)
  std::optional<strategy> user_strategy;  ///< given with shard() (operators)
  bool layerwise_parallel = false;        ///< parameters of hybrid_parallel: already sliced
  double constant = 0;                    ///< the value (constants; their shape is ())
  /// The pipeline stage of an operator (MindSpore's `pipeline_stage` of the cell that
  /// applies it): set while tracing (graph_builder::set_pipeline_stage), otherwise, once
  /// the graph is built, the latest stage of its operator inputs (0 for none). -1 for
  /// the other nodes: an input, a parameter or a constant lives on every stage that
  /// reads it.
  int pipeline_stage = -1;
};

/// A traced graph: its nodes in tracing order and the loss, a scalar every node
/// contributes to. Built by graph_builder::build.
class traced_graph {
 public:
  const std::vector<node>& nodes() const { return nodes_; }
  int size() const { return int(nodes_.size()); }
  const node& at(int id) const {
    if (id < 0 || id >= size())
      throw error("graph: no node " + std::to_string(id) + " in a graph of " + std::to_string(size()) + " nodes");
    return nodes_[id];
  }
  /// The id of the loss node.
  int loss() const { return loss_; }
  /// The node named `name`; throws if there is none.
  int find(std::string_view name) const {
    for (int i = 0; i < size(); ++i)
      if (nodes_[i].name == name) return i;
    throw error("graph: no node named '" + std::string(name) + "'");
  }
  /// Ids of the nodes of a kind, in tracing order: inputs() is the order in which a
  /// batch lists its tensors, parameters() the order of the parameter list.
  std::vector<int> ids(node_kind k) const {
    std::vector<int> v;
    for (int i = 0; i < size(); ++i)
      if (nodes_[i].kind == k) v.push_back(i);
    return v;
  }
  std::vector<int> inputs() const { return ids(node_kind::input); }
  std::vector<int> parameters() const { return ids(node_kind::parameter); }
  /// The number of pipeline stages the operators are given: one more than the latest
  /// operator's node::pipeline_stage (1 when none is set).
  int pipeline_stage_count() const {
    int k = 0;
    for (const node& n : nodes_) k = std::max(k, n.pipeline_stage + 1);
    return std::max(k, 1);
  }
  /// The (operator id, input slot) pairs that read node `id`, in tracing order.
  const std::vector<std::pair<int, int>>& consumers(int id) const {
    at(id);  // checks the id
    return readers_[id];
  }
  /// The global shapes of an operator's inputs.
  shape_list input_shapes(int id) const {
    shape_list s;
    for (int in : at(id).inputs) s.v[s.n++] = at(in).shape;
    return s;
  }
  /// "MatMul 'matmul'", "parameter 'w'", "input 'x'": how errors name a node.
  std::string describe(int id) const {
    const node& n = at(id);
    switch (n.kind) {
      case node_kind::input: return "input '" + n.name + "'";
      case node_kind::parameter: return "parameter '" + n.name + "'";
      case node_kind::constant: return "constant '" + n.name + "'";
      case node_kind::op: return n.op->type() + " '" + n.name + "'";
    }
    return n.name;
  }

 private:
  friend class graph_builder;
  std::vector<node> nodes_;
  std::vector<std::vector<std::pair<int, int>>> readers_;  // per node, consumers(id)
  int loss_ = -1;
};

class graph_builder;

/// A symbolic tensor: the value of one node of a graph under construction. Operators
/// of graph_builder take and return values; shard() and named() configure the
/// operator that produced the value and return the value, so they chain:
///
///     graph::value h = b.matmul(x, w).shard({{2, 4}, {4, 1}}).named("matmul");
class value {
 public:
  value() = default;
  /// The node's id in the graph.
  int id() const { return id_; }
  /// Its global shape.
  const extents& shape() const;
  /// Its node's instance name.
  const std::string& name() const;
  /// Sets the strategy of the operator that produced this value (MindSpore's
  /// `shard`): one split tuple per operator input, e.g. ((2, 4), (4, 1)). Checked
  /// here against the operator's inputs (count, ranks, positive splits); against the
  /// device count when the graph is parallelized.
  value shard(const strategy& st) const;
  /// As above, from text: "((2, 4), (4, 1))".
  value shard(std::string_view st) const { return shard(parse_strategy(st)); }
  /// Renames the node (instance names are unique in a graph).
  value named(std::string name) const;
  /// Puts the operator that produced this value on pipeline stage `stage` (what
  /// graph_builder::set_pipeline_stage does for every operator traced after it).
  value pipeline_stage(int stage) const;
  /// The builder whose graph holds the node (what apply() on values uses).
  graph_builder& builder() const;

 private:
  friend class graph_builder;
  value(graph_builder* b, int id) : b_(b), id_(id) {}
  graph_builder* b_ = nullptr;
  int id_ = -1;
};

/// Traces a network: declare inputs and parameters with their global shapes, apply
/// operators (each returns a value and checks its input shapes at once), then
/// build(loss). Instance names default to the operator's name, numbered from the
/// second on: "matmul", "matmul2", "matmul3". Nodes are numbered in the order the calls
/// run, and C++ leaves the order of a call's arguments unspecified: declare the inputs
/// and parameters before the operators that read them (a batch lists the inputs, and the
/// parameter list the parameters, in node order).
///
///     graph::graph_builder b;
///     auto x = b.input("x", {16, 32});
///     auto w = b.parameter("w", {32, 16});
///     auto y = b.relu(b.matmul(x, w).shard({{2, 4}, {4, 1}}));
///     graph::traced_graph g = b.build(b.reduce_mean(y));
class graph_builder {
 public:
  graph_builder() : serial_(next_serial()) {}
  graph_builder(const graph_builder&) = delete;  // values point to their builder
  graph_builder& operator=(const graph_builder&) = delete;

  /// A number no other builder of this process has had: tells builders apart even when
  /// one is made where another was destroyed (a module's parameter remembers its node
  /// in the builder tracing it).
  std::uint64_t serial() const { return serial_; }

  /// The pipeline stage of the operators traced from now on (MindSpore's
  /// `cell.pipeline_stage = k`); -1 (the start) lets each operator take the latest
  /// stage of its inputs. A stage must not be earlier than its inputs' stages
  /// (parallelize checks).
  ///
  ///     b.set_pipeline_stage(0);
  ///     auto h = b.relu(b.matmul(x, w1));
  ///     b.set_pipeline_stage(1);
  ///     auto loss = b.reduce_mean(b.matmul(h, w2));
  void set_pipeline_stage(int stage) {
    if (stage < -1)
      throw error("graph: set_pipeline_stage: a stage is 0 or more (or -1: the inputs' latest), got " +
                  std::to_string(stage));
    stage_ = stage;
  }
  /// The stage set_pipeline_stage gave last (-1: none).
  int pipeline_stage() const { return stage_; }

  /// A data input of global shape `shape`; a batch lists the inputs in this order.
  value input(std::string name, const extents& shape) {
    return add_leaf(node_kind::input, std::move(name), shape, false);
  }
  /// A parameter of global shape `shape`. `layerwise_parallel` (hybrid_parallel
  /// only): the parameter is already this rank's slice, and its gradient is not
  /// all-reduced over the ranks.
  value parameter(std::string name, const extents& shape, bool layerwise_parallel = false) {
    return add_leaf(node_kind::parameter, std::move(name), shape, layerwise_parallel);
  }
  /// A scalar constant (shape ()) of value `v`, named `name` (numbered if taken): an
  /// operand of operators, laid out as each reader needs it, with no gradient.
  ///
  ///     auto y = b.apply(ops::add_op{}, {x, b.constant("eps", 1e-24)});
  value constant(const std::string& name, double v) {
    if (name.empty()) throw error("graph: constant needs a name");
    node n;
    n.kind = node_kind::constant;
    n.name = unique_name(name);
    n.constant = v;
    return push(std::move(n));
  }

  /// Applies an operator definition (ops/definition.hpp) to values of this builder: the
  /// way every operator enters the graph, the library's and any other. A strategy set
  /// on the definition (op.st) is the node's, as shard() sets it. The node is named
  /// `name` (numbered if taken), or after the operator when `name` is empty.
  ///
  ///     auto h = b.apply(ops::matmul_op{strategy{{2, 4}, {4, 1}}}, {x, w});
  template <ops::operator_definition Op>
  value apply(Op op, const std::vector<value>& in, const std::string& name = {}) {
    const strategy st = op.st;
    value v = apply(make_op(std::move(op)), in, name);
    if (st.n > 0) v.shard(st);
    return v;
  }

  /// Applies an operator already in the graph's form (an op_def).
  value apply(std::shared_ptr<const op_def> op, const std::vector<value>& in, const std::string& name = {}) {
    if (!op) throw error("graph: apply needs an operator");
    const std::string what = op->type();
    if (op->arity() >= 0 && int(in.size()) != op->arity())
      throw error("graph: " + what + " takes " + std::to_string(op->arity()) +
                  (op->arity() == 1 ? " input, got " : " inputs, got ") + std::to_string(in.size()));
    if (in.empty()) throw error("graph: " + what + ": needs at least one input");
    if (int(in.size()) > max_strategy_inputs)
      throw error("graph: " + what + ": at most " + std::to_string(max_strategy_inputs) + " inputs");
    node n;
    n.kind = node_kind::op;
    n.op = op;
    n.name = unique_name(name.empty() ? op->default_name() : name);
    n.pipeline_stage = stage_;
    shape_list shapes;
    for (const value& v : in) {
      if (v.b_ != this) throw error("graph: " + what + " '" + n.name + "': an input comes from another graph_builder");
      n.inputs.push_back(v.id_);
      shapes.v[shapes.n++] = g_.at(v.id_).shape;
    }
    try {
      n.shape = op->output_shape(shapes);
    } catch (const error& e) {
      throw error("graph: " + what + " '" + n.name + "': " + e.what());
    }
    return push(std::move(n));
  }

  // The library's operators by name: each is apply() of its definition.

  /// op(A) op(B), op transposing when the flag is set.
  value matmul(value a, value b, bool transpose_a = false, bool transpose_b = false) {
    return apply(ops::matmul_op{{}, transpose_a, transpose_b}, {a, b});
  }
  value add(value a, value b) { return apply(ops::add_op{}, {a, b}); }
  value sub(value a, value b) { return apply(ops::sub_op{}, {a, b}); }
  value mul(value a, value b) { return apply(ops::mul_op{}, {a, b}); }
  value div(value a, value b) { return apply(ops::div_op{}, {a, b}); }
  /// x (..., c) + bias (c,).
  value bias_add(value x, value bias) { return apply(ops::bias_add_op{}, {x, bias}); }
  value relu(value x) { return apply(ops::relu_op{}, {x}); }
  value exp(value x) { return apply(ops::exp_op{}, {x}); }
  value log(value x) { return apply(ops::log_op{}, {x}); }
  value neg(value x) { return apply(ops::neg_op{}, {x}); }
  /// Sum over `dims` (empty: every dim; negative counts from the end).
  value reduce_sum(value x, dim_list dims = {}, bool keep_dims = false) {
    return apply(ops::reduce_sum_op{{}, dims, keep_dims}, {x});
  }
  value reduce_mean(value x, dim_list dims = {}, bool keep_dims = false) {
    return apply(ops::reduce_mean_op{{}, dims, keep_dims}, {x});
  }
  value reduce_max(value x, dim_list dims = {}, bool keep_dims = false) {
    return apply(ops::reduce_max_op{{}, dims, keep_dims}, {x});
  }
  value reduce_min(value x, dim_list dims = {}, bool keep_dims = false) {
    return apply(ops::reduce_min_op{{}, dims, keep_dims}, {x});
  }
  /// The per-sample loss (B,) of logits (B, C) against labels (B, C).
  value softmax_cross_entropy(value logits, value labels) {
    return apply(ops::softmax_cross_entropy_op{}, {logits, labels});
  }
  /// The per-sample loss (B,) of logits (B, C) against class labels (B,) (integer values).
  value sparse_softmax_cross_entropy(value logits, value labels) {
    return apply(ops::sparse_softmax_cross_entropy_op{}, {logits, labels});
  }
  /// A MatMul per batch entry (an input of rank 2 is shared by every entry).
  value batch_matmul(value a, value b, bool transpose_a = false, bool transpose_b = false) {
    return apply(ops::batch_matmul_op{{}, transpose_a, transpose_b}, {a, b});
  }
  /// indices (integer values) -> indices.shape + (depth,), 1 at each index, 0 elsewhere.
  value one_hot(value indices, index_t depth) { return apply(ops::one_hot_op{{}, depth}, {indices}); }
  value softmax(value x, int axis = -1) { return apply(ops::softmax_op{{}, axis}, {x}); }
  value log_softmax(value x, int axis = -1) { return apply(ops::log_softmax_op{{}, axis}, {x}); }
  value transpose(value x, dim_list perm) { return apply(ops::transpose_op{{}, perm}, {x}); }
  /// x's elements in `target`'s shape (one entry may be -1: inferred).
  value reshape(value x, const extents& target) { return apply(ops::reshape_op{{}, target}, {x}); }
  /// (shape[0], the product of the other dims).
  value flatten(value x) { return apply(ops::flatten_op{}, {x}); }
  /// x[begin:end:strides] on the leading dims, Python's semantics (no strides: all 1).
  value strided_slice(value x, index_list begin, index_list end, index_list strides = {}) {
    return apply(ops::strided_slice_op{{}, begin, end, strides}, {x});
  }
  /// The values joined along `axis`.
  value concat(const std::vector<value>& xs, int axis = 0) { return apply(ops::concat_op{{}, axis}, xs); }
  /// The index of the maximum along `axis`, as a value (no gradient).
  value argmax(value x, int axis = -1) { return apply(ops::argmax_op{{}, axis}, {x}); }
  /// MSELoss: the mean over every element of (pred - label)^2, as Sub, Mul and
  /// ReduceMean (named "<prefix>.sub", ".mul", ".reduce_mean"; the last one returned).
  value mse_loss(value pred, value label, const std::string& prefix = "mse_loss") {
    const value d = sub(pred, label).named(prefix + ".sub");
    return reduce_mean(mul(d, d).named(prefix + ".mul")).named(prefix + ".reduce_mean");
  }
  /// Conv2D of x (N, C, H, W) with w (O, C / groups, KH, KW) under the window `p`.
  value conv2d(value x, value w, const kernels::conv2d_params& p = {}) { return apply(ops::conv2d_op{{}, p}, {x, w}); }
  /// MaxPool / AvgPool of x (N, C, H, W) under the window `p`.
  value max_pool2d(value x, const kernels::pool2d_params& p) { return apply(ops::max_pool2d_op{{}, p}, {x}); }
  value avg_pool2d(value x, const kernels::pool2d_params& p) { return apply(ops::avg_pool2d_op{{}, p}, {x}); }
  /// BatchNorm of x (N, C, H, W) per channel, scaled by gamma (C,) and shifted by beta
  /// (C,): batch statistics (over the whole batch with `sync`) in training, running ones
  /// in evaluation, as the definition's state says (ops/batch_norm_rule.hpp).
  value batch_norm(value x, value gamma, value beta, double eps = 1e-5, double momentum = 0.9, bool sync = true) {
    ops::batch_norm_op op;
    op.eps = eps;
    op.momentum = momentum;
    op.sync = sync;
    return apply(std::move(op), {x, gamma, beta});
  }
  /// hybrid_parallel: the sum of every rank's x, on every rank.
  value all_reduce(value x) { return apply(ops::all_reduce_op{}, {x}); }
  /// hybrid_parallel: the sum over the group of this rank on mesh axes `axes` of
  /// `group_mesh` (whose size must be the device count).
  value all_reduce(value x, const mesh& group_mesh, const axis_list& axes) {
    return apply(ops::all_reduce_op{{}, group_mesh, axes}, {x});
  }

  /// The graph whose loss is `loss`: a scalar (rank 0) to which every node
  /// contributes. The builder can go on tracing afterwards.
  traced_graph build(value loss) const {
    if (loss.b_ != this) throw error("graph: build: the loss comes from another graph_builder");
    const node& l = g_.at(loss.id_);
    if (l.shape.ndim != 0)
      throw error("graph: the loss must be a scalar, '" + l.name + "' has shape " + to_string(l.shape));
    std::vector<bool> live(g_.nodes_.size(), false);
    live[loss.id_] = true;
    for (int i = loss.id_; i >= 0; --i)
      if (live[i])
        for (int in : g_.nodes_[i].inputs) live[in] = true;
    for (std::size_t i = 0; i < live.size(); ++i)
      if (!live[i])
        throw error("graph: " + g_.describe(int(i)) + " does not contribute to the loss '" + l.name + "'");
    traced_graph out = g_;
    out.loss_ = loss.id_;
    for (node& nd : out.nodes_)  // operators traced with no stage follow their inputs
      if (nd.kind == node_kind::op && nd.pipeline_stage < 0) {
        nd.pipeline_stage = 0;
        for (int in : nd.inputs) nd.pipeline_stage = std::max(nd.pipeline_stage, out.nodes_[in].pipeline_stage);
      }
    return out;
  }

  /// The graph traced so far (no loss set).
  const traced_graph& current() const { return g_; }
  /// The value of node `id` of this builder's graph.
  value value_of(int id) {
    g_.at(id);  // checks the id
    return value(this, id);
  }

 private:
  friend class value;

  value add_leaf(node_kind k, std::string name, const extents& shape, bool layerwise) {
    const char* what = k == node_kind::input ? "input" : "parameter";
    if (name.empty()) throw error(std::string("graph: ") + what + " needs a name");
    for (int d = 0; d < shape.ndim; ++d)
      if (shape[d] < 1)
        throw error(std::string("graph: ") + what + " '" + name + "': every extent must be positive, shape " +
                    to_string(shape));
    if (shape.ndim > max_tensor_ndim)
      throw error(std::string("graph: ") + what + " '" + name + "': rank " + std::to_string(shape.ndim) +
                  ", limit " + std::to_string(max_tensor_ndim));
    check_unique(name);
    node n;
    n.kind = k;
    n.name = std::move(name);
    n.shape = shape;
    n.layerwise_parallel = layerwise;
    return push(std::move(n));
  }
  value push(node n) {
    names_.insert(n.name);
    const int id = g_.size();
    for (std::size_t s = 0; s < n.inputs.size(); ++s) g_.readers_[n.inputs[s]].emplace_back(id, int(s));
    g_.readers_.emplace_back();
    g_.nodes_.push_back(std::move(n));
    return value(this, g_.size() - 1);
  }
  void check_unique(const std::string& name) const {
    if (names_.count(name)) throw error("graph: the name '" + name + "' is used twice");
  }
  std::string unique_name(const std::string& base) {
    if (!names_.count(base)) return base;
    int& k = next_suffix_.try_emplace(base, 2).first->second;  // the names below are taken
    while (names_.count(base + std::to_string(k))) ++k;
    return base + std::to_string(k);
  }
  node& at(int id) { return g_.nodes_[id]; }
  void rename(int id, std::string name) {
    next_suffix_.clear();  // a name set free may be the first free one again
    names_.erase(g_.nodes_[id].name);
    names_.insert(name);
    g_.nodes_[id].name = std::move(name);
  }
  static std::uint64_t next_serial() {
    static std::atomic<std::uint64_t> counter{0};
    return ++counter;
  }

  traced_graph g_;
  std::unordered_set<std::string> names_;
  std::unordered_map<std::string, int> next_suffix_;  // per base name, the first suffix maybe free
  std::uint64_t serial_;
  int stage_ = -1;  // set_pipeline_stage
};

/// op(xs...) traced on the builder of the values (autodiff::apply's counterpart on
/// graph values): modules written once call it on either.
///
///     graph::value h = graph::apply(ops::matmul_op{{}, false, true}, x, w);
template <ops::operator_definition Op, class... More>
  requires(std::same_as<More, value> && ...)
value apply(Op op, value x, More... more) {
  return x.builder().apply(std::move(op), std::vector<value>{x, more...});
}
template <ops::operator_definition Op>
value apply(Op op, const std::vector<value>& xs) {
  if (xs.empty()) throw error("graph: " + std::string(Op::type()) + ": needs at least one input");
  return xs[0].builder().apply(std::move(op), xs);
}

inline const extents& value::shape() const { return b_->g_.at(id_).shape; }
inline const std::string& value::name() const { return b_->g_.at(id_).name; }

inline value value::shard(const strategy& st) const {
  if (!b_) throw error("graph: shard on an empty value");
  node& n = b_->at(id_);
  if (n.kind != node_kind::op)
    throw error("graph: shard: " + b_->g_.describe(id_) + " is not an operator");
  if (const status s = n.op->check_form(st, b_->g_.input_shapes(id_)); !s.ok())
    throw error(s, "graph: " + b_->g_.describe(id_), "strategy " + to_string(st));
  n.user_strategy = st;
  return *this;
}

inline value value::named(std::string name) const {
  if (!b_) throw error("graph: named on an empty value");
  if (name.empty()) throw error("graph: a node name must not be empty");
  if (b_->at(id_).name == name) return *this;
  b_->check_unique(name);
  b_->rename(id_, std::move(name));
  return *this;
}

inline value value::pipeline_stage(int stage) const {
  if (!b_) throw error("graph: pipeline_stage on an empty value");
  if (b_->at(id_).kind != node_kind::op)
    throw error("graph: pipeline_stage: " + b_->g_.describe(id_) + " is not an operator");
  if (stage < 0) throw error("graph: pipeline_stage: " + b_->g_.describe(id_) + ": a stage is 0 or more, got " + std::to_string(stage));
  b_->at(id_).pipeline_stage = stage;
  return *this;
}

inline graph_builder& value::builder() const {
  if (!b_) throw error("graph: an empty value has no builder");
  return *b_;
}

}  // namespace tessera::graph
