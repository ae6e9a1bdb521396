// The window geometry of 2-D convolution and pooling on NCHW tensors, shared by every
// device's kernels: parameters, output sizes with their checks and error texts, the
// padding of MindSpore's pad modes and of PyTorch's padding rules, and the result types
// of the convolution, batch-norm and pooling kernels. Standard library only.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <tessera/core/config.hpp>
#include <tessera/core/error.hpp>

namespace tessera::kernels {

/// Zero padding on the four sides of an image (rows above and below, columns left and
/// right). Uneven padding is how MindSpore's pad_mode "same" and TensorFlow's SAME
/// place the odd element: below and right.
struct pad2d {
  index_t top = 0, bottom = 0, left = 0, right = 0;

  /// The same padding on every side (PyTorch's `padding=p`).
  static constexpr pad2d uniform(index_t p) { return {p, p, p, p}; }
  /// `h` above and below, `w` left and right (PyTorch's `padding=(h, w)`).
  static constexpr pad2d symmetric(index_t h, index_t w) { return {h, h, w, w}; }
  friend constexpr bool operator==(const pad2d&, const pad2d&) = default;
};

/// A 2-D convolution: y[n, o, i, j] = b[o] + sum over c in o's group, kh, kw of
/// x[n, c, i * stride_h - top + kh * dilation_h, j * stride_w - left + kw * dilation_w]
/// * w[o, c mod (C / groups), kh, kw], with x zero outside the image. x is (N, C, H, W),
/// w is (O, C / groups, KH, KW), y is (N, O, OH, OW); groups divides C and O.
struct conv2d_params {
  index_t stride_h = 1, stride_w = 1;
  pad2d pad{};
  index_t dilation_h = 1, dilation_w = 1;
  index_t groups = 1;
  friend constexpr bool operator==(const conv2d_params&, const conv2d_params&) = default;
};

/// A 2-D pooling window: kernel, stride and padding per axis. ceil_mode rounds the output
/// size up (PyTorch's rule: a window that would start in the bottom or right padding is
/// dropped). count_include_pad (average pooling): the divisor counts the zero padding
/// inside the window, as PyTorch's default; false divides by the input elements inside
/// it only (PyTorch's count_include_pad=False, MindSpore's pad_mode "same"). Padding never
/// enters a maximum.
struct pool2d_params {
  index_t kernel_h = 1, kernel_w = 1;
  index_t stride_h = 1, stride_w = 1;
  pad2d pad{};
  bool ceil_mode = false;
  bool count_include_pad = true;

