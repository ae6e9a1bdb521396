// 2-D max and average pooling and global average pooling on NCHW float tensors through
// oneDNN, forward and backward, with the window of kernels/conv_params.hpp: kernel,
// stride, explicit padding per side, PyTorch's ceil_mode (as extra padding after the
// image), and for averages the choice of counting the padding. Takes plain
// xt::xarray<float> or dnnl_tensor operands. Link tessera::dnnl.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/kernels/cpu/dnnl.hpp>

namespace tessera::kernels::cpu {

namespace detail {

/// A pooling in oneDNN's terms. pad_r includes ceil_mode's extra padding. `rescale`: an
/// average that counts the padding but whose windows reach into ceil_mode's extra
/// padding, which PyTorch does not count: oneDNN averages over the input elements and
/// the result is scaled by (input elements) / (input and padding elements) per position.
struct pool_geometry {
  dnnl_dims src, dst, kernel, strides, pad_l, pad_r;
  std::array<std::size_t, 4> dst_shape{};
  dnnl::algorithm alg = dnnl::algorithm::pooling_max;
  bool rescale = false;
};

inline pool_geometry pool_geom(const char* fn, std::span<const std::size_t> x, const pool2d_params& p, bool max) {
  pool_geometry g;
  g.dst_shape = pool2d_output_shape(fn, x, p);
  g.src = to_dims(x);
  g.dst = to_dims(g.dst_shape);
  g.kernel = {p.kernel_h, p.kernel_w};
  g.strides = {p.stride_h, p.stride_w};
  g.pad_l = {p.pad.top, p.pad.left};
  const index_t bottom =
      effective_after(index_t(x[2]), p.kernel_h, p.stride_h, p.pad.top, p.pad.bottom, index_t(g.dst_shape[2]));
  const index_t right =
      effective_after(index_t(x[3]), p.kernel_w, p.stride_w, p.pad.left, p.pad.right, index_t(g.dst_shape[3]));
  g.pad_r = {bottom, right};
  const bool extended = bottom > p.pad.bottom || right > p.pad.right;
  if (max) {
    g.alg = dnnl::algorithm::pooling_max;
  } else if (p.count_include_pad && !extended) {
    g.alg = dnnl::algorithm::pooling_avg_include_padding;
  } else {
    g.alg = dnnl::algorithm::pooling_avg_exclude_padding;
    g.rescale = p.count_include_pad;
  }
  return g;
}

inline primitive_key pool_key(std::int64_t kind, const dnnl_md& src, const pool_geometry& g) {
  primitive_key k;
  k.add(kind).add(src).add(g.kernel).add(g.strides).add(g.pad_l).add(g.pad_r).add(std::int64_t(g.alg));
  return k;
}

inline dnnl::pooling_forward::primitive_desc pool_forward_pd(const dnnl_md& src, const pool_geometry& g) {
  return dnnl::pooling_forward::primitive_desc(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, g.alg, src,
                                  dnnl_md(g.dst, dnnl::memory::data_type::f32, dnnl_tag::any), g.strides, g.kernel,
                                  g.pad_l, g.pad_r),
      dnnl_engine());
}

struct pool_forward_entry {
  dnnl::pooling_forward::primitive_desc pd;
  dnnl::pooling_forward prim;
};
struct pool_backward_entry {
  dnnl::pooling_backward::primitive_desc pd;
  dnnl::pooling_backward prim;
};

/// The (N, C)-independent factor of each output position of a `rescale` average (see
/// pool_geometry): (input elements in the window) / (elements within the explicit
/// padding), PyTorch's divisor over oneDNN's.
inline std::vector<float> avg_rescale_factors(std::span<const std::size_t> x, const pool2d_params& p,
                                              const pool_geometry& g) {
  const auto count = [](index_t start, index_t k, index_t lo, index_t hi) {
    return std::max<index_t>(0, std::min(start + k, hi) - std::max(start, lo));
  };
  const index_t oh = index_t(g.dst_shape[2]), ow = index_t(g.dst_shape[3]);
  const index_t h = index_t(x[2]), w = index_t(x[3]);
  std::vector<float> f(std::size_t(oh * ow));
  for (index_t i = 0; i < oh; ++i)
    for (index_t j = 0; j < ow; ++j) {
      const index_t hs = i * p.stride_h - p.pad.top, ws = j * p.stride_w - p.pad.left;
      const index_t inside = count(hs, p.kernel_h, 0, h) * count(ws, p.kernel_w, 0, w);
      const index_t padded =
          count(hs, p.kernel_h, -p.pad.top, h + p.pad.bottom) * count(ws, p.kernel_w, -p.pad.left, w + p.pad.right);
      f[std::size_t(i * ow + j)] = float(inside) / float(padded);
    }
  return f;
}

/// y (plain NCHW) *= the factor of its position.
inline void scale_planes(xt::xarray<float>& y, const std::vector<float>& f) {
  const std::size_t plane = f.size();
  for (std::size_t o = 0; o < y.size(); o += plane)
    for (std::size_t i = 0; i < plane; ++i) y.data()[o + i] *= f[i];
}

/// A plain copy of y scaled by the factors (for the rare rescaled average).
template <dnnl_operand X>
xt::xarray<float> scaled_plain(const X& y, const std::vector<float>& f) {
  xt::xarray<float> out;
  if constexpr (std::same_as<X, dnnl_tensor>) out = y.to_xarray();
  else out = y;
  scale_planes(out, f);
  return out;
}

/// The format tag of a 4-D descriptor among those the pooling kernels meet (plain,
/// channels-last, channel-blocked), or undef.
inline dnnl_tag tag_of(const dnnl_md& md) {
  for (dnnl_tag t : {dnnl_tag::nchw, dnnl_tag::nhwc, dnnl_tag::nChw16c, dnnl_tag::nChw8c, dnnl_tag::nChw4c})
    if (md == dnnl_md(md.dims(), dnnl::memory::data_type::f32, t)) return t;
  return dnnl_tag::undef;
}

template <dnnl_operand X>
X pool_forward(const char* fn, const X& x, const pool2d_params& p, bool max, dnnl_workspace* ws) {
  const auto xs = shape_of(x);
  const auto g = pool_geom(fn, xs, p, max);
  return dnnl_call(fn, [&]() -> X {
    const dnnl::memory src = memory_of(x);
    const auto& e = cached<pool_forward_entry>(pool_key(21, src.get_desc(), g), [&] {
      ++primitives_created();
      auto pd = pool_forward_pd(src.get_desc(), g);
      return pool_forward_entry{pd, dnnl::pooling_forward(pd)};
    });
    output_slot<X> dst(e.pd.dst_desc(), g.dst, g.dst_shape);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst.memory()}};
    if (ws && e.pd.workspace_desc().get_size() > 0) {
      ws->memory = std::make_shared<dnnl::memory>(e.pd.workspace_desc(), dnnl_engine());
      args.emplace(DNNL_ARG_WORKSPACE, *ws->memory);
    }
    e.prim.execute(dnnl_stream(), args);
    X y = dst.take();
    if (!g.rescale) return y;
    xt::xarray<float> scaled = scaled_plain(y, avg_rescale_factors(xs, p, g));
    if constexpr (std::same_as<X, dnnl_tensor>) return dnnl_tensor::from_xarray(scaled);
    else return scaled;
  });
}

