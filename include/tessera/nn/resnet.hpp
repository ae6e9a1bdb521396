// ResNet with bottleneck blocks (He et al.; MindSpore's resnet.py of the parallel
// tutorials, torchvision's resnet50): a 7x7 stride-2 convolution, batch norm, ReLU and a
// 3x3 stride-2 max pooling, four stages of bottleneck blocks (1x1, 3x3 with the stage's
// stride, 1x1 widening 4 times, and a 1x1 projection where the shape changes), global
// average pooling and a Dense classifier. resnet50 is stages 3-4-6-3 (23,528,522
// parameters for 10 classes, as torchvision's); resnet(...) builds smaller ones for tests.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/nn/conv.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/module.hpp>

namespace tessera::nn {

namespace detail {
/// ReLU of a traced or tape value, named "<module>.<what>".
template <class T, class D, class V>
V relu_of(const module<T, D>& m, const std::string& what, V x) {
  return apply_named(m.op_name(what), placed(ops::relu_op{}, x, shape_list{shape_of(x)}), x);
}
}  // namespace detail

/// A bottleneck block: conv1 (1x1, in -> width), bn1, ReLU, conv2 (3x3, stride), bn2,
/// ReLU, conv3 (1x1, width -> 4 width), bn3, plus the shortcut (x, or down_sample's 1x1
/// convolution with the stride and its batch norm where the shape changes), ReLU. The
/// ReLUs after bn1 and bn2 run inside them (batch_norm2d::fuse_relu).
template <class T = float, class D = cpu_device>
class bottleneck : public module<T, D> {
 public:
  static constexpr index_t expansion = 4;

  bottleneck(index_t in_channels, index_t width, index_t stride = 1)
      : conv1(in_channels, width, 1),
        bn1(width),
        conv2(width, width, 3, stride, kernels::pad_mode::pad, 1),
        bn2(width),
        conv3(width, width * expansion, 1),
        bn3(width * expansion) {
    bn1.fuse_relu();
    bn2.fuse_relu();
    if (stride != 1 || in_channels != width * expansion) {
      down_conv.emplace(in_channels, width * expansion, 1, stride);
      down_bn.emplace(width * expansion);
    }
  }

  conv2d<T, D> conv1;
  batch_norm2d<T, D> bn1;
  conv2d<T, D> conv2;
  batch_norm2d<T, D> bn2;
  conv2d<T, D> conv3;
  batch_norm2d<T, D> bn3;
  std::optional<conv2d<T, D>> down_conv;
  std::optional<batch_norm2d<T, D>> down_bn;

  void visit(visitor<T, D>& v) override {
    v.child("conv1", conv1);
    v.child("bn1", bn1);
    v.child("conv2", conv2);
    v.child("bn2", bn2);
    v.child("conv3", conv3);
    v.child("bn3", bn3);
    if (down_conv) {
      v.child("down_sample.0", *down_conv);
      v.child("down_sample.1", *down_bn);
    }
  }

  template <class V>
  V operator()(V x) {
    V h = bn1(conv1(x));  // ReLU fused
    h = bn2(conv2(h));    // ReLU fused
    h = bn3(conv3(h));
    const V s = down_conv ? (*down_bn)((*down_conv)(x)) : x;
    const V sum = apply_named(this->op_name("add"),
                              detail::placed(ops::add_op{}, h, shape_list{detail::shape_of(h), detail::shape_of(s)}),
                              h, s);
    return detail::relu_of(*this, "relu3", sum);
  }
};

/// A stage of bottleneck blocks, named "0", "1", ...: the first with the stage's stride
/// and the projection, the others keeping the shape.
template <class T = float, class D = cpu_device>
class resnet_stage : public module<T, D> {
 public:
  resnet_stage(index_t in_channels, index_t width, int blocks, index_t stride) {
    if (blocks < 1) throw error("resnet: a stage needs at least one block, got " + std::to_string(blocks));
    for (int b = 0; b < blocks; ++b)
      blocks_.push_back(std::make_unique<bottleneck<T, D>>(b == 0 ? in_channels : width * bottleneck<T, D>::expansion,
                                                           width, b == 0 ? stride : 1));
  }
  bottleneck<T, D>& block(std::size_t i) { return *blocks_.at(i); }
  std::size_t size() const { return blocks_.size(); }

  void visit(visitor<T, D>& v) override {
    for (std::size_t i = 0; i < blocks_.size(); ++i) v.child(std::to_string(i), *blocks_[i]);
  }
  template <class V>
  V operator()(V x) {
    for (auto& b : blocks_) x = (*b)(x);
    return x;
  }

 private:
  std::vector<std::unique_ptr<bottleneck<T, D>>> blocks_;
};

/// ResNet with bottleneck stages of `blocks` blocks (widths base, 2 base, 4 base, 8 base,
/// the stages after the first with stride 2) on images of `in_channels` channels: the
/// stem conv1 (7x7, stride 2, padding 3, base channels), bn1 with its ReLU fused,
/// max_pool (3x3, stride 2, pad_mode same), layer1..layerK, global average pooling and end_point
/// (Dense 32 base -> num_classes). Parameter names follow MindSpore's resnet.py
/// ("layer1.0.conv1.weight", "end_point.weight").
template <class T = float, class D = cpu_device>
class resnet : public module<T, D> {
 public:
  resnet(std::vector<int> blocks, index_t num_classes, index_t base = 64, index_t in_channels = 3)
      : conv1(in_channels, base, 7, 2, kernels::pad_mode::pad, 3),
        bn1(base),
        max_pool(3, 2, kernels::pad_mode::same),
        end_point(base * 4 << (blocks.empty() ? 0 : blocks.size() - 1), num_classes) {
    bn1.fuse_relu();
    if (blocks.empty() || blocks.size() > 4)
      throw error("resnet: between 1 and 4 stages, got " + std::to_string(blocks.size()));
    index_t in = base;
    for (std::size_t s = 0; s < blocks.size(); ++s) {
      const index_t width = base << s;
      stages_.push_back(std::make_unique<resnet_stage<T, D>>(in, width, blocks[s], s == 0 ? 1 : 2));
      in = width * bottleneck<T, D>::expansion;
    }
  }

  conv2d<T, D> conv1;
  batch_norm2d<T, D> bn1;
  max_pool2d<T, D> max_pool;
  global_avg_pool2d<T, D> mean;
  dense<T, D> end_point;

  resnet_stage<T, D>& layer(std::size_t i) { return *stages_.at(i); }
  std::size_t stages() const { return stages_.size(); }

  void visit(visitor<T, D>& v) override {
    v.child("conv1", conv1);
    v.child("bn1", bn1);
    v.child("max_pool", max_pool);
    for (std::size_t s = 0; s < stages_.size(); ++s) v.child("layer" + std::to_string(s + 1), *stages_[s]);
    v.child("mean", mean);
    v.child("end_point", end_point);
  }

  template <class V>
  V operator()(V x) {
    x = max_pool(bn1(conv1(x)));  // ReLU fused
    for (auto& s : stages_) x = (*s)(x);
    return end_point(mean(x));
  }

 private:
  std::vector<std::unique_ptr<resnet_stage<T, D>>> stages_;
};

/// ResNet-50 for `num_classes` classes, as the seeds' resnet50(batch_size, num_classes)
/// and torchvision's resnet50(num_classes=...).
template <class T = float, class D = cpu_device>
std::unique_ptr<resnet<T, D>> resnet50(index_t num_classes = 10) {
  return std::make_unique<resnet<T, D>>(std::vector<int>{3, 4, 6, 3}, num_classes);
}

}  // namespace tessera::nn
