// The autodiff wrapper, loss and partial-sum tests of tests/autodiff/ and tests/ops/,
// built again with device tensors (TESSERA_TEST_CUDA): every N-rank run is on the GPU,
// redistributed through MPI with staging in host memory, and must give the one-rank
// run on the host (and, for the wrappers, its central differences). One translation
// unit for the three files (nvcc is slow): each file's cases sit in a namespace of
// their own; the headers they include are included here first.
#define TESSERA_TEST_CUDA 1
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "device_under_test.hpp"
#include "ops/sharded_testing.hpp"
#include <tessera/autodiff/losses.hpp>
#include <tessera/autodiff/ops.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/format.hpp>
#include <tessera/ops/batch_matmul.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape.hpp>

namespace autodiff_ops_on_gpu {
#include "autodiff/test_ops.cpp"
}
namespace autodiff_losses_on_gpu {
#include "autodiff/test_losses.cpp"
}
namespace linear_rule_on_gpu {
#include "ops/test_linear_rule.cpp"
}
