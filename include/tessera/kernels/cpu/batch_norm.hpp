// Batch normalisation over (N, H, W) per channel of NCHW tensors: training forward
// (batch statistics) and backward through oneDNN, with ReLU fused where asked;
// normalising with statistics given from outside (inference, and the second half of a
// batch norm over several ranks), in one pass on plain arrays and through oneDNN on
// blocked ones; and the split form, whose per-channel sums a sharded operator adds up
// across ranks between two kernel calls:
//
//   forward:   s = batch_norm_sums(x)                 per channel sum x, sum x^2 (local)
//              all-reduce s; m = batch_norm_moments(s, count)        (global count)
//              y = batch_norm_forward_inference(x, gamma, beta, m.mean, m.variance, eps, relu)
//   backward:  r = batch_norm_backward_sums(dy, x, m.mean, m.variance, eps, relu ? &y : null)
//              all-reduce r (sum dy = dbeta, sum dy * x_hat = dgamma)
//              dx = batch_norm_backward_data(dy, x, gamma, m.mean, m.variance, r, count, eps, ...)
//
// On one rank the split form equals the whole-batch kernels to float rounding (tests
// check it with the batch split in halves). The split form's sums and backward also take
// dnnl_tensors in oneDNN's channel-blocked layouts (nChw16c, nChw8c), a vector of
// channels at a time. Running statistics: batch_norm_update_running.
// Link tessera::dnnl.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <tessera/core/error.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/kernels/cpu/common.hpp>
#include <tessera/kernels/cpu/dnnl.hpp>
#include <tessera/kernels/cpu/isa.hpp>
#include <tessera/kernels/cpu/parallel.hpp>

