// Partial sums through linear operators: which inputs an operator is linear in, and
// the rule that turns an operator's layouts into the ones it has when partial sums
// come in and stay partial (sum-then-op equals op-then-sum). Standard library only
// and constexpr; every operator of ops/ and every op_def of graph/ uses this one rule.
#pragma once

#include <array>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/refine.hpp>
#include <tessera/core/strategy.hpp>

namespace tessera {

/// The groups of inputs an operator is linear in, tried in order: group g (a bit per
/// input) means that with the other inputs fixed, f(sum of x_k) = sum of f(x_k) when
/// every input of g is a partial sum over the same ranks. Examples: Neg, Transpose,
/// ReduceSum: {0}; Add, Sub, Concat: {every input} (both summands partial alike);
/// Mul, MatMul: {0}, {1} (one factor partial, the other not); RealDiv: {0} (the
/// numerator). ReLU, Exp, Softmax, ReduceMax, ...: none.
struct linearity {
  int n = 0;
  std::array<unsigned, max_strategy_inputs> groups{};

  constexpr linearity() = default;
  /// Linear in the inputs of `mask`, jointly.
  static constexpr linearity jointly(unsigned mask) {
    linearity l;
    l.groups[l.n++] = mask;
    return l;
  }
  /// Linear in each of the first `arity` inputs on its own (a product of factors).
  static constexpr linearity each(int arity) {
    linearity l;
    for (int i = 0; i < arity; ++i) l.groups[l.n++] = 1u << i;
    return l;
  }
  /// Linear in every one of the first `arity` inputs together (a sum).
  static constexpr linearity all(int arity) { return jointly(arity >= 32 ? ~0u : (1u << arity) - 1u); }
  constexpr bool any() const { return n > 0; }
  friend constexpr bool operator==(const linearity&, const linearity&) = default;
};

/// ReduceSum and ReduceMean are linear in their input; ReduceMax and ReduceMin are not.
constexpr linearity reduction_linearity(reduce_op how) {
  return how == reduce_op::sum || how == reduce_op::mean ? linearity::jointly(1u) : linearity{};
}

/// How partial sums cross an operator: its layouts written on `dev` (its own device
/// matrix, or the common refinement with the partial inputs' ones), the inputs of
/// `slots` and the output partial sums over the mesh axes `partial` of `dev`. The
/// backward takes the output's gradient without these partial axes (the gradient of
/// a sum reaches every term), gives the inputs of `slots` their gradient as the rule
/// says, and the other inputs theirs partial over `partial` too (dB = A^T dC is a sum
/// when A is). `partial == 0`: nothing passes, every layout is the rule's.
///
/// Example: MatMul ((1, 4), (4, 1)) on 4 devices gives C [-, -] partial sum {1} on
/// (1, 4, 1). Neg with strategy ((1, 1),) on 4 devices has device matrix (4, 1) and
/// wants [-, -]; mesh axis 0 holds replicas, so the common refinement (4,) carries
/// the partial sums: Neg takes [-, -] partial sum {0} on (4,) and gives the same,
/// nothing moves, and the first consumer that needs the value whole resolves it.
struct partial_pass {
  mesh dev;
  axis_mask partial = 0;
  unsigned slots = 0;

