// The layers of convolutional networks on NCHW tensors: Conv2d, MaxPool2d, AvgPool2d
// (MindSpore's nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d, with their pad_mode) and global
// average pooling. Each applies one operator of ops/ (Conv2D, MaxPool, AvgPool,
// ReduceMean), eagerly on tape values or traced into a graph, with the strategy set by
// `shard` (data parallel when none is set; in a traced graph the parallel mode decides).
// BatchNorm2d is in nn/layers.hpp.
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <tessera/autodiff/ops.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/format.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/nn/init.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/ops/conv2d.hpp>
#include <tessera/ops/pool2d.hpp>
#include <tessera/ops/reduce.hpp>

namespace tessera::nn {

namespace detail {

/// The global shape of a traced or tape value.
template <class V>
extents shape_of(const V& x) {
  if constexpr (is_traced<V>) return x.shape();
  else return x.value().global_shape();
}

/// Throws "<layer>: the input is (2, 3, 8), expected (N, 16, H, W)" unless x is 4-D with
/// `channels` channels (any number when 0).
inline void require_nchw(const char* layer, const extents& s, index_t channels) {
  if (s.ndim != 4 || (channels > 0 && s[1] != channels))
    throw error(std::string(layer) + ": the input is " + to_string(s) + ", expected (N, " +
                (channels > 0 ? std::to_string(channels) : std::string("C")) + ", H, W)");
}

/// The operator an eager call applies: `op`, with the data-parallel strategy for the
/// context's devices when none is set (a traced call leaves it to the parallel mode).
template <class Op, class V>
Op placed(Op op, const V& x, const shape_list& in) {
  if constexpr (!is_traced<V>)
    if (op.st.n == 0) op.st = op.data_parallel(x.t->ctx().size(), in);
  return op;
}

}  // namespace detail

/// MindSpore's nn.Conv2d(in_channels, out_channels, kernel_size, stride, pad_mode,
/// padding, dilation, group), without a bias (MindSpore's has_bias=False default): the
/// weight "weight" (out, in / group, k, k), initialised He-uniform with a = sqrt(5) by
/// default (MindSpore's and PyTorch's). pad_mode same (the default) keeps ceil(H /
/// stride) rows, the odd padding row below; valid pads nothing; pad pads `padding` on
/// every side. The strategy is Conv2D's ((n, ci, h, w), (co, ci, 1, 1)).
///
///     nn::conv2d<float> c(64, 128, 3, 2);          // 3x3, stride 2, pad_mode same
///     c.shard(strategy{{2, 1, 2, 1}, {2, 1, 1, 1}});  // batch, height and output channels
template <class T = float, class D = cpu_device>
class conv2d : public module<T, D> {
 public:
  conv2d(index_t in_channels, index_t out_channels, index_t kernel_size, index_t stride = 1,
         kernels::pad_mode pad_mode = kernels::pad_mode::same, index_t padding = 0, index_t dilation = 1,
         index_t group = 1, std::optional<initializer> weight_init = {})
      : weight(checked_shape(in_channels, out_channels, kernel_size, stride, padding, dilation, group),
               weight_init ? *weight_init : initializer::he_uniform(std::sqrt(5.0))),
        in_(in_channels),
        kernel_(kernel_size),
        stride_(stride),
        mode_(pad_mode),
        padding_(padding),
        dilation_(dilation),
        group_(group) {}

  parameter<T, D> weight;

  /// Sets Conv2D's strategy ((n, ci, h, w), (co, ci, 1, 1)).
  conv2d& shard(const strategy& st) {
    op_.st = st;
    return *this;
  }
  const strategy& strategy_set() const { return op_.st; }
  index_t in_channels() const { return in_; }
  index_t out_channels() const { return weight.shape()[0]; }

  void visit(visitor<T, D>& v) override { v.param("weight", weight); }
  void reset_strategies() override { op_.st = strategy{}; }
  void place(int device_num) override {
    strategy st = op_.st.n ? op_.st : ops::conv2d_op::make(device_num, 1, 1, 1, 1);
    require(check(st, device_num), "conv2d");
    weight.set_target_layout(conv2d_rule(st, device_num).w);
  }

  /// The operator for an input of shape `x`: the window of pad_mode on its H and W.
  ops::conv2d_op op_for(const extents& x) const {
    ops::conv2d_op op = op_;
    op.p = kernels::mindspore_conv2d(mode_, x[2], x[3], kernel_, kernel_, stride_, stride_,
                                     kernels::pad2d::uniform(padding_), dilation_, dilation_, group_);
    return op;
  }

