// 2-D convolution on NCHW float tensors through oneDNN: forward (with its bias and an
// optional fused ReLU), backward data (dx), backward weights (dw, and db when there is a
// bias) and both in one call (conv2d_backward), with stride, explicit padding per side,
// dilation and groups (kernels/conv_params.hpp). Each takes plain xt::xarray<float> or
// dnnl_tensor operands (kernels/cpu/dnnl.hpp); weights (O, C / groups, KH, KW) plain, or
// in the forward's layout (dnnl_form, made by conv2d_forward_weights), which the
// forward reads as it is and in which the backward writes dw.
// Plain arrays meet oneDNN's blocked-layout convolutions through reorders (in and out),
// or its GEMM-based ones in their own layout: 1 x 1 stride-1 convolutions over large
// planes time both at their first call and keep the faster (set_dnnl_conv_layouts).
// Primitives are cached per shape and parameters. Link tessera::dnnl.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/kernels/cpu/dnnl.hpp>

namespace tessera::kernels::cpu {

/// How the convolutions lay out plain NCHW arrays for oneDNN.
/// - `blocked`: in the layout oneDNN chooses for its fastest kernels (nChw16c on
///   AVX-512), reordered to it and back around each primitive.
/// - `plain`: as they are, by oneDNN's GEMM-based convolutions (no reorders; an
///   im2col copy where the kernel is larger than 1 x 1).
/// - `measured` (the default): blocked, except the 1 x 1 stride-1 convolutions without
///   groups or padding whose planes have 28 x 28 elements or more, which run each pass
///   both ways at their first call (twice each, alternately) and keep the faster for the
///   process. On the 2-core AVX-512 build machine (bench_conv's conv/1x1_* cases, forward
///   and both backward passes, batch 32; docs/benchmarks.md) the GEMM took about 0.7 of
///   the blocked kernels' time with their reorders at ResNet-50's 56 x 56 and 28 x 28
///   planes, about the same at 14 x 14, 1.2-1.3 times it at 7 x 7 and 2.5 at 1 x 1, and 2.2
///   with a 3 x 3 kernel. At 8 x 8 it took 0.7 alone, yet ResNet-50's 32 x 32 step ran
///   1-5% slower with it: repeated calls measure it with its operands in cache, which a
///   network's layers do not give it. Hence the smallest plane measured.
/// The layouts give the same values to float rounding. dnnl_tensor operands keep their
/// own layout either way.
enum class conv_layouts { measured, blocked, plain };

namespace detail {

inline std::atomic<conv_layouts>& conv_layouts_setting() {
  static std::atomic<conv_layouts> s{conv_layouts::measured};
  return s;
}

/// The layouts measured so far, process-wide (threads agree once one has measured):
/// true where the plain GEMM-based convolution was the faster.
struct conv_layout_choices {
  std::mutex m;
  std::unordered_map<primitive_key, bool, primitive_key_hash> plain;
};
inline conv_layout_choices& conv_choices() {
  static conv_layout_choices c;
  return c;
}

}  // namespace detail

/// Sets how the convolutions lay out plain arrays (conv_layouts) from the next call on;
/// forgets the layouts measured so far.
inline void set_dnnl_conv_layouts(conv_layouts l) {
  detail::conv_layouts_setting().store(l, std::memory_order_relaxed);
  detail::conv_layout_choices& c = detail::conv_choices();
  const std::lock_guard<std::mutex> lock(c.m);
  c.plain.clear();
}
inline conv_layouts dnnl_conv_layouts() { return detail::conv_layouts_setting().load(std::memory_order_relaxed); }

namespace detail {
inline std::atomic<bool>& conv_weights_kept_setting() {
  static std::atomic<bool> s{true};
  return s;
}
}  // namespace detail

/// Whether the convolution operators keep their weights in the layout the forward reads
/// them in, between calls and between steps (backend<cpu_device>'s conv2d_forward taking
/// the weights' tensor; on by default): the weights are then reordered once, not at
/// every forward, the gradient stays in that layout, and the optimizers update both
/// there. Off, every call reorders the plain weights (the values are the same).
inline void set_dnnl_conv_weights_kept(bool kept) {
  detail::conv_weights_kept_setting().store(kept, std::memory_order_relaxed);
}
inline bool dnnl_conv_weights_kept() { return detail::conv_weights_kept_setting().load(std::memory_order_relaxed); }

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

/// An activation's descriptor (src, dst and their gradients): plain NCHW for the
/// GEMM-based convolution, else left to oneDNN.
inline dnnl_md activation_desc(const dnnl_dims& d, bool plain) { return plain ? plain_desc(d) : any_desc(d); }

/// The smallest plane (H * W) whose 1 x 1 convolutions conv_layouts::measured times.
inline constexpr dnnl::memory::dim measured_min_plane = 28 * 28;

/// Whether conv_layouts::measured times both layouts for g: 1 x 1, stride 1, no
/// dilation, groups or padding, a plane of measured_min_plane elements or more.
inline bool conv_layout_measured(const conv_geometry& g) {
  return g.weights.size() == 4 && g.weights[2] == 1 && g.weights[3] == 1 && g.strides == dnnl_dims{1, 1} &&
         g.dilates == dnnl_dims{0, 0} && g.pad_l == dnnl_dims{0, 0} && g.pad_r == dnnl_dims{0, 0} &&
         g.src[2] * g.src[3] >= measured_min_plane;
}

/// run(plain) in the layout conv_layouts says for pass `kind` (1 forward, 2 backward data,
/// 3 backward weights, 4 both backward passes) of the convolution g, p on operands of
/// type X: dnnl_tensors in their own layout (run(false)). Measuring: each layout twice,
/// alternately, the faster (by the smaller of its two times) kept for the process, for
/// the pass and geometry whatever the bias, ReLU and dx asked (so the weights' gradient
/// is the same with and without dx), and its last result returned.
/// Whether pass `kind` of the convolution g, p on operands of type X runs on plain
/// arrays (the GEMM-based convolution): nothing where conv_layouts::measured has still to
/// time it.
template <dnnl_operand X>
std::optional<bool> conv_layout_of(std::int64_t kind, const conv_geometry& g, const conv2d_params& p) {
  if constexpr (std::same_as<X, dnnl_tensor>) {
    return false;
  } else {
    const conv_layouts setting = conv_layouts_setting().load(std::memory_order_relaxed);
    if (setting != conv_layouts::measured) return setting == conv_layouts::plain;
    if (!conv_layout_measured(g)) return false;
    conv_layout_choices& c = conv_choices();
    const std::lock_guard<std::mutex> lock(c.m);
    if (const auto it = c.plain.find(conv_key(kind, g, p, false, false)); it != c.plain.end()) return it->second;
    return std::nullopt;
  }
}

template <dnnl_operand X, class Run>
auto in_conv_layout(std::int64_t kind, const conv_geometry& g, const conv2d_params& p, Run&& run)
    -> decltype(run(false)) {
  if constexpr (std::same_as<X, dnnl_tensor>) {
    return run(false);  // dnnl_tensors keep their layout
  } else {
    if (const std::optional<bool> plain = conv_layout_of<X>(kind, g, p)) return run(*plain);
    const primitive_key key = conv_key(kind, g, p, false, false);
    conv_layout_choices& c = conv_choices();
    using clock = std::chrono::steady_clock;
    std::array<double, 2> best{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    std::array<std::optional<decltype(run(false))>, 2> last;
    for (int round = 0; round < 2; ++round)
      for (int plain = 0; plain < 2; ++plain) {
        last[std::size_t(plain)].reset();
        const auto t0 = clock::now();
        last[std::size_t(plain)].emplace(run(plain == 1));
        best[std::size_t(plain)] =
            std::min(best[std::size_t(plain)], std::chrono::duration<double>(clock::now() - t0).count());
      }
    bool plain = best[1] < best[0];
    {
      const std::lock_guard<std::mutex> lock(c.m);
      plain = c.plain.emplace(key, plain).first->second;  // a thread that measured first wins
    }
    return std::move(*last[std::size_t(plain)]);
  }
}

/// The forward primitive descriptor with the weights' layout left to oneDNN (`any`) and
/// the activations' too unless `plain`, as the backward ones are hinted with.
inline dnnl::convolution_forward::primitive_desc conv_forward_pd(const conv_geometry& g, bool bias, bool relu,
                                                                 bool plain) {
  const dnnl_md src = activation_desc(g.src, plain), dst = activation_desc(g.dst, plain);
  const dnnl::convolution_forward::desc d =
      bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                             src, any_desc(g.weights), plain_desc(g.bias), dst, g.strides,
                                             g.dilates, g.pad_l, g.pad_r)
           : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                             src, any_desc(g.weights), dst, g.strides, g.dilates, g.pad_l, g.pad_r);
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

/// The convolutions' weight operands: plain (O, C / groups, KH, KW) xarrays, and the same
/// weights in a layout of oneDNN's (dnnl_form).
template <class W>
concept conv_weights = std::same_as<W, xt::xarray<float>> || std::same_as<W, dnnl_form>;

namespace detail {

inline std::span<const std::size_t> weights_shape(const xt::xarray<float>& w) {
  return std::span<const std::size_t>(w.shape().data(), w.shape().size());
}
inline std::span<const std::size_t> weights_shape(const dnnl_form& w) { return w.shape(); }
/// The weights' memory: a plain xarray wrapped as g's (grouped: 5-D) weights, a form's own.
inline dnnl::memory weights_memory(const xt::xarray<float>& w, const conv_geometry& g) { return wrap(w, g.weights); }
inline dnnl::memory weights_memory(const dnnl_form& w, const conv_geometry&) { return w.memory(); }

}  // namespace detail

/// y = conv(x, w) + bias, then max(y, 0) when `relu` (oneDNN's post-op): x (N, C, H, W),
/// w (O, C / groups, KH, KW), bias (O,) or null; y (N, O, OH, OW) with OH = floor((H +
/// top + bottom - dilation_h * (KH - 1) - 1) / stride_h) + 1 (kernels/conv_params.hpp).
/// Takes and returns xarrays (plain NCHW) or dnnl_tensors (y in the format the primitive
/// chose); w plain or a dnnl_form (reordered only if its layout is not the primitive's).
/// Throws tessera::error naming conv2d_forward on shapes that do not fit.
template <dnnl_operand X, conv_weights W>
X conv2d_forward(const X& x, const W& w, const xt::xarray<float>* bias, const conv2d_params& p, bool relu = false) {
  constexpr const char* fn = "conv2d_forward";
  const auto xs = detail::shape_of(x);
  const auto g = detail::conv_geom(fn, xs, detail::weights_shape(w), p);
  if (bias) detail::require_vector(fn, "bias", *bias, g.dst_shape[1]);
  return detail::dnnl_call(fn, [&] {
    auto run = [&](bool plain) {
      const auto& e = detail::cached<detail::conv_forward_entry>(detail::conv_key(1, g, p, bias, relu).add(plain), [&] {
        ++detail::primitives_created();
        auto pd = detail::conv_forward_pd(g, bias, relu, plain);
        return detail::conv_forward_entry{pd, dnnl::convolution_forward(pd)};
      });
      const auto src = detail::input_as(x, e.pd.src_desc());
      const auto wei = detail::as_desc(detail::weights_memory(w, g), e.pd.weights_desc());
      detail::output_slot<X> dst(e.pd.dst_desc(), g.dst, g.dst_shape);
      std::unordered_map<int, dnnl::memory> args{
          {DNNL_ARG_SRC, src.get()}, {DNNL_ARG_WEIGHTS, wei.get()}, {DNNL_ARG_DST, dst.memory()}};
      if (bias) args.emplace(DNNL_ARG_BIAS, detail::wrap(*bias));
      e.prim.execute(dnnl_stream(), args);
      return dst.take();
    };
    return detail::in_conv_layout<X>(1, g, p, run);
  });
}

/// The plain weights `w` in the layout conv2d_forward(x, w, bias or none, p, relu) reads
/// them in, for x of shape x_shape (plain NCHW): a copy to pass as the weights while they
/// do not change. Nothing where the forward reads them plain, or where its layout is
/// still to be measured (conv_layouts::measured, before its first call).
template <dnnl_operand X>
std::optional<dnnl_form> conv2d_forward_weights(std::span<const std::size_t> x_shape, const xt::xarray<float>& w,
                                                bool bias, const conv2d_params& p, bool relu = false) {
  constexpr const char* fn = "conv2d_forward_weights";
  const auto g = detail::conv_geom(fn, x_shape, detail::weights_shape(w), p);
  return detail::dnnl_call(fn, [&]() -> std::optional<dnnl_form> {
    const std::optional<bool> plain = detail::conv_layout_of<X>(1, g, p);
    if (!plain) return std::nullopt;
    const auto& e = detail::cached<detail::conv_forward_entry>(detail::conv_key(1, g, p, bias, relu).add(*plain), [&] {
      ++detail::primitives_created();
      auto pd = detail::conv_forward_pd(g, bias, relu, *plain);
      return detail::conv_forward_entry{pd, dnnl::convolution_forward(pd)};
    });
    const detail::dnnl_md want = e.pd.weights_desc();
    if (want == detail::plain_desc(g.weights)) return std::nullopt;
    dnnl::memory m(want, dnnl_engine());
    detail::reorder_into(detail::weights_memory(w, g), m);
    return dnnl_form(std::move(m), std::vector<std::size_t>(w.shape().begin(), w.shape().end()));
  });
}

namespace detail {

inline const conv_backward_data_entry& backward_data_entry(const conv_geometry& g, const conv2d_params& p,
                                                           bool plain) {
  return cached<conv_backward_data_entry>(conv_key(2, g, p, false, false).add(plain), [&] {
    ++primitives_created();
    auto hint = conv_forward_pd(g, false, false, plain);
    dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, activation_desc(g.src, plain),
                                            any_desc(g.weights), activation_desc(g.dst, plain), g.strides,
                                            g.dilates, g.pad_l, g.pad_r);
    dnnl::convolution_backward_data::primitive_desc pd(d, dnnl_engine(), hint);
    return conv_backward_data_entry{pd, dnnl::convolution_backward_data(pd)};
  });
}

inline const conv_backward_weights_entry& backward_weights_entry(const conv_geometry& g, const conv2d_params& p,
                                                                 bool bias, bool plain) {
  return cached<conv_backward_weights_entry>(conv_key(3, g, p, bias, false).add(plain), [&] {
    ++primitives_created();
    auto hint = conv_forward_pd(g, bias, false, plain);
    const dnnl_md src = activation_desc(g.src, plain), dst = activation_desc(g.dst, plain);
    const dnnl::convolution_backward_weights::desc d =
        bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src,
                                                        any_desc(g.weights), plain_desc(g.bias), dst, g.strides,
                                                        g.dilates, g.pad_l, g.pad_r)
             : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src,
                                                        any_desc(g.weights), dst, g.strides, g.dilates, g.pad_l,
                                                        g.pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(d, dnnl_engine(), hint);
    return conv_backward_weights_entry{pd, dnnl::convolution_backward_weights(pd)};
  });
}

