// Differentiable sharded operators: each runs the operator of ops/ on the tape's values
// and records its backward.
#pragma once

#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>
#include <tessera/autodiff/tape.hpp>
#include <tessera/ops/argmax.hpp>
#include <tessera/ops/batch_matmul.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/ops/matmul_pipelined.hpp>
#include <tessera/ops/one_hot.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape.hpp>
#include <tessera/ops/softmax.hpp>
#include <tessera/ops/softmax_axis.hpp>
#include <tessera/ops/sparse_cross_entropy.hpp>

namespace tessera::autodiff {

namespace detail {
// MatMul's backward on the tape, whichever forward computed C (ops::matmul or a
// pipelined one): dC is brought to C's layout without partial sums, and dA and dB land
// in the rule's gradient layouts.
template <class T, class C, class D>
auto matmul_grads(const ops::matmul_op& op, int ia, int ib) {
  return [op, ia, ib](tape<T, C, D>& tp, const tensor_on<T, D>& g) {
    auto [da, db] = ops::matmul_backward(op, g, tp.value(ia), tp.value(ib), tp.ctx());
    tp.add_grad(ia, std::move(da));
    tp.add_grad(ib, std::move(db));
  };
}
}  // namespace detail

/// C = op(A) op(B) with MatMul's strategy; dA and dB in the rule's gradient layouts.
template <class T, class C, class D>
var<T, C, D> matmul(const ops::matmul_op& op, var<T, C, D> a, var<T, C, D> b) {
  tape<T, C, D>& t = *a.t;
  tensor_on<T, D> c = ops::matmul(op, a.value(), b.value(), t.ctx());
  return t.record(std::move(c), detail::matmul_grads<T, C, D>(op, a.id, b.id));
}

/// C = op(A) op(B) by ops::matmul_overlapped: the contraction's partial sums resolved
/// as `how` says, chunk by chunk, while the next chunk is multiplied (C in
/// ops::resolved_layout(rule, how)). The backward is MatMul's. C's communicator must be
/// non-blocking (mpi_communicator, local_communicator, the staged and NCCL ones).
///
///     auto h = autodiff::matmul_overlapped(ops::matmul_op{strategy{{1, 4}, {4, 1}}}, x, w);
template <class T, class C, class D>
var<T, C, D> matmul_overlapped(const ops::matmul_op& op, var<T, C, D> a, var<T, C, D> b,
                               ops::partial_resolution how = ops::partial_resolution::scatter_rows,
                               const ops::pipeline_options& opt = {}) {
  tape<T, C, D>& t = *a.t;
  tensor_on<T, D> c = ops::matmul_overlapped(op, a.value(), b.value(), t.ctx(), how, opt);
  return t.record(std::move(c), detail::matmul_grads<T, C, D>(op, a.id, b.id));
}

/// C = op(A) op(B) by SUMMA (ops::matmul_summa), for strategies ((pm, 1), (1, pn)): the
/// panels of A and B broadcast along the mesh's rows and columns while the previous
/// panels are multiplied. The backward is MatMul's.
template <class T, class C, class D>
var<T, C, D> matmul_summa(const ops::matmul_op& op, var<T, C, D> a, var<T, C, D> b,
                          const ops::pipeline_options& opt = {}) {
  tape<T, C, D>& t = *a.t;
  tensor_on<T, D> c = ops::matmul_summa(op, a.value(), b.value(), t.ctx(), opt);
  return t.record(std::move(c), detail::matmul_grads<T, C, D>(op, a.id, b.id));
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

// ---- the remaining element-wise and reduction operators, BatchMatMul, OneHot, Softmax,
// LogSoftmax, the data-movement operators, the sparse cross entropy and ArgMax ----------

namespace detail {
// Records a unary operator whose backward reads the operator's own output y:
// bwd(op, g, x, y, ctx) -> dx.
template <class T, class C, class D, class Op, class Fwd, class Bwd>
var<T, C, D> unary_with_output(const Op& op, var<T, C, D> x, Fwd fwd, Bwd bwd) {
  tape<T, C, D>& t = *x.t;
  tensor_on<T, D> y = fwd(op, x.value(), t.ctx());
  auto self = std::make_shared<int>(-1);  // y's id, known once it is recorded
  const var<T, C, D> out =
      t.record(std::move(y), [op, bwd, ix = x.id, self](tape<T, C, D>& tp, const tensor_on<T, D>& g) {
        tp.add_grad(ix, bwd(op, g, tp.value(ix), tp.value(*self), tp.ctx()));
      });
  *self = out.id;
  return out;
}
}  // namespace detail

template <class T, class C, class D>
var<T, C, D> div(const ops::div_op& op, var<T, C, D> a, var<T, C, D> b) {
  return detail::binary(op, a, b, [](auto&&... x) { return ops::div(x...); },
                        [](auto&&... x) { return ops::div_backward(x...); });
}
template <class T, class C, class D>
var<T, C, D> exp(const ops::exp_op& op, var<T, C, D> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::exp(a...); },
                       [](auto&&... a) { return ops::exp_backward(a...); });
}
template <class T, class C, class D>
var<T, C, D> log(const ops::log_op& op, var<T, C, D> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::log(a...); },
                       [](auto&&... a) { return ops::log_backward(a...); });
}
template <class T, class C, class D>
var<T, C, D> neg(const ops::neg_op& op, var<T, C, D> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::neg(a...); },
                       [](auto&&... a) { return ops::neg_backward(a...); });
}
/// The maximum over op.dims; the gradient goes to the maxima (ties share it).
template <class T, class C, class D>
var<T, C, D> reduce_max(const ops::reduce_max_op& op, var<T, C, D> x) {
  return detail::unary_with_output(op, x, [](auto&&... a) { return ops::reduce_max(a...); },
                                   [](auto&&... a) { return ops::reduce_max_backward(a...); });
}
/// The minimum over op.dims; the gradient goes to the minima (ties share it).
template <class T, class C, class D>
var<T, C, D> reduce_min(const ops::reduce_min_op& op, var<T, C, D> x) {
  return detail::unary_with_output(op, x, [](auto&&... a) { return ops::reduce_min(a...); },
                                   [](auto&&... a) { return ops::reduce_min_backward(a...); });
}

