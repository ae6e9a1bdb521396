// The other operators of ops/ as graph operators: BatchMatMul, OneHot, Softmax,
// LogSoftmax, Transpose, Reshape, Flatten, StridedSlice, Concat, ArgMax and
// SparseSoftmaxCrossEntropyWithLogits, each with its rule (ops/<name>_rule.hpp), its
// candidate strategies and its data-parallel strategy. Standard library only.
#pragma once

#include <memory>
#include <string>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/graph/op_def.hpp>
#include <tessera/ops/argmax_rule.hpp>
#include <tessera/ops/batch_matmul_rule.hpp>
#include <tessera/ops/one_hot_rule.hpp>
#include <tessera/ops/shape_rule.hpp>
#include <tessera/ops/softmax_axis_rule.hpp>
#include <tessera/ops/sparse_cross_entropy_rule.hpp>
#include <tessera/plan/cost.hpp>

namespace tessera::graph {

namespace detail {

// A strategy of one input split by `t`.
inline std::vector<strategy> one_input_candidates(const extents& shape, int device_num) {
  std::vector<strategy> c;
  for_each_split(shape, device_num, [&](const split_tuple& t) { c.push_back(strategy{t}); });
  order_candidates(c, [](const strategy& st) { return st.in[0].product(); });
  return c;
}

// The input's split tuple with dim `d` split `n` ways and the others whole.
inline strategy split_dim(const extents& shape, int d, int n) {
  split_tuple t = ones(shape.ndim);
  if (d >= 0 && d < t.n) t.v[d] = n;
  return strategy{t};
}

// Throws the status `s` of a shape check without a strategy.
inline void require_shapes(const status& s) {
  if (!s.ok()) throw error(s);
}

}  // namespace detail

// ---- BatchMatMul -----------------------------------------------------------------------

/// BatchMatMul(transpose_a, transpose_b): a MatMul per batch entry; an input of rank 2
/// is shared by every entry; rule ops/batch_matmul_rule.hpp. Candidates: every split of
/// the batch dims, m, k and n whose device matrix divides the device count (the batched
/// inputs' batch dims split alike). Data parallel: batch dim 0 split over every device.
class batch_matmul_def : public op_def {
 public:
  bool transpose_a = false;
  bool transpose_b = false;

  explicit batch_matmul_def(bool ta = false, bool tb = false) : transpose_a(ta), transpose_b(tb) {}

