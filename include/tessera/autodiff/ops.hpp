// Differentiable sharded operators: autodiff::apply runs any operator's definition
// (ops/definition.hpp) on the tape's values and records its backward, so an operator
// is recorded by the same one definition that ops/ runs eagerly and graph/ plans.
// MatMul's pipelined forwards (matmul_overlapped, matmul_summa) record MatMul's backward.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>
#include <tessera/autodiff/tape.hpp>
#include <tessera/core/error.hpp>
#include <tessera/ops/all_reduce.hpp>
#include <tessera/ops/argmax.hpp>
#include <tessera/ops/batch_matmul.hpp>
#include <tessera/ops/batch_norm.hpp>
#include <tessera/ops/conv2d.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/dropout.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/ops/matmul_pipelined.hpp>
#include <tessera/ops/one_hot.hpp>
#include <tessera/ops/pool2d.hpp>
#include <tessera/ops/operators.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/ops/shape.hpp>
#include <tessera/ops/softmax.hpp>
#include <tessera/ops/softmax_axis.hpp>
#include <tessera/ops/sparse_cross_entropy.hpp>

namespace tessera::autodiff {

/// y = op(xs...) on the tape of the inputs: the operator's forward on their values, and
/// a record of its backward, which adds each differentiable input's gradient. An
/// operator with no differentiable input, or inputs that need no gradient, gives a
/// constant (a leaf without gradient). Without a strategy (op.st empty) it runs its
/// data-parallel one:
///
///     auto h = autodiff::apply(ops::matmul_op{strategy{{2, 4}, {4, 1}}}, x, w);
///     auto y = autodiff::apply(ops::concat_op{{}, 1}, {a, b, c});
template <ops::operator_definition Op, class T, class D>
var<T, D> apply(const Op& op, const std::vector<var<T, D>>& xs) {
  const std::string who(Op::name());
  if (xs.empty()) throw error("autodiff: " + who + ": needs at least one input");
  if (int(xs.size()) > max_strategy_inputs)
    throw error("autodiff: " + who + ": at most " + std::to_string(max_strategy_inputs) + " inputs, got " +
                std::to_string(xs.size()));
  if (Op::arity >= 0 && int(xs.size()) != Op::arity)
    throw error("autodiff: " + who + " takes " + std::to_string(Op::arity) +
                (Op::arity == 1 ? " input, got " : " inputs, got ") + std::to_string(xs.size()));
  tape<T, D>& t = *xs[0].t;
  std::vector<int> ids;
  std::vector<const tensor_on<T, D>*> in;
  bool needs_grad = false;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].t != &t) throw error("autodiff: " + who + ": the inputs are on different tapes");
    ids.push_back(xs[i].id);
    in.push_back(&xs[i].value());
    needs_grad = needs_grad || (ops::differentiable_in(op, int(i)) && t.requires_grad(xs[i].id));
  }
  // Without a strategy an operator runs data parallel, as the graph runs it in that mode.
  Op run = op;
  if (run.st.n == 0) {
    shape_list shapes;
    for (const tensor_on<T, D>* x : in) shapes.v[shapes.n++] = x->global_shape();
    run.st = op.data_parallel(t.ctx().size(), shapes);
  }
  tensor_on<T, D> y = ops::run_forward(run, ops::op_inputs<T, D>(in.data(), in.size()), t.ctx());
  if (!needs_grad) return t.leaf(std::move(y), false);
  const int self = t.size();  // y's id once recorded: the backward may read it
  return t.record(std::move(y), [op = run, ids = std::move(ids), self](tape<T, D>& tp, tensor_on<T, D>&& g) {
    std::vector<const tensor_on<T, D>*> values;
    values.reserve(ids.size());
    ops::grads_wanted want;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      values.push_back(&tp.value(ids[i]));
      if (!tp.requires_grad(ids[i])) want.skip(i);
    }
    ops::op_grads<T, D> dx = ops::run_backward(op, std::move(g), ops::op_inputs<T, D>(values.data(), values.size()),
                                               tp.value(self), tp.ctx(), want);
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (dx[i] && ops::differentiable_in(op, int(i))) tp.add_grad(ids[i], std::move(*dx[i]));
  });
}

/// apply of a fixed number of inputs: apply(op, a, b).
template <ops::operator_definition Op, class T, class D, class... More>
  requires(std::same_as<More, var<T, D>> && ...)
var<T, D> apply(const Op& op, var<T, D> x, More... more) {
  return autodiff::apply(op, std::vector<var<T, D>>{x, more...});
}

/// apply of a braced list: apply(ops::concat_op{{}, 1}, {a, b}).
template <ops::operator_definition Op, class T, class D>
var<T, D> apply(const Op& op, std::initializer_list<var<T, D>> xs) {
  return autodiff::apply(op, std::vector<var<T, D>>(xs));
}

namespace detail {
// MatMul's backward on the tape, whichever forward computed C (ops::matmul or a
// pipelined one): dC is brought to C's layout without partial sums, and dA and dB land
// in the rule's gradient layouts.
template <class T, class D>
auto matmul_grads(const ops::matmul_op& op, int ia, int ib) {
  return [op, ia, ib](tape<T, D>& tp, const tensor_on<T, D>& g) {
    auto [da, db] = ops::matmul_backward(op, g, tp.value(ia), tp.value(ib), tp.ctx());
    tp.add_grad(ia, std::move(da));
    tp.add_grad(ib, std::move(db));
  };
}
}  // namespace detail

/// C = op(A) op(B) by ops::matmul_overlapped: the contraction's partial sums resolved
/// as `how` says, chunk by chunk, while the next chunk is multiplied (C in
/// ops::resolved_layout(rule, how)). The backward is MatMul's.
///
///     auto h = autodiff::matmul_overlapped(ops::matmul_op{strategy{{1, 4}, {4, 1}}}, x, w);
template <class T, class D>
var<T, D> matmul_overlapped(const ops::matmul_op& op, var<T, D> a, var<T, D> b,
                               ops::partial_resolution how = ops::partial_resolution::scatter_rows,
                               const ops::pipeline_options& opt = {}) {
  tape<T, D>& t = *a.t;
  tensor_on<T, D> c = ops::matmul_overlapped(op, a.value(), b.value(), t.ctx(), how, opt);
  return t.record(std::move(c), detail::matmul_grads<T, D>(op, a.id, b.id));
}

/// C = op(A) op(B) by SUMMA (ops::matmul_summa), for strategies ((pm, 1), (1, pn)): the
/// panels of A and B broadcast along the mesh's rows and columns while the previous
/// panels are multiplied. The backward is MatMul's.
template <class T, class D>
var<T, D> matmul_summa(const ops::matmul_op& op, var<T, D> a, var<T, D> b,
                          const ops::pipeline_options& opt = {}) {
  tape<T, D>& t = *a.t;
  tensor_on<T, D> c = ops::matmul_summa(op, a.value(), b.value(), t.ctx(), opt);
  return t.record(std::move(c), detail::matmul_grads<T, D>(op, a.id, b.id));
}

}  // namespace tessera::autodiff
