// 2-D convolution on NCHW float tensors through oneDNN: forward (with its bias and an
// optional fused ReLU), backward data (dx), backward weights (dw, and db when there is a
// bias) and both in one call (conv2d_backward), with stride, explicit padding per side,
// dilation and groups (kernels/conv_params.hpp). Each takes plain xt::xarray<float> or
// dnnl_tensor operands (kernels/cpu/dnnl.hpp); weights are always plain (O, C / groups,
// KH, KW).
// Primitives are cached per shape and parameters. Link tessera::dnnl.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <cstddef>
#include <span>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/kernels/cpu/dnnl.hpp>

namespace tessera::kernels::cpu {

namespace detail {

/// A convolution in oneDNN's terms: the dims of its operands (5-D grouped weights when
/// groups > 1), strides, dilations (oneDNN counts dilation - 1) and padding.
struct conv_geometry {
  dnnl_dims src, weights, dst, bias, strides, dilates, pad_l, pad_r;
  std::array<std::size_t, 4> dst_shape{};
};

inline conv_geometry conv_geom(const char* fn, std::span<const std::size_t> x, std::span<const std::size_t> w,
                               const conv2d_params& p) {
  conv_geometry g;
  g.dst_shape = conv2d_output_shape(fn, x, w, p);
  g.src = to_dims(x);
  g.dst = to_dims(g.dst_shape);
  if (p.groups > 1)
    g.weights = {p.groups, dnnl::memory::dim(w[0]) / p.groups, dnnl::memory::dim(w[1]), dnnl::memory::dim(w[2]),
                 dnnl::memory::dim(w[3])};
  else
    g.weights = to_dims(w);
  g.bias = {dnnl::memory::dim(w[0])};
  g.strides = {p.stride_h, p.stride_w};
  g.dilates = {p.dilation_h - 1, p.dilation_w - 1};
  g.pad_l = {p.pad.top, p.pad.left};
  g.pad_r = {p.pad.bottom, p.pad.right};
  return g;
}

inline primitive_key conv_key(std::int64_t kind, const conv_geometry& g, const conv2d_params& p, bool bias,
                              bool relu) {
  primitive_key k;
  k.add(kind).add(g.src).add(g.weights).add(p.stride_h).add(p.stride_w).add(p.pad).add(p.dilation_h);
  k.add(p.dilation_w).add(p.groups).add(bias).add(relu);
  return k;
}

inline dnnl_md any_desc(const dnnl_dims& d) {
  return dnnl_md(d, dnnl::memory::data_type::f32, dnnl_tag::any);
}

/// The forward primitive descriptor with every layout left to oneDNN (`any`), as the
/// backward ones are hinted with.
inline dnnl::convolution_forward::primitive_desc conv_forward_pd(const conv_geometry& g, bool bias, bool relu) {
  const dnnl::convolution_forward::desc d =
      bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                             any_desc(g.src), any_desc(g.weights), plain_desc(g.bias),
                                             any_desc(g.dst), g.strides, g.dilates, g.pad_l, g.pad_r)
           : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                             any_desc(g.src), any_desc(g.weights), any_desc(g.dst), g.strides,
                                             g.dilates, g.pad_l, g.pad_r);
  dnnl::primitive_attr attr;
  if (relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(ops);
  }
  return dnnl::convolution_forward::primitive_desc(d, attr, dnnl_engine());
}

struct conv_forward_entry {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
};
struct conv_backward_data_entry {
  dnnl::convolution_backward_data::primitive_desc pd;
  dnnl::convolution_backward_data prim;
};
struct conv_backward_weights_entry {
  dnnl::convolution_backward_weights::primitive_desc pd;
  dnnl::convolution_backward_weights prim;
};

}  // namespace detail