/// dx of shape x_shape for dy. Max pooling: `src` is x's layout (the forward's) and `ws`
/// the forward's workspace; averages: `src` is undefined and x's layout follows dy's.
template <dnnl_operand X>
X pool_backward(const char* fn, const X& dy, std::span<const std::size_t> x_shape, const pool2d_params& p, bool max,
                const dnnl_md* src, const dnnl_workspace* ws) {
  const auto g = pool_geom(fn, x_shape, p, max);
  require_dims(fn, "dy", shape_of(dy), g.dst_shape);
  return dnnl_call(fn, [&]() -> X {
    dnnl::memory ddst_in = memory_of(dy);
    xt::xarray<float> scaled;  // keeps a rescaled dy alive
    if (g.rescale) {
      scaled = scaled_plain(dy, avg_rescale_factors(x_shape, p, g));
      ddst_in = wrap(scaled);
    }
    std::optional<scratch_memory> plain_dy;  // dy made plain, when its layout is none of tag_of's
    dnnl_md src_md;
    if (src) {
      src_md = *src;
    } else {
      dnnl_tag t = tag_of(ddst_in.get_desc());
      if (t == dnnl_tag::undef) {
        plain_dy.emplace(as_desc(ddst_in, plain_desc(g.dst)));
        ddst_in = plain_dy->get();
        t = dnnl_tag::nchw;
      }
      src_md = dnnl_md(g.src, dnnl::memory::data_type::f32, t);
    }
    const auto& e = cached<pool_backward_entry>(pool_key(22, src_md, g), [&] {
      ++primitives_created();
      auto hint = pool_forward_pd(src_md, g);
      dnnl::pooling_backward::primitive_desc pd(
          dnnl::pooling_backward::desc(g.alg, src_md, dnnl_md(g.dst, dnnl::memory::data_type::f32, dnnl_tag::any),
                                       g.strides, g.kernel, g.pad_l, g.pad_r),
          dnnl_engine(), hint);
      return pool_backward_entry{pd, dnnl::pooling_backward(pd)};
    });
    const scratch_memory ddst = as_desc(ddst_in, e.pd.diff_dst_desc());
    output_slot<X> dsrc(e.pd.diff_src_desc(), g.src, x_shape);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DIFF_DST, ddst.get()}, {DNNL_ARG_DIFF_SRC, dsrc.memory()}};
    if (max) args.emplace(DNNL_ARG_WORKSPACE, *ws->memory);
    e.prim.execute(dnnl_stream(), args);
    return dsrc.take();
  });
}

