// MatMul's definition: its sharding rule, from a shard strategy such as ((2, 4), (4, 1))
// to the operator's device matrix and the layouts of its inputs, output and gradients
// (constexpr, so a static strategy is checked and turned into layouts by the compiler),
// and the operator type ops::matmul_op built on it. Standard library only; the forward
// and backward are in ops/matmul.hpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>

namespace tessera {

/// The layouts of C = op(A) op(B), where op transposes when the flag is set.
struct matmul_layouts {
  mesh dev;       ///< the operator's device matrix
  layout a, b;    ///< the inputs as the local product needs them
  layout c;       ///< the output: partial sums over the contraction axis when it is split
  layout grad_a;  ///< dA = dC op(B)^T locally: A's layout, partial over the n axis
  layout grad_b;  ///< dB = op(A)^T dC locally: B's layout, partial over the m axis
  friend constexpr bool operator==(const matmul_layouts&, const matmul_layouts&) = default;
};

/// Checks a MatMul strategy on `device_num` devices: two inputs of rank 2, positive
/// splits, the contraction dim split alike in both ((2, 4), (4, 1) splits it 4 ways),
/// and a device matrix (m, k, n) whose size divides the device count.
constexpr status check_matmul(const strategy& st, int device_num, bool trans_a = false,
                              bool trans_b = false) {
  if (st.n != 2) return fail(errc::op_inputs, -1, -1, st.n, 2);
  for (int i = 0; i < 2; ++i)
    if (st.in[i].n != 2) return fail(errc::op_input_ndim, i, -1, st.in[i].n, 2);
  if (status s = check(st, device_num); !s.ok()) return s;
  const int ka = trans_a ? st.in[0].v[0] : st.in[0].v[1];
  const int kb = trans_b ? st.in[1].v[1] : st.in[1].v[0];
  if (ka != kb) return fail(errc::matmul_contraction, -1, -1, ka, kb);
  const int m = trans_a ? st.in[0].v[1] : st.in[0].v[0];
  const int n = trans_b ? st.in[1].v[0] : st.in[1].v[1];
  if (device_num % (m * ka * n) != 0) return fail(errc::op_device_num, -1, -1, m * ka * n, device_num);
  return {};
}

/// MatMul's rule, as MindSpore's: the device matrix is (m, k, n), the pieces of C's
/// rows, the contraction and C's columns, preceded by a replica axis when it uses
/// fewer devices than there are. A is split (m, k), B (k, n) (swapped for a transposed
/// operand), C (m, n) with partial sums over the k axis. Example: ((2, 4), (4, 1)) on
/// 8 devices -> device matrix (2, 4, 1); A (16, 32) has (8, 8) shards, B (32, 16) has
/// (8, 16) shards, C's (8, 16) shards are partial over the 4 ranks of each mesh row.
/// @pre check_matmul(st, device_num, trans_a, trans_b).ok()
constexpr matmul_layouts matmul_rule(const strategy& st, int device_num, bool trans_a = false,
                                     bool trans_b = false) {
  const int m = trans_a ? st.in[0].v[1] : st.in[0].v[0];
  const int k = trans_a ? st.in[0].v[0] : st.in[0].v[1];
  const int n = trans_b ? st.in[1].v[0] : st.in[1].v[1];
  const int replicas = device_num / (m * k * n);
  matmul_layouts r;
  const int first = replicas > 1 ? 1 : 0;
  r.dev = replicas > 1 ? mesh{replicas, m, k, n} : mesh{m, k, n};
  const int am = first, ak = first + 1, an = first + 2;
  r.a = trans_a ? layout(r.dev, {{ak}, {am}}) : layout(r.dev, {{am}, {ak}});
  r.b = trans_b ? layout(r.dev, {{an}, {ak}}) : layout(r.dev, {{ak}, {an}});
  r.c = layout(r.dev, {{am}, {an}});
  if (k > 1) r.c = r.c.with_partial(ak);
  r.grad_a = n > 1 ? r.a.with_partial(an) : r.a;
  r.grad_b = m > 1 ? r.b.with_partial(am) : r.b;
  return r;
}

/// The rule for a static strategy; an invalid one fails to compile with the rule it
/// breaks as the message.
template <strategy St, int DeviceNum, bool TransA = false, bool TransB = false>
inline constexpr matmul_layouts static_matmul_rule = [] {
  constexpr status s = check_matmul(St, DeviceNum, TransA, TransB);
  detail::static_require<s>();
  if constexpr (s.ok()) return matmul_rule(St, DeviceNum, TransA, TransB);
  else return matmul_layouts{};
}();

namespace ops {

/// MatMul with a shard strategy, as `MatMul(transpose_a, transpose_b).shard(st)`: C =
/// op(A) op(B) of two matrices, op transposing when its flag is set; rule matmul_rule.
/// Linear in either operand. Candidates: every ((m, k), (k, n)) (swapped for a
/// transposed operand) with m, k, n dividing C's rows, the contraction and C's columns
/// and m k n dividing the device count. Data parallel: m = device count.
struct matmul_op {
  strategy st;
  bool trans_a = false;
  bool trans_b = false;