  std::string type() const override { return "BatchMatMul"; }
  std::string default_name() const override { return "batch_matmul"; }
  int arity() const override { return 2; }
  linearity linear() const override { return linearity::each(2); }
  /// 2 (batch m n) k on each rank's shards.
  double forward_work(const op_layouts& l, const shape_list& in, const extents& out) const override {
    const extents a = local_shape(l.in[0], in[0]);
    return 2.0 * double(local_shape(l.out, out).size()) * double(transpose_a ? a[a.ndim - 2] : a[a.ndim - 1]);
  }
  std::string attributes() const override {
    return "transpose_a: " + detail::bool_text(transpose_a) + ", transpose_b: " + detail::bool_text(transpose_b);
  }
  extents output_shape(const shape_list& in) const override {
    const strategy ones{detail::ones(in[0].ndim), detail::ones(in[1].ndim)};
    detail::require_shapes(check_batch_matmul(ones, 1, in[0], in[1], transpose_a, transpose_b));
    return batch_matmul_rule(ones, 1, in[0], in[1], transpose_a, transpose_b).shape;
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_batch_matmul(st, device_num, in[0], in[1], transpose_a, transpose_b);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const batch_matmul_layouts r = batch_matmul_rule(st, device_num, in[0], in[1], transpose_a, transpose_b);
    return {r.dev, {r.a, r.b}, r.c, {r.grad_a, r.grad_b}, r.c.without_partial()};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    const extents out = output_shape(in);
    const int nb = out.ndim - 2;
    extents dims = out;  // (batch..., m, k, n)
    dims.ndim = nb + 3;
    dims.v[nb + 1] = transpose_a ? in[0][in[0].ndim - 2] : in[0][in[0].ndim - 1];
    dims.v[nb + 2] = out[nb + 1];
    std::vector<strategy> c;
    detail::for_each_split(dims, device_num, [&](const split_tuple& t) {
      const strategy st = make(t, in);
      if (check(st, device_num, in).ok()) c.push_back(st);
    });
    detail::order_candidates(c, [&](const strategy& st) { return devices(st, in); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list& in) const override {
    const extents out = output_shape(in);
    split_tuple t = detail::ones(out.ndim + 1);
    t.v[0] = device_num;
    return make(t, in);
  }

  /// The strategy of batch splits, then m, k and n: t = (b..., m, k, n).
  strategy make(const split_tuple& t, const shape_list& in) const {
    const int nb = t.n - 3;
    const int m = t[nb], k = t[nb + 1], n = t[nb + 2];
    strategy st{detail::ones(in[0].ndim), detail::ones(in[1].ndim)};
    for (int i = 0; i < 2; ++i)
      if (in[i].ndim == nb + 2)
        for (int d = 0; d < nb; ++d) st.in[i].v[d] = t[d];
    split_tuple& a = st.in[0];
    split_tuple& b = st.in[1];
    a.v[a.n - 2] = transpose_a ? k : m;
    a.v[a.n - 1] = transpose_a ? m : k;
    b.v[b.n - 2] = transpose_b ? n : k;
    b.v[b.n - 1] = transpose_b ? k : n;
    return st;
  }

 private:
  int devices(const strategy& st, const shape_list& in) const {
    const split_tuple& batched = in[0].ndim >= in[1].ndim ? st.in[0] : st.in[1];
    const int nb = batched.n - 2;
    int p = 1;
    for (int d = 0; d < nb; ++d) p *= batched[d];
    const split_tuple& a = st.in[0];
    const split_tuple& b = st.in[1];
    return p * a[a.n - 2] * a[a.n - 1] * (transpose_b ? b[b.n - 2] : b[b.n - 1]);
  }
};

// ---- OneHot ------------------------------------------------------------------------------

/// OneHot(depth): indices (..., ) to indices.shape + (depth,), `on` (1) at each index and
/// `off` (0) elsewhere; rule ops/one_hot_rule.hpp. Its strategy splits the OUTPUT, as
/// MindSpore's ((b, d),): one entry per output dim. The indices get no gradient.
/// Candidates: every split tuple of the output. Data parallel: output dim 0.
class one_hot_def : public op_def {
 public:
  index_t depth = 0;

  explicit one_hot_def(index_t d) : depth(d) {}

  std::string type() const override { return "OneHot"; }
  std::string default_name() const override { return "one_hot"; }
  int arity() const override { return 1; }
  bool differentiable(int) const override { return false; }
  std::string attributes() const override { return "depth: " + std::to_string(depth) + ", axis: -1"; }
  extents output_shape(const shape_list& in) const override {
    extents out = in[0];
    detail::require_shapes(check_one_hot(strategy{detail::ones(in[0].ndim + 1)}, 1, in[0], depth));
    out.v[out.ndim++] = depth;
    return out;
  }
  /// ((b, d),), or MindSpore's ((b, d), (), ()) (empty tuples for the on and off values).
  status check_form(const strategy& st, const shape_list& in) const override {
    if (st.n != 1 && st.n != 3) return fail(errc::one_hot_inputs, -1, -1, st.n);
    for (int i = 1; i < st.n; ++i)
      if (st.in[i].n != 0) return fail(errc::one_hot_value_split, i, -1, st.in[i].n);
    if (st.in[0].n != in[0].ndim + 1) return fail(errc::one_hot_ndim, -1, -1, st.in[0].n, in[0].ndim + 1);
    for (int d = 0; d < st.in[0].n; ++d)
      if (st.in[0].v[d] < 1) return fail(errc::strategy_split, 0, d, st.in[0].v[d]);
    return {};
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_one_hot(st, device_num, in[0], depth);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const one_hot_layouts r = one_hot_rule(st, device_num, in[0], depth);
    return {r.dev, {r.indices}, r.out, {r.indices}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    return detail::one_input_candidates(output_shape(in), device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const override {
    return detail::split_dim(output_shape(in), 0, device_num);
  }
};

// ---- Softmax, LogSoftmax -----------------------------------------------------------

/// Softmax or LogSoftmax along `axis`; rule ops/softmax_axis_rule.hpp. Candidates: every
/// split tuple of the input; a split axis combines the rows' maxima and sums over its
/// group (forward two all-reduces of one value per row, backward one). Data parallel:
/// dim 0 (the axis itself when the input has one dim).
class softmax_def : public op_def {
 public:
  int axis = -1;
  bool log = false;

  softmax_def(int a, bool lg) : axis(a), log(lg) {}

  std::string type() const override { return log ? "LogSoftmax" : "Softmax"; }
  std::string default_name() const override { return log ? "log_softmax" : "softmax"; }
  int arity() const override { return 1; }
  std::string attributes() const override { return "axis: " + std::to_string(axis); }
  extents output_shape(const shape_list& in) const override {
    detail::require_shapes(check_softmax(strategy{detail::ones(in[0].ndim)}, 1, in[0], axis));
    return in[0];
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_softmax(st, device_num, in[0], axis);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const softmax_layouts r = softmax_rule(st, device_num, in[0], axis);
    return {r.dev, {r.in}, r.out, {r.in}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    return detail::one_input_candidates(in[0], device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const override {
    return detail::split_dim(in[0], 0, device_num);
  }
  std::vector<internal_collective> collectives(const strategy& st, int device_num, const shape_list& in,
                                               index_t elem_bytes) const override {
    const softmax_layouts r = softmax_rule(st, device_num, in[0], axis);
    if (r.group.empty()) return {};
    const index_t b = cost::all_reduce(detail::local_rows(r.in, in[0], r.axis) * elem_bytes, group_size(r.dev, r.group));
    return {{"AllReduce", reduce_op::max, r.dev, r.group, b, false, "row maxima"},
            {"AllReduce", reduce_op::sum, r.dev, r.group, b, false, "row sums"},
            {"AllReduce", reduce_op::sum, r.dev, r.group, b, true, "row sums of the gradient"}};
  }
};

// ---- Transpose, Reshape, Flatten, StridedSlice ---------------------------------------

/// Transpose(perm); rule ops/shape_rule.hpp: the shards are permuted in place, no
/// communication. Candidates: every split tuple of the input. Data parallel: the
/// input's dim perm[0] (the output's dim 0).
class transpose_def : public op_def {
 public:
  dim_list perm;

  explicit transpose_def(dim_list p) : perm(p) {}

  std::string type() const override { return "Transpose"; }
  std::string default_name() const override { return "transpose"; }
  int arity() const override { return 1; }
  linearity linear() const override { return linearity::jointly(1u); }
  std::string attributes() const override {
    std::string s = "perm: (";
    for (int i = 0; i < perm.n; ++i) s += (i ? ", " : "") + std::to_string(perm.v[i]);
    return s + (perm.n == 1 ? ",)" : ")");
  }
  extents output_shape(const shape_list& in) const override {
    const strategy ones{detail::ones(in[0].ndim)};
    detail::require_shapes(check_transpose(ones, 1, in[0], perm));
    return transpose_rule(ones, 1, in[0], perm).shape;
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_transpose(st, device_num, in[0], perm);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const transpose_layouts r = transpose_rule(st, device_num, in[0], perm);
    return {r.dev, {r.in}, r.out, {r.in}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    return detail::one_input_candidates(in[0], device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const override {
    const int p0 = perm.n > 0 ? (perm.v[0] < 0 ? perm.v[0] + in[0].ndim : perm.v[0]) : 0;
    return detail::split_dim(in[0], p0, device_num);
  }
};

/// Reshape(target) (one entry may be -1, inferred), and Flatten (the batch dim kept,
/// the others multiplied); rule ops/shape_rule.hpp: the shards stay in place when only
/// the first dim of each group of dims is split, else the input is redistributed
/// first (the rule's `in`). Candidates: every split tuple of the input. Data parallel:
/// dim 0.
class reshape_def : public op_def {
 public:
  extents target;
  bool flatten = false;

  explicit reshape_def(const extents& t, bool flat = false) : target(t), flatten(flat) {}

  std::string type() const override { return flatten ? "Flatten" : "Reshape"; }
  std::string default_name() const override { return flatten ? "flatten" : "reshape"; }
  int arity() const override { return 1; }
  linearity linear() const override { return linearity::jointly(1u); }
  std::string attributes() const override {
    if (flatten) return {};
    std::string s = "shape: (";
    for (int d = 0; d < target.ndim; ++d) s += (d ? ", " : "") + std::to_string(target.v[d]);
    return s + (target.ndim == 1 ? ",)" : ")");
  }
  extents output_shape(const shape_list& in) const override {
    const strategy ones{detail::ones(in[0].ndim)};
    detail::require_shapes(check_reshape(ones, 1, in[0], to(in[0])));
    return reshape_rule(ones, 1, in[0], to(in[0])).shape;
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_reshape(st, device_num, in[0], to(in[0]));
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const reshape_layouts r = reshape_rule(st, device_num, in[0], to(in[0]));
    return {r.dev, {r.in}, r.out, {r.in}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    return detail::one_input_candidates(in[0], device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const override {
    return detail::split_dim(in[0], 0, device_num);
  }

 private:
  extents to(const extents& shape) const { return flatten ? flatten_target(shape) : target; }
};

/// StridedSlice(begin, end, strides) (Python slice semantics on the leading dims); rule
/// ops/shape_rule.hpp: a dim taken whole keeps its split, a cut dim is whole on every
/// rank (gathered first when the strategy splits it). Candidates: every split tuple of
/// the input. Data parallel: dim 0.
class strided_slice_def : public op_def {
 public:
  index_list begin, end, strides;

  strided_slice_def(index_list b, index_list e, index_list s) : begin(b), end(e), strides(s) {}

  std::string type() const override { return "StridedSlice"; }
  std::string default_name() const override { return "strided_slice"; }
  int arity() const override { return 1; }
  linearity linear() const override { return linearity::jointly(1u); }
  std::string attributes() const override { return "begin: " + text(begin) + ", end: " + text(end) + ", strides: " + text(strides); }
  extents output_shape(const shape_list& in) const override {
    const strategy ones{detail::ones(in[0].ndim)};
    detail::require_shapes(check_strided_slice(ones, 1, in[0], begin, end, strides));
    return strided_slice_rule(ones, 1, in[0], begin, end, strides).shape;
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_strided_slice(st, device_num, in[0], begin, end, strides);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const strided_slice_layouts r = strided_slice_rule(st, device_num, in[0], begin, end, strides);
    return {r.dev, {r.in}, r.out, {r.in}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    return detail::one_input_candidates(in[0], device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const override {
    return detail::split_dim(in[0], 0, device_num);
  }

 private:
  static std::string text(const index_list& l) {
    std::string s = "(";
    for (int i = 0; i < l.n; ++i) s += (i ? ", " : "") + std::to_string(l.v[i]);
    return s + (l.n == 1 ? ",)" : ")");
  }
};

// ---- Concat --------------------------------------------------------------------------

/// Concat(axis) of `inputs` tensors; rule ops/shape_rule.hpp: every input split alike,
/// the axis whole, each rank joins its shards. Candidates: every split tuple of the
/// inputs with the axis unsplit, given to each. Data parallel: dim 0 split over every
/// device (whole when dim 0 is the axis).
class concat_def : public op_def {
 public:
  int axis = 0;
  int inputs = 2;

  concat_def(int a, int n) : axis(a), inputs(n) {}

  std::string type() const override { return "Concat"; }
  std::string default_name() const override { return "concat"; }
  int arity() const override { return inputs; }
  linearity linear() const override { return linearity::all(inputs); }
  std::string attributes() const override { return "axis: " + std::to_string(axis); }
  extents output_shape(const shape_list& in) const override {
    strategy ones;
    for (int i = 0; i < in.n; ++i) ones.in[ones.n++] = detail::ones(in[i].ndim);
    detail::require_shapes(check_concat(ones, 1, in, axis));
    return concat_rule(ones, 1, in, axis).shape;
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_concat(st, device_num, in, axis);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const concat_layouts r = concat_rule(st, device_num, in, axis);
    op_layouts l{r.dev, {}, r.out, {}, r.out};
    for (int i = 0; i < in.n; ++i) {
      l.in.push_back(r.in);
      l.in_grad.push_back(r.in);
    }
    return l;
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    extents s = in[0];
    s.v[ax(s)] = 1;  // the axis stays whole
    std::vector<strategy> c;
    detail::for_each_split(s, device_num, [&](const split_tuple& t) { c.push_back(all(t, in)); });
    detail::order_candidates(c, [](const strategy& st) { return st.in[0].product(); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list& in) const override {
    split_tuple t = detail::ones(in[0].ndim);
    if (t.n > 0 && ax(in[0]) != 0) t.v[0] = device_num;
    return all(t, in);
  }

 private:
  int ax(const extents& s) const { return axis < 0 ? axis + s.ndim : axis; }
  static strategy all(const split_tuple& t, const shape_list& in) {
    strategy st;
    for (int i = 0; i < in.n; ++i) st.in[st.n++] = t;
    return st;
  }
};

// ---- ArgMax --------------------------------------------------------------------------

/// ArgMax(axis): the index of the maximum along `axis` (as a value of the tensors'
/// type), data with no gradient; rule ops/argmax_rule.hpp. Candidates: every split
/// tuple of the input; a split axis combines the maxima and then the indices over its
/// group (two all-reduces, the second of 8-byte indices). Data parallel: dim 0.
class argmax_def : public op_def {
 public:
  int axis = -1;

  explicit argmax_def(int a) : axis(a) {}

  std::string type() const override { return "Argmax"; }
  std::string default_name() const override { return "argmax"; }
  int arity() const override { return 1; }
  bool differentiable(int) const override { return false; }
  std::string attributes() const override { return "axis: " + std::to_string(axis); }
  extents output_shape(const shape_list& in) const override {
    const strategy ones{detail::ones(in[0].ndim)};
    detail::require_shapes(check_argmax(ones, 1, in[0], axis));
    return argmax_rule(ones, 1, in[0], axis).shape;
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_argmax(st, device_num, in[0], axis);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const argmax_layouts r = argmax_rule(st, device_num, in[0], axis);
    return {r.dev, {r.in}, r.out, {r.in}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    return detail::one_input_candidates(in[0], device_num);
  }
  strategy data_parallel(int device_num, const shape_list& in) const override {
    return detail::split_dim(in[0], 0, device_num);
  }
  std::vector<internal_collective> collectives(const strategy& st, int device_num, const shape_list& in,
                                               index_t elem_bytes) const override {
    const argmax_layouts r = argmax_rule(st, device_num, in[0], axis);
    if (r.group.empty()) return {};
    const index_t rows = detail::local_rows(r.in, in[0], r.axis);
    const int g = group_size(r.dev, r.group);
    return {{"AllReduce", reduce_op::max, r.dev, r.group, cost::all_reduce(rows * elem_bytes, g), false, "the maxima"},
            {"AllReduce", reduce_op::min, r.dev, r.group, cost::all_reduce(rows * 8, g), false,
             "the first index of each maximum"}};
  }
};

// ---- SparseSoftmaxCrossEntropyWithLogits -------------------------------------------------

/// The per-sample loss (B,) of logits (B, C) against class labels (B,); rule
/// ops/sparse_cross_entropy_rule.hpp. Labels get no gradient. Candidates: every
/// ((b, c), (b,)) with b | B, c | C and b c dividing the device count. Data parallel:
/// b = device count. A split class dim combines the row maxima and sums over the class
/// axis, forward and backward.
class sparse_softmax_cross_entropy_def : public op_def {
 public:
  std::string type() const override { return "SparseSoftmaxCrossEntropyWithLogits"; }
  std::string default_name() const override { return "sparse_softmax_cross_entropy"; }
  int arity() const override { return 2; }
  bool differentiable(int i) const override { return i == 0; }
  extents output_shape(const shape_list& in) const override {
    detail::require_shapes(check_sparse_softmax_cross_entropy(
        strategy{detail::ones(in[0].ndim), detail::ones(in[1].ndim)}, 1, in[0], in[1]));
    return extents{in[0][0]};
  }
  status check(const strategy& st, int device_num, const shape_list& in) const override {
    return check_sparse_softmax_cross_entropy(st, device_num, in[0], in[1]);
  }
  op_layouts layouts(const strategy& st, int device_num, const shape_list& in) const override {
    const sparse_cross_entropy_layouts r = sparse_softmax_cross_entropy_rule(st, device_num, in[0]);
    return {r.dev, {r.logits, r.labels}, r.out, {r.logits, r.labels}, r.out};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const override {
    std::vector<strategy> c;
    detail::for_each_split(in[0], device_num, [&](const split_tuple& t) { c.push_back(strategy{t, {t[0]}}); });
    detail::order_candidates(c, [](const strategy& st) { return st.in[0].product(); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list&) const override {
    return strategy{{device_num, 1}, {device_num}};
  }
  std::vector<internal_collective> collectives(const strategy& st, int device_num, const shape_list& in,
                                               index_t elem_bytes) const override {
    const sparse_cross_entropy_layouts r = sparse_softmax_cross_entropy_rule(st, device_num, in[0]);
    if (r.class_split <= 1) return {};
    const index_t rows = in[0][0] / st.in[0].v[0];
    const axis_list axes{r.class_axis};
    const index_t one = cost::all_reduce(rows * elem_bytes, r.class_split);
    const index_t two = cost::all_reduce(2 * rows * elem_bytes, r.class_split);
    return {{"AllReduce", reduce_op::max, r.dev, axes, one, false, "row maxima"},
            {"AllReduce", reduce_op::sum, r.dev, axes, two, false, "row sums and the labels' logits"},
            {"AllReduce", reduce_op::max, r.dev, axes, one, true, "row maxima"},
            {"AllReduce", reduce_op::sum, r.dev, axes, two, true, "row sums and the labels' logits"}};
  }
};

}  // namespace tessera::graph
