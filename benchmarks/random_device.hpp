// Device arrays of uniform values in [-1, 1) for the GPU benchmarks (bench_cuda,
// bench_resnet_step_cuda), drawn on the host from a seed and copied.
#pragma once

#include <cstddef>
#include <random>
#include <utility>
#include <vector>
#include <tessera/cuda/device_array.hpp>

namespace tessera::bench {

inline cuda::device_array<float> random_device(std::vector<std::size_t> shape, unsigned seed) {
  std::size_t n = 1;
  for (std::size_t e : shape) n *= e;
  std::vector<float> h(n);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : h) v = u(gen);
  return cuda::device_array<float>::from_host(h.data(), n, std::move(shape));
}

}  // namespace tessera::bench
