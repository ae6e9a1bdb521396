// BatchMatMul's definition: the sharding rule (C[..., :, :] = op(A[..., :, :])
// op(B[..., :, :]) over batch dims split like an element-wise operator's and a
// contraction split that leaves partial sums, as MatMul's), constexpr, and the operator
// type ops::batch_matmul_op. Standard library only; the forward and backward are in
// ops/batch_matmul.hpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/split_check.hpp>

namespace tessera {

/// The layouts of C = batch_matmul(A, B, transpose_a, transpose_b).
struct batch_matmul_layouts {
  mesh dev;        ///< (batch splits..., m, k, n), or (replicas, batch splits..., m, k, n)
  layout a, b;     ///< the inputs as the local products need them
  layout c;        ///< the output: partial sums over the k axis when the contraction is split
  layout grad_a;   ///< A's layout, partial over the n axis (and the batch axes when A is shared)
  layout grad_b;   ///< B's layout, partial over the m axis (and the batch axes when B is shared)
  extents shape;   ///< C's global shape (batch..., m, n)
  int batch = 0;   ///< number of batch dims
  friend constexpr bool operator==(const batch_matmul_layouts&, const batch_matmul_layouts&) = default;
};

namespace detail {
// (rows, cols) of op(X) for the last two dims of a split tuple or a shape.
template <class V>
constexpr auto op_rows(const V& v, int n, bool trans) { return trans ? v[n - 1] : v[n - 2]; }
template <class V>
constexpr auto op_cols(const V& v, int n, bool trans) { return trans ? v[n - 2] : v[n - 1]; }
}  // namespace detail

/// Checks a BatchMatMul strategy on `device_num` devices for inputs of shapes `a` and
/// `b`. Each input has rank 2 (a matrix shared by every batch entry) or the output's
/// rank (the same batch dims, then a matrix), and one of them has batch dims; the
/// contraction extents agree; the strategy has one split tuple per input with one
/// entry per dim, positive splits; both inputs split each batch dim alike (when both
/// have it) and the contraction dim alike; the device matrix (batch splits, m, k, n)
/// divides the device count; and every extent is divisible by its split.
/// Example: A (4, 8, 16), B (4, 16, 8) on 8 devices: ((2, 2, 2), (2, 2, 1)) is valid;
/// ((2, 2, 2), (1, 2, 1)) splits batch dim 0 unlike A.
constexpr status check_batch_matmul(const strategy& st, int device_num, const extents& a,
                                    const extents& b, bool trans_a = false, bool trans_b = false) {
  if (st.n != 2) return fail(errc::op_inputs, -1, -1, st.n, 2);
  const int rank = a.ndim > b.ndim ? a.ndim : b.ndim;
  if (rank < 3) return fail(errc::batch_matmul_no_batch, -1, -1, a.ndim, b.ndim);
  const extents* in[2] = {&a, &b};
  for (int i = 0; i < 2; ++i)
    if (in[i]->ndim != 2 && in[i]->ndim != rank) return fail(errc::batch_matmul_rank, i, -1, in[i]->ndim, rank);
  for (int i = 0; i < 2; ++i)
    if (st.in[i].n != in[i]->ndim) return fail(errc::op_input_ndim, i, -1, st.in[i].n, in[i]->ndim);
  if (status s = check(st, device_num); !s.ok()) return s;
  const int nb = rank - 2;
  if (a.ndim == rank && b.ndim == rank)
    for (int d = 0; d < nb; ++d)
      if (a.v[d] != b.v[d] && a.v[d] != dynamic_extent && b.v[d] != dynamic_extent)
        return fail(errc::batch_matmul_batch_shape, d, -1, b.v[d], a.v[d]);
  const index_t ka = detail::op_cols(a.v, a.ndim, trans_a), kb = detail::op_rows(b.v, b.ndim, trans_b);
  if (ka != kb && ka != dynamic_extent && kb != dynamic_extent)
    return fail(errc::batch_matmul_contraction_shape, -1, -1, ka, kb);
  if (a.ndim == rank && b.ndim == rank)
    for (int d = 0; d < nb; ++d)
      if (st.in[1].v[d] != st.in[0].v[d])
        return fail(errc::batch_matmul_batch_split, d, -1, st.in[1].v[d], st.in[0].v[d]);
  const int sk_a = detail::op_cols(st.in[0].v, a.ndim, trans_a);
  const int sk_b = detail::op_rows(st.in[1].v, b.ndim, trans_b);
  if (sk_a != sk_b) return fail(errc::batch_matmul_contraction, -1, -1, sk_a, sk_b);
  const split_tuple& batched = a.ndim == rank ? st.in[0] : st.in[1];
  int size = detail::op_rows(st.in[0].v, a.ndim, trans_a) * sk_a * detail::op_cols(st.in[1].v, b.ndim, trans_b);
  for (int d = 0; d < nb; ++d) size *= batched.v[d];
  if (device_num % size != 0) return fail(errc::op_device_num, -1, -1, size, device_num);
  const int axes = nb + 3 + (device_num / size > 1 ? 1 : 0);
  if (axes > max_mesh_ndim) return fail(errc::mesh_ndim, -1, -1, axes, max_mesh_ndim);
  if (status s = detail::check_divides(st.in[0], a); !s.ok()) return s;
  return detail::check_divides(st.in[1], b);
}

/// BatchMatMul's rule, as MindSpore's: the device matrix is (batch splits..., m, k, n),
/// preceded by a replica axis when it uses fewer devices than there are. A batched
/// input's batch dims are split by the batch axes; a shared (rank-2) input is
/// replicated over them. The matrix dims follow MatMul's rule: A (m, k), B (k, n)
/// (swapped for a transposed operand), C (batch..., m, n) partial over the k axis when
/// it is split. A shared input's gradient sums over the batch, so it is also partial
/// over the batch axes that split it.
/// Example: A (4, 8, 16), B (4, 16, 8) with ((2, 2, 2), (2, 2, 1)) on 8 devices ->
/// device matrix (2, 2, 2, 1); A split (0, 1, 2), B (0, 2, 3), C (0, 1, 3) partial
/// over axis 2.
/// @pre check_batch_matmul(st, device_num, a, b, trans_a, trans_b).ok()
constexpr batch_matmul_layouts batch_matmul_rule(const strategy& st, int device_num, const extents& a,
                                                 const extents& b, bool trans_a = false,
                                                 bool trans_b = false) {
  batch_matmul_layouts r;
  const int rank = a.ndim > b.ndim ? a.ndim : b.ndim;
  const int nb = rank - 2;
  r.batch = nb;
  const bool a_batched = a.ndim == rank, b_batched = b.ndim == rank;
  const split_tuple& batched = a_batched ? st.in[0] : st.in[1];
  const int m = detail::op_rows(st.in[0].v, a.ndim, trans_a);
  const int k = detail::op_cols(st.in[0].v, a.ndim, trans_a);
  const int n = detail::op_cols(st.in[1].v, b.ndim, trans_b);
  split_tuple dm;  // the device matrix without replicas
  dm.n = nb + 3;
  for (int d = 0; d < nb; ++d) dm.v[d] = batched.v[d];
  dm.v[nb] = m;
  dm.v[nb + 1] = k;
  dm.v[nb + 2] = n;
  const layout full = strategy_layout(dm, device_num);
  r.dev = full.dev;
  const int first = r.dev.ndim - dm.n;
  const int am = first + nb, ak = am + 1, an = am + 2;
  r.a = layout::replicated(r.dev, a.ndim);
  r.b = layout::replicated(r.dev, b.ndim);
  r.c = layout::replicated(r.dev, rank);
  for (int d = 0; d < nb; ++d) {
    if (a_batched) r.a.split[d] = axis_list{first + d};
    if (b_batched) r.b.split[d] = axis_list{first + d};
    r.c.split[d] = axis_list{first + d};
  }
  r.a.split[a.ndim - 2] = axis_list{trans_a ? ak : am};
  r.a.split[a.ndim - 1] = axis_list{trans_a ? am : ak};
  r.b.split[b.ndim - 2] = axis_list{trans_b ? an : ak};
  r.b.split[b.ndim - 1] = axis_list{trans_b ? ak : an};
  r.c.split[rank - 2] = axis_list{am};
  r.c.split[rank - 1] = axis_list{an};
  if (k > 1) r.c = r.c.with_partial(ak);
  axis_list batch_axes;  // the batch axes that split something
  for (int d = 0; d < nb; ++d)
    if (batched.v[d] > 1) batch_axes.push_back(first + d);
  r.grad_a = r.a;
  if (n > 1) r.grad_a = r.grad_a.with_partial(an);
  if (!a_batched && !batch_axes.empty()) r.grad_a = r.grad_a.with_partial(batch_axes);
  r.grad_b = r.b;
  if (m > 1) r.grad_b = r.grad_b.with_partial(am);
  if (!b_batched && !batch_axes.empty()) r.grad_b = r.grad_b.with_partial(batch_axes);
  r.shape.ndim = rank;
  const extents& bs = a_batched ? a : b;
  for (int d = 0; d < nb; ++d) r.shape.v[d] = bs.v[d];
  r.shape.v[rank - 2] = detail::op_rows(a.v, a.ndim, trans_a);
  r.shape.v[rank - 1] = detail::op_cols(b.v, b.ndim, trans_b);
  return r;
}

/// The rule for a static strategy and shapes; an invalid one fails to compile with the
/// rule it breaks as the message.
template <strategy St, int DeviceNum, extents A, extents B, bool TransA = false, bool TransB = false>
inline constexpr batch_matmul_layouts static_batch_matmul_rule = [] {
  constexpr status s = check_batch_matmul(St, DeviceNum, A, B, TransA, TransB);
  detail::static_require<s>();
  if constexpr (s.ok()) return batch_matmul_rule(St, DeviceNum, A, B, TransA, TransB);
  else return batch_matmul_layouts{};
}();

namespace ops {

/// BatchMatMul with a shard strategy, as `BatchMatMul(transpose_a, transpose_b).shard(st)`:
/// A (batch..., m, k) times B (batch..., k, n), either of them possibly a plain matrix
/// shared by every batch entry; the strategy splits every dim of each input; rule
/// batch_matmul_rule. Linear in either operand. Candidates: every split of the batch
/// dims, m, k and n whose device matrix divides the device count (the batched inputs'
/// batch dims split alike). Data parallel: batch dim 0 split over every device.
struct batch_matmul_op {
  strategy st;
  bool trans_a = false;
  bool trans_b = false;

