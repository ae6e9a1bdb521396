// The host's side of the GPU ResNet test (cnn.cu): tests/train/resnet_test.hpp's small
// ResNet trained stand-alone on the host, compiled by the host compiler in
// resnet_host.cpp (nvcc's view of the host has no oneDNN kernels).
#pragma once

#include <string>
#include <vector>
#include <xtensor/xarray.hpp>

namespace resnet_host {

struct outcome {
  std::vector<double> losses;
  std::vector<std::string> names;
  std::vector<xt::xarray<float>> params;
};

/// `steps` steps of Momentum(0.05, 0.9) of the small ResNet on one rank, through
/// train::model, seed 3, on resnet_test::global_batch(0), (1), ...
outcome train_stand_alone(int steps);

}  // namespace resnet_host
