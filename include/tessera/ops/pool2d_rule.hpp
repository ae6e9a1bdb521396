// MaxPool's and AvgPool's definitions: the sharding rule of a 2-D pooling window, from a
// strategy ((n, c, h, w),) to the device matrix and layouts (constexpr), the halo
// exchanges of a split height or width (ops/window_rule.hpp), and the operator types
// ops::max_pool2d_op and ops::avg_pool2d_op. Standard library only; the forwards and
// backwards are in ops/pool2d.hpp. Global average pooling is ReduceMean over (2, 3).
#pragma once

#include <string>
#include <string_view>
#include <tuple>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/core/strategy.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/ops/definition.hpp>
#include <tessera/ops/window_rule.hpp>

namespace tessera {

/// The layouts of a pooling under a strategy ((n, c, h, w),): device matrix (n, c, h, w)
/// (a replica axis first when it uses fewer devices than there are); x, y and dx split
/// alike.
struct pool2d_layouts {
  mesh dev;
  layout x;
  int axis_h = -1, axis_w = -1;
  friend constexpr bool operator==(const pool2d_layouts&, const pool2d_layouts&) = default;
};

/// Checks a pooling strategy on `device_num` devices for x (N, C, H, W) under the window
/// `p`: one 4-D input, each split dividing its dim, a device matrix dividing the device
/// count, and a split H or W that each rank computes from its rows and its neighbours'
/// halo (window_axis).
constexpr status check_pool2d(const strategy& st, int device_num, const extents& x, const kernels::pool2d_params& p) {
  if (st.n != 1) return fail(errc::op_inputs, -1, -1, st.n, 1);
  if (st.in[0].n != 4) return fail(errc::op_input_ndim, 0, -1, st.in[0].n, 4);
  if (x.ndim != 4) return fail(errc::window_rank, 0, -1, x.ndim);
  if (status s = check(st, device_num); !s.ok()) return s;
  for (int d = 0; d < 2; ++d)
    if (x[d] % st.in[0].v[d] != 0) return fail(errc::dim_not_divisible, d, -1, x[d], st.in[0].v[d]);
  const auto [h, w] = ops::pool_axes(x, p, st.in[0].v[2], st.in[0].v[3]);
  if (status s = h.check(2); !s.ok()) return s;
  return w.check(3);
}

/// The pooling rule. Example: ((2, 2, 2, 1),) on 8 devices -> device matrix (2, 2, 2, 1).
/// @pre check_pool2d(st, device_num, x, p).ok()
constexpr pool2d_layouts pool2d_rule(const strategy& st, int device_num) {
  const split_tuple& t = st.in[0];
  const int replicas = device_num / t.product();
  pool2d_layouts r;
  const int f = replicas > 1 ? 1 : 0;
  r.dev = replicas > 1 ? mesh{replicas, t.v[0], t.v[1], t.v[2], t.v[3]} : mesh{t.v[0], t.v[1], t.v[2], t.v[3]};
  r.x = layout(r.dev, {{f}, {f + 1}, {f + 2}, {f + 3}});
  r.axis_h = f + 2;
  r.axis_w = f + 3;
  return r;
}

namespace ops {

/// Which pooling: the maximum or the average over each window.
enum class pool_kind { max, avg };

/// MaxPool (pool_kind::max) or AvgPool (avg) with a shard strategy, as MindSpore's
/// `MaxPool(kernel_size, strides, pad_mode).shard(((n, c, h, w),))`: the window `p`
/// (kernels::mindspore_pool2d gives a pad_mode's padding; PyTorch's padding, ceil_mode
/// and count_include_pad are its fields). Splits: batch and channels freely; height and
/// width with the neighbours' halo (a max pooling's backward fetches it again to find
/// its maxima). Candidates: every split passing check_pool2d; data parallel: n = the
/// device count.
template <pool_kind Kind>
struct pool2d_op {
  strategy st;
  kernels::pool2d_params p{};

  static constexpr std::string_view type() { return Kind == pool_kind::max ? "MaxPool" : "AvgPool"; }
  static constexpr std::string_view name() { return Kind == pool_kind::max ? "max_pool2d" : "avg_pool2d"; }
  static constexpr int arity = 1;