  /// A square window `k` with stride `s` (PyTorch's default stride is the kernel) and
  /// padding `p` on every side.
  static constexpr pool2d_params square(index_t k, index_t s, index_t p = 0) {
    return {k, k, s, s, pad2d::uniform(p)};
  }
  friend constexpr bool operator==(const pool2d_params&, const pool2d_params&) = default;
};

/// MindSpore's pad_mode of Conv2d, MaxPool2d and AvgPool2d.
enum class pad_mode {
  same,   ///< output ceil(in / stride); the padding that needs, the odd element below/right
  valid,  ///< no padding: output ceil((in - extent + 1) / stride)
  pad,    ///< the padding given explicitly
};

/// The extent of a dilated window: dilation * (kernel - 1) + 1.
constexpr index_t window_extent(index_t kernel, index_t dilation = 1) { return dilation * (kernel - 1) + 1; }

/// The number of window positions along one axis: floor((in + before + after - extent) /
/// stride) + 1, or with ceil_mode the ceiling, less one when the last window would start
/// at or past in + before (PyTorch's pooling rule). 0 when no window fits.
///
/// Examples: in 32, kernel 3, stride 1, padding 1 + 1 -> 32; in 32, kernel 3, stride 2,
/// padding 1 + 1 -> 16; in 5, kernel 2, stride 2 -> 2, with ceil_mode 3; in 4, kernel 2,
/// stride 2, padding 1 + 1, ceil_mode -> 3 (a fourth window would start in the padding).
constexpr index_t window_output_size(index_t in, index_t kernel, index_t stride, index_t before, index_t after,
                                     index_t dilation = 1, bool ceil_mode = false) {
  const index_t span = in + before + after - window_extent(kernel, dilation);
  if (span < 0 || stride < 1) return 0;
  if (!ceil_mode) return span / stride + 1;
  index_t out = (span + stride - 1) / stride + 1;
  if ((out - 1) * stride >= in + before) --out;
  return out;
}

/// The padding of MindSpore's pad_mode "same" along one axis (TensorFlow's SAME): the
/// least total padding that gives ceil(in / stride) outputs, {before, after} with the odd
/// element after. With stride 1 this is PyTorch's padding="same" (total dilation *
/// (kernel - 1), the odd element after), so one function serves both.
///
/// Examples: in 32, kernel 3, stride 1 -> {1, 1}; in 32, kernel 3, stride 2 -> {0, 1};
/// in 32, kernel 4, stride 1 -> {1, 2}; in 5, kernel 1, stride 2 -> {0, 0}.
constexpr std::array<index_t, 2> same_padding(index_t in, index_t kernel, index_t stride, index_t dilation = 1) {
  const index_t out = (in + stride - 1) / stride;
  const index_t total = std::max<index_t>((out - 1) * stride + window_extent(kernel, dilation) - in, 0);
  return {total / 2, total - total / 2};
}

/// The padding MindSpore's pad_mode gives an image of in_h x in_w under a window kernel_h x
/// kernel_w (stride, dilation): "same" as same_padding on each axis, "valid" none,
/// "pad" the explicit `padding`.
constexpr pad2d padding_for(pad_mode mode, index_t in_h, index_t in_w, index_t kernel_h, index_t kernel_w,
                            index_t stride_h, index_t stride_w, index_t dilation_h = 1, index_t dilation_w = 1,
                            pad2d padding = {}) {
  switch (mode) {
    case pad_mode::valid: return {};
    case pad_mode::pad: return padding;
    case pad_mode::same: break;
  }
  const auto h = same_padding(in_h, kernel_h, stride_h, dilation_h);
  const auto w = same_padding(in_w, kernel_w, stride_w, dilation_w);
  return {h[0], h[1], w[0], w[1]};
}

/// The convolution parameters of MindSpore's Conv2d(pad_mode, padding, stride, dilation,
/// group) on an image of in_h x in_w under a kernel_h x kernel_w kernel.
constexpr conv2d_params mindspore_conv2d(pad_mode mode, index_t in_h, index_t in_w, index_t kernel_h,
                                         index_t kernel_w, index_t stride_h = 1, index_t stride_w = 1,
                                         pad2d padding = {}, index_t dilation_h = 1, index_t dilation_w = 1,
                                         index_t groups = 1) {
  return {stride_h, stride_w,
          padding_for(mode, in_h, in_w, kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, padding),
          dilation_h, dilation_w, groups};
}

/// The pooling parameters of MindSpore's MaxPool2d / AvgPool2d(kernel_size, stride,
/// pad_mode) on an image of in_h x in_w: "same" pads as same_padding and averages over
/// the input elements only (count_include_pad false); "valid" does not pad; "pad" takes
/// the explicit padding, ceil_mode and count_include_pad.
constexpr pool2d_params mindspore_pool2d(pad_mode mode, index_t in_h, index_t in_w, index_t kernel_h,
                                         index_t kernel_w, index_t stride_h, index_t stride_w, pad2d padding = {},
                                         bool ceil_mode = false, bool count_include_pad = true) {
  pool2d_params p{kernel_h, kernel_w, stride_h, stride_w,
                  padding_for(mode, in_h, in_w, kernel_h, kernel_w, stride_h, stride_w, 1, 1, padding)};
  p.ceil_mode = mode == pad_mode::pad && ceil_mode;
  p.count_include_pad = mode == pad_mode::pad ? count_include_pad : mode == pad_mode::valid;
  return p;
}

}  // namespace tessera::kernels