namespace tessera::kernels::cpu {

namespace detail {

struct bn_forward_entry {
  dnnl::batch_normalization_forward::primitive_desc pd;
  dnnl::batch_normalization_forward prim;
};
struct bn_backward_entry {
  dnnl::batch_normalization_backward::primitive_desc pd;
  dnnl::batch_normalization_backward prim;
};

inline dnnl::normalization_flags bn_flags(bool global_stats, bool relu) {
  auto f = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  if (global_stats) f = f | dnnl::normalization_flags::use_global_stats;
  if (relu) f = f | dnnl::normalization_flags::fuse_norm_relu;
  return f;
}

inline dnnl::batch_normalization_forward::primitive_desc bn_forward_pd(const dnnl_md& data, float eps,
                                                                       bool training, bool global_stats, bool relu) {
  return dnnl::batch_normalization_forward::primitive_desc(
      dnnl::batch_normalization_forward::desc(
          training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference, data, eps,
          bn_flags(global_stats, relu)),
      dnnl_engine());
}

inline primitive_key bn_key(std::int64_t kind, const dnnl_md& data, float eps, bool relu) {
  primitive_key k;
  k.add(kind).add(data).add(eps).add(relu);
  return k;
}

/// The layout oneDNN's batch norm of plain NCHW arrays computes in: its channel-blocked
/// one for this CPU (channel_blocked_tag). Its blocked kernels are several times faster
/// than its plain-NCHW one (at batch 32, 64 x 32 x 32: 1.7 ms against 12.8 ms for forward
/// and backward), more than the reorders to and from it cost.
inline dnnl_md bn_blocked_desc(const dnnl_dims& dims) {
  return dnnl_md(dims, dnnl::memory::data_type::f32, channel_blocked_tag());
}

/// A batch norm's data operand: a dnnl_tensor as it is, a plain array reordered to
/// bn_blocked_desc.
template <dnnl_operand X>
scratch_memory bn_data(const X& x) {
  if constexpr (std::same_as<X, xt::xarray<float>>) {
    const dnnl::memory m = wrap(x);
    return as_desc(m, bn_blocked_desc(m.get_desc().dims()));
  } else {
    return scratch_memory(memory_of(x));
  }
}

/// Planes (H * W) of fewer elements than this are walked a batch row at a time by the
/// split-form kernels (for_each_run, channel_sums_of) rather than plane by plane.
inline constexpr std::size_t small_plane = 64;

/// A channel's coefficient for every element of one of its planes.
template <class T>
struct plane_value {
  T v;
  T operator[](std::size_t) const { return v; }
};

/// Channel c's K coefficients (coef[k][c]) for every element of its planes.
template <class T, std::size_t K>
TESSERA_ALWAYS_INLINE inline std::array<plane_value<T>, K> plane_values(const std::array<std::vector<T>, K>& coef,
                                                                       std::size_t c) {
  std::array<plane_value<T>, K> co;
  for (std::size_t k = 0; k < K; ++k) co[k].v = coef[k][c];
  return co;
}

/// The K per-channel coefficients (coef[k][c]) of channels [c0, c1) spread to one per
/// element of a batch row of those channels: co[k][(c - c0) * plane + i].
template <class T, std::size_t K>
struct spread_coefficients {
  std::array<std::vector<T>, K> values;
  std::array<const T*, K> co;
  spread_coefficients(const std::array<std::vector<T>, K>& coef, std::size_t c0, std::size_t c1, std::size_t plane) {
    for (std::size_t k = 0; k < K; ++k) {
      values[k].resize((c1 - c0) * plane);
      for (std::size_t c = c0; c < c1; ++c) std::fill_n(values[k].data() + (c - c0) * plane, plane, coef[k][c]);
      co[k] = values[k].data();
    }
  }
};

/// f(c0, c1) over ranges of the channels of an NCHW array of shape s, on several threads
/// when there are enough elements (parallel_ranges): each channel on one thread.
template <class F>
void for_channel_ranges(const char* fn, std::span<const std::size_t> s, F&& f) {
  tessera::detail::require_nchw(fn, "x", s);
  const std::size_t per_channel = std::max<std::size_t>(s[0] * s[2] * s[3], 1);
  parallel_ranges(s[1], std::max<std::size_t>(parallel_grain / per_channel, 1), f);
}

/// The element-wise pass of a split-form kernel over an NCHW array of shape s, with K
/// coefficients per channel (coef[k][c]): f(co, off, len) for runs [off, off + len) of
/// the array's elements, where co[k][i] is the k-th coefficient of element off + i's
/// channel; different channels on different threads at once.
/// - Planes of small_plane elements or more are runs of their own, co[k] a plane_value.
/// - Smaller planes (ResNet-50's last stages at 32 x 32: 4 x 4 down to 1 x 1) would make
///   runs of a few elements, each costing many times its arithmetic (on one thread, 1 x 1
///   planes took 6 to 15 ns an element against 0.5 for 16 x 16). A thread's channels of
///   one image are one run instead, with the coefficients spread to one per element
///   (co[k] a pointer): 1 x 1 planes then take 0.6 to 1.5 ns an element.
/// f is marked TESSERA_ALWAYS_INLINE: the runs take the widest vectors the CPU has
/// (on_cpu_isa, kernels/cpu/isa.hpp).
template <class T, std::size_t K, class F>
void for_each_run(const char* fn, std::span<const std::size_t> s, const std::array<std::vector<T>, K>& coef, F&& f) {
  for_channel_ranges(fn, s, [&](std::size_t c0, std::size_t c1) {
    const std::size_t images = s[0], channels = s[1], plane = s[2] * s[3];
    if (plane >= small_plane) {
      on_cpu_isa(
          [&](std::size_t b, std::size_t e) TESSERA_ALWAYS_INLINE {
            for (std::size_t c = b; c < e; ++c) {
              const auto co = plane_values(coef, c);
              for (std::size_t n = 0; n < images; ++n) f(co, (n * channels + c) * plane, plane);
            }
          },
          c0, c1);
    } else {
      const spread_coefficients<T, K> spread(coef, c0, c1, plane);
      on_cpu_isa(
          [&](std::size_t len) TESSERA_ALWAYS_INLINE {
            for (std::size_t n = 0; n < images; ++n) f(spread.co, (n * channels + c0) * plane, len);
          },
          (c1 - c0) * plane);
    }
  });
}

/// The two sums over i < n of f(i) = {u, v}, in double, in `lanes` running sums each
/// (lane j takes the i with i % lanes == j) added up at the end: independent lanes
/// vectorise and pipeline, where one running sum is a chain of dependent additions
/// (batch_norm_sums of a 32 x 256 x 56 x 56 array on 2 threads: about 11 ms against 15).
/// Compiled for each instruction set (on_cpu_isa) with f inlined (f is marked
/// TESSERA_ALWAYS_INLINE), a plane at a time: GCC vectorises the lanes in a function of
/// their own, and leaves them scalar when they are inlined into the loops around them.
template <class F>
std::pair<double, double> lane_sums(std::size_t n, F&& f) {
  std::pair<double, double> out;
  on_cpu_isa(
      [&](std::size_t count) TESSERA_ALWAYS_INLINE {
        constexpr std::size_t lanes = 8;
        std::array<double, lanes> u{}, v{};
        std::size_t i = 0;
        for (; i + lanes <= count; i += lanes)
          for (std::size_t j = 0; j < lanes; ++j) {
            const auto [a, b] = f(i + j);
            u[j] += a;
            v[j] += b;
          }
        double su = 0, sv = 0;
        for (std::size_t j = 0; j < lanes; ++j) {
          su += u[j];
          sv += v[j];
        }
        for (; i < count; ++i) {
          const auto [a, b] = f(i);
          su += a;
          sv += b;
        }
        out = {su, sv};
      },
      n);
  return out;
}

/// Per channel c of an NCHW array of shape s, the two sums over c's elements of term(co,
/// off, i) = {u, v} (element off + i, co as for_each_run gives it), in double.
/// - A plane of small_plane elements or more is summed by lane_sums.
/// - Smaller planes: one running sum per element of a thread's batch row, over the
///   images, added up per channel after the last.
/// term is marked TESSERA_ALWAYS_INLINE, as for_each_run's f.
template <class T, std::size_t K, class F>
std::pair<std::vector<double>, std::vector<double>> channel_sums_of(const char* fn, std::span<const std::size_t> s,
                                                                   const std::array<std::vector<T>, K>& coef,
                                                                   F&& term) {
  std::vector<double> su(s.size() == 4 ? s[1] : 0, 0.0), sv(su.size(), 0.0);
  for_channel_ranges(fn, s, [&](std::size_t c0, std::size_t c1) {
    const std::size_t images = s[0], channels = s[1], plane = s[2] * s[3];
    if (plane >= small_plane) {
      for (std::size_t c = c0; c < c1; ++c) {
        const auto co = plane_values(coef, c);
        for (std::size_t n = 0; n < images; ++n) {
          const std::size_t off = (n * channels + c) * plane;
          const auto [a, b] = lane_sums(plane, [&](std::size_t i) TESSERA_ALWAYS_INLINE { return term(co, off, i); });
          su[c] += a;
          sv[c] += b;
        }
      }
    } else {
      const spread_coefficients<T, K> spread(coef, c0, c1, plane);
      const std::size_t len = (c1 - c0) * plane;
      std::vector<double> u(len, 0.0), v(len, 0.0);
      double* pu = u.data();
      double* pv = v.data();
      on_cpu_isa(
          [&](std::size_t m) TESSERA_ALWAYS_INLINE {
            for (std::size_t n = 0; n < images; ++n) {
              const std::size_t off = (n * channels + c0) * plane;
              for (std::size_t i = 0; i < m; ++i) {
                const auto [x, y] = term(spread.co, off, i);
                pu[i] += x;
                pv[i] += y;
              }
            }
          },
          len);
      for (std::size_t c = c0; c < c1; ++c)
        for (std::size_t i = (c - c0) * plane; i < (c - c0 + 1) * plane; ++i) {
          su[c] += u[i];
          sv[c] += v[i];
        }
    }
  });
  return {std::move(su), std::move(sv)};
}

/// The channel count of an NCHW operand, checking its rank.
inline std::size_t channels_of(const char* fn, std::span<const std::size_t> s) {
  tessera::detail::require_nchw(fn, "x", s);
  return s[1];
}

}  // namespace detail

/// Training-mode batch norm: per channel c, mean and biased variance of x over (N, H,
/// W), y = gamma[c] * (x - mean) / sqrt(variance + eps) + beta[c], then max(y, 0) when
/// `relu` (fused; the workspace keeps its mask for the backward). x (N, C, H, W), gamma
/// and beta (C,). Plain arrays are computed in oneDNN's blocked layout (reordered in and
/// out); the workspace is in the layout of the form given, so the backward takes the
/// same form (xarrays, or dnnl_tensors in the same layout).
template <dnnl_operand X>
batch_norm_training<X, xt::xarray<float>, dnnl_workspace> batch_norm_forward_training(
    const X& x, const xt::xarray<float>& gamma, const xt::xarray<float>& beta, float eps, bool relu = false) {
  constexpr const char* fn = "batch_norm_forward_training";
  const auto xs = detail::shape_of(x);
  const std::size_t c = detail::channels_of(fn, xs);
  detail::require_vector(fn, "gamma", gamma, c);
  detail::require_vector(fn, "beta", beta, c);
  return detail::dnnl_call(fn, [&] {
    const detail::scratch_memory src = detail::bn_data(x);
    const auto& e = detail::cached<detail::bn_forward_entry>(detail::bn_key(11, src.get().get_desc(), eps, relu), [&] {
      ++detail::primitives_created();
      auto pd = detail::bn_forward_pd(src.get().get_desc(), eps, true, false, relu);
      return detail::bn_forward_entry{pd, dnnl::batch_normalization_forward(pd)};
    });
    batch_norm_training<X, xt::xarray<float>, dnnl_workspace> out;
    out.mean = detail::vector_of(c);
    out.variance = detail::vector_of(c);
    detail::output_slot<X> dst(e.pd.dst_desc(), src.get().get_desc().dims(), xs);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src.get()},
                                               {DNNL_ARG_DST, dst.memory()},
                                               {DNNL_ARG_MEAN, detail::wrap(out.mean)},
                                               {DNNL_ARG_VARIANCE, detail::wrap(out.variance)},
                                               {DNNL_ARG_SCALE, detail::wrap(gamma)},
                                               {DNNL_ARG_SHIFT, detail::wrap(beta)}};
    if (relu) {
      out.workspace.memory = std::make_shared<dnnl::memory>(e.pd.workspace_desc(), dnnl_engine());
      args.emplace(DNNL_ARG_WORKSPACE, *out.workspace.memory);
    }
    e.prim.execute(dnnl_stream(), args);
    out.y = dst.take();
    return out;
  });
}