/// y = conv(x, w) + bias, then max(y, 0) when `relu` (oneDNN's post-op): x (N, C, H, W),
/// w (O, C / groups, KH, KW), bias (O,) or null; y (N, O, OH, OW) with OH = floor((H +
/// top + bottom - dilation_h * (KH - 1) - 1) / stride_h) + 1 (kernels/conv_params.hpp).
/// Takes and returns xarrays (plain NCHW) or dnnl_tensors (y in the format the primitive
/// chose). Throws tessera::error naming conv2d_forward on shapes that do not fit.
template <dnnl_operand X>
X conv2d_forward(const X& x, const xt::xarray<float>& w, const xt::xarray<float>* bias, const conv2d_params& p,
                 bool relu = false) {
  constexpr const char* fn = "conv2d_forward";
  const auto xs = detail::shape_of(x);
  const auto g = detail::conv_geom(fn, xs, std::span<const std::size_t>(w.shape().data(), w.shape().size()), p);
  if (bias) detail::require_vector(fn, "bias", *bias, g.dst_shape[1]);
  return detail::dnnl_call(fn, [&] {
    const auto& e = detail::cached<detail::conv_forward_entry>(detail::conv_key(1, g, p, bias, relu), [&] {
      ++detail::primitives_created();
      auto pd = detail::conv_forward_pd(g, bias, relu);
      return detail::conv_forward_entry{pd, dnnl::convolution_forward(pd)};
    });
    const auto src = detail::input_as(x, e.pd.src_desc());
    const auto wei = detail::as_desc(detail::wrap(w, g.weights), e.pd.weights_desc());
    detail::output_slot<X> dst(e.pd.dst_desc(), g.dst, g.dst_shape);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, src.get()}, {DNNL_ARG_WEIGHTS, wei.get()}, {DNNL_ARG_DST, dst.memory()}};
    if (bias) args.emplace(DNNL_ARG_BIAS, detail::wrap(*bias));
    e.prim.execute(dnnl_stream(), args);
    return dst.take();
  });
}

namespace detail {

inline const conv_backward_data_entry& backward_data_entry(const conv_geometry& g, const conv2d_params& p) {
  return cached<conv_backward_data_entry>(conv_key(2, g, p, false, false), [&] {
    ++primitives_created();
    auto hint = conv_forward_pd(g, false, false);
    dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, any_desc(g.src),
                                            any_desc(g.weights), any_desc(g.dst), g.strides, g.dilates, g.pad_l,
                                            g.pad_r);
    dnnl::convolution_backward_data::primitive_desc pd(d, dnnl_engine(), hint);
    return conv_backward_data_entry{pd, dnnl::convolution_backward_data(pd)};
  });
}

inline const conv_backward_weights_entry& backward_weights_entry(const conv_geometry& g, const conv2d_params& p,
                                                                 bool bias) {
  return cached<conv_backward_weights_entry>(conv_key(3, g, p, bias, false), [&] {
    ++primitives_created();
    auto hint = conv_forward_pd(g, bias, false);
    const dnnl::convolution_backward_weights::desc d =
        bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any_desc(g.src),
                                                        any_desc(g.weights), plain_desc(g.bias), any_desc(g.dst),
                                                        g.strides, g.dilates, g.pad_l, g.pad_r)
             : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any_desc(g.src),
                                                        any_desc(g.weights), any_desc(g.dst), g.strides, g.dilates,
                                                        g.pad_l, g.pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(d, dnnl_engine(), hint);
    return conv_backward_weights_entry{pd, dnnl::convolution_backward_weights(pd)};
  });
}

/// dx of shape x_shape from dy's memory `dy` (any layout; reordered to the primitive's).
template <dnnl_operand X>
X run_backward_data(const dnnl::memory& dy, const xt::xarray<float>& w, std::span<const std::size_t> x_shape,
                    const conv_geometry& g, const conv2d_params& p) {
  const auto& e = backward_data_entry(g, p);
  const auto ddst = as_desc(dy, e.pd.diff_dst_desc());
  const auto wei = as_desc(wrap(w, g.weights), e.pd.weights_desc());
  output_slot<X> dsrc(e.pd.diff_src_desc(), g.src, x_shape);
  e.prim.execute(dnnl_stream(),
                 {{DNNL_ARG_DIFF_DST, ddst.get()}, {DNNL_ARG_WEIGHTS, wei.get()}, {DNNL_ARG_DIFF_SRC, dsrc.memory()}});
  return dsrc.take();
}

/// dw (and db when `bias`) from dy's memory in the primitive's layout (`ddst`) and x.
template <dnnl_operand X>
conv2d_weight_grads<xt::xarray<float>> run_backward_weights(const conv_backward_weights_entry& e,
                                                            const dnnl::memory& ddst, const X& x,
                                                            std::span<const std::size_t> w_shape, bool bias,
                                                            const conv_geometry& g) {
  const auto src = input_as(x, e.pd.src_desc());
  output_slot<xt::xarray<float>> dw(e.pd.diff_weights_desc(), g.weights, w_shape);
  conv2d_weight_grads<xt::xarray<float>> out{xt::xarray<float>(), vector_of(0)};
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, src.get()}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_WEIGHTS, dw.memory()}};
  if (bias) {
    out.db = vector_of(g.dst_shape[1]);
    args.emplace(DNNL_ARG_DIFF_BIAS, wrap(out.db));
  }
  e.prim.execute(dnnl_stream(), args);
  out.dw = dw.take();
  return out;
}

}  // namespace detail

