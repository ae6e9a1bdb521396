// Conv2D's definition: its sharding rule, from a strategy ((n, ci, h, w), (co, ci, 1, 1))
// as MindSpore's to the device matrix and the layouts of x, w, y and the gradients
// (constexpr, so a static strategy is checked by the compiler), the halo exchanges of a
// split height or width (ops/window_rule.hpp), and the operator type ops::conv2d_op.
// Standard library only; the forward and backward are in ops/conv2d.hpp.
#pragma once

#include <string>
#include <string_view>
#include <tuple>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/window_rule.hpp>

namespace tessera {

/// The layouts of y = conv2d(x, w) under a strategy: the device matrix is (n, ci, h, w,
/// co), preceded by a replica axis when it uses fewer devices than there are.
struct conv2d_layouts {
  mesh dev;
  layout x;       ///< (N, C, H, W) split (n, ci, h, w); replicated over co
  layout w;       ///< (O, C / groups, KH, KW) split (co, ci, 1, 1); replicated over n, h, w
  layout y;       ///< (N, O, OH, OW) split (n, co, h, w); partial sums over ci when it is split
  layout grad_x;  ///< x's layout, partial over co (each rank's output channels' share)
  layout grad_w;  ///< w's layout, partial over n, h and w (each rank's part of the batch and image)
  int axis_h = -1, axis_w = -1;  ///< the mesh axes of H and W
  friend constexpr bool operator==(const conv2d_layouts&, const conv2d_layouts&) = default;
};

/// Checks a Conv2D strategy on `device_num` devices for x (N, C, H, W) and w (O, C /
/// groups, KH, KW) under the window `p`: two 4-D inputs, w split (co, ci, 1, 1) with ci
/// as x's channel split, a grouped convolution splitting neither channel dim, each
/// split dividing its dim, a device matrix dividing the device count, and a split H or
/// W that each rank can compute from its rows and its neighbours' halo (window_axis).
constexpr status check_conv2d(const strategy& st, int device_num, const extents& x, const extents& w,
                              const kernels::conv2d_params& p) {
  if (st.n != 2) return fail(errc::op_inputs, -1, -1, st.n, 2);
  for (int i = 0; i < 2; ++i)
    if (st.in[i].n != 4) return fail(errc::op_input_ndim, i, -1, st.in[i].n, 4);
  if (x.ndim != 4) return fail(errc::window_rank, 0, -1, x.ndim);
  if (w.ndim != 4) return fail(errc::window_rank, 1, -1, w.ndim);
  if (status s = check(st, device_num); !s.ok()) return s;
  if (p.groups < 1 || w[0] % p.groups != 0 || w[1] * p.groups != x[1])
    return fail(errc::conv2d_channels, -1, -1, x[1], w[1] * p.groups);
  const split_tuple& sx = st.in[0];
  const split_tuple& sw = st.in[1];
  for (int d = 2; d < 4; ++d)
    if (sw.v[d] != 1) return fail(errc::conv2d_split, d, -1, sw.v[d], 1);
  if (sw.v[1] != sx.v[1]) return fail(errc::conv2d_split, 1, -1, sw.v[1], sx.v[1]);
  if (p.groups > 1 && (sx.v[1] > 1 || sw.v[0] > 1))
    return fail(errc::conv2d_group_split, -1, -1, p.groups, std::max(sx.v[1], sw.v[0]));
  for (int d = 0; d < 2; ++d)
    if (x[d] % sx.v[d] != 0) return fail(errc::dim_not_divisible, d, -1, x[d], sx.v[d]);
  if (w[0] % sw.v[0] != 0) return fail(errc::dim_not_divisible, 0, -1, w[0], sw.v[0]);
  const int used = sx.v[0] * sx.v[1] * sx.v[2] * sx.v[3] * sw.v[0];
  if (device_num % used != 0) return fail(errc::op_device_num, -1, -1, used, device_num);
  const auto [h, wa] = ops::conv_axes(x, w, p, sx.v[2], sx.v[3]);
  if (status s = h.check(2); !s.ok()) return s;
  return wa.check(3);
}

/// Conv2D's rule. Example: ((2, 1, 2, 1), (2, 1, 1, 1)) on 8 devices -> device matrix
/// (2, 1, 2, 1, 2); each rank holds half the batch and half the image's rows of x (with
/// its neighbour's halo rows fetched by the forward), half the output channels of w, and
/// computes its (N/2, O/2, OH/2, OW) block of y.
/// @pre check_conv2d(st, device_num, x, w, p).ok()
constexpr conv2d_layouts conv2d_rule(const strategy& st, int device_num) {
  const int n = st.in[0].v[0], ci = st.in[0].v[1], h = st.in[0].v[2], w = st.in[0].v[3], co = st.in[1].v[0];
  const int replicas = device_num / (n * ci * h * w * co);
  conv2d_layouts r;
  const int f = replicas > 1 ? 1 : 0;
  r.dev = replicas > 1 ? mesh{replicas, n, ci, h, w, co} : mesh{n, ci, h, w, co};
  const int an = f, aci = f + 1, ah = f + 2, aw = f + 3, aco = f + 4;
  r.axis_h = ah;
  r.axis_w = aw;
  r.x = layout(r.dev, {{an}, {aci}, {ah}, {aw}});
  r.w = layout(r.dev, {{aco}, {aci}, {}, {}});
  r.y = layout(r.dev, {{an}, {aco}, {ah}, {aw}});
  if (ci > 1) r.y = r.y.with_partial(aci);
  r.grad_x = co > 1 ? r.x.with_partial(aco) : r.x;
  r.grad_w = r.w;
  for (int a : {an, ah, aw})
    if (r.dev.extent(a) > 1) r.grad_w = r.grad_w.with_partial(a);
  return r;
}

/// The rule for a static strategy and shapes; an invalid one fails to compile with the
/// rule it breaks as the message.
template <strategy St, int DeviceNum, extents X, extents W, kernels::conv2d_params P = kernels::conv2d_params{}>
inline constexpr conv2d_layouts static_conv2d_rule = [] {
  constexpr status s = check_conv2d(St, DeviceNum, X, W, P);
  detail::static_require<s>();
  if constexpr (s.ok()) return conv2d_rule(St, DeviceNum);
  else return conv2d_layouts{};
}();

namespace ops {

/// Conv2D with a shard strategy, as MindSpore's `Conv2D(...).shard(((n, ci, h, w), (co,
/// ci, 1, 1)))`: y = the convolution of x (N, C, H, W) with w (O, C / groups, KH, KW)
/// under `p` (kernels::mindspore_conv2d gives the padding of a pad_mode). Splits: the
/// batch (n), the input channels (ci: y holds partial sums over them, which stay partial
/// through linear operators), the height and width (h, w: each rank fetches its
/// neighbours' halo rows and columns, and returns their gradients in the backward), and
/// the output channels (co). Linear in either input. Candidates: every split passing
/// check_conv2d; data parallel: n = the device count.
struct conv2d_op {
  strategy st;
  kernels::conv2d_params p{};