/// y = gamma[c] * (x - mean[c]) / sqrt(variance[c] + eps) + beta[c], then max(y, 0)
/// when `relu`, with the statistics given: inference with the running statistics, and
/// the normalisation of a batch norm whose statistics were gathered across ranks
/// (batch_norm_moments). A plain array is normalised in its own layout (for_each_run: one
/// pass, where oneDNN's blocked kernel needs a reorder in and one out: a third of the
/// memory traffic); a dnnl_tensor by oneDNN in its own layout.
template <dnnl_operand X>
X batch_norm_forward_inference(const X& x, const xt::xarray<float>& gamma, const xt::xarray<float>& beta,
                               const xt::xarray<float>& mean, const xt::xarray<float>& variance, float eps,
                               bool relu = false) {
  constexpr const char* fn = "batch_norm_forward_inference";
  const auto xs = detail::shape_of(x);
  const std::size_t c = detail::channels_of(fn, xs);
  detail::require_vector(fn, "gamma", gamma, c);
  detail::require_vector(fn, "beta", beta, c);
  detail::require_vector(fn, "mean", mean, c);
  detail::require_vector(fn, "variance", variance, c);
  if constexpr (std::same_as<X, xt::xarray<float>>) {
    xt::xarray<float> y = xt::xarray<float>::from_shape(x.shape());
    // y = (x - m) * a + b per channel, a = gamma / sqrt(variance + eps).
    std::array<std::vector<float>, 3> coef{std::vector<float>(c), std::vector<float>(c), std::vector<float>(c)};
    for (std::size_t ch = 0; ch < c; ++ch) {
      coef[0][ch] = mean(ch);
      coef[1][ch] = float(double(gamma(ch)) / std::sqrt(double(variance(ch)) + double(eps)));
      coef[2][ch] = beta(ch);
    }
    const float* px = x.data();
    float* py = y.data();
    detail::for_each_run(fn, xs, coef,
                         [px, py, relu](const auto& co, std::size_t off, std::size_t len) TESSERA_ALWAYS_INLINE {
      const float* p = px + off;
      float* o = py + off;
      const auto m = co[0], a = co[1], b = co[2];
      if (relu)
        for (std::size_t i = 0; i < len; ++i) o[i] = std::max((p[i] - m[i]) * a[i] + b[i], 0.f);
      else
        for (std::size_t i = 0; i < len; ++i) o[i] = (p[i] - m[i]) * a[i] + b[i];
    });
    return y;
  }
  return detail::dnnl_call(fn, [&] {
    const detail::scratch_memory src = detail::bn_data(x);
    const auto& e = detail::cached<detail::bn_forward_entry>(detail::bn_key(12, src.get().get_desc(), eps, relu), [&] {
      ++detail::primitives_created();
      auto pd = detail::bn_forward_pd(src.get().get_desc(), eps, false, true, relu);
      return detail::bn_forward_entry{pd, dnnl::batch_normalization_forward(pd)};
    });
    detail::output_slot<X> dst(e.pd.dst_desc(), src.get().get_desc().dims(), xs);
    e.prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, src.get()},
                                   {DNNL_ARG_DST, dst.memory()},
                                   {DNNL_ARG_MEAN, detail::wrap(mean)},
                                   {DNNL_ARG_VARIANCE, detail::wrap(variance)},
                                   {DNNL_ARG_SCALE, detail::wrap(gamma)},
                                   {DNNL_ARG_SHIFT, detail::wrap(beta)}});
    return dst.take();
  });
}

