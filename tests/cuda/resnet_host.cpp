// The small ResNet trained stand-alone on the host (oneDNN), for cnn.cu.
#include "resnet_host.hpp"

#include <tessera/comm/local.hpp>

namespace resnet_host {

using namespace tessera;

resnet_test::outcome train_stand_alone(int steps) {
  any_communicator one{local_communicator{}};
  context ctx(one);
  graph::parallel_config cfg;
  cfg.mode = graph::parallel_mode::stand_alone;
  std::vector<train_test::batch_t> data;
  for (int s = 0; s < steps; ++s) data.push_back(resnet_test::global_batch(s));
  return resnet_test::train<cpu_device>(cfg, ctx, data, false);
}

}  // namespace resnet_host