  template <class V>
  V operator()(V x) {
    const extents s = detail::shape_of(x);
    detail::require_nchw("conv2d", s, in_);
    const V w = weight.on(x);
    const ops::conv2d_op op = detail::placed(op_for(s), x, shape_list{s, weight.shape()});
    return apply_named(this->op_name("conv2d"), op, x, w);
  }

 private:
  static extents checked_shape(index_t in, index_t out, index_t k, index_t stride, index_t padding, index_t dilation,
                               index_t group) {
    if (in < 1 || out < 1 || k < 1 || stride < 1 || dilation < 1 || group < 1 || padding < 0)
      throw error("conv2d: channels, kernel_size, stride, dilation and group must be positive and padding not "
                  "negative: in " + std::to_string(in) + ", out " + std::to_string(out) + ", kernel_size " +
                  std::to_string(k) + ", stride " + std::to_string(stride) + ", padding " + std::to_string(padding) +
                  ", dilation " + std::to_string(dilation) + ", group " + std::to_string(group));
    if (in % group != 0 || out % group != 0)
      throw error("conv2d: group " + std::to_string(group) + " must divide in_channels " + std::to_string(in) +
                  " and out_channels " + std::to_string(out));
    return extents{out, in / group, k, k};
  }

  index_t in_, kernel_, stride_;
  kernels::pad_mode mode_;
  index_t padding_, dilation_, group_;
  ops::conv2d_op op_;
};

/// MindSpore's nn.MaxPool2d (Kind max) and nn.AvgPool2d (avg): kernel_size, stride and
/// pad_mode (valid, MindSpore's default; same; or pad with `padding`, ceil_mode and, for
/// the average, count_include_pad as PyTorch's). The strategy is ((n, c, h, w),).
template <ops::pool_kind Kind, class T = float, class D = cpu_device>
class pool2d : public module<T, D> {
 public:
  explicit pool2d(index_t kernel_size = 1, index_t stride = 1, kernels::pad_mode pad_mode = kernels::pad_mode::valid,
                  index_t padding = 0, bool ceil_mode = false, bool count_include_pad = true)
      : kernel_(kernel_size),
        stride_(stride),
        mode_(pad_mode),
        padding_(padding),
        ceil_(ceil_mode),
        count_pad_(count_include_pad) {
    if (kernel_size < 1 || stride < 1 || padding < 0)
      throw error(std::string(name()) + ": kernel_size and stride must be positive and padding not negative: "
                  "kernel_size " + std::to_string(kernel_size) + ", stride " + std::to_string(stride) +
                  ", padding " + std::to_string(padding));
  }

  pool2d& shard(const strategy& st) {
    op_.st = st;
    return *this;
  }
  void visit(visitor<T, D>&) override {}
  void reset_strategies() override { op_.st = strategy{}; }

  ops::pool2d_op<Kind> op_for(const extents& x) const {
    ops::pool2d_op<Kind> op = op_;
    op.p = kernels::mindspore_pool2d(mode_, x[2], x[3], kernel_, kernel_, stride_, stride_,
                                     kernels::pad2d::uniform(padding_), ceil_, count_pad_);
    return op;
  }

  template <class V>
  V operator()(V x) {
    const extents s = detail::shape_of(x);
    detail::require_nchw(name(), s, 0);
    return apply_named(this->op_name(name()), detail::placed(op_for(s), x, shape_list{s}), x);
  }

 private:
  static constexpr const char* name() { return Kind == ops::pool_kind::max ? "max_pool2d" : "avg_pool2d"; }
  index_t kernel_, stride_;
  kernels::pad_mode mode_;
  index_t padding_;
  bool ceil_, count_pad_;
  ops::pool2d_op<Kind> op_;
};

template <class T = float, class D = cpu_device>
using max_pool2d = pool2d<ops::pool_kind::max, T, D>;
template <class T = float, class D = cpu_device>
using avg_pool2d = pool2d<ops::pool_kind::avg, T, D>;

/// Global average pooling: (N, C, H, W) -> (N, C), the mean over H and W (ReduceMean
/// over (2, 3), as MindSpore's ResNet ends), named "<layer>.reduce_mean".
template <class T = float, class D = cpu_device>
class global_avg_pool2d : public module<T, D> {
 public:
  global_avg_pool2d& shard(const strategy& st) {
    op_.st = st;
    return *this;
  }
  void visit(visitor<T, D>&) override {}
  void reset_strategies() override { op_.st = strategy{}; }

  template <class V>
  V operator()(V x) {
    const extents s = detail::shape_of(x);
    detail::require_nchw("global_avg_pool2d", s, 0);
    return apply_named(this->op_name("reduce_mean"), detail::placed(op_, x, shape_list{s}), x);
  }

 private:
  ops::reduce_mean_op op_{{}, {2, 3}, false};
};

}  // namespace tessera::nn
