// The device a test file runs its tensors on: the host by default, the GPU when the
// same file is compiled as CUDA with TESSERA_TEST_CUDA=1 (tests/cuda/ builds the
// operator and redistribution tests a second time that way). Tests build their inputs
// and expected values on the host and move them with to_test_device / to_host_array.
// The world is MPI's, or, compiled with TESSERA_TEST_GLOO=1 and linked with
// tests/gloo_main.cpp, a Gloo job's (the redistribution test's third build).
#pragma once

#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/tessera.hpp>
#if TESSERA_TEST_CUDA
#include <tessera/cuda.hpp>
#endif
#if TESSERA_TEST_GLOO
#include <tessera/comm/gloo.hpp>
#endif

namespace tessera::testing {

#if TESSERA_TEST_CUDA
using test_device = cuda_device;
/// Several ranks share one GPU in these tests, which NCCL refuses: device buffers go
/// through MPI, staged in pinned host memory.
using test_comm = staged_communicator<mpi_communicator>;
inline test_comm test_world() { return test_comm(mpi_communicator::world()); }
#elif TESSERA_TEST_GLOO
using test_device = cpu_device;
using test_comm = gloo_communicator;
any_communicator*& gloo_world_slot();  // tests/gloo_main.cpp
inline gloo_communicator& test_world() { return *gloo_world_slot()->target<gloo_communicator>(); }
#else
using test_device = cpu_device;
using test_comm = mpi_communicator;
inline test_comm test_world() { return mpi_communicator::world(); }
#endif

/// This process alone, moving the test device's buffers: the communicator of the
/// one-rank oracle runs.
inline any_communicator test_solo() {
  any_communicator one{local_communicator{}};
  return device_communicator(one, test_device{});
}

using test_tensor = tensor_on<float, test_device>;
template <class T>
using test_array = typename storage<T, test_device>::array;

/// A host tensor's copy on the test device.
template <class T>
tensor_on<T, test_device> to_test_device(const tensor_on<T, cpu_device>& x) {
#if TESSERA_TEST_CUDA
  return to_device(x);
#else
  return x;
#endif
}

/// A host array's copy on the test device.
template <class T>
test_array<T> to_test_array(const xt::xarray<T>& x) {
  return storage<T, test_device>::from_host(x);
}

/// An array of the test device, copied to the host.
template <class T>
xt::xarray<T> to_host_array(const test_array<T>& a) {
  return storage<T, test_device>::to_host(a);
}

/// A test device's tensor's shard, on the host.
template <class T>
xt::xarray<T> host_shard(const tensor_on<T, test_device>& x) {
  return to_host_array<T>(x.local());
}

}  // namespace tessera::testing
