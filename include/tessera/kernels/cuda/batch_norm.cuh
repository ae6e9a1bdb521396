// Batch normalisation over (N, H, W) per channel of NCHW float device arrays, the GPU
// twin of kernels/cpu/batch_norm.hpp: the same functions, formulas and error texts.
// Every form is built from the split kernels (per-channel sums accumulated in double,
// each channel's samples split over blocks where the batch is large, their parts added
// by a second kernel; normalisation and the backward's dx, element-wise), so the
// whole-batch kernels and the form whose sums are added across ranks compute the same
// way. The fused ReLU keeps its mask (one byte per element) in the workspace. nvcc only;
// link tessera::cudnn (the plans of kernels/cuda/cudnn.cuh).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/launch.cuh>
#include <tessera/cuda/runtime.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/kernels/cuda/common.cuh>
#include <tessera/kernels/cuda/cudnn.cuh>

namespace tessera::kernels::cuda {

namespace detail {

constexpr int bn_threads = 256;

/// Sums a and b over the block (bn_threads threads); thread 0 gets the totals.
__device__ inline void block_sum2(double& a, double& b) {
  __shared__ double sa[bn_threads], sb[bn_threads];
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (int s = bn_threads / 2; s > 0; s /= 2) {
    if (int(threadIdx.x) < s) {
      sa[threadIdx.x] += sa[threadIdx.x + s];
      sb[threadIdx.x] += sb[threadIdx.x + s];
    }
    __syncthreads();
  }
  a = sa[0];
  b = sb[0];
}

/// Walks block (ch, s) of a (C, S) grid over its part of channel ch's elements in NCHW:
/// the runs of hw contiguous elements of samples [s n / S, (s + 1) n / S), each thread
/// taking every bn_threads-th element in order, and calls f(index). The position moves on
/// by additions (a 32-bit division only where a step crosses into the next sample:
/// hw + bn_threads fits in 32 bits, bn_splits checks).
template <class F>
__device__ inline void channel_walk(std::int64_t n, std::int64_t c, std::int64_t hw, F&& f) {
  if (hw == 0) return;
  const std::int64_t ch = blockIdx.x, s = blockIdx.y, parts = gridDim.y;
  const std::int64_t end = (s + 1) * n / parts;
  std::int64_t b = s * n / parts, j = threadIdx.x;
  const auto wrap = [&] {
    if (j >= hw) {
      const std::uint32_t q = std::uint32_t(j) / std::uint32_t(hw);
      b += q;
      j -= std::int64_t(q) * hw;
    }
  };
  for (wrap(); b < end; j += bn_threads, wrap()) f((b * c + ch) * hw + j);
}

/// The block's two totals: the channel's (one part: gridDim.y == 1), written as T with
/// the second scaled by `scale2`; else the part's, in double, to part[(s c + ch) 2 + k]
/// for bn_combine_kernel to add up.
template <class T>
__device__ inline void channel_totals(double a, double b, double scale2, std::int64_t c, T* out1, T* out2,
                                      double* part) {
  block_sum2(a, b);
  if (threadIdx.x != 0) return;
  const std::int64_t ch = blockIdx.x;
  if (gridDim.y == 1) {
    out1[ch] = T(a);
    out2[ch] = T(b * scale2);
  } else {
    double* p = part + (std::int64_t(blockIdx.y) * c + ch) * 2;
    p[0] = a;
    p[1] = b;
  }
}

/// Sum x and sum x^2 over (N, H, W) per channel, grid (C, parts).
template <class T>
__global__ void bn_sums_kernel(const T* x, std::int64_t n, std::int64_t c, std::int64_t hw, T* sum, T* sum_sq,
                               double* part) {
  double a = 0, b = 0;
  channel_walk(n, c, hw, [&](std::int64_t at) {
    const double v = double(x[at]);
    a += v;
    b += v * v;
  });
  channel_totals(a, b, 1.0, c, sum, sum_sq, part);
}

/// The parts' totals added up per channel, the second scaled by 1 / sqrt(var + eps)
/// where var is given.
template <class T>
__global__ void bn_combine_kernel(const double* part, int parts, std::int64_t c, const T* var, T eps, T* out1,
                                  T* out2) {
  TESSERA_GRID_STRIDE(ch, c) {
    double a = 0, b = 0;
    for (int s = 0; s < parts; ++s) {
      a += part[(s * c + ch) * 2];
      b += part[(s * c + ch) * 2 + 1];
    }
    out1[ch] = T(a);
    out2[ch] = T(var ? b / sqrt(double(var[ch]) + double(eps)) : b);
  }
}

/// dy masked by the ReLU: zero where the mask byte is 0 or relu_y <= 0 (either may be null).
template <class T>
__device__ inline T masked(const T* dy, const std::uint8_t* mask, const T* relu_y, std::int64_t i) {
  if (mask && !mask[i]) return T(0);
  if (relu_y && !(relu_y[i] > T(0))) return T(0);
  return dy[i];
}

/// Sum dy and sum dy * x_hat over (N, H, W) per channel, grid (C, parts).
template <class T>
__global__ void bn_backward_sums_kernel(const T* dy, const T* x, const std::uint8_t* mask, const T* relu_y,
                                        const T* mean, const T* var, T eps, std::int64_t n, std::int64_t c,
                                        std::int64_t hw, T* sum_dy, T* sum_dy_xhat, double* part) {
  const std::int64_t ch = blockIdx.x;
  const double m = double(mean[ch]);
  double a = 0, b = 0;
  channel_walk(n, c, hw, [&](std::int64_t at) {
    const double d = double(masked(dy, mask, relu_y, at));
    a += d;
    b += d * (double(x[at]) - m);
  });
  channel_totals(a, b, 1.0 / sqrt(double(var[ch]) + double(eps)), c, sum_dy, sum_dy_xhat, part);
}

/// The channel of element i of an NCHW array: 32-bit division where the array's indices
/// fit (`narrow`, the same for every thread), else 64-bit.
__device__ inline std::int64_t channel_of(std::int64_t i, std::int64_t c, std::int64_t hw, bool narrow) {
  if (narrow) return std::int64_t(std::uint32_t(i) / std::uint32_t(hw) % std::uint32_t(c));
  return (i / hw) % c;
}

/// y = gamma (x - mean) / sqrt(var + eps) + beta, ReLU'd when relu (its mask written
/// when mask is not null).
template <class T>
__global__ void bn_normalize_kernel(const T* x, T* y, std::uint8_t* mask, const T* gamma, const T* beta,
                                    const T* mean, const T* var, T eps, bool relu, std::int64_t total,
                                    std::int64_t c, std::int64_t hw, bool narrow) {
  TESSERA_GRID_STRIDE(i, total) {
    const std::int64_t ch = channel_of(i, c, hw, narrow);
    const T scale = gamma[ch] * T(1.0 / sqrt(double(var[ch]) + double(eps)));
    T v = scale * (x[i] - mean[ch]) + beta[ch];
    if (relu) {
      const bool on = v > T(0);
      if (mask) mask[i] = on;
      v = on ? v : T(0);
    }
    y[i] = v;
  }
}

/// dx = gamma / sqrt(var + eps) * (dy - sum_dy / count - x_hat * sum_dy_xhat / count).
template <class T>
__global__ void bn_backward_data_kernel(const T* dy, const T* x, const std::uint8_t* mask, const T* relu_y,
                                        const T* gamma, const T* mean, const T* var, const T* sum_dy,
                                        const T* sum_dy_xhat, double count, T eps, std::int64_t total,
                                        std::int64_t c, std::int64_t hw, bool narrow, T* dx) {
  TESSERA_GRID_STRIDE(i, total) {
    const std::int64_t ch = channel_of(i, c, hw, narrow);
    const double inv = 1.0 / sqrt(double(var[ch]) + double(eps));
    const double xhat = (double(x[i]) - double(mean[ch])) * inv;
    dx[i] = T(double(gamma[ch]) * inv *
              (double(masked(dy, mask, relu_y, i)) - double(sum_dy[ch]) / count -
               xhat * double(sum_dy_xhat[ch]) / count));
  }
}

template <class T>
__global__ void bn_moments_kernel(const T* sum, const T* sum_sq, double count, std::int64_t c, T* mean, T* var) {
  TESSERA_GRID_STRIDE(i, c) {
    const double m = double(sum[i]) / count;
    mean[i] = T(m);
    const double v = double(sum_sq[i]) / count - m * m;
    var[i] = T(v > 0 ? v : 0);
  }
}

template <class T>
__global__ void bn_running_kernel(T* rm, T* rv, const T* mean, const T* var, std::int64_t c, T momentum, T corr) {
  TESSERA_GRID_STRIDE(i, c) {
    rm[i] = (T(1) - momentum) * rm[i] + momentum * mean[i];
    rv[i] = (T(1) - momentum) * rv[i] + momentum * var[i] * corr;
  }
}

struct bn_geometry {
  std::int64_t n = 0, c = 0, hw = 0, total = 0;
};

inline bn_geometry bn_geom(const char* fn, const device_array<float>& x) {
  tessera::detail::require_nchw(fn, "x", dims(x));
  const auto& s = x.shape();
  return {std::int64_t(s[0]), std::int64_t(s[1]), std::int64_t(s[2] * s[3]), std::int64_t(x.size())};
}

inline device_array<float> channel_vector(std::int64_t c) { return device_array<float>({std::size_t(c)}); }

inline void launch_check(const char* fn) { tessera::cuda::check_launch(fn); }

/// Whether every index of the array fits in 32 bits (channel_of's narrow division).
inline bool narrow(const bn_geometry& g) { return g.total <= std::int64_t(UINT32_MAX); }

/// How many parts the channel sums split each channel's samples into: enough blocks to
/// keep the GPU busy (about bn_target_blocks over all channels), each part over at least
/// bn_min_part elements, at most one part per sample; one part (no second kernel) for
/// small batches and wide layers.
constexpr std::int64_t bn_target_blocks = 1024, bn_min_part = 8192;
inline unsigned bn_splits(const char* fn, const bn_geometry& g) {
  if (g.hw > std::int64_t(UINT32_MAX) - bn_threads)
    throw error(std::string(fn) + ": a channel's plane of " + std::to_string(g.hw) + " elements is too large");
  const std::int64_t want = (bn_target_blocks + g.c - 1) / g.c, most = g.n * g.hw / bn_min_part;
  return unsigned(std::max<std::int64_t>(1, std::min({want, most, g.n})));
}

/// The channel totals from the parts (nothing to do for one part: the kernel wrote them).
inline void bn_combine(const char* fn, const device_array<double>& part, unsigned parts, std::int64_t c,
                       const float* var, float eps, channel_sums<device_array<float>>& out) {
  if (parts <= 1) return;
  bn_combine_kernel<<<tessera::cuda::grid_for(c), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(
      part.data(), int(parts), c, var, eps, out.sum.data(), out.sum_sq.data());
  launch_check(fn);
}

}  // namespace detail

/// Per channel: sum of x and of x^2 over (N, H, W), accumulated in double.
inline channel_sums<device_array<float>> batch_norm_sums(const device_array<float>& x) {
  constexpr const char* fn = "batch_norm_sums";
  const auto g = detail::bn_geom(fn, x);
  channel_sums<device_array<float>> out{detail::channel_vector(g.c), detail::channel_vector(g.c)};
  if (g.c == 0) return out;
  const unsigned parts = detail::bn_splits(fn, g);
  device_array<double> part({parts > 1 ? std::size_t(parts) * std::size_t(g.c) * 2 : 0});
  detail::bn_sums_kernel<<<dim3(unsigned(g.c), parts), detail::bn_threads, 0, tessera::cuda::stream()>>>(
      x.data(), g.n, g.c, g.hw, out.sum.data(), out.sum_sq.data(), part.data());
  detail::launch_check(fn);
  detail::bn_combine(fn, part, parts, g.c, nullptr, 0.f, out);
  return out;
}

/// mean = sum / count, biased variance = sum_sq / count - mean^2 (never below 0).
inline batch_norm_stats<device_array<float>> batch_norm_moments(const channel_sums<device_array<float>>& sums,
                                                                std::size_t count) {
  constexpr const char* fn = "batch_norm_moments";
  const std::size_t c = sums.sum.size();
  detail::require_vector(fn, "sum", sums.sum, c);
  detail::require_vector(fn, "sum_sq", sums.sum_sq, c);
  if (count == 0) throw error(std::string(fn) + ": count must be positive");
  batch_norm_stats<device_array<float>> out{detail::channel_vector(std::int64_t(c)),
                                            detail::channel_vector(std::int64_t(c))};
  if (c == 0) return out;
  detail::bn_moments_kernel<<<tessera::cuda::grid_for(std::int64_t(c)), tessera::cuda::block_threads, 0,
                              tessera::cuda::stream()>>>(sums.sum.data(), sums.sum_sq.data(), double(count),
                                                         std::int64_t(c), out.mean.data(), out.variance.data());
  detail::launch_check(fn);
  return out;
}

namespace detail {

inline device_array<float> bn_normalize(const char* fn, const device_array<float>& x, const device_array<float>& gamma,
                                        const device_array<float>& beta, const device_array<float>& mean,
                                        const device_array<float>& variance, float eps, bool relu,
                                        std::uint8_t* mask) {
  const auto g = bn_geom(fn, x);
  require_vector(fn, "gamma", gamma, std::size_t(g.c));
  require_vector(fn, "beta", beta, std::size_t(g.c));
  require_vector(fn, "mean", mean, std::size_t(g.c));
  require_vector(fn, "variance", variance, std::size_t(g.c));
  device_array<float> y(x.shape());
  if (g.total == 0) return y;
  bn_normalize_kernel<<<tessera::cuda::grid_for(g.total), tessera::cuda::block_threads, 0, tessera::cuda::stream()>>>(
      x.data(), y.data(), mask, gamma.data(), beta.data(), mean.data(), variance.data(), eps, relu, g.total, g.c,
      g.hw, narrow(g));
  launch_check(fn);
  return y;
}

inline channel_sums<device_array<float>> bn_backward_sums(const char* fn, const device_array<float>& dy,
                                                          const device_array<float>& x, const std::uint8_t* mask,
                                                          const device_array<float>* relu_y,
                                                          const device_array<float>& mean,
                                                          const device_array<float>& variance, float eps) {
  const auto g = bn_geom(fn, x);
  require_dims(fn, "dy", dims(dy), dims(x));
  if (relu_y) require_dims(fn, "relu_y", dims(*relu_y), dims(x));
  require_vector(fn, "mean", mean, std::size_t(g.c));
  require_vector(fn, "variance", variance, std::size_t(g.c));
  channel_sums<device_array<float>> out{channel_vector(g.c), channel_vector(g.c)};
  if (g.c == 0) return out;
  const unsigned parts = bn_splits(fn, g);
  device_array<double> part({parts > 1 ? std::size_t(parts) * std::size_t(g.c) * 2 : 0});
  bn_backward_sums_kernel<<<dim3(unsigned(g.c), parts), bn_threads, 0, tessera::cuda::stream()>>>(
      dy.data(), x.data(), mask, relu_y ? relu_y->data() : nullptr, mean.data(), variance.data(), eps, g.n, g.c,
      g.hw, out.sum.data(), out.sum_sq.data(), part.data());
  launch_check(fn);
  bn_combine(fn, part, parts, g.c, variance.data(), eps, out);
  return out;
}

inline device_array<float> bn_backward_data(const char* fn, const device_array<float>& dy,
                                            const device_array<float>& x, const std::uint8_t* mask,
                                            const device_array<float>* relu_y, const device_array<float>& gamma,
                                            const device_array<float>& mean, const device_array<float>& variance,
                                            const channel_sums<device_array<float>>& sums, std::size_t count,
                                            float eps) {
  const auto g = bn_geom(fn, x);
  require_dims(fn, "dy", dims(dy), dims(x));
  if (relu_y) require_dims(fn, "relu_y", dims(*relu_y), dims(x));
  require_vector(fn, "gamma", gamma, std::size_t(g.c));
  require_vector(fn, "mean", mean, std::size_t(g.c));
  require_vector(fn, "variance", variance, std::size_t(g.c));
  require_vector(fn, "sum", sums.sum, std::size_t(g.c));
  require_vector(fn, "sum_sq", sums.sum_sq, std::size_t(g.c));
  if (count == 0) throw error(std::string(fn) + ": count must be positive");
  device_array<float> dx(x.shape());
  if (g.total == 0) return dx;
  bn_backward_data_kernel<<<tessera::cuda::grid_for(g.total), tessera::cuda::block_threads, 0,
                            tessera::cuda::stream()>>>(
      dy.data(), x.data(), mask, relu_y ? relu_y->data() : nullptr, gamma.data(), mean.data(), variance.data(),
      sums.sum.data(), sums.sum_sq.data(), double(count), eps, g.total, g.c, g.hw, narrow(g), dx.data());
  launch_check(fn);
  return dx;
}

}  // namespace detail

/// Training-mode batch norm: the batch's mean and biased variance per channel, y
/// normalised, scaled and shifted, ReLU'd when `relu` (its mask in the workspace).
inline batch_norm_training<device_array<float>, device_array<float>, device_workspace> batch_norm_forward_training(
    const device_array<float>& x, const device_array<float>& gamma, const device_array<float>& beta, float eps,
    bool relu = false) {
  constexpr const char* fn = "batch_norm_forward_training";
  const auto g = detail::bn_geom(fn, x);
  detail::require_vector(fn, "gamma", gamma, std::size_t(g.c));
  detail::require_vector(fn, "beta", beta, std::size_t(g.c));
  batch_norm_training<device_array<float>, device_array<float>, device_workspace> out;
  const std::size_t count = std::size_t(g.n * g.hw);
  auto stats = batch_norm_moments(batch_norm_sums(x), count == 0 ? 1 : count);
  if (relu) out.workspace.mask = device_array<std::uint8_t>(x.shape());
  out.y = detail::bn_normalize(fn, x, gamma, beta, stats.mean, stats.variance, eps, relu,
                               relu ? out.workspace.mask.data() : nullptr);
  out.mean = std::move(stats.mean);
  out.variance = std::move(stats.variance);
  return out;
}

/// y with the statistics given (inference; the normalisation of a batch norm whose
/// statistics were summed across ranks).
inline device_array<float> batch_norm_forward_inference(const device_array<float>& x, const device_array<float>& gamma,
                                                        const device_array<float>& beta,
                                                        const device_array<float>& mean,
                                                        const device_array<float>& variance, float eps,
                                                        bool relu = false) {
  return detail::bn_normalize("batch_norm_forward_inference", x, gamma, beta, mean, variance, eps, relu, nullptr);
}

/// The backward of batch_norm_forward_training: {dx, dgamma = sum dy * x_hat, dbeta =
/// sum dy}, dy masked by the forward's ReLU mask when `relu`.
inline batch_norm_grads<device_array<float>, device_array<float>> batch_norm_backward(
    const device_array<float>& dy, const device_array<float>& x, const device_array<float>& gamma,
    const device_array<float>& mean, const device_array<float>& variance, const device_workspace& workspace,
    float eps, bool relu = false) {
  constexpr const char* fn = "batch_norm_backward";
  const auto g = detail::bn_geom(fn, x);
  if (relu && workspace.mask.size() != x.size())
    throw error(std::string(fn) + ": relu needs the workspace of batch_norm_forward_training(..., relu = true)");
  const std::uint8_t* mask = relu ? workspace.mask.data() : nullptr;
  auto sums = detail::bn_backward_sums(fn, dy, x, mask, nullptr, mean, variance, eps);
  const std::size_t count = std::size_t(g.n * g.hw);
  batch_norm_grads<device_array<float>, device_array<float>> out;
  out.dx = detail::bn_backward_data(fn, dy, x, mask, nullptr, gamma, mean, variance, sums, count == 0 ? 1 : count,
                                    eps);
  out.dgamma = std::move(sums.sum_sq);
  out.dbeta = std::move(sums.sum);
  return out;
}

/// The local half of the split backward: {sum = sum dy, sum_sq = sum dy * x_hat} over
/// this rank's batch with the global statistics, dy masked by relu_y > 0 when given.
inline channel_sums<device_array<float>> batch_norm_backward_sums(const device_array<float>& dy,
                                                                  const device_array<float>& x,
                                                                  const device_array<float>& mean,
                                                                  const device_array<float>& variance, float eps,
                                                                  const device_array<float>* relu_y = nullptr) {
  return detail::bn_backward_sums("batch_norm_backward_sums", dy, x, nullptr, relu_y, mean, variance, eps);
}

/// The second half: dx from the sums added over every rank and the whole batch's count.
inline device_array<float> batch_norm_backward_data(const device_array<float>& dy, const device_array<float>& x,
                                                    const device_array<float>& gamma, const device_array<float>& mean,
                                                    const device_array<float>& variance,
                                                    const channel_sums<device_array<float>>& sums, std::size_t count,
                                                    float eps, const device_array<float>* relu_y = nullptr) {
  return detail::bn_backward_data("batch_norm_backward_data", dy, x, nullptr, relu_y, gamma, mean, variance, sums,
                                  count, eps);
}

/// running = (1 - momentum) running + momentum batch (variance made unbiased when
/// `unbiased`), in place.
inline void batch_norm_update_running(device_array<float>& running_mean, device_array<float>& running_var,
                                      const device_array<float>& mean, const device_array<float>& variance,
                                      std::size_t count, float momentum, bool unbiased = true) {
  constexpr const char* fn = "batch_norm_update_running";
  const std::size_t c = running_mean.size();
  detail::require_vector(fn, "running_mean", running_mean, c);
  detail::require_vector(fn, "running_var", running_var, c);
  detail::require_vector(fn, "mean", mean, c);
  detail::require_vector(fn, "variance", variance, c);
  if (c == 0) return;
  const float corr = unbiased && count > 1 ? float(double(count) / double(count - 1)) : 1.f;
  detail::bn_running_kernel<<<tessera::cuda::grid_for(std::int64_t(c)), tessera::cuda::block_threads, 0,
                              tessera::cuda::stream()>>>(running_mean.data(), running_var.data(), mean.data(),
                                                         variance.data(), std::int64_t(c), momentum, corr);
  detail::launch_check(fn);
}

}  // namespace tessera::kernels::cuda
