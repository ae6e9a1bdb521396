// The small ResNet trained stand-alone on the host (oneDNN), for cnn.cu.
#include "resnet_host.hpp"

#include <tessera/comm/local.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/momentum.hpp>
#include <tessera/train/model.hpp>

#include "train/resnet_test.hpp"

namespace resnet_host {

using namespace tessera;

outcome train_stand_alone(int steps) {
  any_communicator one{local_communicator{}};
  context ctx(one);
  nn::resnet<float> net = resnet_test::small_resnet();
  nn::cross_entropy_loss<float> ce;
  optim::momentum<float> opt(net.trainable_params(), 0.05f, 0.9f);
  train::model<nn::resnet<float>, nn::cross_entropy_loss<float>>::options o;
  o.parallel.mode = graph::parallel_mode::stand_alone;
  o.seed = 3;
  train::model model(net, ce, opt, ctx, o);
  std::vector<train_test::batch_t> data;
  for (int s = 0; s < steps; ++s) data.push_back(resnet_test::global_batch(s));
  resnet_test::loss_recorder rec;
  model.train(1, data, {&rec});
  outcome out;
  out.losses = rec.losses;
  for (auto& [name, q] : net.named_parameters()) {
    out.names.push_back(name);
    out.params.push_back(q->data().local());
  }
  return out;
}

}  // namespace resnet_host
