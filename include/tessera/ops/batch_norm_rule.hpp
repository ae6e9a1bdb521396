// BatchNorm's definition (MindSpore's BatchNorm2d): per channel of x (N, C, H, W),
// y = gamma * (x - mean) / sqrt(variance + eps) + beta, with the batch's statistics over
// (N, H, W) in training and the running ones in evaluation. The sharding rule
// (MindSpore's strategy ((n, c, 1, 1), (c,), (c,)): the batch and the channels split,
// height and width whole, gamma and beta split as x's channels), constexpr; the
// operator type ops::batch_norm_op with the state its copies share (the mode and where
// the running statistics live). Standard library only; the forward and backward are in
// ops/batch_norm.hpp.
//
// Batch statistics over a split batch. With `sync` (the default) the n ranks of a batch
// group add up their per-channel sums (one AllReduce of 2 * C_local elements: the sums
// and the sums of squares), so every rank normalises with the statistics of the whole
// batch and N ranks compute what one rank computes (MindSpore's SyncBatchNorm, PyTorch's
// SyncBatchNorm). Without it each rank normalises its own batch shard with that shard's
// statistics and keeps its own running statistics (MindSpore's BatchNorm2d and PyTorch
// DDP's default): cheaper, and equal to the one-rank result only when n = 1.
#pragma once

#include <any>
#include <atomic>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/extents.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/split_check.hpp>