// The helpers live in tessera::detail: a tessera::kernels::detail would hide it from the
// code of tessera::kernels.
namespace tessera::detail {

inline std::string dims_text(std::span<const std::size_t> s) {
  std::string out = "(";
  for (std::size_t d = 0; d < s.size(); ++d) out += (d ? ", " : "") + std::to_string(s[d]);
  return out + (s.size() == 1 ? ",)" : ")");
}

inline void require_nchw(const char* fn, const char* name, std::span<const std::size_t> s) {
  if (s.size() != 4)
    throw error(std::string(fn) + ": " + name + " must be 4-D (N, C, H, W), " + name + " is " + dims_text(s));
}

inline void require_positive(const char* fn, const char* what, index_t h, index_t w) {
  if (h < 1 || w < 1)
    throw error(std::string(fn) + ": " + what + " must be positive, " + what + " is (" + std::to_string(h) + ", " +
                std::to_string(w) + ")");
}

inline void require_padding(const char* fn, const kernels::pad2d& p) {
  if (p.top < 0 || p.bottom < 0 || p.left < 0 || p.right < 0)
    throw error(std::string(fn) + ": padding must not be negative, padding is (top " + std::to_string(p.top) +
                ", bottom " + std::to_string(p.bottom) + ", left " + std::to_string(p.left) + ", right " +
                std::to_string(p.right) + ")");
}

inline index_t checked_output(const char* fn, const char* axis, index_t in, index_t kernel, index_t stride,
                              index_t before, index_t after, index_t dilation, bool ceil_mode) {
  const index_t out = kernels::window_output_size(in, kernel, stride, before, after, dilation, ceil_mode);
  if (out < 1)
    throw error(std::string(fn) + ": the window does not fit along " + axis + ": input " + std::to_string(in) +
                " + padding " + std::to_string(before) + " + " + std::to_string(after) + " < window extent " +
                std::to_string(kernels::window_extent(kernel, dilation)) + " (kernel " + std::to_string(kernel) +
                ", dilation " + std::to_string(dilation) + ")");
  return out;
}

}  // namespace tessera::detail

