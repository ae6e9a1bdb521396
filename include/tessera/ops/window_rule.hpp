// The spatial rule shared by the window operators (Conv2D, MaxPool, AvgPool) on NCHW
// tensors: what a height or width split into `parts` slabs needs. Each rank computes
// the output rows of its own input rows, after its neighbours along the split axis
// have sent it the rows its windows overlap (the halo: `before` rows from the previous
// rank, `after` rows from the next); the first and last ranks pad the image's edge as
// the unsplit operator does. The rule checks when that works (each rank's output rows
// are its input rows / stride) and lists the exchanges with the elements each rank
// receives, which the operators run and the graph prices (ops::internal_collective).
// Standard library only.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/core/mesh.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/ops/definition.hpp>

namespace tessera::ops {

/// One spatial axis (H or W) of a window operator: the input's extent, the window
/// (kernel, dilation, stride), the image's padding before and after, and the number of
/// slabs the axis is split into. Example: a 3x3 stride-1 convolution with padding 1 over
/// H = 32 split 4 ways: 8 rows per rank; each receives 1 row from each neighbour; rank 0
/// pads 1 row above and rank 3 one below, as the unsplit convolution.
struct window_axis {
  index_t in = 1;
  index_t kernel = 1;
  index_t dilation = 1;
  index_t stride = 1;
  index_t before = 0;  ///< the image's padding before (top or left)
  index_t after = 0;   ///< the image's padding after (bottom or right)
  int parts = 1;
  bool ceil_mode = false;

  constexpr index_t extent() const { return kernels::window_extent(kernel, dilation); }
  /// The input rows of each rank.
  constexpr index_t local() const { return in / parts; }
  /// The output rows of the whole axis.
  constexpr index_t output() const {
    return kernels::window_output_size(in, kernel, stride, before, after, dilation, ceil_mode);
  }
  /// The rows a rank's windows reach before its own (received from the previous rank).
  constexpr index_t halo_before() const { return parts > 1 ? before : 0; }
  /// The rows a rank's windows reach after its own (received from the next rank).
  constexpr index_t halo_after() const { return parts > 1 ? std::max<index_t>(extent() - stride - before, 0) : 0; }
  /// What the rank at coordinate c along the axis receives, and pads, on each side.
  constexpr index_t recv_before(int c) const { return c > 0 ? halo_before() : 0; }
  constexpr index_t recv_after(int c) const { return c < parts - 1 ? halo_after() : 0; }
  constexpr index_t pad_before(int c) const { return c == 0 ? before : 0; }
  constexpr index_t pad_after(int c) const { return c == parts - 1 ? after : 0; }
  /// The rows of the rank's input with its halo.
  constexpr index_t extended(int c) const { return recv_before(c) + local() + recv_after(c); }
  /// The output rows the rank at coordinate c computes.
  constexpr index_t local_output(int c) const {
    return kernels::window_output_size(extended(c), kernel, stride, pad_before(c), pad_after(c), dilation, ceil_mode);
  }
  /// What the rank at coordinate c receives in the backward, which returns each halo's
  /// gradient to the rank that owns the rows: from the previous rank the gradient of its
  /// `halo_after` rows, from the next that of its `halo_before`.
  constexpr index_t recv_back(int c) const {
    return (c > 0 ? halo_after() : 0) + (c < parts - 1 ? halo_before() : 0);
  }

