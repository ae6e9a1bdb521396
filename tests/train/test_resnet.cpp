// ResNet as modules: ResNet-50's traced shapes and parameter count equal torchvision's
// resnet50(num_classes=10); a small ResNet (the same blocks: convolutions, batch norms,
// max pooling, the residual Add, global average pooling, Dense) trained by train::model
// for a few steps on 1, 2 and 4 ranks in data parallel (synchronised batch norm),
// semi_auto_parallel (height, batch and output-channel splits of convolutions, with
// their halo exchanges) and auto_parallel gives the stand-alone losses and parameters;
// the convolutions' weights kept in oneDNN's layout between steps give the numbers of
// plain weights exactly.
//
// Tolerance: 1e-4 relative. The ranks add a convolution's and a batch norm's sums in
// another order than one rank does (per-rank partial sums of the weight gradients and
// of the batch statistics, combined by all-reduce; oneDNN picks its algorithm per
// shard shape), and three steps of momentum SGD carry those float roundings forward.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/nn/resnet.hpp>
#include <tessera/nn/trace.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/model.hpp>

#include "nn/nn_test.hpp"
#include "resnet_test.hpp"
#include "train_test.hpp"

namespace train_test_resnet {  // the file's own scope in its test group's translation unit

using namespace tessera;

namespace {

using train_test::batch_t;
using train_test::mode;
using resnet_test::global_batch;
using resnet_test::outcome;

outcome train_in(const graph::parallel_config& cfg, context& ctx, bool whole_batch, bool configured) {
  std::vector<batch_t> data;
  for (int s = 0; s < 3; ++s)
    data.push_back(whole_batch ? global_batch(s) : train_test::rows_of(global_batch(s), ctx.rank(), ctx.size()));
  return resnet_test::train<cpu_device>(cfg, ctx, data, configured);
}

}  // namespace

TEST_CASE("ResNet-50: torchvision's parameter count and the traced shapes of each stage") {
  auto net = nn::resnet50<float>(10);
  index_t count = 0;
  for (auto* q : net->trainable_params()) count += q->shape().size();
  CHECK(count == 23528522);
  const auto named = net->named_parameters();
  CHECK(named.front().first == "conv1.weight");
  CHECK(named.back().first == "end_point.bias");
  nn::cross_entropy_loss<float> ce;
  const nn::traced_network t = nn::trace(*net, ce, extents{2, 3, 224, 224}, extents{2});
  const graph::traced_graph& g = t.graph;
  CHECK(g.at(g.find("conv1.conv2d")).shape == extents{2, 64, 112, 112});
  CHECK(g.at(g.find("max_pool.max_pool2d")).shape == extents{2, 64, 56, 56});
  CHECK(g.at(g.find("layer1.2.relu3")).shape == extents{2, 256, 56, 56});
  CHECK(g.at(g.find("layer2.3.relu3")).shape == extents{2, 512, 28, 28});
  CHECK(g.at(g.find("layer3.5.relu3")).shape == extents{2, 1024, 14, 14});
  CHECK(g.at(g.find("layer4.2.relu3")).shape == extents{2, 2048, 7, 7});
  CHECK(g.at(g.find("mean.reduce_mean")).shape == extents{2, 2048});
  CHECK(g.at(t.output).shape == extents{2, 10});
  CHECK(g.at(g.find("layer2.0.down_sample.0.conv2d")).op->type() == "Conv2D");
}

TEST_CASE("a small ResNet trains in data parallel, semi-auto and auto parallel to the stand-alone numbers") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  any_communicator one{local_communicator{}};
  context solo(one);
  const outcome oracle = train_in(mode(graph::parallel_mode::stand_alone), solo, true, false);
  REQUIRE(oracle.losses.size() == 3);
  for (double l : oracle.losses) CHECK(std::isfinite(l));
  struct mode_case {
    const char* what;
    graph::parallel_config cfg;
    bool whole_batch, configured;
  };
  const std::vector<mode_case> cases = {
      {"data_parallel", mode(graph::parallel_mode::data_parallel), false, false},
      {"semi_auto_parallel", mode(graph::parallel_mode::semi_auto_parallel), false, true},
      {"auto_parallel, dynamic programming",
       mode(graph::parallel_mode::auto_parallel, graph::search_mode::dynamic_programming), false, false},
  };
  for (const mode_case& c : cases) {
    CAPTURE(std::string(c.what));
    const outcome got = train_in(c.cfg, ctx, c.whole_batch, c.configured);
    // The convolutions' weights stay in oneDNN's layout between steps (on several
    // ranks their gradients are summed in row-major order and brought to it).
    CHECK(got.kept_forms > 0);
    REQUIRE(got.losses.size() == oracle.losses.size());
    for (std::size_t i = 0; i < got.losses.size(); ++i) {
      CAPTURE(i);
      CHECK(got.losses[i] == doctest::Approx(oracle.losses[i]).epsilon(1e-4));
    }
    REQUIRE(got.params.size() == oracle.params.size());
    for (std::size_t i = 0; i < got.params.size(); ++i) {
      CAPTURE(got.names[i]);
      CHECK(nn_test::close(got.params[i], oracle.params[i], 1e-4));
    }
  }
}

TEST_CASE("convolution weights kept in oneDNN's layout between steps train as plain weights do") {
  // The same kernels read the same values either way, and the update of the kept weights
  // is the same arithmetic on each element, in another order: equal, not merely close.
  any_communicator one{local_communicator{}};
  context solo(one);
  // Wide enough that the weights' channel blocks are whole (a form that only reorders
  // the plain weights, which the optimizer updates as it is).
  auto run = [&](bool kept) {
    kernels::cpu::set_dnnl_conv_weights_kept(kept);
    std::vector<batch_t> data;
    for (int s = 0; s < 3; ++s) data.push_back(global_batch(s));
    outcome out = resnet_test::train<cpu_device>(mode(graph::parallel_mode::stand_alone), solo, data, false,
                                                 nn::resnet<float>(std::vector<int>{1, 1}, resnet_test::classes, 16));
    kernels::cpu::set_dnnl_conv_weights_kept(true);
    return out;
  };
  const outcome plain = run(false), kept = run(true);
  CHECK(plain.kept_forms == 0);
  CHECK(kept.kept_forms > 0);
  CHECK(kept.losses == plain.losses);
  REQUIRE(kept.params.size() == plain.params.size());
  for (std::size_t i = 0; i < kept.params.size(); ++i) {
    CAPTURE(kept.names[i]);
    CHECK(kept.params[i] == plain.params[i]);
  }
  // The momentum, as a checkpoint holds it: in the plain weights' order.
  REQUIRE(kept.state.size() == plain.state.size());
  for (std::size_t i = 0; i < kept.state.size(); ++i) {
    CAPTURE(i);
    CHECK(kept.state[i] == plain.state[i]);
  }
}

}  // namespace train_test_resnet