/// The backward of batch_norm_forward_training (the statistics are the batch's, so dx
/// includes their gradient): with x_hat = (x - mean) / sqrt(variance + eps), n = N * H *
/// W and dy masked by the ReLU when `relu` (from the forward's workspace),
///   dbeta = sum dy, dgamma = sum dy * x_hat,
///   dx = gamma / sqrt(variance + eps) * (dy - dbeta / n - x_hat * dgamma / n).
template <dnnl_operand X>
batch_norm_grads<X, xt::xarray<float>> batch_norm_backward(const X& dy, const X& x, const xt::xarray<float>& gamma,
                                                           const xt::xarray<float>& mean,
                                                           const xt::xarray<float>& variance,
                                                           const dnnl_workspace& workspace, float eps,
                                                           bool relu = false) {
  constexpr const char* fn = "batch_norm_backward";
  const auto xs = detail::shape_of(x);
  const std::size_t c = detail::channels_of(fn, xs);
  detail::require_dims(fn, "dy", detail::shape_of(dy), xs);
  detail::require_vector(fn, "gamma", gamma, c);
  detail::require_vector(fn, "mean", mean, c);
  detail::require_vector(fn, "variance", variance, c);
  if (relu && workspace.empty())
    throw error(std::string(fn) + ": relu needs the workspace of batch_norm_forward_training(..., relu = true)");
  return detail::dnnl_call(fn, [&] {
    const detail::scratch_memory src = detail::bn_data(x);
    const auto& e = detail::cached<detail::bn_backward_entry>(detail::bn_key(13, src.get().get_desc(), eps, relu), [&] {
      ++detail::primitives_created();
      auto hint = detail::bn_forward_pd(src.get().get_desc(), eps, true, false, relu);
      dnnl::batch_normalization_backward::primitive_desc pd(
          dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, src.get().get_desc(),
                                                   src.get().get_desc(), eps,
                                                   detail::bn_flags(false, relu)),
          dnnl_engine(), hint);
      return detail::bn_backward_entry{pd, dnnl::batch_normalization_backward(pd)};
    });
    batch_norm_grads<X, xt::xarray<float>> out;
    out.dgamma = detail::vector_of(c);
    out.dbeta = detail::vector_of(c);
    const auto ddst = detail::input_as(dy, e.pd.diff_dst_desc());
    detail::output_slot<X> dsrc(e.pd.diff_src_desc(), src.get().get_desc().dims(), xs);
    // oneDNN 2.6 asks for the shift too, though no gradient depends on it.
    const xt::xarray<float> shift = xt::zeros<float>({c});
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src.get()},
                                               {DNNL_ARG_DIFF_DST, ddst.get()},
                                               {DNNL_ARG_MEAN, detail::wrap(mean)},
                                               {DNNL_ARG_VARIANCE, detail::wrap(variance)},
                                               {DNNL_ARG_SCALE, detail::wrap(gamma)},
                                               {DNNL_ARG_SHIFT, detail::wrap(shift)},
                                               {DNNL_ARG_DIFF_SRC, dsrc.memory()},
                                               {DNNL_ARG_DIFF_SCALE, detail::wrap(out.dgamma)},
                                               {DNNL_ARG_DIFF_SHIFT, detail::wrap(out.dbeta)}};
    if (relu) args.emplace(DNNL_ARG_WORKSPACE, *workspace.memory);
    e.prim.execute(dnnl_stream(), args);
    out.dx = dsrc.take();
    return out;
  });
}

// ---- the split form: per-channel sums that can be added across ranks ----------------

namespace detail {

template <class T>
void require_channels(const char* fn, const char* name, const xt::xarray<T>& v, std::size_t c) {
  if (v.dimension() != 1 || v.shape()[0] != c)
    throw error(std::string(fn) + ": " + name + " must be (" + std::to_string(c) + ",), " + name + " is " +
                tessera::detail::dims_text(std::span<const std::size_t>(v.shape().data(), v.shape().size())));
}

template <class T>
void require_same_nchw(const char* fn, const char* name, const xt::xarray<T>& a, const xt::xarray<T>& x) {
  require_dims(fn, name, std::span<const std::size_t>(a.shape().data(), a.shape().size()),
               std::span<const std::size_t>(x.shape().data(), x.shape().size()));
}

}  // namespace detail

/// The element types of the split-form batch-norm kernels.
template <class T>
concept bn_scalar = std::same_as<T, float> || std::same_as<T, double>;