/// dx of shape x_shape from dy's memory `dy` (any layout; reordered to the primitive's).
template <dnnl_operand X, conv_weights W>
X run_backward_data(const dnnl::memory& dy, const W& w, std::span<const std::size_t> x_shape,
                    const conv_geometry& g, const conv2d_params& p, bool plain) {
  const auto& e = backward_data_entry(g, p, plain);
  const auto ddst = as_desc(dy, e.pd.diff_dst_desc());
  const auto wei = as_desc(weights_memory(w, g), e.pd.weights_desc());
  output_slot<X> dsrc(e.pd.diff_src_desc(), g.src, x_shape);
  e.prim.execute(dnnl_stream(),
                 {{DNNL_ARG_DIFF_DST, ddst.get()}, {DNNL_ARG_WEIGHTS, wei.get()}, {DNNL_ARG_DIFF_SRC, dsrc.memory()}});
  return dsrc.take();
}

/// dw (and db when `bias`) from dy's memory in the primitive's layout (`ddst`) and x: dw
/// plain, or in the primitive's layout for W = dnnl_form (no bias).
template <conv_weights W, dnnl_operand X>
conv2d_weight_grads<W> run_backward_weights(const conv_backward_weights_entry& e, const dnnl::memory& ddst,
                                            const X& x, std::span<const std::size_t> w_shape, bool bias,
                                            const conv_geometry& g) {
  const auto src = input_as(x, e.pd.src_desc());
  output_slot<W> dw(e.pd.diff_weights_desc(), g.weights, w_shape);
  conv2d_weight_grads<W> out{};
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, src.get()}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_WEIGHTS, dw.memory()}};
  if constexpr (std::same_as<W, xt::xarray<float>>) {
    out.db = vector_of(0);
    if (bias) {
      out.db = vector_of(g.dst_shape[1]);
      args.emplace(DNNL_ARG_DIFF_BIAS, wrap(out.db));
    }
  }
  e.prim.execute(dnnl_stream(), args);
  out.dw = dw.take();
  return out;
}

}  // namespace detail

