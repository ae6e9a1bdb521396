// The graph executor and the redistribution executor on device tensors, in one
// translation unit (nvcc is slow; each file's cases sit in a namespace of their own and
// the headers they include are included here first):
// - tests/graph/test_priced_bytes.cpp built again with TESSERA_TEST_CUDA: every operator
//   of the library runs under every candidate strategy on the GPU (through the staged
//   communicator), moves the bytes the graph prices, and gives the one-rank run on the
//   host;
// - tests/exec/test_redistribute.cpp, the exhaustive redistribution test: device
//   shards, packed and unpacked by the CUDA kernels, moved through MPI with staging in
//   host memory.
#define TESSERA_TEST_CUDA 1
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mesh_comm.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/format.hpp>
#include <tessera/exec/redistribute.hpp>
#include <tessera/graph/execute.hpp>
#include <tessera/plan/format.hpp>

#include "device_under_test.hpp"

namespace priced_bytes_on_gpu {
#include "graph/test_priced_bytes.cpp"
}
namespace redistribute_on_gpu {
#include "exec/test_redistribute.cpp"
}
