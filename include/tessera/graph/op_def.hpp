// An operator as the traced graph holds it: op_def, the graph's view of any operator
// definition (ops/definition.hpp), made by one generic adapter (op_model<Op>) from the
// operator's one type, so that the graph's passes read each operator's shapes, rule,
// candidates, linearity and internal collectives from that type. Also the variants of a
// strategy that keep partial sums, which sharding propagation weighs. Standard library
// only: the graph's parallel passes run without xtensor, BLAS or MPI.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/linear_rule.hpp>

namespace tessera::graph {

/// The graph's view of an operator: what its passes and dumps ask of it. Every op_def is
/// an op_model<Op> of an operator definition Op (make_op); the executor runs the
/// definition itself (definition<Op>()), found by its type.
class op_def {
 public:
  virtual ~op_def() = default;

  /// The operator's type as the IR prints it, e.g. "MatMul".
  virtual std::string type() const = 0;
  /// The instance name given when the user gives none, e.g. "matmul".
  virtual std::string default_name() const = 0;
  /// The number of inputs; -1 for any number (Concat).
  virtual int arity() const = 0;
  /// The output's global shape for inputs of shapes `in`; throws tessera::error whose
  /// text says why the shapes do not fit (without the operator's name; the graph adds it).
  virtual extents output_shape(const shape_list& in) const = 0;
  /// Checks a strategy's form before the device count is known (shard() calls it).
  virtual status check_form(const strategy& st, const shape_list& in) const = 0;
  /// Checks a strategy on `device_num` devices for inputs of shapes `in` (the rule's
  /// own checks; the graph checks the divisibility of every layout afterwards).
  virtual status check(const strategy& st, int device_num, const shape_list& in) const = 0;
  /// The layouts of a strategy. @pre check(st, device_num, in).ok()
  virtual op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const = 0;
  /// Every strategy the searches consider, in order of preference for ties.
  virtual std::vector<strategy> candidates(int device_num, const shape_list& in) const = 0;
  /// The strategy under data parallelism.
  virtual strategy data_parallel(int device_num, const shape_list& in) const = 0;
  /// Attributes printed in the IR, e.g. "transpose_a: false, transpose_b: false".
  virtual std::string attributes() const = 0;
  /// The inputs the operator is linear in (partial sums may stay partial through it).
  virtual linearity linear() const = 0;
  /// Whether input `i` gets a gradient (labels do not).
  virtual bool differentiable(int i) const = 0;
  /// Whether the backward reads input `i`'s values (not only its shape and layout).
  virtual bool backward_reads(int i) const = 0;
  /// Whether the backward reads the output's values.
  virtual bool backward_reads_output() const = 0;
  /// The collectives the operator runs inside its computation for a strategy, priced.
  virtual std::vector<internal_collective> collectives(const strategy& st, int device_num, const shape_list& in,
                                                       index_t elem_bytes) const = 0;
  /// The floating-point operations of one rank's forward computation under layouts `l`.
  virtual double forward_work(const op_layouts& l, const shape_list& in, const extents& out) const = 0;
  /// Whether only hybrid_parallel runs it (the user's AllReduce).
  virtual bool hybrid_only() const = 0;
  /// Checks the operator's attributes against a device count; throws tessera::error.
  virtual void validate(int device_num) const = 0;

  /// The operator definition's type: what the executor finds its runner by.
  virtual std::type_index definition_type() const = 0;
  /// The definition, when its type is Op (nullptr otherwise).
  template <class Op>
  const Op* definition() const {
    return definition_type() == std::type_index(typeid(Op)) ? static_cast<const Op*>(definition_address()) : nullptr;
  }

 protected:
  virtual const void* definition_address() const = 0;
};

/// The op_def of an operator definition: every answer is the definition's own. The
/// definition's strategy is not part of it (the graph keeps it as the node's
/// user_strategy).
template <ops::operator_definition Op>
class op_model final : public op_def {
 public:
  explicit op_model(Op op) : op_(std::move(op)) { op_.st = strategy{}; }

  const Op& op() const { return op_; }

  std::string type() const override { return std::string(Op::type()); }
  std::string default_name() const override { return std::string(Op::name()); }
  int arity() const override { return Op::arity; }
  extents output_shape(const shape_list& in) const override { return op_.output_shape(in); }
  status check_form(const strategy& st, const shape_list& in) const override {
    return ops::check_form_of(op_, st, in);
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return op_.check(st, device_num, in);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    return op_.layouts(st, device_num, in);
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    return op_.candidates(device_num, in);
  }
  strategy data_parallel(int device_num, const shape_list& in) const override {
    return op_.data_parallel(device_num, in);
  }
  std::string attributes() const override { return ops::attributes_of(op_); }
  linearity linear() const override { return ops::linear_of(op_); }
  bool differentiable(int i) const override { return ops::differentiable_in(op_, i); }
  bool backward_reads(int i) const override { return ops::backward_reads_input(op_, i); }
  bool backward_reads_output() const override { return ops::backward_reads_output_of(op_); }
  std::vector<internal_collective> collectives(const strategy& st, int device_num, const shape_list& in,
                                               index_t elem_bytes) const override {
    return ops::collectives_of(op_, st, device_num, in, elem_bytes);
  }
  double forward_work(const op_layouts& l, const shape_list& in, const extents& out) const override {
    return ops::forward_work_of(op_, l, in, out);
  }
  bool hybrid_only() const override {
    if constexpr (requires { Op::hybrid_only; }) return Op::hybrid_only;
    else return false;
  }
  void validate(int device_num) const override {
    if constexpr (requires { op_.validate(device_num); }) op_.validate(device_num);
    else (void)device_num;
  }
  std::type_index definition_type() const override { return std::type_index(typeid(Op)); }

 protected:
  const void* definition_address() const override { return &op_; }

 private:
  Op op_;
};

/// The graph's op_def of an operator definition.
template <ops::operator_definition Op>
std::shared_ptr<const op_def> make_op(Op op) {
  return std::make_shared<op_model<Op>>(std::move(op));
}

/// The layouts `l` of one of `op`'s strategies when its inputs arrive in `actual`
/// (pass_layouts of ops/definition.hpp with the operator's linearity).
inline op_layouts pass_layouts(const op_def& op, const op_layouts& l, const std::vector<layout>& actual) {
  return tessera::pass_layouts(op.linear(), l, actual);
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

}  // namespace tessera::graph