/// dx = the gradient of sum(dy * conv2d_forward(x, w, no bias)) with respect to x, of
/// shape x_shape (N, C, H, W); dy (N, O, OH, OW). The transposed convolution.
template <dnnl_operand X, conv_weights W>
X conv2d_backward_data(const X& dy, const W& w, std::span<const std::size_t> x_shape, const conv2d_params& p) {
  constexpr const char* fn = "conv2d_backward_data";
  const auto g = detail::conv_geom(fn, x_shape, detail::weights_shape(w), p);
  detail::require_dims(fn, "dy", detail::shape_of(dy), g.dst_shape);
  return detail::dnnl_call(fn, [&] {
    auto run = [&](bool plain) { return detail::run_backward_data<X>(detail::memory_of(dy), w, x_shape, g, p, plain); };
    return detail::in_conv_layout<X>(2, g, p, run);
  });
}
/// The same with x's shape as a braced list or vector.
template <dnnl_operand X, conv_weights W>
X conv2d_backward_data(const X& dy, const W& w, const std::vector<std::size_t>& x_shape, const conv2d_params& p) {
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
    auto run = [&](bool plain) {
      const auto& e = detail::backward_weights_entry(g, p, bias, plain);
      const auto ddst = detail::input_as(dy, e.pd.diff_dst_desc());
      return detail::run_backward_weights<xt::xarray<float>>(e, ddst.get(), x, w_shape, bias, g);
    };
    return detail::in_conv_layout<X>(3, g, p, run);
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
/// With w a dnnl_form (no bias), dw is one too, in the layout the primitive writes it.
template <dnnl_operand X, conv_weights W>
conv2d_grads<X, W> conv2d_backward(const X& dy, const X& x, const W& w, bool need_dx, bool bias,
                                   const conv2d_params& p) {
  constexpr const char* fn = "conv2d_backward";
  if (std::same_as<W, dnnl_form> && bias) throw error(std::string(fn) + ": weights in a dnnl_form take no bias");
  const auto xs = detail::shape_of(x);
  const auto ws = detail::weights_shape(w);
  const auto g = detail::conv_geom(fn, xs, ws, p);
  detail::require_dims(fn, "dy", detail::shape_of(dy), g.dst_shape);
  return detail::dnnl_call(fn, [&] {
    auto run = [&](bool plain) {
      const auto& e = detail::backward_weights_entry(g, p, bias, plain);
      const auto ddst = detail::input_as(dy, e.pd.diff_dst_desc());
      conv2d_weight_grads<W> wg = detail::run_backward_weights<W>(e, ddst.get(), x, ws, bias, g);
      conv2d_grads<X, W> out{X(), std::move(wg.dw), std::move(wg.db)};
      if (need_dx) out.dx = detail::run_backward_data<X>(ddst.get(), w, xs, g, p, plain);
      else if constexpr (std::same_as<X, xt::xarray<float>>) out.dx = detail::vector_of(0);
      return out;
    };
    return detail::in_conv_layout<X>(4, g, p, run);
  });
}

}  // namespace tessera::kernels::cpu