namespace tessera {

/// The layouts of y = batch_norm(x, gamma, beta).
struct batch_norm_layouts {
  mesh dev;           ///< the device matrix: (n, c), or (replicas, n, c)
  layout x;           ///< x, y, dx and dy: N split by batch_axis, C by channel_axis, H and W whole
  layout param;       ///< gamma and beta: C split by channel_axis, replicated elsewhere
  layout param_grad;  ///< dgamma and dbeta: as param, partial sums over batch_axis when n > 1
  int batch_axis = 0;     ///< the device-matrix axis that splits the batch (N)
  int channel_axis = 1;   ///< the device-matrix axis that splits the channels (C)
  int batch_split = 1;    ///< n
  int channel_split = 1;  ///< c
  friend constexpr bool operator==(const batch_norm_layouts&, const batch_norm_layouts&) = default;
};

/// Checks a BatchNorm strategy on `device_num` devices for x, gamma and beta of the given
/// shapes: three split tuples of 4, 1 and 1 entries, x of rank 4 and gamma, beta of rank
/// 1 with one entry per channel, positive splits whose product divides the device count,
/// height and width not split, gamma and beta split as x's channels, and every known
/// extent divisible by its split (dynamic extents are checked once known). Example on 8
/// devices with x (16, 8, 4, 4): ((2, 4, 1, 1), (4,), (4,)) is valid; ((2, 2, 2, 1),
/// (2,), (2,)) splits the height; ((2, 4, 1, 1), (2,), (2,)) splits gamma unlike x's
/// channels.
constexpr status check_batch_norm(const strategy& st, int device_num, const extents& x, const extents& gamma,
                                  const extents& beta) {
  if (st.n != 3) return fail(errc::op_inputs, -1, -1, st.n, 3);
  if (x.ndim != 4) return fail(errc::batch_norm_rank, 0, -1, x.ndim, 4);
  if (gamma.ndim != 1) return fail(errc::batch_norm_rank, 1, -1, gamma.ndim, 1);
  if (beta.ndim != 1) return fail(errc::batch_norm_rank, 2, -1, beta.ndim, 1);
  const extents* in[3] = {&x, &gamma, &beta};
  for (int i = 0; i < 3; ++i)
    if (st.in[i].n != in[i]->ndim) return fail(errc::op_input_ndim, i, -1, st.in[i].n, in[i]->ndim);
  for (int i = 1; i < 3; ++i)
    if (in[i]->v[0] != x.v[1] && in[i]->v[0] != dynamic_extent && x.v[1] != dynamic_extent)
      return fail(errc::batch_norm_shapes, i, -1, in[i]->v[0], x.v[1]);
  if (status s = check(st, device_num); !s.ok()) return s;
  for (int d = 2; d < 4; ++d)
    if (st.in[0].v[d] != 1) return fail(errc::batch_norm_split, 0, d, st.in[0].v[d], 1);
  for (int i = 1; i < 3; ++i)
    if (st.in[i].v[0] != st.in[0].v[1]) return fail(errc::batch_norm_split, i, 0, st.in[i].v[0], st.in[0].v[1]);
  return detail::check_divides(st.in[0], x);
}

/// The rule: the device matrix is (n, c), preceded by a replica axis when n * c uses
/// fewer devices; x (and y) split N by the batch axis and C by the channel axis; gamma
/// and beta split by the channel axis and replicated over the batch axis; the gradients
/// of gamma and beta (sums over the batch) are partial sums over the batch axis when
/// n > 1, each rank holding its own shard's.
/// Example: ((2, 2, 1, 1), (2,), (2,)) on 8 devices -> device matrix (2, 2, 2); x split
/// [{1}, {2}, {}, {}], gamma [{2}], dgamma [{2}] partial sum {1}.
/// @pre check_batch_norm(st, device_num, ...).ok()
constexpr batch_norm_layouts batch_norm_rule(const strategy& st, int device_num) {
  batch_norm_layouts r;
  r.batch_split = st.in[0].v[0];
  r.channel_split = st.in[0].v[1];
  const int replicas = device_num / (r.batch_split * r.channel_split);
  r.dev = replicas > 1 ? mesh{replicas, r.batch_split, r.channel_split} : mesh{r.batch_split, r.channel_split};
  r.batch_axis = replicas > 1 ? 1 : 0;
  r.channel_axis = r.batch_axis + 1;
  r.x = layout(r.dev, {axis_list{r.batch_axis}, axis_list{r.channel_axis}, axis_list{}, axis_list{}});
  r.param = layout(r.dev, {axis_list{r.channel_axis}});
  r.param_grad = r.batch_split > 1 ? r.param.with_partial(r.batch_axis) : r.param;
  return r;
}

/// The rule for a static strategy and shapes; an invalid one fails to compile with the
/// rule it breaks as the message.
template <strategy St, int DeviceNum, extents X, extents Gamma = extents{X.v[1]}, extents Beta = Gamma>
inline constexpr batch_norm_layouts static_batch_norm_rule = [] {
  constexpr status s = check_batch_norm(St, DeviceNum, X, Gamma, Beta);
  detail::static_require<s>();
  if constexpr (s.ok()) return batch_norm_rule(St, DeviceNum);
  else return batch_norm_layouts{};
}();

namespace ops {

/// What the copies of one batch-norm layer's definition share (the module's, the
/// graph's, the tape's): whether it trains, and where its running statistics live.
///
/// `statistics` holds an ops::batch_norm_statistics<T, D> (ops/batch_norm.hpp): the
/// accessors of two tensors of shape (C,), the running mean and variance, in any layout
/// (each forward lays them out as the rule's `param`, as gamma, and keeps them so).
/// nn::batch_norm2d binds it to its parameters moving_mean and moving_variance when it
/// is built, so that they are the one copy of the statistics (saved in checkpoints,
/// loaded from them); an operator used alone makes its own at its first forward, 0 and 1.
/// Each training forward updates them with the batch's mean and unbiased variance (see
/// batch_norm_op::momentum). With `sync` every rank of a batch group holds the same
/// values; without it each rank its own shard's (the replicas of a checkpoint's one
/// copy then differ, as MindSpore's BatchNorm2d's do).
struct batch_norm_state {
  std::atomic<bool> training{true};
  std::any statistics;           ///< an ops::batch_norm_statistics<T, D>, or empty until bound or first run
  std::atomic<long> updates{0};  ///< training forwards so far (running statistics updates)
  /// The batch statistics of training forwards whose backward has not run yet, each by
  /// the address of the x shard they came from (ops/batch_norm.hpp: the backward of that
  /// shard reads them instead of computing them again).
  std::mutex saved_mutex;
  std::vector<std::pair<const void*, std::any>> saved;
};

/// BatchNorm with a shard strategy, as `BatchNorm().shard(((2, 4, 1, 1), (4,), (4,)))`:
/// inputs x (N, C, H, W), gamma (C,), beta (C,); the output as x. Rule
/// batch_norm_rule. Candidates: every ((n, c, 1, 1), (c,), (c,)) with n | N, c | C and
/// n c dividing the device count. Data parallel: n = device count. Linear in none.
///
/// Attributes: `eps` (added to the variance), `momentum` in MindSpore's convention:
/// running = momentum * running + (1 - momentum) * batch (PyTorch's momentum is 1 - this
/// one), the batch variance made unbiased (times count / (count - 1)) as both keep it;
/// `sync`: the batch statistics of the whole batch (see the top of this file); `relu`:
/// ReLU applied to the output in the same pass (oneDNN's and cuDNN's fused batch norm +
/// ReLU: one tensor kept for the backward where the two operators keep two); `state`,
/// shared by the definition's copies: training or evaluation (running statistics, no
/// communication) and where the running statistics live.
///
/// Internal collectives, with sync and n > 1 in training: forward one AllReduce (sum) of
/// 2 * C_local over the batch axis (the per-channel sums and sums of squares); backward
/// one of 2 * C_local for the sums of dy and dy * x_hat. The backward reads the batch
/// statistics its forward computed from the same x shard (kept on the state); given
/// another x (a copy, or a forward that ran again since) it computes them again, with the
/// forward's AllReduce, which the price does not count.
/// The price (collectives()) cannot read the state: it assumes training mode, where the
/// graph's training step runs the operator; an evaluation pass moves none of these.
/// Nor does it price laying the running statistics out as the rule's `param` when they
/// come in another layout (a module placed them for another strategy than the graph's): the first
/// forward after that redistributes them once and keeps them so.
struct batch_norm_op {
  strategy st;
  double eps = 1e-5;
  double momentum = 0.9;
  bool sync = true;
  bool relu = false;
  std::shared_ptr<batch_norm_state> state = std::make_shared<batch_norm_state>();

