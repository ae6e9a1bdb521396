// any_communicator over nccl_communicator (compiled by nvcc, run on one rank: NCCL
// refuses two ranks on one GPU): the typed results through the handle, the backend and
// device buffers reported at run time, the element types NCCL lacks refused by name, and
// node_local on one rank. Exits 77 (skipped) without a GPU. Built into test_cuda_nccl
// (test_nccl.cu includes it).
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <vector>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/comm/nccl.hpp>
#include <tessera/cuda.hpp>

using namespace tessera;

static_assert(std::is_convertible_v<nccl_communicator, any_communicator>);
static_assert(comm_supports<nccl_communicator, float> && comm_supports<nccl_communicator, std::int64_t>);
static_assert(!comm_supports<nccl_communicator, short> && !comm_supports<nccl_communicator, long double>);
static_assert(sizeof(nccl_communicator::request) <= any_request::inline_bytes);  // kept inside, no allocation

TEST_CASE("any_communicator over nccl_communicator") {
  mpi_communicator world = mpi_communicator::world();
  cuda::select_device(world.node_local().rank());
  any_communicator any = nccl_communicator::create(world);
  CHECK(any.backend() == "nccl");
  CHECK(any.device_buffers());
  REQUIRE(any.target<nccl_communicator>() != nullptr);
  const int g = any.size();
  auto a = cuda::device_array<float>::from_host(std::vector<float>{1, 2, 3}.data(), 3, {3});
  any.all_reduce(std::span<float>(a.data(), 3), reduce_op::sum);
  CHECK(a.to_vector() == std::vector<float>{float(g), float(2 * g), float(3 * g)});
  auto r = any.iall_reduce(std::span<float>(a.data(), 3), reduce_op::max);
  r.wait();
  cuda::synchronize();
  CHECK(any.stats().calls == 2);
  auto i = cuda::device_array<std::int64_t>::from_host(std::vector<std::int64_t>{5}.data(), 1, {1});
  any.broadcast(std::span<std::int64_t>(i.data(), 1), 0);
  CHECK(i.to_vector() == std::vector<std::int64_t>{5});
  auto s = cuda::device_array<short>::from_host(std::vector<short>{1}.data(), 1, {1});
  CHECK_THROWS_WITH_AS(any.all_reduce(std::span<short>(s.data(), 1), reduce_op::sum),
                       "all_reduce: the nccl backend has no element type short", error);
  CHECK_THROWS_WITH_AS((void)any.isend(std::span<const float>(a.data(), 3), 0),
                       "isend: the nccl backend has no non-blocking send", error);
  any_communicator sub = any.split(0, 0);
  CHECK(sub.backend() == "nccl");
  CHECK(sub.size() == g);
  if (g == 1) CHECK(any.node_local().size() == 1);
}