  static constexpr std::string_view type() { return "BatchMatMul"; }
  static constexpr std::string_view name() { return "batch_matmul"; }
  static constexpr int arity = 2;
  /// The backward reads A and B, not C (ops/definition.hpp).
  static constexpr bool backward_reads_output() { return false; }

  std::string attributes() const {
    return "transpose_a: " + bool_text(trans_a) + ", transpose_b: " + bool_text(trans_b);
  }
  linearity linear() const { return linearity::each(2); }
  /// 2 (batch m n) k on each rank's shards.
  double forward_work(const op_layouts& l, const shape_list& in, const extents& out) const {
    const extents a = local_shape(l.in[0], in[0]);
    return 2.0 * double(local_shape(l.out, out).size()) * double(trans_a ? a[a.ndim - 2] : a[a.ndim - 1]);
  }
  extents output_shape(const shape_list& in) const {
    require_shapes(check_batch_matmul(all_ones(in), 1, in[0], in[1], trans_a, trans_b));
    return batch_matmul_rule(all_ones(in), 1, in[0], in[1], trans_a, trans_b).shape;
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_batch_matmul(s, device_num, in[0], in[1], trans_a, trans_b);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list& in) const {
    const batch_matmul_layouts r = batch_matmul_rule(s, device_num, in[0], in[1], trans_a, trans_b);
    return {r.dev, {r.a, r.b}, r.c, {r.grad_a, r.grad_b}, r.c.without_partial()};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    const extents out = output_shape(in);
    const int nb = out.ndim - 2;
    extents dims = out;  // (batch..., m, k, n)
    dims.ndim = nb + 3;
    dims.v[nb + 1] = trans_a ? in[0][in[0].ndim - 2] : in[0][in[0].ndim - 1];
    dims.v[nb + 2] = out[nb + 1];
    std::vector<strategy> c;
    for_each_split(dims, device_num, [&](const split_tuple& t) {
      const strategy s = make(t, in);
      if (check(s, device_num, in).ok()) c.push_back(s);
    });
    order_candidates(c, [&](const strategy& s) { return devices(s, in); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list& in) const {
    split_tuple t = ones(output_shape(in).ndim + 1);
    t.v[0] = device_num;
    return make(t, in);
  }

  /// The strategy of batch splits, then m, k and n: t = (b..., m, k, n).
  strategy make(const split_tuple& t, const shape_list& in) const {
    const int nb = t.n - 3;
    const int m = t[nb], k = t[nb + 1], n = t[nb + 2];
    strategy s{ones(in[0].ndim), ones(in[1].ndim)};
    for (int i = 0; i < 2; ++i)
      if (in[i].ndim == nb + 2)
        for (int d = 0; d < nb; ++d) s.in[i].v[d] = t[d];
    split_tuple& a = s.in[0];
    split_tuple& b = s.in[1];
    a.v[a.n - 2] = trans_a ? k : m;
    a.v[a.n - 1] = trans_a ? m : k;
    b.v[b.n - 2] = trans_b ? n : k;
    b.v[b.n - 1] = trans_b ? k : n;
    return s;
  }

  /// The rule on `device_num` devices for inputs of the given global shapes; throws
  /// tessera::error naming the rule broken, the numbers and the strategy:
  /// "batch_matmul: both inputs must split each batch dim alike: dim 0: input 1 splits
  /// it 1 ways, input 0 2 ways; shapes (4, 8, 16) and (4, 16, 8), strategy ((2, 2, 2),
  /// (1, 2, 1))".
  batch_matmul_layouts rule(int device_num, const extents& a, const extents& b) const {
    require_rule(check_batch_matmul(st, device_num, a, b, trans_a, trans_b), name(),
                 "shapes " + to_string(a) + " and " + to_string(b) + ", strategy " + to_string(st));
    return batch_matmul_rule(st, device_num, a, b, trans_a, trans_b);
  }

 private:
  int devices(const strategy& s, const shape_list& in) const {
    const split_tuple& batched = in[0].ndim >= in[1].ndim ? s.in[0] : s.in[1];
    const int nb = batched.n - 2;
    int p = 1;
    for (int d = 0; d < nb; ++d) p *= batched[d];
    const split_tuple& a = s.in[0];
    const split_tuple& b = s.in[1];
    return p * a[a.n - 2] * a[a.n - 1] * (trans_b ? b[b.n - 2] : b[b.n - 1]);
  }
};

}  // namespace ops

}  // namespace tessera