  static constexpr std::string_view type() { return "Conv2D"; }
  static constexpr std::string_view name() { return "conv2d"; }
  static constexpr int arity = 2;

  std::string attributes() const {
    return "stride: (" + std::to_string(p.stride_h) + ", " + std::to_string(p.stride_w) + "), pad: (" +
           std::to_string(p.pad.top) + ", " + std::to_string(p.pad.bottom) + ", " + std::to_string(p.pad.left) +
           ", " + std::to_string(p.pad.right) + "), dilation: (" + std::to_string(p.dilation_h) + ", " +
           std::to_string(p.dilation_w) + "), group: " + std::to_string(p.groups);
  }
  linearity linear() const { return linearity::each(2); }
  /// The backward reads x and w, not y (ops/definition.hpp).
  static constexpr bool backward_reads_output() { return false; }

  /// y's shape; throws "conv2d_forward: w (64, 3, 3, 3) needs x with 3 * groups 1 = 3
  /// channels, x is (32, 4, 32, 32)" and the like (kernels::conv2d_output_shape).
  extents output_shape(const shape_list& in) const {
    if (in.n != 2) throw error("conv2d: takes 2 inputs (x, w), given " + std::to_string(in.n));
    const auto y = kernels::conv2d_output_shape("conv2d", dims(in[0]), dims(in[1]), p);
    return extents{index_t(y[0]), index_t(y[1]), index_t(y[2]), index_t(y[3])};
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_conv2d(s, device_num, in[0], in[1], p);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list&) const {
    const conv2d_layouts r = conv2d_rule(s, device_num);
    return {r.dev, {r.x, r.w}, r.y, {r.grad_x, r.grad_w}, r.y.without_partial()};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    std::vector<strategy> out;
    for_each_split(extents{in[0][0], in[0][1], in[0][2], in[0][3], in[1][0]}, device_num, [&](const split_tuple& t) {
      const strategy s = make(t[0], t[1], t[2], t[3], t[4]);
      if (check(s, device_num, in).ok()) out.push_back(s);
    });
    order_candidates(out, [](const strategy& s) { return s.in[0].product() * s.in[1].v[0]; });
    return out;
  }
  strategy data_parallel(int device_num, const shape_list&) const { return make(device_num, 1, 1, 1, 1); }
  /// The halo exchanges of a split H or W (ops/window_rule.hpp), run by the forward and
  /// the backward (which fetches the halo again for the weights' gradient).
  std::vector<internal_collective> collectives(const strategy& s, int device_num, const shape_list& in) const {
    return halo_exchanges(split(s, device_num, in), true);
  }
  /// 2 N O OH OW (C / groups) KH KW / (the devices that split them).
  double forward_work(const op_layouts& l, const shape_list& in, const extents& out) const {
    const extents x = local_shape(l.in[0], in[0]);
    return 2.0 * double(local_shape(l.out, out).size()) * double(x[1] / (p.groups > 1 ? p.groups : 1)) *
           double(in[1][2] * in[1][3]);
  }

  /// The strategy of batch, input-channel, height, width and output-channel splits.
  static strategy make(int n, int ci, int h, int w, int co) {
    return strategy{split_tuple{n, ci, h, w}, split_tuple{co, ci, 1, 1}};
  }
  /// The rule on `device_num` devices for x and w of shapes `in`; throws tessera::error
  /// naming the rule broken, the numbers and the strategy.
  conv2d_layouts rule(int device_num, const shape_list& in) const {
    require_rule(check_conv2d(st, device_num, in[0], in[1], p), name(), st);
    return conv2d_rule(st, device_num);
  }
  /// The H and W splits of strategy `s` on its device matrix (the halo's geometry).
  window_split split(const strategy& s, int device_num, const shape_list& in) const {
    const conv2d_layouts r = conv2d_rule(s, device_num);
    window_split ws;
    ws.dev = r.dev;
    ws.axis_h = r.axis_h;
    ws.axis_w = r.axis_w;
    std::tie(ws.h, ws.w) = conv_axes(in[0], in[1], p, s.in[0].v[2], s.in[0].v[3]);
    ws.nc = (in[0][0] / s.in[0].v[0]) * (in[0][1] / s.in[0].v[1]);
    return ws;
  }

 private:
  static std::vector<std::size_t> dims(const extents& e) {
    return std::vector<std::size_t>(e.v.begin(), e.v.begin() + e.ndim);
  }
};

}  // namespace ops

}  // namespace tessera
