// The host's side of the GPU ResNet test (cnn.cu): tests/train/resnet_test.hpp's small
// ResNet trained stand-alone on the host, compiled by the host compiler in
// resnet_host.cpp (nvcc's view of the host has no oneDNN kernels).
#pragma once

#include "train/resnet_test.hpp"

namespace resnet_host {

/// `steps` steps of resnet_test::train on the host, stand-alone on one rank, on
/// resnet_test::global_batch(0), (1), ...
resnet_test::outcome train_stand_alone(int steps);

}  // namespace resnet_host