/// C = op(A) op(B) per batch entry with BatchMatMul's strategy.
template <class T, class C, class D>
var<T, C, D> batch_matmul(const ops::batch_matmul_op& op, var<T, C, D> a, var<T, C, D> b) {
  return detail::binary(op, a, b, [](auto&&... x) { return ops::batch_matmul(x...); },
                        [](auto&&... x) { return ops::batch_matmul_backward(x...); });
}

/// one_hot(indices) with values `on` and `off`: data, not differentiable (a constant on
/// the tape, like a leaf without gradient).
template <class T, class C, class D>
var<T, C, D> one_hot(const ops::one_hot_op& op, var<T, C, D> indices, T on = T(1), T off = T(0)) {
  tape<T, C, D>& t = *indices.t;
  return t.leaf(ops::one_hot(op, indices.value(), on, off, t.ctx()), false);
}

/// softmax(x) along op.axis; the backward reads the output.
template <class T, class C, class D>
var<T, C, D> softmax(const ops::softmax_op& op, var<T, C, D> x) {
  return detail::unary_with_output(
      op, x, [](auto&&... a) { return ops::softmax(a...); },
      [](const auto& o, const auto& g, const auto&, const auto& y, auto& ctx) {
        return ops::softmax_backward(o, g, y, ctx);
      });
}
/// log_softmax(x) along op.axis; the backward reads the output.
template <class T, class C, class D>
var<T, C, D> log_softmax(const ops::log_softmax_op& op, var<T, C, D> x) {
  return detail::unary_with_output(
      op, x, [](auto&&... a) { return ops::log_softmax(a...); },
      [](const auto& o, const auto& g, const auto&, const auto& y, auto& ctx) {
        return ops::log_softmax_backward(o, g, y, ctx);
      });
}

template <class T, class C, class D>
var<T, C, D> transpose(const ops::transpose_op& op, var<T, C, D> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::transpose(a...); },
                       [](auto&&... a) { return ops::transpose_backward(a...); });
}
template <class T, class C, class D>
var<T, C, D> reshape(const ops::reshape_op& op, var<T, C, D> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::reshape(a...); },
                       [](auto&&... a) { return ops::reshape_backward(a...); });
}
template <class T, class C, class D>
var<T, C, D> flatten(const ops::flatten_op& op, var<T, C, D> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::flatten(a...); },
                       [](auto&&... a) { return ops::flatten_backward(a...); });
}
template <class T, class C, class D>
var<T, C, D> strided_slice(const ops::strided_slice_op& op, var<T, C, D> x) {
  return detail::unary(op, x, [](auto&&... a) { return ops::strided_slice(a...); },
                       [](auto&&... a) { return ops::strided_slice_backward(a...); });
}
/// The values joined along op.axis (all on one tape); each gets its slice of the gradient.
template <class T, class C, class D>
var<T, C, D> concat(const ops::concat_op& op, const std::vector<var<T, C, D>>& xs) {
  if (xs.empty()) throw error("concat: needs at least one input");
  tape<T, C, D>& t = *xs[0].t;
  std::vector<const tensor_on<T, D>*> values;
  std::vector<int> ids;
  for (const var<T, C, D>& x : xs) {
    values.push_back(&x.value());
    ids.push_back(x.id);
  }
  tensor_on<T, D> y = ops::concat(op, values, t.ctx());
  return t.record(std::move(y), [op, ids](tape<T, C, D>& tp, const tensor_on<T, D>& g) {
    std::vector<const tensor_on<T, D>*> in;
    for (int id : ids) in.push_back(&tp.value(id));
    std::vector<tensor_on<T, D>> dxs = ops::concat_backward(op, g, in, tp.ctx());
    for (std::size_t i = 0; i < ids.size(); ++i) tp.add_grad(ids[i], std::move(dxs[i]));
  });
}
/// concat of a braced list: concat(op, {a, b}).
template <class T, class C, class D>
var<T, C, D> concat(const ops::concat_op& op, std::initializer_list<var<T, C, D>> xs) {
  return concat(op, std::vector<var<T, C, D>>(xs));
}

/// The per-sample loss (B,) of softmax(logits) against class labels (B,) (integer-valued);
/// only the logits get a gradient.
template <class T, class C, class D>
var<T, C, D> sparse_softmax_cross_entropy(const ops::sparse_softmax_cross_entropy_op& op, var<T, C, D> logits,
                                       var<T, C, D> labels) {
  tape<T, C, D>& t = *logits.t;
  tensor_on<T, D> y = ops::sparse_softmax_cross_entropy(op, logits.value(), labels.value(), t.ctx());
  return t.record(std::move(y), [op, ix = logits.id, it = labels.id](tape<T, C, D>& tp, const tensor_on<T, D>& g) {
    tp.add_grad(ix, ops::sparse_softmax_cross_entropy_backward(op, g, tp.value(ix), tp.value(it), tp.ctx()));
  });
}

/// The indices of the maxima along op.axis, as values of T (for accuracy): a constant on
/// the tape.
template <class T, class C, class D>
var<T, C, D> argmax(const ops::argmax_op& op, var<T, C, D> x) {
  tape<T, C, D>& t = *x.t;
  return t.leaf(ops::argmax<T>(op, x.value(), t.ctx()), false);
}

}  // namespace tessera::autodiff