/// Per channel c: sum of x[:, c] and of x[:, c]^2 over (N, H, W), accumulated in double
/// (the sums of several ranks' batches add up to the whole batch's).
template <bn_scalar T>
channel_sums<xt::xarray<T>> batch_norm_sums(const xt::xarray<T>& x) {
  constexpr const char* fn = "batch_norm_sums";
  const std::span<const std::size_t> xs(x.shape().data(), x.shape().size());
  const std::size_t c = detail::channels_of(fn, xs);
  const T* px = x.data();
  const auto [s, q] = detail::channel_sums_of(fn, xs, std::array<std::vector<T>, 0>{},
                                              [px](const auto&, std::size_t off, std::size_t i) TESSERA_ALWAYS_INLINE {
                                                const double v = double(px[off + i]);
                                                return std::pair{v, v * v};
                                              });
  channel_sums<xt::xarray<T>> out{xt::xarray<T>::from_shape({c}), xt::xarray<T>::from_shape({c})};
  for (std::size_t i = 0; i < c; ++i) {
    out.sum(i) = T(s[i]);
    out.sum_sq(i) = T(q[i]);
  }
  return out;
}

/// The mean and biased variance per channel from the sums of `count` elements per channel
/// (N * H * W of the whole batch, every rank's): mean = sum / count, variance = sum_sq /
/// count - mean^2 (in double, never below 0).
template <bn_scalar T>
batch_norm_stats<xt::xarray<T>> batch_norm_moments(const channel_sums<xt::xarray<T>>& sums, std::size_t count) {
  constexpr const char* fn = "batch_norm_moments";
  const std::size_t c = sums.sum.size();
  detail::require_channels(fn, "sum", sums.sum, c);
  detail::require_channels(fn, "sum_sq", sums.sum_sq, c);
  if (count == 0) throw error(std::string(fn) + ": count must be positive");
  batch_norm_stats<xt::xarray<T>> out{xt::xarray<T>::from_shape({c}), xt::xarray<T>::from_shape({c})};
  for (std::size_t i = 0; i < c; ++i) {
    const double m = double(sums.sum(i)) / double(count);
    out.mean(i) = T(m);
    out.variance(i) = T(std::max(0.0, double(sums.sum_sq(i)) / double(count) - m * m));
  }
  return out;
}

/// The local half of the split backward: per channel, sum of dy (dbeta) and sum of dy *
/// x_hat (dgamma) over this rank's (N, H, W), x_hat = (x - mean) / sqrt(variance + eps)
/// with the global statistics; dy is masked by y > 0 first when relu_y (the fused ReLU's
/// output) is given. Returned as {sum = sum dy, sum_sq = sum dy * x_hat}.
template <bn_scalar T>
channel_sums<xt::xarray<T>> batch_norm_backward_sums(const xt::xarray<T>& dy, const xt::xarray<T>& x,
                                                     const xt::xarray<T>& mean, const xt::xarray<T>& variance,
                                                     T eps, const xt::xarray<T>* relu_y = nullptr) {
  constexpr const char* fn = "batch_norm_backward_sums";
  const std::span<const std::size_t> xs(x.shape().data(), x.shape().size());
  const std::size_t c = detail::channels_of(fn, xs);
  detail::require_same_nchw(fn, "dy", dy, x);
  if (relu_y) detail::require_same_nchw(fn, "relu_y", *relu_y, x);
  detail::require_channels(fn, "mean", mean, c);
  detail::require_channels(fn, "variance", variance, c);
  // Per channel: the mean, then 1 / sqrt(variance + eps) for the sum of dy * x_hat.
  std::array<std::vector<T>, 1> coef{std::vector<T>(c)};
  std::vector<double> inv(c);
  for (std::size_t ch = 0; ch < c; ++ch) {
    coef[0][ch] = mean(ch);
    inv[ch] = 1.0 / std::sqrt(double(variance(ch)) + double(eps));
  }
  const T* pg = dy.data();
  const T* px = x.data();
  const T* pr = relu_y ? relu_y->data() : nullptr;
  // sum dy and sum dy * (x - mean); dy masked by relu_y > 0 when given.
  auto sums = [&](auto masked) {
    return detail::channel_sums_of(fn, xs, coef,
                                   [pg, px, pr](const auto& co, std::size_t off, std::size_t i) TESSERA_ALWAYS_INLINE {
      T g = pg[off + i];
      if constexpr (decltype(masked)::value) g = detail::kept(g, pr[off + i] > T(0));
      const double d = double(g);
      return std::pair{d, d * (double(px[off + i]) - double(co[0][i]))};
    });
  };
  auto [sd, sdx] = pr ? sums(std::true_type{}) : sums(std::false_type{});
  for (std::size_t ch = 0; ch < c; ++ch) sdx[ch] *= inv[ch];
  channel_sums<xt::xarray<T>> out{xt::xarray<T>::from_shape({c}), xt::xarray<T>::from_shape({c})};
  for (std::size_t i = 0; i < c; ++i) {
    out.sum(i) = T(sd[i]);
    out.sum_sq(i) = T(sdx[i]);
  }
  return out;
}

