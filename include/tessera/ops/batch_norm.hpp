// BatchNorm's forward and backward (ops/batch_norm_rule.hpp) in the split form of the
// batch-norm kernels, whose per-channel sums add up across the ranks of a batch group:
//
//   training forward:  s = batch_norm_sums(x); all-reduce s (sync, n > 1);
//                      m = batch_norm_moments(s, count of the batch group);
//                      y = batch_norm_forward_inference(x, gamma, beta, m.mean, m.variance, eps);
//                      running statistics updated (batch_norm_update_running)
//   inference forward: y = batch_norm_forward_inference(...) with the running statistics
//   backward:          m, the forward's (kept on the operator's state by the address
//                      of x's shard; computed again as above where the backward is given
//                      another x); r = batch_norm_backward_sums(dy, x, m) (sum dy, sum dy * x_hat);
//                      all-reduce r; dx = batch_norm_backward_data(dy, x, gamma, m, r, count);
//                      dgamma = sum dy * x_hat and dbeta = sum dy of this rank's batch shard
//                      (partial sums over the batch axis, as the rule says)
//   with op.relu:      y = max(batch norm, 0) in the forward's pass, and the backward's
//                      sums and dx take dy where y > 0 (the kernels' relu_y), y being the
//                      operator's output
//
// Everything runs through kernels::backend<D>. The running statistics are two tensors of
// device D (batch_norm_statistics: a module's parameters moving_mean and moving_variance,
// or the operator's own), laid out as gamma and updated in place. For another element
// type than float, or a device without batch-norm kernels, the operator compiles and
// throws tessera::error when run ("batch_norm: ..."); on the host of a program that does
// not link tessera::dnnl the kernels throw (kernels/cpu/cnn_table.hpp).
#pragma once

#include <any>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/geometry.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/kernels/backend.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/kernels/cpu/backend.hpp>
#include <tessera/ops/batch_norm_rule.hpp>
#include <tessera/ops/run.hpp>
#include <tessera/tensor/dist_tensor.hpp>
#include <tessera/tensor/host_storage.hpp>

