// 2-D convolution on NCHW float device arrays through cuDNN, the GPU twin of
// kernels/cpu/conv.hpp: forward (bias, optional ReLU), backward data and backward
// weights (and bias), with the same parameters (kernels/conv_params.hpp), shapes and
// error texts. cuDNN's descriptors pad each axis the same on both sides: a padding that
// differs before and after is applied explicitly (a padded copy of x, a cropped dx).
// Plans (descriptors and algorithms, from cuDNN's heuristics) are cached per shape,
// parameters, device and precision. fp32 math unless set_matmul_precision asks for
// TF32 (kernels/cuda/matmul.cuh). nvcc only; link tessera::cudnn.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/runtime.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/kernels/cuda/common.cuh>
#include <tessera/kernels/cuda/cudnn.cuh>
#include <tessera/kernels/cuda/elementwise.cuh>
#include <tessera/kernels/cuda/matmul.cuh>

namespace tessera::kernels::cuda {

namespace detail {

/// A convolution as cuDNN runs it: descriptors of x (padded where the padding is
/// uneven), w, y and the bias, one convolution descriptor per direction (each with its
/// algorithm's math type), the algorithms and their workspace sizes.
struct conv_plan {
  std::array<std::size_t, 4> x_shape{}, y_shape{};  // x_shape: what cuDNN sees (padded)
  pad2d explicit_pad{};
  bool padded = false;
  tensor_desc x, y, b;
  filter_desc w;
  conv_desc fwd_conv, data_conv, filter_conv;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t data{};
  cudnnConvolutionBwdFilterAlgo_t filter{};
  std::size_t fwd_bytes = 0, data_bytes = 0, filter_bytes = 0;
};

inline void set_conv(const conv_desc& c, int pad_h, int pad_w, const conv2d_params& p, cudnnMathType_t math) {
  TESSERA_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(c, pad_h, pad_w, int(p.stride_h), int(p.stride_w),
                                                      int(p.dilation_h), int(p.dilation_w), CUDNN_CROSS_CORRELATION,
                                                      CUDNN_DATA_FLOAT));
  TESSERA_CUDNN_CHECK(cudnnSetConvolutionGroupCount(c, int(p.groups)));
  TESSERA_CUDNN_CHECK(cudnnSetConvolutionMathType(c, math));
}

/// The first of cuDNN's ranked algorithms that runs (asked under c's math type). In fp32
/// mode c keeps CUDNN_FMA_MATH, so no algorithm rounds its inputs to TF32; otherwise c
/// takes the chosen algorithm's math type.
template <class Perf>
const Perf& pick_algo(const char* fn, const Perf* perf, int n, bool fp32, const conv_desc& c) {
  const Perf* best = nullptr;
  const auto plain = [](cudnnMathType_t m) { return m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH; };
  for (int i = 0; i < n && !best; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && (!fp32 || plain(perf[i].mathType))) best = &perf[i];
  if (!best) throw error(std::string(fn) + ": cuDNN offers no algorithm for this convolution");
  TESSERA_CUDNN_CHECK(cudnnSetConvolutionMathType(c, fp32 ? CUDNN_FMA_MATH : best->mathType));
  return *best;
}

inline const conv_plan& plan_conv(const char* fn, std::span<const std::size_t> x, std::span<const std::size_t> w,
                                  const conv2d_params& p) {
  const auto y = conv2d_output_shape(fn, x, w, p);
  const bool fp32 = get_matmul_precision() == matmul_precision::fp32;
  std::vector<std::int64_t> key{tessera::cuda::current_device(), fp32, p.stride_h, p.stride_w, p.pad.top,
                                p.pad.bottom, p.pad.left, p.pad.right, p.dilation_h, p.dilation_w, p.groups};
  key.insert(key.end(), x.begin(), x.end());
  key.insert(key.end(), w.begin(), w.end());
  thread_local std::map<std::vector<std::int64_t>, std::unique_ptr<conv_plan>> plans;
  if (auto it = plans.find(key); it != plans.end()) return *it->second;

  auto plan = std::make_unique<conv_plan>();
  conv_plan& c = *plan;
  c.y_shape = y;
  c.padded = p.pad.top != p.pad.bottom || p.pad.left != p.pad.right;
  c.explicit_pad = c.padded ? p.pad : pad2d{};
  c.x_shape = {x[0], x[1], x[2] + std::size_t(c.explicit_pad.top + c.explicit_pad.bottom),
               x[3] + std::size_t(c.explicit_pad.left + c.explicit_pad.right)};
  const int pad_h = c.padded ? 0 : int(p.pad.top), pad_w = c.padded ? 0 : int(p.pad.left);
  c.x = nchw_desc(c.x_shape);
  c.y = nchw_desc(c.y_shape);
  TESSERA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c.b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, int(w[0]), 1, 1));
  TESSERA_CUDNN_CHECK(
      cudnnSetFilter4dDescriptor(c.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, int(w[0]), int(w[1]), int(w[2]), int(w[3])));
  const cudnnMathType_t math = fp32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  for (const conv_desc* d : {&c.fwd_conv, &c.data_conv, &c.filter_conv}) set_conv(*d, pad_h, pad_w, p, math);

  int n = 0, h = 0, wd = 0, ch = 0;
  TESSERA_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(c.fwd_conv, c.x, c.w, &n, &ch, &h, &wd));
  if (std::size_t(n) != y[0] || std::size_t(ch) != y[1] || std::size_t(h) != y[2] || std::size_t(wd) != y[3])
    throw error(std::string(fn) + ": cuDNN's output " + tessera::detail::dims_text(std::array<std::size_t, 4>{
                                                             std::size_t(n), std::size_t(ch), std::size_t(h),
                                                             std::size_t(wd)}) +
                " differs from " + tessera::detail::dims_text(y));

  const cudnnHandle_t hd = cudnn();
  cudnnConvolutionFwdAlgoPerf_t fp[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int got = 0;
  TESSERA_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(hd, c.x, c.w, c.fwd_conv, c.y,
                                                             CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fp));
  c.fwd = pick_algo(fn, fp, got, fp32, c.fwd_conv).algo;
  TESSERA_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(hd, c.x, c.w, c.fwd_conv, c.y, c.fwd, &c.fwd_bytes));

  cudnnConvolutionBwdDataAlgoPerf_t dp[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  TESSERA_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(hd, c.w, c.y, c.data_conv, c.x,
                                                                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, dp));
  c.data = pick_algo(fn, dp, got, fp32, c.data_conv).algo;
  TESSERA_CUDNN_CHECK(
      cudnnGetConvolutionBackwardDataWorkspaceSize(hd, c.w, c.y, c.data_conv, c.x, c.data, &c.data_bytes));

  cudnnConvolutionBwdFilterAlgoPerf_t wp[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  TESSERA_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
      hd, c.x, c.y, c.filter_conv, c.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, wp));
  c.filter = pick_algo(fn, wp, got, fp32, c.filter_conv).algo;
  TESSERA_CUDNN_CHECK(
      cudnnGetConvolutionBackwardFilterWorkspaceSize(hd, c.x, c.y, c.filter_conv, c.w, c.filter, &c.filter_bytes));

  return *plans.emplace(std::move(key), std::move(plan)).first->second;
}