/// The second half of the split backward: dx = gamma / sqrt(variance + eps) * (dy -
/// sum_dy / count - x_hat * sum_dy_xhat / count), with `sums` added up over every rank
/// (batch_norm_backward_sums) and count the whole batch's N * H * W; dy masked by
/// relu_y > 0 when given.
template <bn_scalar T>
xt::xarray<T> batch_norm_backward_data(const xt::xarray<T>& dy, const xt::xarray<T>& x, const xt::xarray<T>& gamma,
                                       const xt::xarray<T>& mean, const xt::xarray<T>& variance,
                                       const channel_sums<xt::xarray<T>>& sums, std::size_t count, T eps,
                                       const xt::xarray<T>* relu_y = nullptr) {
  constexpr const char* fn = "batch_norm_backward_data";
  const std::span<const std::size_t> xs(x.shape().data(), x.shape().size());
  const std::size_t c = detail::channels_of(fn, xs);
  detail::require_same_nchw(fn, "dy", dy, x);
  if (relu_y) detail::require_same_nchw(fn, "relu_y", *relu_y, x);
  using named = std::pair<const char*, const xt::xarray<T>*>;
  for (const named& v : {named{"gamma", &gamma}, named{"mean", &mean}, named{"variance", &variance},
                         named{"sum", &sums.sum}, named{"sum_sq", &sums.sum_sq}})
    detail::require_channels(fn, v.first, *v.second, c);
  if (count == 0) throw error(std::string(fn) + ": count must be positive");
  xt::xarray<T> dx = xt::xarray<T>::from_shape(x.shape());
  // dx = a * dy + b * x + k, folded per channel.
  std::array<std::vector<T>, 3> coef{std::vector<T>(c), std::vector<T>(c), std::vector<T>(c)};
  for (std::size_t ch = 0; ch < c; ++ch) {
    const double inv = 1.0 / std::sqrt(double(variance(ch)) + double(eps));
    const double scale = double(gamma(ch)) * inv;
    const double mdy = double(sums.sum(ch)) / double(count);
    const double mdyx = double(sums.sum_sq(ch)) / double(count);
    coef[0][ch] = T(scale);
    coef[1][ch] = T(-scale * mdyx * inv);
    coef[2][ch] = T(scale * (-mdy + mdyx * inv * double(mean(ch))));
  }
  const T* pg = dy.data();
  const T* px = x.data();
  const T* pr = relu_y ? relu_y->data() : nullptr;
  T* pd = dx.data();
  detail::for_each_run(fn, xs, coef,
                       [pg, px, pr, pd](const auto& co, std::size_t off, std::size_t len) TESSERA_ALWAYS_INLINE {
    const T* g = pg + off;
    const T* p = px + off;
    T* o = pd + off;
    const auto a = co[0], b = co[1], k = co[2];
    if (pr) {
      // dy masked by relu_y > 0.
      const T* r = pr + off;
      for (std::size_t i = 0; i < len; ++i) o[i] = a[i] * detail::kept(g[i], r[i] > T(0)) + b[i] * p[i] + k[i];
    } else {
      for (std::size_t i = 0; i < len; ++i) o[i] = a[i] * g[i] + b[i] * p[i] + k[i];
    }
  });
  return dx;
}

// ---- the split form on channel-blocked dnnl_tensors ----------------------------------
//
// The same four kernels on activations kept in oneDNN's channel-blocked layouts (nChw16c,
// nChw8c), where a plane of B channels lies element after element, B floats each: every
// inner loop runs over one vector of channels, each lane with its own channel's
// coefficients, with no per-channel runs to cut (the planes of 1 x 1 included).

namespace detail {

/// A float (N, C, H, W) tensor in one of oneDNN's channel-blocked layouts: [N][C / B][H][W][B],
/// B = 16 (nChw16c) or 8 (nChw8c), the channels padded up to a multiple of B.
struct blocked_nchw {
  std::size_t images, channels, blocks, plane, block;
};

/// x's blocked geometry; anything else is an error naming the kernel:
/// "batch_norm_sums: x must be in oneDNN's nChw16c or nChw8c layout".
inline blocked_nchw blocked_geometry(const char* fn, const char* name, const dnnl_tensor& x) {
  const dnnl_md d = x.desc();
  const dnnl_dims dims = d.dims();
  for (const auto& [tag, b] : {std::pair{dnnl_tag::nChw16c, 16}, std::pair{dnnl_tag::nChw8c, 8}})
    if (d == dnnl_md(dims, dnnl::memory::data_type::f32, tag)) {
      const std::size_t c = std::size_t(dims[1]), block = std::size_t(b);
      return {std::size_t(dims[0]), c, (c + block - 1) / block, std::size_t(dims[2] * dims[3]), block};
    }
  throw error(std::string(fn) + ": " + name + " must be in oneDNN's nChw16c or nChw8c layout");
}

/// Operand `name` laid out as x (same shape and layout).
inline void require_layout_of(const char* fn, const char* name, const dnnl_tensor& a, const dnnl_tensor& x) {
  require_dims(fn, name, shape_of(a), shape_of(x));
  if (!(a.desc() == x.desc())) throw error(std::string(fn) + ": " + name + " must be laid out as x");
}

/// Per-channel coefficients spread over the padded channels (zero past the last).
inline std::vector<float> padded(const blocked_nchw& g, const std::vector<double>& v) {
  std::vector<float> out(g.blocks * g.block, 0.f);
  for (std::size_t c = 0; c < g.channels; ++c) out[c] = float(v[c]);
  return out;
}

/// f(b0, b1) over ranges of channel blocks, on several threads where there are enough
/// elements; each block on one thread.
template <class F>
void for_block_ranges(const blocked_nchw& g, F&& f) {
  const std::size_t per_block = std::max<std::size_t>(g.images * g.plane * g.block, 1);
  parallel_ranges(g.blocks, std::max<std::size_t>(parallel_grain / per_block, 1), f);
}

/// Per channel, the two sums over its elements that block(cb, u, v) adds into u and v (B
/// running sums each, one a lane) for channel block cb over every image; in double.
/// block is marked TESSERA_ALWAYS_INLINE: its loops over a block's lanes take the widest
/// vectors the CPU has (on_cpu_isa).
template <std::size_t B, class F>
std::pair<std::vector<double>, std::vector<double>> blocked_channel_sums(const blocked_nchw& g, F&& block) {
  std::vector<double> su(g.blocks * B, 0.0), sv(g.blocks * B, 0.0);
  for_block_ranges(g, [&](std::size_t b0, std::size_t b1) {
    on_cpu_isa(
        [&](std::size_t first, std::size_t last) TESSERA_ALWAYS_INLINE {
          for (std::size_t cb = first; cb < last; ++cb) {
            alignas(64) double u[B] = {}, v[B] = {};
            block(cb, u, v);
            std::copy_n(u, B, su.data() + cb * B);
            std::copy_n(v, B, sv.data() + cb * B);
          }
        },
        b0, b1);
  });
  su.resize(g.channels);
  sv.resize(g.channels);
  return {std::move(su), std::move(sv)};
}

/// block(cb) for every channel block cb, blocks on several threads; block is marked
/// TESSERA_ALWAYS_INLINE, as above.
template <class F>
void blocked_blocks(const blocked_nchw& g, F&& block) {
  for_block_ranges(g, [&](std::size_t b0, std::size_t b1) {
    on_cpu_isa(
        [&](std::size_t first, std::size_t last) TESSERA_ALWAYS_INLINE {
          for (std::size_t cb = first; cb < last; ++cb) block(cb);
        },
        b0, b1);
  });
}

/// The float offset of image n's plane of channel block cb.
inline std::size_t block_plane(const blocked_nchw& g, std::size_t n, std::size_t cb) {
  return (n * g.blocks + cb) * g.plane * g.block;
}

/// f.template operator()<B>() with the block of g as a constant.
template <class F>
decltype(auto) with_block(const blocked_nchw& g, F&& f) {
  return g.block == 16 ? f.template operator()<16>() : f.template operator()<8>();
}

/// Per-channel sums in double as the split form returns them (float arrays of C).
inline channel_sums<xt::xarray<float>> as_channel_sums(const std::vector<double>& a, const std::vector<double>& b) {
  channel_sums<xt::xarray<float>> out{xt::xarray<float>::from_shape({a.size()}),
                                      xt::xarray<float>::from_shape({a.size()})};
  for (std::size_t i = 0; i < a.size(); ++i) {
    out.sum(i) = float(a[i]);
    out.sum_sq(i) = float(b[i]);
  }
  return out;
}

}  // namespace detail

