// The operator and autodiff tests of tests/ops/ and tests/autodiff/, built again with
// device tensors (TESSERA_TEST_CUDA): every case runs on the GPU, redistributed
// through MPI with staging in host memory, and must give the single-process host
// results (and, for the autodiff wrappers, their central differences; the composed
// losses and the partial sums through linear operators included). One translation unit
// for all of them (nvcc is slow): each file's cases sit in a namespace of their own; the
// headers they include are included here first.
#define TESSERA_TEST_CUDA 1
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
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
#include <tessera/ops/argmax.hpp>
#include <tessera/ops/batch_matmul.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/linear_rule.hpp>
#include <tessera/ops/matmul.hpp>
#include <tessera/ops/one_hot.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape.hpp>
#include <tessera/ops/softmax_axis.hpp>
#include <tessera/ops/sparse_cross_entropy.hpp>

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
namespace batch_matmul_on_gpu {
#include "ops/test_batch_matmul.cpp"
}
namespace one_hot_on_gpu {
#include "ops/test_one_hot.cpp"
}
namespace softmax_axis_on_gpu {
#include "ops/test_softmax_axis.cpp"
}
namespace shape_on_gpu {
#include "ops/test_shape.cpp"
}
namespace argmax_on_gpu {
#include "ops/test_argmax.cpp"
}
namespace sparse_cross_entropy_on_gpu {
#include "ops/test_sparse_cross_entropy.cpp"
}
namespace autodiff_on_gpu {
#include "autodiff/test_value_and_grad.cpp"
}
namespace autodiff_ops_on_gpu {
#include "autodiff/test_ops.cpp"
}
namespace autodiff_losses_on_gpu {
#include "autodiff/test_losses.cpp"
}
namespace linear_rule_on_gpu {
#include "ops/test_linear_rule.cpp"
}
