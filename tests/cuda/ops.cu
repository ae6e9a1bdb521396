// The operator and autodiff tests of tests/ops/ and tests/autodiff/, built again with
// device tensors (TESSERA_TEST_CUDA): every case runs on the GPU, redistributed
// through MPI with staging in host memory, and must give the single-process host
// results. One translation unit for all of them (nvcc is slow): each file's cases sit
// in a namespace of their own; the headers they include are included here first.
#define TESSERA_TEST_CUDA 1
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "device_under_test.hpp"

namespace matmul_on_gpu {
#include "ops/test_matmul.cpp"
}
namespace elementwise_on_gpu {
#include "ops/test_elementwise.cpp"
}
namespace reduce_on_gpu {
#include "ops/test_reduce.cpp"
}
namespace softmax_on_gpu {
#include "ops/test_softmax.cpp"
}
namespace autodiff_on_gpu {
#include "autodiff/test_value_and_grad.cpp"
}