  static constexpr std::string_view type() { return "MatMul"; }
  static constexpr std::string_view name() { return "matmul"; }
  static constexpr int arity = 2;
  /// The backward reads A and B, not C (ops/definition.hpp).
  static constexpr bool backward_reads_output() { return false; }

  std::string attributes() const {
    return "transpose_a: " + bool_text(trans_a) + ", transpose_b: " + bool_text(trans_b);
  }
  linearity linear() const { return linearity::each(2); }

  /// C's shape; throws "shapes (16, 32) and (16, 16) do not multiply (transpose_a
  /// false, transpose_b false)".
  extents output_shape(const shape_list& in) const {
    const extents& a = in[0];
    const extents& b = in[1];
    if (in.n != 2 || a.ndim != 2 || b.ndim != 2 || (trans_a ? a[0] : a[1]) != (trans_b ? b[1] : b[0]))
      throw error("shapes " + to_string(a) + " and " + to_string(b) + " do not multiply (transpose_a " +
                  bool_text(trans_a) + ", transpose_b " + bool_text(trans_b) + ")");
    return extents{trans_a ? a[1] : a[0], trans_b ? b[0] : b[1]};
  }
  status check(const strategy& s, int device_num, const shape_list&) const {
    return check_matmul(s, device_num, trans_a, trans_b);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list&) const {
    const matmul_layouts r = matmul_rule(s, device_num, trans_a, trans_b);
    return {r.dev, {r.a, r.b}, r.c, {r.grad_a, r.grad_b}, r.c.without_partial()};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    const extents c = output_shape(in);
    const index_t k = trans_a ? in[0][0] : in[0][1];
    std::vector<strategy> out;
    for_each_split(extents{c[0], k, c[1]}, device_num,
                   [&](const split_tuple& t) { out.push_back(make(t[0], t[1], t[2])); });
    order_candidates(out, [&](const strategy& s) { return s.in[0].product() * (trans_b ? s.in[1].v[0] : s.in[1].v[1]); });
    return out;
  }
  strategy data_parallel(int device_num, const shape_list&) const { return make(device_num, 1, 1); }
  /// 2 m k n / (the devices that split them): each rank's product of its shards.
  double forward_work(const op_layouts& l, const shape_list& in, const extents& out) const {
    const extents a = local_shape(l.in[0], in[0]);
    return 2.0 * double(local_shape(l.out, out).size()) * double(trans_a ? a[0] : a[1]);
  }

  /// The strategy of row, contraction and column splits (m, k, n).
  strategy make(int m, int k, int n) const {
    return strategy{trans_a ? split_tuple{k, m} : split_tuple{m, k}, trans_b ? split_tuple{n, k} : split_tuple{k, n}};
  }
  /// The rule on `device_num` devices; throws tessera::error naming the rule broken,
  /// the numbers and the strategy.
  matmul_layouts rule(int device_num) const {
    const status s = check_matmul(st, device_num, trans_a, trans_b);
    if (!s.ok()) throw error(s, "", "strategy " + to_string(st));
    return matmul_rule(st, device_num, trans_a, trans_b);
  }
};

}  // namespace ops

}  // namespace tessera