inline device_array<std::uint8_t> workspace_of(std::size_t bytes) {
  return device_array<std::uint8_t>({bytes});
}

}  // namespace detail

/// y = conv(x, w) + bias, then max(y, 0) when `relu`: x (N, C, H, W), w (O, C / groups,
/// KH, KW), bias (O,) or null; y (N, O, OH, OW). As kernels/cpu/conv.hpp's.
inline device_array<float> conv2d_forward(const device_array<float>& x, const device_array<float>& w,
                                          const device_array<float>* bias, const conv2d_params& p,
                                          bool relu = false) {
  constexpr const char* fn = "conv2d_forward";
  const auto& c = detail::plan_conv(fn, detail::dims(x), detail::dims(w), p);
  if (bias) detail::require_vector(fn, "bias", *bias, c.y_shape[1]);
  device_array<float> y(std::vector<std::size_t>(c.y_shape.begin(), c.y_shape.end()));
  if (y.size() == 0) return y;
  device_array<float> xp;
  if (c.padded) xp = detail::pad_nchw(x, c.explicit_pad, 0.f);
  const device_array<float>& xin = c.padded ? xp : x;
  device_array<std::uint8_t> ws = detail::workspace_of(c.fwd_bytes);
  const float one = 1.f, zero = 0.f;
  TESSERA_CUDNN_CHECK(cudnnConvolutionForward(detail::cudnn(), &one, c.x, xin.data(), c.w, w.data(), c.fwd_conv,
                                              c.fwd, ws.data(), c.fwd_bytes, &zero, c.y, y.data()));
  if (bias) TESSERA_CUDNN_CHECK(cudnnAddTensor(detail::cudnn(), &one, c.b, bias->data(), &one, c.y, y.data()));
  if (relu) detail::map_contiguous(fn, y.data(), std::int64_t(y.size()), detail::relu_f{}, y.data());
  return y;
}