namespace tessera::kernels {

/// The output shape (N, O, OH, OW) of a convolution of x (N, C, H, W) with w (O, C /
/// groups, KH, KW). Throws tessera::error naming `fn` and the numbers when the shapes or
/// parameters do not fit: "conv2d_forward: w (64, 3, 3, 3) needs x with 3 * groups 1 = 3
/// channels, x is (32, 4, 32, 32)".
inline std::array<std::size_t, 4> conv2d_output_shape(const char* fn, std::span<const std::size_t> x,
                                                       std::span<const std::size_t> w, const conv2d_params& p) {
  detail::require_nchw(fn, "x", x);
  if (w.size() != 4)
    throw error(std::string(fn) + ": w must be 4-D (O, C / groups, KH, KW), w is " + detail::dims_text(w));
  detail::require_positive(fn, "stride", p.stride_h, p.stride_w);
  detail::require_positive(fn, "dilation", p.dilation_h, p.dilation_w);
  detail::require_padding(fn, p.pad);
  if (p.groups < 1)
    throw error(std::string(fn) + ": groups must be positive, groups is " + std::to_string(p.groups));
  const auto g = std::size_t(p.groups);
  if (w[0] % g != 0)
    throw error(std::string(fn) + ": groups " + std::to_string(g) + " must divide the output channels of w " +
                detail::dims_text(w));
  if (w[1] * g != x[1])
    throw error(std::string(fn) + ": w " + detail::dims_text(w) + " needs x with " + std::to_string(w[1]) +
                " * groups " + std::to_string(g) + " = " + std::to_string(w[1] * g) + " channels, x is " +
                detail::dims_text(x));
  if (w[2] < 1 || w[3] < 1)
    throw error(std::string(fn) + ": the kernel must not be empty, w is " + detail::dims_text(w));
  const index_t oh = detail::checked_output(fn, "H", index_t(x[2]), index_t(w[2]), p.stride_h, p.pad.top,
                                            p.pad.bottom, p.dilation_h, false);
  const index_t ow = detail::checked_output(fn, "W", index_t(x[3]), index_t(w[3]), p.stride_w, p.pad.left,
                                            p.pad.right, p.dilation_w, false);
  return {x[0], w[0], std::size_t(oh), std::size_t(ow)};
}

/// The output shape (N, C, OH, OW) of pooling x (N, C, H, W). Throws on a bad window:
/// padding must be smaller than the kernel on each side (a window of padding alone has
/// no maximum), as PyTorch requires.
inline std::array<std::size_t, 4> pool2d_output_shape(const char* fn, std::span<const std::size_t> x,
                                                       const pool2d_params& p) {
  detail::require_nchw(fn, "x", x);
  detail::require_positive(fn, "kernel", p.kernel_h, p.kernel_w);
  detail::require_positive(fn, "stride", p.stride_h, p.stride_w);
  detail::require_padding(fn, p.pad);
  if (std::max(p.pad.top, p.pad.bottom) >= p.kernel_h || std::max(p.pad.left, p.pad.right) >= p.kernel_w)
    throw error(std::string(fn) + ": padding must be smaller than the kernel (" + std::to_string(p.kernel_h) +
                ", " + std::to_string(p.kernel_w) + "), padding is (top " + std::to_string(p.pad.top) +
                ", bottom " + std::to_string(p.pad.bottom) + ", left " + std::to_string(p.pad.left) + ", right " +
                std::to_string(p.pad.right) + ")");
  const index_t oh = detail::checked_output(fn, "H", index_t(x[2]), p.kernel_h, p.stride_h, p.pad.top,
                                            p.pad.bottom, 1, p.ceil_mode);
  const index_t ow = detail::checked_output(fn, "W", index_t(x[3]), p.kernel_w, p.stride_w, p.pad.left,
                                            p.pad.right, 1, p.ceil_mode);
  return {x[0], x[1], std::size_t(oh), std::size_t(ow)};
}

/// The padding after the image that makes a window of `kernel` at every one of `out`
/// positions fit: at least `after`, more under ceil_mode (the windows past the padding
/// that PyTorch's ceil_mode keeps). Kernel libraries without a ceil mode take this.
constexpr index_t effective_after(index_t in, index_t kernel, index_t stride, index_t before, index_t after,
                                  index_t out) {
  return std::max(after, (out - 1) * stride + kernel - in - before);
}

// ---- what the kernels return (every device, its own array types) --------------------

/// A convolution's weight gradients: dw of w's shape, db (O,) when the convolution has a
/// bias (otherwise empty).
template <class Array>
struct conv2d_weight_grads {
  Array dw;
  Array db;
};

/// A convolution's whole backward: dx of x's shape (empty where it was not asked for),
/// dw and db as conv2d_weight_grads. Weights is the weights' array type where it differs
/// from the activations' (the host's oneDNN-format tensors).
template <class Array, class Weights = Array>
struct conv2d_grads {
  Array dx;
  Weights dw;
  Weights db;
};

/// Per-channel sums of a local batch, the pieces a batch norm over several ranks adds up
/// (all-reduces) before it normalises: forward, sum of x and of x^2 over (N, H, W);
/// backward, sum of dy and of dy * x_hat.
template <class Array>
struct channel_sums {
  Array sum;
  Array sum_sq;
};

/// Per-channel batch statistics: the mean and the biased variance (divided by the count).
template <class Array>
struct batch_norm_stats {
  Array mean;
  Array variance;
};

/// A training-mode batch norm's forward: y, the batch's mean and biased variance per
/// channel, and what the backward needs besides (the ReLU mask where it is fused).
template <class Y, class Stat, class Workspace>
struct batch_norm_training {
  Y y;
  Stat mean;
  Stat variance;
  Workspace workspace;
};

/// A batch norm's gradients: dx, and per channel dgamma (sum of dy * x_hat) and dbeta
/// (sum of dy).
template <class X, class Stat>
struct batch_norm_grads {
  X dx;
  Stat dgamma;
  Stat dbeta;
};

/// A max pooling's forward: y and what its backward needs besides (the positions of the
/// maxima where the device keeps them).
template <class Y, class Workspace>
struct max_pool2d_result {
  Y y;
  Workspace workspace;
};

}  // namespace tessera::kernels