/// batch_norm_sums of x in nChw16c or nChw8c (the padding left out).
inline channel_sums<xt::xarray<float>> batch_norm_sums(const dnnl_tensor& x) {
  const detail::blocked_nchw g = detail::blocked_geometry("batch_norm_sums", "x", x);
  const float* px = static_cast<const float*>(x.memory().get_data_handle());
  return detail::with_block(g, [&]<std::size_t B>() {
    const auto [s, q] = detail::blocked_channel_sums<B>(
        g, [px, &g](std::size_t cb, double* __restrict u, double* __restrict v) TESSERA_ALWAYS_INLINE {
          for (std::size_t n = 0; n < g.images; ++n) {
            const float* __restrict p = px + detail::block_plane(g, n, cb);
            for (std::size_t i = 0; i < g.plane * B; i += B)
              for (std::size_t l = 0; l < B; ++l) {
                const double e = double(p[i + l]);
                u[l] += e;
                v[l] += e * e;
              }
          }
        });
    return detail::as_channel_sums(s, q);
  });
}

/// batch_norm_backward_sums of dy, x and relu_y laid out alike in nChw16c or nChw8c.
inline channel_sums<xt::xarray<float>> batch_norm_backward_sums(const dnnl_tensor& dy, const dnnl_tensor& x,
                                                               const xt::xarray<float>& mean,
                                                               const xt::xarray<float>& variance, float eps,
                                                               const dnnl_tensor* relu_y = nullptr) {
  constexpr const char* fn = "batch_norm_backward_sums";
  const detail::blocked_nchw g = detail::blocked_geometry(fn, "x", x);
  detail::require_layout_of(fn, "dy", dy, x);
  if (relu_y) detail::require_layout_of(fn, "relu_y", *relu_y, x);
  detail::require_channels(fn, "mean", mean, g.channels);
  detail::require_channels(fn, "variance", variance, g.channels);
  std::vector<double> m(g.channels), inv(g.channels);
  for (std::size_t c = 0; c < g.channels; ++c) {
    m[c] = double(mean(c));
    inv[c] = 1.0 / std::sqrt(double(variance(c)) + double(eps));
  }
  const std::vector<float> pm = detail::padded(g, m);
  const float* pg = static_cast<const float*>(dy.memory().get_data_handle());
  const float* px = static_cast<const float*>(x.memory().get_data_handle());
  const float* pr = relu_y ? static_cast<const float*>(relu_y->memory().get_data_handle()) : nullptr;
  const float* mp = pm.data();
  return detail::with_block(g, [&]<std::size_t B>() {
    // sum dy and sum dy * (x - mean); dy masked by relu_y > 0 when given.
    auto sums = [&](auto masked) {
      return detail::blocked_channel_sums<B>(
          g, [pg, px, pr, mp, &g](std::size_t cb, double* __restrict u, double* __restrict v) TESSERA_ALWAYS_INLINE {
            float mean[B];
            std::copy_n(mp + cb * B, B, mean);
            for (std::size_t n = 0; n < g.images; ++n) {
              const std::size_t base = detail::block_plane(g, n, cb);
              const float* __restrict d = pg + base;
              const float* __restrict p = px + base;
              const float* __restrict r = pr ? pr + base : nullptr;
              for (std::size_t i = 0; i < g.plane * B; i += B)
                for (std::size_t l = 0; l < B; ++l) {
                  float e = d[i + l];
                  if constexpr (decltype(masked)::value) e = detail::kept(e, r[i + l] > 0.f);
                  u[l] += double(e);
                  v[l] += double(e) * (double(p[i + l]) - double(mean[l]));
                }
            }
          });
    };
    auto [sd, sdx] = pr ? sums(std::true_type{}) : sums(std::false_type{});
    for (std::size_t c = 0; c < g.channels; ++c) sdx[c] *= inv[c];
    return detail::as_channel_sums(sd, sdx);
  });
}

