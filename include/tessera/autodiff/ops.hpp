// Differentiable sharded operators: each runs the operator of ops/ on the tape's values
// and records its backward.
#pragma once

#include <utility>
#include <tessera/autodiff/tape.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/softmax.hpp>

namespace tessera::autodiff {

/// C = op(A) op(B) with MatMul's strategy; dA and dB in the rule's gradient layouts.
template <class T, class C, class D>
var<T, C, D> matmul(const ops::matmul_op& op, var<T, C, D> a, var<T, C, D> b) {
  tape<T, C, D>& t = *a.t;
  tensor_on<T, D> c = ops::matmul(op, a.value(), b.value(), t.ctx());
  return t.record(std::move(c), [op, ia = a.id, ib = b.id](tape<T, C, D>& tp, const tensor_on<T, D>& g) {
    auto [da, db] = ops::matmul_backward(op, g, tp.value(ia), tp.value(ib), tp.ctx());
    tp.add_grad(ia, std::move(da));
    tp.add_grad(ib, std::move(db));
  });
}

namespace detail {
// Records a binary operator whose backward returns the pair (da, db).
template <class T, class C, class D, class Op, class Fwd, class Bwd>
var<T, C, D> binary(const Op& op, var<T, C, D> a, var<T, C, D> b, Fwd fwd, Bwd bwd) {
  tape<T, C, D>& t = *a.t;
  tensor_on<T, D> y = fwd(op, a.value(), b.value(), t.ctx());
  return t.record(std::move(y), [op, bwd, ia = a.id, ib = b.id](tape<T, C, D>& tp, const tensor_on<T, D>& g) {
    auto [da, db] = bwd(op, g, tp.value(ia), tp.value(ib), tp.ctx());
    tp.add_grad(ia, std::move(da));
    tp.add_grad(ib, std::move(db));
  });
}
// Records a unary operator whose backward returns dx.
template <class T, class C, class D, class Op, class Fwd, class Bwd>
var<T, C, D> unary(const Op& op, var<T, C, D> x, Fwd fwd, Bwd bwd) {
  tape<T, C, D>& t = *x.t;
  tensor_on<T, D> y = fwd(op, x.value(), t.ctx());
  return t.record(std::move(y), [op, bwd, ix = x.id](tape<T, C, D>& tp, const tensor_on<T, D>& g) {
    tp.add_grad(ix, bwd(op, g, tp.value(ix), tp.ctx()));
  });
}
}  // namespace detail

template <class T, class C, class D>
var<T, C, D> add(const ops::add_op& op, var<T, C, D> a, var<T, C, D> b) {
  return detail::binary(op, a, b, [](auto&&... x) { return ops::add(x...); },
                        [](auto&&... x) { return ops::add_backward(x...); });
}
template <class T, class C, class D>
var<T, C, D> sub(const ops::sub_op& op, var<T, C, D> a, var<T, C, D> b) {
  return detail::binary(op, a, b, [](auto&&... x) { return ops::sub(x...); },
                        [](auto&&... x) { return ops::sub_backward(x...); });
}
template <class T, class C, class D>
var<T, C, D> mul(const ops::mul_op& op, var<T, C, D> a, var<T, C, D> b) {
  return detail::binary(op, a, b, [](auto&&... x) { return ops::mul(x...); },
                        [](auto&&... x) { return ops::mul_backward(x...); });
}
template <class T, class C, class D>
var<T, C, D> bias_add(const ops::bias_add_op& op, var<T, C, D> x, var<T, C, D> bias) {
  return detail::binary(op, x, bias, [](auto&&... a) { return ops::bias_add(a...); },
                        [](auto&&... a) { return ops::bias_add_backward(a...); });
}
template <class T, class C, class D>
var<T, C, D> relu(const ops::relu_op& op, var<T, C, D> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::relu(a...); },
                       [](auto&&... a) { return ops::relu_backward(a...); });
}
template <class T, class C, class D>
var<T, C, D> reduce_sum(const ops::reduce_sum_op& op, var<T, C, D> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::reduce_sum(a...); },
                       [](auto&&... a) { return ops::reduce_sum_backward(a...); });
}
template <class T, class C, class D>
var<T, C, D> reduce_mean(const ops::reduce_mean_op& op, var<T, C, D> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::reduce_mean(a...); },
                       [](auto&&... a) { return ops::reduce_mean_backward(a...); });
}

/// The per-sample loss (B,) of softmax(logits) against labels; only the logits get a
/// gradient (labels are data).
template <class T, class C, class D>
var<T, C, D> softmax_cross_entropy(const ops::softmax_cross_entropy_op& op, var<T, C, D> logits,
                                var<T, C, D> labels) {
  tape<T, C, D>& t = *logits.t;
  tensor_on<T, D> y = ops::softmax_cross_entropy(op, logits.value(), labels.value(), t.ctx());
  return t.record(std::move(y), [op, ix = logits.id, it = labels.id](tape<T, C, D>& tp, const tensor_on<T, D>& g) {
    tp.add_grad(ix, ops::softmax_cross_entropy_backward(op, g, tp.value(ix), tp.value(it), tp.ctx()));
  });
}

}  // namespace tessera::autodiff