  static constexpr std::string_view type() { return "BatchNorm"; }
  static constexpr std::string_view name() { return "batch_norm"; }
  static constexpr int arity = 3;

  /// The backward reads x and gamma, and y only for the fused ReLU's mask
  /// (ops/definition.hpp).
  bool backward_reads(int i) const { return i != 2; }
  bool backward_reads_output() const { return relu; }

  std::string attributes() const {
    std::ostringstream s;
    s << "eps: " << eps << ", momentum: " << momentum << ", sync: " << bool_text(sync);
    if (relu) s << ", relu: true";
    return s.str();
  }
  extents output_shape(const shape_list& in) const {
    require_shapes(check_batch_norm(all_ones(in), 1, in[0], in[1], in[2]));
    return in[0];
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_batch_norm(s, device_num, in[0], in[1], in[2]);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list&) const {
    const batch_norm_layouts r = batch_norm_rule(s, device_num);
    return {r.dev, {r.x, r.param, r.param}, r.x, {r.x, r.param_grad, r.param_grad}, r.x};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    std::vector<strategy> c;
    for_each_split(extents{in[0][0], in[0][1]}, device_num, [&](const split_tuple& t) {
      c.push_back(strategy{{t.v[0], t.v[1], 1, 1}, {t.v[1]}, {t.v[1]}});
    });
    order_candidates(c, [](const strategy& s) { return s.in[0].product(); });
    return c;
  }
  strategy data_parallel(int device_num, const shape_list&) const {
    return strategy{{device_num, 1, 1, 1}, {1}, {1}};
  }
  std::vector<internal_collective> collectives(const strategy& s, int device_num, const shape_list& in) const {
    const batch_norm_layouts r = batch_norm_rule(s, device_num);
    std::vector<internal_collective> c = statistics_collectives(r, in[0], false);
    for (const internal_collective& b : statistics_collectives(r, in[0], true)) c.push_back(b);
    return c;
  }

  /// The AllReduce over the batch axis of a training pass with sync and n > 1 (none
  /// otherwise), of 2 * C_local elements: forward the batch statistics' sums, backward the
  /// sums of dy and dy * x_hat.
  std::vector<internal_collective> statistics_collectives(const batch_norm_layouts& r, const extents& x,
                                                          bool backward) const {
    if (!sync || r.batch_split <= 1) return {};
    const index_t elements = 2 * (x[1] / r.channel_split);
    return {all_reduce_of(reduce_op::sum, r.dev, axis_list{r.batch_axis}, elements,
                          backward ? "gradient sums" : "batch statistics", backward)};
  }

  /// Whether the layer normalises with the batch's statistics (training) rather than
  /// the running ones.
  bool training() const { return state->training.load(); }

  /// The rule on `device_num` devices for inputs of the given global shapes; throws
  /// tessera::error naming the operator, the rule broken, the numbers and the strategy:
  /// "batch_norm: a strategy is ((n, c, 1, 1), (c,), (c,)): height and width whole, gamma
  /// and beta split as x's channels: input 0, dim 2: split 2, expected 1; strategy ((1,
  /// 1, 2, 1), (1,), (1,))".
  batch_norm_layouts rule(int device_num, const shape_list& in) const {
    require_rule(check(st, device_num, in), name(), st);
    return batch_norm_rule(st, device_num);
  }
};

}  // namespace ops

}  // namespace tessera