/// dx of shape x_shape for dy (N, O, OH, OW): the transposed convolution.
inline device_array<float> conv2d_backward_data(const device_array<float>& dy, const device_array<float>& w,
                                                std::span<const std::size_t> x_shape, const conv2d_params& p) {
  constexpr const char* fn = "conv2d_backward_data";
  const auto& c = detail::plan_conv(fn, x_shape, detail::dims(w), p);
  detail::require_dims(fn, "dy", detail::dims(dy), c.y_shape);
  device_array<float> dxp(std::vector<std::size_t>(c.x_shape.begin(), c.x_shape.end()));
  if (dxp.size() == 0) return dxp;
  device_array<std::uint8_t> ws = detail::workspace_of(c.data_bytes);
  const float one = 1.f, zero = 0.f;
  TESSERA_CUDNN_CHECK(cudnnConvolutionBackwardData(detail::cudnn(), &one, c.w, w.data(), c.y, dy.data(), c.data_conv,
                                                   c.data, ws.data(), c.data_bytes, &zero, c.x, dxp.data()));
  return c.padded ? detail::crop_nchw(dxp, x_shape, c.explicit_pad) : dxp;
}
inline device_array<float> conv2d_backward_data(const device_array<float>& dy, const device_array<float>& w,
                                                const std::vector<std::size_t>& x_shape, const conv2d_params& p) {
  return conv2d_backward_data(dy, w, std::span<const std::size_t>(x_shape), p);
}

/// dw (w_shape) and, when `bias`, db (O,) = dy summed over (N, OH, OW); db is (0,)
/// otherwise.
inline conv2d_weight_grads<device_array<float>> conv2d_backward_weights(const device_array<float>& dy,
                                                                        const device_array<float>& x,
                                                                        std::span<const std::size_t> w_shape,
                                                                        bool bias, const conv2d_params& p) {
  constexpr const char* fn = "conv2d_backward_weights";
  const auto& c = detail::plan_conv(fn, detail::dims(x), w_shape, p);
  detail::require_dims(fn, "dy", detail::dims(dy), c.y_shape);
  conv2d_weight_grads<device_array<float>> out{device_array<float>(std::vector<std::size_t>(w_shape.begin(),
                                                                                            w_shape.end())),
                                               device_array<float>({bias ? w_shape[0] : 0})};
  const float one = 1.f, zero = 0.f;
  if (dy.size() == 0 || x.size() == 0) {
    TESSERA_CUDA_CHECK(cudaMemsetAsync(out.dw.data(), 0, out.dw.size() * sizeof(float), tessera::cuda::stream()));
    if (bias)
      TESSERA_CUDA_CHECK(cudaMemsetAsync(out.db.data(), 0, out.db.size() * sizeof(float), tessera::cuda::stream()));
    return out;
  }
  device_array<float> xp;
  if (c.padded) xp = detail::pad_nchw(x, c.explicit_pad, 0.f);
  const device_array<float>& xin = c.padded ? xp : x;
  device_array<std::uint8_t> ws = detail::workspace_of(c.filter_bytes);
  TESSERA_CUDNN_CHECK(cudnnConvolutionBackwardFilter(detail::cudnn(), &one, c.x, xin.data(), c.y, dy.data(),
                                                     c.filter_conv, c.filter, ws.data(), c.filter_bytes, &zero, c.w,
                                                     out.dw.data()));
  if (bias)
    TESSERA_CUDNN_CHECK(
        cudnnConvolutionBackwardBias(detail::cudnn(), &one, c.y, dy.data(), &zero, c.b, out.db.data()));
  return out;
}
inline conv2d_weight_grads<device_array<float>> conv2d_backward_weights(const device_array<float>& dy,
                                                                        const device_array<float>& x,
                                                                        const std::vector<std::size_t>& w_shape,
                                                                        bool bias, const conv2d_params& p) {
  return conv2d_backward_weights(dy, x, std::span<const std::size_t>(w_shape), bias, p);
}

/// The whole backward of conv2d_forward(x, w, bias or none): dw and db as
/// conv2d_backward_weights gives them, and dx as conv2d_backward_data does when `need_dx`
/// (else dx is empty, of shape (0,)).
inline conv2d_grads<device_array<float>> conv2d_backward(const device_array<float>& dy, const device_array<float>& x,
                                                         const device_array<float>& w, bool need_dx, bool bias,
                                                         const conv2d_params& p) {
  conv2d_weight_grads<device_array<float>> wg = conv2d_backward_weights(dy, x, detail::dims(w), bias, p);
  return {need_dx ? conv2d_backward_data(dy, w, detail::dims(x), p) : device_array<float>({0}), std::move(wg.dw),
          std::move(wg.db)};
}

}  // namespace tessera::kernels::cuda
