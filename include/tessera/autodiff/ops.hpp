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
template <class T, class C>
var<T, C> matmul(const ops::matmul_op& op, var<T, C> a, var<T, C> b) {
  tape<T, C>& t = *a.t;
  dist_tensor<T> c = ops::matmul(op, a.value(), b.value(), t.ctx());
  return t.record(std::move(c), [op, ia = a.id, ib = b.id](tape<T, C>& tp, const dist_tensor<T>& g) {
    auto [da, db] = ops::matmul_backward(op, g, tp.value(ia), tp.value(ib), tp.ctx());
    tp.add_grad(ia, std::move(da));
    tp.add_grad(ib, std::move(db));
  });
}

namespace detail {
// Records a binary operator whose backward returns the pair (da, db).
template <class T, class C, class Op, class Fwd, class Bwd>
var<T, C> binary(const Op& op, var<T, C> a, var<T, C> b, Fwd fwd, Bwd bwd) {
  tape<T, C>& t = *a.t;
  dist_tensor<T> y = fwd(op, a.value(), b.value(), t.ctx());
  return t.record(std::move(y), [op, bwd, ia = a.id, ib = b.id](tape<T, C>& tp, const dist_tensor<T>& g) {
    auto [da, db] = bwd(op, g, tp.value(ia), tp.value(ib), tp.ctx());
    tp.add_grad(ia, std::move(da));
    tp.add_grad(ib, std::move(db));
  });
}
// Records a unary operator whose backward returns dx.
template <class T, class C, class Op, class Fwd, class Bwd>
var<T, C> unary(const Op& op, var<T, C> x, Fwd fwd, Bwd bwd) {
  tape<T, C>& t = *x.t;
  dist_tensor<T> y = fwd(op, x.value(), t.ctx());
  return t.record(std::move(y), [op, bwd, ix = x.id](tape<T, C>& tp, const dist_tensor<T>& g) {
    tp.add_grad(ix, bwd(op, g, tp.value(ix), tp.ctx()));
  });
}
}  // namespace detail

template <class T, class C>
var<T, C> add(const ops::add_op& op, var<T, C> a, var<T, C> b) {
  return detail::binary(op, a, b, [](auto&&... x) { return ops::add(x...); },
                        [](auto&&... x) { return ops::add_backward(x...); });
}
template <class T, class C>
var<T, C> sub(const ops::sub_op& op, var<T, C> a, var<T, C> b) {
  return detail::binary(op, a, b, [](auto&&... x) { return ops::sub(x...); },
                        [](auto&&... x) { return ops::sub_backward(x...); });
}
template <class T, class C>
var<T, C> mul(const ops::mul_op& op, var<T, C> a, var<T, C> b) {
  return detail::binary(op, a, b, [](auto&&... x) { return ops::mul(x...); },
                        [](auto&&... x) { return ops::mul_backward(x...); });
}
template <class T, class C>
var<T, C> bias_add(const ops::bias_add_op& op, var<T, C> x, var<T, C> bias) {
  return detail::binary(op, x, bias, [](auto&&... a) { return ops::bias_add(a...); },
                        [](auto&&... a) { return ops::bias_add_backward(a...); });
}
template <class T, class C>
var<T, C> relu(const ops::relu_op& op, var<T, C> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::relu(a...); },
                       [](auto&&... a) { return ops::relu_backward(a...); });
}
template <class T, class C>
var<T, C> reduce_sum(const ops::reduce_sum_op& op, var<T, C> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::reduce_sum(a...); },
                       [](auto&&... a) { return ops::reduce_sum_backward(a...); });
}
template <class T, class C>
var<T, C> reduce_mean(const ops::reduce_mean_op& op, var<T, C> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::reduce_mean(a...); },
                       [](auto&&... a) { return ops::reduce_mean_backward(a...); });
}

/// The per-sample loss (B,) of softmax(logits) against labels; only the logits get a
/// gradient (labels are data).
template <class T, class C>
var<T, C> softmax_cross_entropy(const ops::softmax_cross_entropy_op& op, var<T, C> logits,
                                var<T, C> labels) {
  tape<T, C>& t = *logits.t;
  dist_tensor<T> y = ops::softmax_cross_entropy(op, logits.value(), labels.value(), t.ctx());
  return t.record(std::move(y), [op, ix = logits.id, it = labels.id](tape<T, C>& tp, const dist_tensor<T>& g) {
    tp.add_grad(ix, ops::softmax_cross_entropy_backward(op, g, tp.value(ix), tp.value(it), tp.ctx()));
  });
}

}  // namespace tessera::autodiff