/// dx = the gradient of sum(dy * conv2d_forward(x, w, no bias)) with respect to x, of
/// shape x_shape (N, C, H, W); dy (N, O, OH, OW). The transposed convolution.
template <dnnl_operand X>
X conv2d_backward_data(const X& dy, const xt::xarray<float>& w, std::span<const std::size_t> x_shape,
                       const conv2d_params& p) {
  constexpr const char* fn = "conv2d_backward_data";
  const auto g = detail::conv_geom(fn, x_shape, std::span<const std::size_t>(w.shape().data(), w.shape().size()), p);
  detail::require_dims(fn, "dy", detail::shape_of(dy), g.dst_shape);
  return detail::dnnl_call(fn, [&] { return detail::run_backward_data<X>(detail::memory_of(dy), w, x_shape, g, p); });
}
/// The same with x's shape as a braced list or vector.
template <dnnl_operand X>
X conv2d_backward_data(const X& dy, const xt::xarray<float>& w, const std::vector<std::size_t>& x_shape,
                       const conv2d_params& p) {
  return conv2d_backward_data(dy, w, std::span<const std::size_t>(x_shape), p);
}

/// dw (w_shape: O, C / groups, KH, KW) = the gradient of sum(dy * conv2d_forward(x, w,
/// b)) with respect to w, and db (O,) = dy summed over (N, OH, OW) when `bias` (else db
/// is empty, of shape (0,)).
template <dnnl_operand X>
conv2d_weight_grads<xt::xarray<float>> conv2d_backward_weights(const X& dy, const X& x,
                                                               std::span<const std::size_t> w_shape, bool bias,
                                                               const conv2d_params& p) {
  constexpr const char* fn = "conv2d_backward_weights";
  const auto g = detail::conv_geom(fn, detail::shape_of(x), w_shape, p);
  detail::require_dims(fn, "dy", detail::shape_of(dy), g.dst_shape);
  return detail::dnnl_call(fn, [&] {
    const auto& e = detail::backward_weights_entry(g, p, bias);
    const auto ddst = detail::input_as(dy, e.pd.diff_dst_desc());
    return detail::run_backward_weights(e, ddst.get(), x, w_shape, bias, g);
  });
}
/// The same with w's shape as a braced list or vector.
template <dnnl_operand X>
conv2d_weight_grads<xt::xarray<float>> conv2d_backward_weights(const X& dy, const X& x,
                                                               const std::vector<std::size_t>& w_shape, bool bias,
                                                               const conv2d_params& p) {
  return conv2d_backward_weights(dy, x, std::span<const std::size_t>(w_shape), bias, p);
}

/// The whole backward of conv2d_forward(x, w, bias or none): dw (and db when `bias`) as
/// conv2d_backward_weights gives them, and dx as conv2d_backward_data does when
/// `need_dx` (else dx is empty, of shape (0,)). dy is brought to the primitives' layout
/// once for both, where conv2d_backward_data and conv2d_backward_weights each reorder it.
template <dnnl_operand X>
conv2d_grads<X, xt::xarray<float>> conv2d_backward(const X& dy, const X& x, const xt::xarray<float>& w,
                                                   bool need_dx, bool bias, const conv2d_params& p) {
  constexpr const char* fn = "conv2d_backward";
  const auto xs = detail::shape_of(x);
  const auto ws = std::span<const std::size_t>(w.shape().data(), w.shape().size());
  const auto g = detail::conv_geom(fn, xs, ws, p);
  detail::require_dims(fn, "dy", detail::shape_of(dy), g.dst_shape);
  return detail::dnnl_call(fn, [&] {
    const auto& e = detail::backward_weights_entry(g, p, bias);
    const auto ddst = detail::input_as(dy, e.pd.diff_dst_desc());
    conv2d_weight_grads<xt::xarray<float>> wg = detail::run_backward_weights(e, ddst.get(), x, ws, bias, g);
    conv2d_grads<X, xt::xarray<float>> out{X(), std::move(wg.dw), std::move(wg.db)};
    if (need_dx) out.dx = detail::run_backward_data<X>(ddst.get(), w, xs, g, p);
    else if constexpr (std::same_as<X, xt::xarray<float>>) out.dx = detail::vector_of(0);
    return out;
  });
}

}  // namespace tessera::kernels::cpu