namespace tessera::ops {

/// Whether batch_norm runs for elements T on device D: T is float and the device's
/// backend has the batch-norm kernels (batch_norm_sums, batch_norm_moments,
/// batch_norm_forward_inference, batch_norm_backward_sums, batch_norm_backward_data,
/// batch_norm_update_running).
template <class T, class D>
inline constexpr bool batch_norm_supported =
    std::is_same_v<T, float> &&
    requires(typename storage<T, D>::array& a, const kernels::channel_sums<typename storage<T, D>::array>& s,
             std::size_t n, T e) {
      kernels::backend<D>::template batch_norm_sums<T>(a);
      kernels::backend<D>::template batch_norm_forward_inference<T>(a, a, a, a, a, e);
      kernels::backend<D>::template batch_norm_moments<T>(s, n);
      kernels::backend<D>::template batch_norm_backward_sums<T>(a, a, a, a, e);
      kernels::backend<D>::template batch_norm_backward_data<T>(a, a, a, a, a, s, n, e);
      kernels::backend<D>::template batch_norm_update_running<T>(a, a, a, a, n, e, true);
    };

/// Where a batch-norm layer's running statistics live on device D (ops::batch_norm_state
/// holds one): accessors of the running mean and variance, tensors of shape (C,).
template <class T, class D>
struct batch_norm_statistics {
  std::function<tensor_on<T, D>&()> mean;
  std::function<tensor_on<T, D>&()> variance;
};

namespace detail {

// The shapes of the three inputs.
template <class T, class D>
shape_list batch_norm_shapes(op_inputs<T, D> x) {
  if (x.size() != 3)
    throw error("batch_norm: takes 3 inputs (x, gamma, beta), got " + std::to_string(x.size()));
  return shape_list{x[0]->global_shape(), x[1]->global_shape(), x[2]->global_shape()};
}

[[noreturn]] inline void batch_norm_unsupported() {
  throw error(
      "batch_norm: no batch-norm kernels for this element type on this device (float only: on the host of a "
      "program that links tessera::dnnl, on the GPU with cuDNN)");
}

// The number of elements per channel in this rank's shard of x: N_local * H * W.
inline std::size_t batch_norm_count(const extents& local_x) {
  return std::size_t(local_x[0] * local_x[2] * local_x[3]);
}

// The batch statistics of a training pass: this rank's per-channel sums, added up over
// the batch group by `c` (the definition's collective) when given; `count` is set to the
// number of elements per channel they cover.
template <class T, class D, class C>
kernels::batch_norm_stats<typename storage<T, D>::array> batch_norm_batch_stats(
    const typename storage<T, D>::array& x, const internal_collective* c, int batch_split, std::size_t& count,
    device_context<C>& ctx) {
  using K = kernels::backend<D>;
  using A = typename storage<T, D>::array;
  kernels::channel_sums<A> s = K::template batch_norm_sums<T>(x);
  if (c) {
    // One buffer of 2 * C_local: the sums, then the sums of squares.
    A both = K::template concat<T>(std::vector<const A*>{&s.sum, &s.sum_sq}, 0);
    run_internal(*c, std::span<T>(both.data(), both.size()), ctx, batch_norm_op::name());
    std::vector<A> parts = K::template split<T>(both, {s.sum.size(), s.sum.size()}, 0);
    s.sum = std::move(parts[0]);
    s.sum_sq = std::move(parts[1]);
    count *= std::size_t(batch_split);
  }
  return K::template batch_norm_moments<T>(s, count);
}

// The running statistics of `op` laid out as the rule's `param` (redistributed there,
// and kept so, when they come in another layout): made at the first use of an operator
// no module bound (0 and 1), checked against x's channels.
template <class T, class D, class C>
std::pair<tensor_on<T, D>*, tensor_on<T, D>*> batch_norm_running(const batch_norm_op& op,
                                                                 const batch_norm_layouts& r, index_t channels,
                                                                 device_context<C>& ctx) {
  batch_norm_state& s = *op.state;
  if (!s.statistics.has_value()) {
    const extents shape{channels};
    auto own = std::make_shared<std::pair<tensor_on<T, D>, tensor_on<T, D>>>(
        tensor_on<T, D>(r.param, shape, ctx.rank()), tensor_on<T, D>(r.param, shape, ctx.rank()));
    storage<T, D>::fill(own->second.local(), T(1));
    s.statistics = batch_norm_statistics<T, D>{[own]() -> tensor_on<T, D>& { return own->first; },
                                               [own]() -> tensor_on<T, D>& { return own->second; }};
  }
  auto* b = std::any_cast<batch_norm_statistics<T, D>>(&s.statistics);
  if (!b)
    throw error("batch_norm: the running statistics are bound for another element type or device than the "
                "forward's");
  tensor_on<T, D>* out[2] = {&b->mean(), &b->variance()};
  for (int i = 0; i < 2; ++i) {
    tensor_on<T, D>& t = *out[i];
    if (!(t.global_shape() == extents{channels}))
      throw error(std::string("batch_norm: the running ") + (i == 0 ? "mean" : "variance") + " is " +
                  to_string(t.global_shape()) + ", x has " + std::to_string(channels) + " channels");
    if (!same_placement(t.layout(), r.param)) t = redistribute(t, r.param, ctx);
  }
  return {out[0], out[1]};
}

// The batch statistics a training forward computed from an x shard, kept on the
// operator's state (batch_norm_state::saved) until the backward of that shard. At most
// max_saved_statistics per operator (pipeline stages keep one per micro-batch in
// flight); the oldest goes first, its backward then computing them again.
template <class T, class D>
struct saved_statistics {
  extents shape;  // the shard's
  kernels::batch_norm_stats<typename storage<T, D>::array> m;
  std::size_t count = 0;
};
inline constexpr std::size_t max_saved_statistics = 64;

// Keeps `v` for the shard at `key`, or (no v) forgets what a forward kept there: every
// forward does one or the other, so what a backward finds is its own forward's.
template <class T, class D>
void save_statistics(batch_norm_state& s, const void* key, std::optional<saved_statistics<T, D>> v) {
  const std::lock_guard lock(s.saved_mutex);
  std::erase_if(s.saved, [&](const auto& e) { return e.first == key; });
  if (!v) return;
  if (s.saved.size() >= max_saved_statistics) s.saved.erase(s.saved.begin());
  s.saved.emplace_back(key, std::move(*v));
}

// What the forward kept for the shard at `key` of shape `shape`, taken off the state.
template <class T, class D>
std::optional<saved_statistics<T, D>> take_statistics(batch_norm_state& s, const void* key, const extents& shape) {
  const std::lock_guard lock(s.saved_mutex);
  for (auto it = s.saved.begin(); it != s.saved.end(); ++it) {
    if (it->first != key) continue;
    std::optional<saved_statistics<T, D>> out;
    if (auto* v = std::any_cast<saved_statistics<T, D>>(&it->second); v && v->shape == shape) out = std::move(*v);
    s.saved.erase(it);
    return out;
  }
  return std::nullopt;
}

// running = momentum * running + (1 - momentum) * batch (MindSpore's momentum), the
// batch variance unbiased over `count` elements per channel, in place.
template <class T, class D, class C>
void batch_norm_update(const batch_norm_op& op, const batch_norm_layouts& r, index_t channels,
                       const kernels::batch_norm_stats<typename storage<T, D>::array>& batch, std::size_t count,
                       device_context<C>& ctx) {
  const auto [mean, variance] = batch_norm_running<T, D>(op, r, channels, ctx);
  kernels::backend<D>::template batch_norm_update_running<T>(mean->local(), variance->local(), batch.mean,
                                                             batch.variance, count, T(1.0 - op.momentum), true);
  op.state->updates.fetch_add(1);
}

}  // namespace detail

/// Binds the running statistics of `op` (and of its copies, which share its state) to
/// two tensors of shape (C,) on device D, given by accessors called at each forward:
/// nn::batch_norm2d binds its parameters moving_mean and moving_variance, whose storage
/// may be laid out anew (a model's plan, a checkpoint loaded). The forward lays them out
/// as gamma when they are not, and updates them in place in training.
template <class T, class D>
void bind_running_statistics(const batch_norm_op& op, std::function<tensor_on<T, D>&()> mean,
                             std::function<tensor_on<T, D>&()> variance) {
  op.state->statistics = batch_norm_statistics<T, D>{std::move(mean), std::move(variance)};
}

/// This rank's shard of the running mean (variance) of `op` as floats on the host, one
/// per channel of the shard; empty before an unbound operator's first forward.
template <class T = float, class D = cpu_device>
std::vector<float> running_mean(const batch_norm_op& op, bool variance = false) {
  auto* b = std::any_cast<batch_norm_statistics<T, D>>(&op.state->statistics);
  if (!b) return {};
  const xt::xarray<T> h = storage<T, D>::to_host((variance ? b->variance() : b->mean()).local());
  return std::vector<float>(h.begin(), h.end());
}
template <class T = float, class D = cpu_device>
std::vector<float> running_variance(const batch_norm_op& op) {
  return running_mean<T, D>(op, true);
}

/// y = gamma * (x - mean) / sqrt(variance + eps) + beta per channel, x (N, C, H, W) and
/// gamma, beta (C,) in any layouts (brought to the rule's); y in the rule's layout of x.
/// Training (op.training()): the batch's statistics, over the batch group with sync
/// (one AllReduce of 2 * C_local), and the running statistics updated; evaluation: the
/// running statistics, no communication.
template <class T, class D, class C>
tensor_on<T, D> forward(const batch_norm_op& op, op_inputs<T, D> x, device_context<C>& ctx) {
  const shape_list shapes = detail::batch_norm_shapes(x);
  const batch_norm_layouts r = op.rule(ctx.size(), shapes);
  if constexpr (!batch_norm_supported<T, D>) {
    detail::batch_norm_unsupported();
  } else {
    const auto lx = in_layout(*x[0], r.x, ctx);
    const auto lg = in_layout(*x[1], r.param, ctx);
    const auto lb = in_layout(*x[2], r.param, ctx);
    using K = kernels::backend<D>;
    typename storage<T, D>::array y;
    // The statistics are kept for the backward by the address of x's own shard (not of a
    // redistributed copy, which is gone by then).
    const void* key = x[0]->local().data();
    const bool own = &*lx == &*x[0];
    std::optional<detail::saved_statistics<T, D>> kept;
    if (op.training()) {
      const std::vector<internal_collective> cs = op.statistics_collectives(r, shapes[0], false);
      std::size_t count = detail::batch_norm_count(lx->local_shape());
      auto m = detail::batch_norm_batch_stats<T, D>(lx->local(), cs.empty() ? nullptr : &cs[0], r.batch_split, count,
                                                    ctx);
      y = K::template batch_norm_forward_inference<T>(lx->local(), lg->local(), lb->local(), m.mean, m.variance,
                                                      T(op.eps), op.relu);
      detail::batch_norm_update<T, D>(op, r, shapes[0][1], m, count, ctx);
      if (own) kept = detail::saved_statistics<T, D>{lx->local_shape(), std::move(m), count};
      detail::save_statistics<T, D>(*op.state, key, std::move(kept));
    } else {
      detail::save_statistics<T, D>(*op.state, key, std::nullopt);
      const auto [mean, variance] = detail::batch_norm_running<T, D>(op, r, shapes[0][1], ctx);
      y = K::template batch_norm_forward_inference<T>(lx->local(), lg->local(), lb->local(), mean->local(),
                                                      variance->local(), T(op.eps), op.relu);
    }
    return tensor_on<T, D>(r.x, shapes[0], ctx.rank(), std::move(y));
  }
}

/// dx, dgamma, dbeta given dy (in any layout; partial sums resolved first). Training:
/// the batch statistics the forward computed from this x (or computed again, with their
/// AllReduce under sync, for another x), the sums of dy and dy * x_hat added up over the
/// batch group (one AllReduce with sync), dx in x's rule layout. Evaluation
/// (the running statistics are constants): dx = dy * gamma / sqrt(running_var + eps).
/// dgamma = sum dy * x_hat and dbeta = sum dy over this rank's batch shard, partial sums
/// over the batch axis when the batch is split.
template <class T, class D, class C>
op_grads<T, D> backward(const batch_norm_op& op, const tensor_on<T, D>& dy, op_inputs<T, D> x,
                        const tensor_on<T, D>& out, device_context<C>& ctx) {
  const shape_list shapes = detail::batch_norm_shapes(x);
  const batch_norm_layouts r = op.rule(ctx.size(), shapes);
  if (!(dy.global_shape() == shapes[0]))
    throw error("batch_norm: backward: dy is " + to_string(dy.global_shape()) + ", x " + to_string(shapes[0]));
  if constexpr (!batch_norm_supported<T, D>) {
    detail::batch_norm_unsupported();
  } else {
    using K = kernels::backend<D>;
    using A = typename storage<T, D>::array;
    const auto lx = in_layout(*x[0], r.x, ctx);
    const auto lg = in_layout(*x[1], r.param, ctx);
    const auto ldy = in_layout(dy, r.x, ctx);
    const T eps = T(op.eps);
    // The fused ReLU's mask: the output, where it is positive.
    std::optional<laid_out<T, D>> ly;
    if (op.relu) ly.emplace(in_layout(out, r.x, ctx));
    const A* relu_y = ly ? &(*ly)->local() : nullptr;
    A dx;
    kernels::channel_sums<A> local;
    if (op.training()) {
      const std::vector<internal_collective> cs = op.statistics_collectives(r, shapes[0], true);
      std::size_t count = detail::batch_norm_count(lx->local_shape());
      std::optional<detail::saved_statistics<T, D>> kept;
      if (&*lx == &*x[0]) kept = detail::take_statistics<T, D>(*op.state, lx->local().data(), lx->local_shape());
      kernels::batch_norm_stats<A> m;
      if (kept) {
        m = std::move(kept->m);
        count = kept->count;
      } else {
        const std::vector<internal_collective> fs = op.statistics_collectives(r, shapes[0], false);
        m = detail::batch_norm_batch_stats<T, D>(lx->local(), fs.empty() ? nullptr : &fs[0], r.batch_split, count,
                                                 ctx);
      }
      local = K::template batch_norm_backward_sums<T>(ldy->local(), lx->local(), m.mean, m.variance, eps, relu_y);
      if (cs.empty()) {
        dx = K::template batch_norm_backward_data<T>(ldy->local(), lx->local(), lg->local(), m.mean, m.variance,
                                                     local, count, eps, relu_y);
      } else {
        // The group's sums, in a buffer of their own: `local` stays this rank's.
        A both = K::template concat<T>(std::vector<const A*>{&local.sum, &local.sum_sq}, 0);
        run_internal(cs[0], std::span<T>(both.data(), both.size()), ctx, op.name());
        std::vector<A> parts = K::template split<T>(both, {local.sum.size(), local.sum.size()}, 0);
        const kernels::channel_sums<A> group{std::move(parts[0]), std::move(parts[1])};
        dx = K::template batch_norm_backward_data<T>(ldy->local(), lx->local(), lg->local(), m.mean, m.variance,
                                                     group, count, eps, relu_y);
      }
    } else {
      // The statistics are constants: dx = gamma / sqrt(variance + eps) * dy, the data
      // backward with zero sums.
      const std::size_t channels = std::size_t(lg->local().size());
      const auto [mean, variance] = detail::batch_norm_running<T, D>(op, r, shapes[0][1], ctx);
      local = K::template batch_norm_backward_sums<T>(ldy->local(), lx->local(), mean->local(), variance->local(),
                                                      eps, relu_y);
      const xt::xarray<T> zeros = xt::zeros<T>({channels});
      const kernels::channel_sums<A> none{storage<T, D>::from_host(zeros), storage<T, D>::from_host(zeros)};
      dx = K::template batch_norm_backward_data<T>(ldy->local(), lx->local(), lg->local(), mean->local(),
                                                   variance->local(), none,
                                                   detail::batch_norm_count(lx->local_shape()), eps, relu_y);
    }
    return grads_of(tensor_on<T, D>(r.x, shapes[0], ctx.rank(), std::move(dx)),
                    tensor_on<T, D>(r.param_grad, shapes[1], ctx.rank(), std::move(local.sum_sq)),
                    tensor_on<T, D>(r.param_grad, shapes[2], ctx.rank(), std::move(local.sum)));
  }
}

}  // namespace tessera::ops