inline pool2d_params global_window(const char* fn, std::span<const std::size_t> x) {
  tessera::detail::require_nchw(fn, "x", x);
  return pool2d_params{index_t(x[2]), index_t(x[3]), 1, 1};
}

}  // namespace detail

/// Max pooling: y[n, c, i, j] = the maximum of x over the window at (i * stride_h -
/// top, j * stride_w - left) (padding never wins), and the workspace its backward needs
/// (the positions of the maxima, in the layout of x). x (N, C, H, W); y (N, C, OH, OW).
template <dnnl_operand X>
max_pool2d_result<X, dnnl_workspace> max_pool2d_forward(const X& x, const pool2d_params& p) {
  max_pool2d_result<X, dnnl_workspace> out;
  out.y = detail::pool_forward("max_pool2d_forward", x, p, true, &out.workspace);
  return out;
}

/// dx: dy routed to the position of each window's maximum (summed where windows
/// overlap), from the forward's workspace. x is the forward's input, in the same form
/// (its shape and layout); y, the forward's output, is not read here (the GPU kernels
/// read it), so an empty one will do.
template <dnnl_operand X>
X max_pool2d_backward(const X& dy, const X& x, const X& y, const dnnl_workspace& workspace,
                      const pool2d_params& p) {
  (void)y;
  constexpr const char* fn = "max_pool2d_backward";
  if (workspace.empty()) throw error(std::string(fn) + ": the workspace is empty (max_pool2d_forward's)");
  const detail::dnnl_md src = detail::memory_of(x).get_desc();
  return detail::pool_backward(fn, dy, detail::shape_of(x), p, true, &src, &workspace);
}

/// Average pooling: the mean of x over each window, the divisor counting the padding
/// when count_include_pad (never ceil_mode's extra windows' part past the padding, as
/// PyTorch), else the input elements only.
template <dnnl_operand X>
X avg_pool2d_forward(const X& x, const pool2d_params& p) {
  return detail::pool_forward("avg_pool2d_forward", x, p, false, nullptr);
}

/// dx of shape x_shape: each dy spread evenly (by the forward's divisor) over its window.
template <dnnl_operand X>
X avg_pool2d_backward(const X& dy, std::span<const std::size_t> x_shape, const pool2d_params& p) {
  return detail::pool_backward("avg_pool2d_backward", dy, x_shape, p, false, nullptr, nullptr);
}
template <dnnl_operand X>
X avg_pool2d_backward(const X& dy, const std::vector<std::size_t>& x_shape, const pool2d_params& p) {
  return avg_pool2d_backward(dy, std::span<const std::size_t>(x_shape), p);
}

/// Global average pooling: y (N, C, 1, 1) = the mean of x (N, C, H, W) over (H, W).
template <dnnl_operand X>
X global_avg_pool2d_forward(const X& x) {
  constexpr const char* fn = "global_avg_pool2d_forward";
  const auto xs = detail::shape_of(x);
  return detail::pool_forward(fn, x, detail::global_window(fn, xs), false, nullptr);
}

/// dx (x_shape) = dy (N, C, 1, 1) / (H * W) at every position.
template <dnnl_operand X>
X global_avg_pool2d_backward(const X& dy, std::span<const std::size_t> x_shape) {
  constexpr const char* fn = "global_avg_pool2d_backward";
  return detail::pool_backward(fn, dy, x_shape, detail::global_window(fn, x_shape), false, nullptr, nullptr);
}
template <dnnl_operand X>
X global_avg_pool2d_backward(const X& dy, const std::vector<std::size_t>& x_shape) {
  return global_avg_pool2d_backward(dy, std::span<const std::size_t>(x_shape));
}

}  // namespace tessera::kernels::cpu