  /// The backward of a max pooling reads x (it finds the maxima again), an average
  /// pooling's only x's shape; neither reads y (ops/definition.hpp).
  static constexpr bool backward_reads(int) { return Kind == pool_kind::max; }
  static constexpr bool backward_reads_output() { return false; }

  std::string attributes() const {
    std::string a = "kernel_size: (" + std::to_string(p.kernel_h) + ", " + std::to_string(p.kernel_w) +
                    "), strides: (" + std::to_string(p.stride_h) + ", " + std::to_string(p.stride_w) + "), pad: (" +
                    std::to_string(p.pad.top) + ", " + std::to_string(p.pad.bottom) + ", " +
                    std::to_string(p.pad.left) + ", " + std::to_string(p.pad.right) + ")";
    if (p.ceil_mode) a += ", ceil_mode: true";
    if (Kind == pool_kind::avg) a += ", count_include_pad: " + bool_text(p.count_include_pad);
    return a;
  }

  /// y's shape; throws naming the operator and the numbers (kernels::pool2d_output_shape).
  extents output_shape(const shape_list& in) const {
    if (in.n != 1) throw error(std::string(name()) + ": takes 1 input, given " + std::to_string(in.n));
    const auto y = kernels::pool2d_output_shape(std::string(name()).c_str(), dims(in[0]), p);
    return extents{index_t(y[0]), index_t(y[1]), index_t(y[2]), index_t(y[3])};
  }
  status check(const strategy& s, int device_num, const shape_list& in) const {
    return check_pool2d(s, device_num, in[0], p);
  }
  op_layouts layouts(const strategy& s, int device_num, const shape_list&) const {
    const pool2d_layouts r = pool2d_rule(s, device_num);
    return {r.dev, {r.x}, r.x, {r.x}, r.x};
  }
  std::vector<strategy> candidates(int device_num, const shape_list& in) const {
    std::vector<strategy> out;
    for_each_split(in[0], device_num, [&](const split_tuple& t) {
      const strategy s{t};
      if (check(s, device_num, in).ok()) out.push_back(s);
    });
    order_candidates(out, [](const strategy& s) { return s.in[0].product(); });
    return out;
  }
  strategy data_parallel(int device_num, const shape_list&) const {
    return strategy{split_tuple{device_num, 1, 1, 1}};
  }
  /// The halo exchanges of a split H or W (ops/window_rule.hpp).
  std::vector<internal_collective> collectives(const strategy& s, int device_num, const shape_list& in) const {
    return halo_exchanges(split(s, device_num, in), Kind == pool_kind::max);
  }
  /// One operation per window element of each output: N C OH OW KH KW / the devices.
  double forward_work(const op_layouts& l, const shape_list&, const extents& out) const {
    return double(local_shape(l.out, out).size()) * double(p.kernel_h * p.kernel_w);
  }

  /// The rule on `device_num` devices for x of shape in[0]; throws tessera::error naming
  /// the rule broken, the numbers and the strategy.
  pool2d_layouts rule(int device_num, const shape_list& in) const {
    require_rule(check_pool2d(st, device_num, in[0], p), name(), st);
    return pool2d_rule(st, device_num);
  }
  /// The H and W splits of strategy `s` on its device matrix (the halo's geometry).
  window_split split(const strategy& s, int device_num, const shape_list& in) const {
    const pool2d_layouts r = pool2d_rule(s, device_num);
    window_split ws;
    ws.dev = r.dev;
    ws.axis_h = r.axis_h;
    ws.axis_w = r.axis_w;
    std::tie(ws.h, ws.w) = pool_axes(in[0], p, s.in[0].v[2], s.in[0].v[3]);
    ws.nc = (in[0][0] / s.in[0].v[0]) * (in[0][1] / s.in[0].v[1]);
    return ws;
  }

 private:
  static std::vector<std::size_t> dims(const extents& e) {
    return std::vector<std::size_t>(e.v.begin(), e.v.begin() + e.ndim);
  }
};

using max_pool2d_op = pool2d_op<pool_kind::max>;
using avg_pool2d_op = pool2d_op<pool_kind::avg>;

}  // namespace ops

}  // namespace tessera