/// batch_norm_backward_data of dy, x and relu_y laid out alike in nChw16c or nChw8c; dx
/// in their layout, its padding zero.
inline dnnl_tensor batch_norm_backward_data(const dnnl_tensor& dy, const dnnl_tensor& x,
                                            const xt::xarray<float>& gamma, const xt::xarray<float>& mean,
                                            const xt::xarray<float>& variance,
                                            const channel_sums<xt::xarray<float>>& sums, std::size_t count,
                                            float eps, const dnnl_tensor* relu_y = nullptr) {
  constexpr const char* fn = "batch_norm_backward_data";
  const detail::blocked_nchw g = detail::blocked_geometry(fn, "x", x);
  detail::require_layout_of(fn, "dy", dy, x);
  if (relu_y) detail::require_layout_of(fn, "relu_y", *relu_y, x);
  using named = std::pair<const char*, const xt::xarray<float>*>;
  for (const named& v : {named{"gamma", &gamma}, named{"mean", &mean}, named{"variance", &variance},
                         named{"sum", &sums.sum}, named{"sum_sq", &sums.sum_sq}})
    detail::require_channels(fn, v.first, *v.second, g.channels);
  if (count == 0) throw error(std::string(fn) + ": count must be positive");
  // dx = a * dy + b * x + k per channel, as the plain kernel folds it; zero coefficients
  // on the padding.
  std::vector<double> a(g.channels), b(g.channels), k(g.channels);
  for (std::size_t c = 0; c < g.channels; ++c) {
    const double inv = 1.0 / std::sqrt(double(variance(c)) + double(eps));
    const double scale = double(gamma(c)) * inv;
    const double mdy = double(sums.sum(c)) / double(count);
    const double mdyx = double(sums.sum_sq(c)) / double(count);
    a[c] = scale;
    b[c] = -scale * mdyx * inv;
    k[c] = scale * (-mdy + mdyx * inv * double(mean(c)));
  }
  const std::vector<float> pa = detail::padded(g, a), pb = detail::padded(g, b), pk = detail::padded(g, k);
  dnnl_tensor dx(dnnl::memory(x.desc(), dnnl_engine()));
  const float* pg = static_cast<const float*>(dy.memory().get_data_handle());
  const float* px = static_cast<const float*>(x.memory().get_data_handle());
  const float* pr = relu_y ? static_cast<const float*>(relu_y->memory().get_data_handle()) : nullptr;
  float* pd = static_cast<float*>(dx.memory().get_data_handle());
  const float *ca = pa.data(), *cb = pb.data(), *ck = pk.data();
  detail::with_block(g, [&]<std::size_t B>() {
    auto run = [&](auto masked) {
      detail::blocked_blocks(g, [=, &g](std::size_t blk) TESSERA_ALWAYS_INLINE {
        float a[B], b[B], k[B];  // the block's coefficients, a vector each
        std::copy_n(ca + blk * B, B, a);
        std::copy_n(cb + blk * B, B, b);
        std::copy_n(ck + blk * B, B, k);
        for (std::size_t n = 0; n < g.images; ++n) {
          const std::size_t base = detail::block_plane(g, n, blk);
          const float* __restrict d = pg + base;
          const float* __restrict p = px + base;
          const float* __restrict r = pr ? pr + base : nullptr;
          float* __restrict o = pd + base;
          for (std::size_t i = 0; i < g.plane * B; i += B)
            for (std::size_t l = 0; l < B; ++l) {
              float e = d[i + l];
              if constexpr (decltype(masked)::value) e = detail::kept(e, r[i + l] > 0.f);
              o[i + l] = a[l] * e + b[l] * p[i + l] + k[l];
            }
        }
      });
    };
    if (pr) run(std::true_type{});
    else run(std::false_type{});
  });
  return dx;
}

/// The running statistics' update, in place: running = (1 - momentum) * running +
/// momentum * batch (PyTorch's convention; MindSpore's momentum m is 1 - m here), the
/// batch variance made unbiased (times count / (count - 1)) when `unbiased`, as PyTorch
/// and MindSpore keep it.
template <bn_scalar T>
void batch_norm_update_running(xt::xarray<T>& running_mean, xt::xarray<T>& running_var, const xt::xarray<T>& mean,
                               const xt::xarray<T>& variance, std::size_t count, T momentum, bool unbiased = true) {
  constexpr const char* fn = "batch_norm_update_running";
  const std::size_t c = running_mean.size();
  using named = std::pair<const char*, const xt::xarray<T>*>;
  for (const named& v : {named{"running_mean", &running_mean}, named{"running_var", &running_var},
                         named{"mean", &mean}, named{"variance", &variance}})
    detail::require_channels(fn, v.first, *v.second, c);
  const T corr = unbiased && count > 1 ? T(double(count) / double(count - 1)) : T(1);
  for (std::size_t i = 0; i < c; ++i) {
    running_mean(i) = (T(1) - momentum) * running_mean(i) + momentum * mean(i);
    running_var(i) = (T(1) - momentum) * running_var(i) + momentum * variance(i) * corr;
  }
}

}  // namespace tessera::kernels::cpu
