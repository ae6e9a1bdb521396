// Shared by the ResNet training tests on the host (test_resnet.cpp) and on the GPU
// (tests/cuda/cnn.cu, resnet_host.cpp): the small ResNet, its global batches, the
// strategies of its semi_auto_parallel runs, and its training on any device with the
// losses and parameters it ends with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>
#include <tessera/core/strategy.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/nn/resnet.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/callbacks.hpp>
#include <tessera/train/model.hpp>

#include "train_test.hpp"

namespace resnet_test {

using namespace tessera;

constexpr index_t batch = 8, image = 32, classes = 4;

/// Four stages of one block each, 4 base channels, 4 classes, on 32x32 images: the stem
/// gives (8, 4, 16, 16), the max pooling (8, 4, 8, 8), layer1 (8, 16, 8, 8), layer2 (8,
/// 32, 4, 4), layer3 (8, 64, 2, 2), layer4 (8, 128, 1, 1). (On 16x16 images layer3 would
/// already be 1x1, and two stages of batch norm over 8 values per channel magnify float
/// rounding to 1e-3 of the weights in three steps, on one rank and on N alike: an
/// ill-conditioned test, not a parallel difference.)
template <class D = cpu_device>
nn::resnet<float, D> small_resnet() {
  return nn::resnet<float, D>(std::vector<int>{1, 1, 1, 1}, classes, 4);
}

/// Step s's global batch: images (8, 3, 32, 32), labels in [0, 4).
inline train_test::batch_t global_batch(int s) { return train_test::image_batch(s, batch, image, classes); }

/// The strategies a semi_auto_parallel run sets on p ranks: the stem's rows split (halo
/// exchange) from 4 ranks, layer1's 3x3 convolution split by batch and output channels,
/// layer2's first 1x1 convolution split by input channels (partial sums), the classifier
/// by output features.
template <class D>
void set_strategies(nn::resnet<float, D>& net, int p) {
  if (p == 1) return;
  const int h = p >= 4 ? 2 : 1, n = p / h;
  net.conv1.shard(strategy{{n, 1, h, 1}, {1, 1, 1, 1}});
  net.layer(0).block(0).conv2.shard(strategy{{n, 1, 1, 1}, {h, 1, 1, 1}});
  net.layer(1).block(0).conv1.shard(strategy{{1, p, 1, 1}, {1, p, 1, 1}});
  net.end_point.shard(strategy{{1, 1}, {p, 1}});
}

/// Records each step's loss.
struct loss_recorder : train::callback<float> {
  std::vector<double> losses;
  void on_step_end(train::run_context<float>& rc) override { losses.push_back(rc.loss); }
};

/// A run's step losses, its parameters' global values on the host, by name, this rank's
/// shards of the optimizer's state (as checkpoints hold them), and how many parameters it
/// left held in a kernel's layout (kept_forms: the convolutions' weights on the host,
/// kernels/cpu/dnnl.hpp).
struct outcome {
  std::vector<double> losses;
  std::vector<std::string> names;
  std::vector<xt::xarray<float>> params;
  std::vector<xt::xarray<float>> state;
  int kept_forms = 0;
};

/// `net` (the small ResNet unless given) on device D trained by train::model under `cfg`
/// on the ranks of `ctx`, Momentum(0.05, 0.9), seed 3, one step per batch of `data` (this
/// rank's rows, or whole batches stand-alone); `configured` sets set_strategies first.
template <class D>
outcome train(const graph::parallel_config& cfg, context& ctx, std::vector<train_test::batch_t> data,
              bool configured, nn::resnet<float, D> net = small_resnet<D>()) {
  if (configured) set_strategies(net, ctx.size());
  nn::cross_entropy_loss<float, D> ce;
  optim::momentum<float, D> opt(net.trainable_params(), 0.05f, 0.9f);
  typename train::model<nn::resnet<float, D>, nn::cross_entropy_loss<float, D>>::options o;
  o.parallel = cfg;
  o.seed = 3;
  train::model model(net, ce, opt, ctx, o);
  loss_recorder rec;
  model.train(1, data, {&rec});
  outcome out;
  out.losses = rec.losses;
  for (auto& [name, q] : net.named_parameters()) {
    out.names.push_back(name);
    out.kept_forms += q->data().form() != nullptr;
    const auto whole = redistribute(q->data(), layout::replicated(q->layout().dev, q->shape().ndim), ctx);
    out.params.push_back(storage<float, D>::to_host(whole.local()));
  }
  for (auto& [name, t] : opt.state_tensors()) out.state.push_back(t.local());
  return out;
}

}  // namespace resnet_test