  /// Checks the axis (tensor dim `dim`, 2 for H, 3 for W): the window fits, and a split
  /// gives every rank input rows a multiple of the stride, output rows = input rows /
  /// stride (the padding of pad_mode same), and a halo no larger than its own rows.
  constexpr status check(int dim) const {
    if (output() < 1) return fail(errc::window_fit, dim, -1, in, extent());
    if (parts == 1) return {};
    if (in % parts != 0) return fail(errc::dim_not_divisible, dim, -1, in, parts);
    if (local() % stride != 0) return fail(errc::window_split_stride, dim, -1, local(), stride);
    if (output() * stride != in) return fail(errc::window_split_output, dim, -1, output(), in / stride);
    const index_t halo = std::max(halo_before(), halo_after());
    if (halo > local()) return fail(errc::window_halo, dim, -1, halo, local());
    for (int c : {0, 1, parts - 1})
      if (c < parts && local_output(c) != local() / stride)
        return fail(errc::window_split_output, dim, -1, local_output(c), local() / stride);
    return {};
  }
};

/// The axes of a convolution's or pooling's H and W with the window of `p` (conv2d:
/// dilation; pool: ceil_mode), split h and w ways.
constexpr std::pair<window_axis, window_axis> conv_axes(const extents& x, const extents& w,
                                                        const kernels::conv2d_params& p, int h, int wsplit) {
  return {window_axis{x[2], w[2], p.dilation_h, p.stride_h, p.pad.top, p.pad.bottom, h, false},
          window_axis{x[3], w[3], p.dilation_w, p.stride_w, p.pad.left, p.pad.right, wsplit, false}};
}
constexpr std::pair<window_axis, window_axis> pool_axes(const extents& x, const kernels::pool2d_params& p, int h,
                                                        int wsplit) {
  return {window_axis{x[2], p.kernel_h, 1, p.stride_h, p.pad.top, p.pad.bottom, h, p.ceil_mode},
          window_axis{x[3], p.kernel_w, 1, p.stride_w, p.pad.left, p.pad.right, wsplit, p.ceil_mode}};
}

/// Where a window operator's H and W splits live on its device matrix, and the
/// elements of one local row of each (N_local * C_local * the other dim's local extent).
struct window_split {
  mesh dev;
  int axis_h = -1;  ///< the mesh axis splitting H (-1: whole)
  int axis_w = -1;
  window_axis h, w;
  index_t nc = 1;  ///< N_local * C_local of the exchanged tensor

  /// The rank's coordinate along the H (W) split.
  int coord_h(int rank) const { return axis_h < 0 ? 0 : dev.coords(rank)[std::size_t(axis_h)]; }
  int coord_w(int rank) const { return axis_w < 0 ? 0 : dev.coords(rank)[std::size_t(axis_w)]; }
};

/// The neighbour exchanges of a window operator, in the order it runs them: forward, the
/// H halo (rows of local width) then the W halo (columns of the H-extended height); the
/// backward returns them in reverse (W then H), preceded, when `refetch` (an operator
/// whose backward reads its input's halo: a convolution's weights, the maxima of a max
/// pooling), by the forward's two again.
inline std::vector<internal_collective> halo_exchanges(const window_split& s, bool refetch) {
  const int n = s.dev.size();
  auto exchange = [&](bool along_h, bool back, bool backward, std::string purpose) {
    internal_collective c;
    c.kind = "NeighborExchange";
    c.dev = s.dev;
    c.axes = axis_list{along_h ? s.axis_h : s.axis_w};
    c.backward = backward;
    c.purpose = std::move(purpose);
    c.rank_elements.resize(std::size_t(n));
    const window_axis& a = along_h ? s.h : s.w;
    for (int r = 0; r < n; ++r) {
      const int c_axis = along_h ? s.coord_h(r) : s.coord_w(r);
      const index_t rows = back ? a.recv_back(c_axis) : a.recv_before(c_axis) + a.recv_after(c_axis);
      const index_t row = along_h ? s.nc * s.w.local() : s.nc * s.h.extended(s.coord_h(r));
      c.rank_elements[std::size_t(r)] = rows * row;
    }
    c.elements = c.rank_elements.empty() ? 0 : *std::max_element(c.rank_elements.begin(), c.rank_elements.end());
    return c;
  };
  std::vector<internal_collective> out;
  const bool sh = s.axis_h >= 0 && s.h.parts > 1, sw = s.axis_w >= 0 && s.w.parts > 1;
  if (sh) out.push_back(exchange(true, false, false, "the rows the windows overlap (halo)"));
  if (sw) out.push_back(exchange(false, false, false, "the columns the windows overlap (halo)"));
  if (refetch && sh) out.push_back(exchange(true, false, true, "the halo rows again, for the backward"));
  if (refetch && sw) out.push_back(exchange(false, false, true, "the halo columns again, for the backward"));
  if (sw) out.push_back(exchange(false, true, true, "the halo columns' gradients, back to their owners"));
  if (sh) out.push_back(exchange(true, true, true, "the halo rows' gradients, back to their owners"));
  return out;
}

}  // namespace tessera::ops