  constexpr bool passes() const { return partial != 0; }
  /// A layout of the rule on dev, with the pass's partial axes when `add`.
  constexpr layout apply(const layout& l, bool add) const {
    if (!passes()) return l;
    layout out = l.dev == dev ? l : refine(l, dev);
    if (add) {
      out.partial |= partial;
      out.op = reduce_op::sum;
    }
    return out;
  }
  /// Input i as the operator takes it (the rule's layout `l`).
  constexpr layout input(const layout& l, int i) const { return apply(l, (slots >> i & 1u) != 0); }
  /// The output (the rule's `l`, possibly partial already, e.g. MatMul's contraction).
  constexpr layout output(const layout& l) const { return apply(l, true); }
  /// Input i's gradient (the rule's `l`).
  constexpr layout input_grad(const layout& l, int i) const { return apply(l, (slots >> i & 1u) == 0); }
  /// The output's gradient as the backward takes it (the rule's `l`, not partial).
  constexpr layout output_grad(const layout& l) const { return apply(l, false); }
};

namespace detail {
constexpr layout on_mesh(const layout& l, const mesh& m) { return l.dev == m ? l : refine(l, m); }
}  // namespace detail

/// Whether the inputs of group `slots`, arriving in layouts `actual`, pass their
/// partial sums through an operator whose rule wants its `n` inputs in `want` and
/// gives `out`: every input of the group must be a sum over some mesh axes, and the
/// axes that pass are those where every group input is partial and every layout of
/// the rule (all inputs, the output) holds replicas, on the common refinement of the
/// rule's device matrix and the group inputs' ones. Axes where not all inputs are
/// partial, or where the rule splits, are resolved by the redistribution into the
/// operator. Returns a pass with partial == 0 when nothing passes.
constexpr partial_pass pass_partial_group(unsigned slots, const layout* actual, const layout* want, int n,
                                          const layout& out) {
  partial_pass none;
  none.dev = out.dev;
  mesh fine = out.dev;
  bool any = false;
  for (int i = 0; i < n; ++i) {
    if (!(slots >> i & 1u)) continue;
    any = true;
    const layout& x = actual[i];
    if (!x.has_partial() || x.op != reduce_op::sum || x.dev.size() != fine.size()) return none;
    if (x.dev == fine) continue;
    if (!check_refinement(fine, x.dev).ok()) return none;
    fine = common_refinement(fine, x.dev);
  }
  if (!any) return none;
  axis_mask p = fine.ndim >= 32 ? ~0u : (1u << fine.ndim) - 1u;
  for (int a = 0; a < fine.ndim; ++a)
    if (fine.dims[a] == 1) p &= ~(1u << a);
  for (int i = 0; i < n; ++i) {
    if (slots >> i & 1u) p &= detail::on_mesh(actual[i], fine).partial;
    p &= detail::on_mesh(want[i], fine).replica_axes();
  }
  p &= detail::on_mesh(out, fine).replica_axes();
  if (p == 0) return none;
  return partial_pass{fine, p, slots};
}

/// The first group of `lin` whose inputs pass partial sums (pass_partial_group), or a
/// pass with partial == 0: then every input is resolved into the rule's layouts.
constexpr partial_pass pass_partial(const linearity& lin, const layout* actual, const layout* want, int n,
                                    const layout& out) {
  for (int g = 0; g < lin.n; ++g) {
    const partial_pass p = pass_partial_group(lin.groups[g], actual, want, n, out);
    if (p.passes()) return p;
  }
  partial_pass none;
  none.dev = out.dev;
  return none;
}

/// For a rule of one input whose layouts are `dev`, `in` (also the gradient's) and `out`
/// (Transpose, Reshape, StridedSlice, ReduceSum, ...): the layouts for an input
/// arriving in `x` when the operator is linear in it (`lin`). The gradient is then
/// `in.without_partial()` and the output's gradient `out.without_partial()`.
template <class Rule>
constexpr Rule pass_unary(Rule r, const layout& x, const linearity& lin = linearity::jointly(1u)) {
  const partial_pass p = pass_partial(lin, &x, &r.in, 1, r.out);
  if (!p.passes()) return r;
  r.in = p.input(r.in, 0);
  r.out = p.output(r.out);
  r.dev = p.dev;
  return r;
}

/// For a product rule whose layouts are `dev`, `a`, `b`, `c`, `grad_a`, `grad_b`
/// (MatMul, BatchMatMul; linear in either operand): the layouts for operands arriving
/// in `a` and `b`. A partial operand whose partial axes the rule holds replicas on stays
/// partial; C is then partial over those axes and the contraction axis, and the other
/// operand's gradient partial over those axes. The gradient of C is taken as
/// `c.without_partial()`.
template <class Rule>
constexpr Rule pass_product(Rule r, const layout& a, const layout& b) {
  const layout actual[2] = {a, b}, want[2] = {r.a, r.b};
  const partial_pass p = pass_partial(linearity::each(2), actual, want, 2, r.c);
  if (!p.passes()) return r;
  r.a = p.input(r.a, 0);
  r.b = p.input(r.b, 1);
  r.grad_a = p.input_grad(r.grad_a, 0);
  r.grad_b = p.input_grad(r.grad_b, 1);
  r.c = p.output(r.c);
  r.dev = p.dev;
  return r;
}

}  // namespace tessera
