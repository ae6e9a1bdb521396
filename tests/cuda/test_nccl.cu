// The NCCL communicator on one rank (this machine has one GPU, and NCCL refuses two
// ranks on one device): every collective's result and traffic count, splits, a
// grouped all_to_all_v, and a redistribution of device tensors over NCCL.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>
#include <tessera/comm/mpi.hpp>
#include <tessera/cuda.hpp>

using namespace tessera;
using S = storage<float, cuda_device>;

namespace {
cuda::device_array<float> dev(const std::vector<float>& v) {
  return cuda::device_array<float>::from_host(v.data(), v.size(), {v.size()});
}
}  // namespace

TEST_CASE("nccl_communicator: collectives on one rank") {
  mpi_communicator world = mpi_communicator::world();
  nccl_communicator nc = nccl_communicator::create(world);
  CHECK(nc.size() == world.size());
  CHECK(nc.rank() == world.rank());
  static_assert(takes_device_buffers<nccl_communicator>);
  auto in = dev({1, 2, 3, 4}), out = dev({0, 0, 0, 0});
  nc.all_reduce(std::span<const float>(in.data(), 4), std::span<float>(out.data(), 4), reduce_op::sum);
  CHECK(out.to_vector() == std::vector<float>{1, 2, 3, 4});
  nc.all_reduce(std::span<float>(out.data(), 4), reduce_op::max);
  nc.all_gather(std::span<const float>(in.data(), 4), std::span<float>(out.data(), 4));
  CHECK(out.to_vector() == std::vector<float>{1, 2, 3, 4});
  nc.reduce_scatter(std::span<const float>(in.data(), 4), std::span<float>(out.data(), 4), reduce_op::mean);
  CHECK(out.to_vector() == std::vector<float>{1, 2, 3, 4});
  auto o2 = dev({0, 0, 0, 0});
  nc.all_to_all(std::span<const float>(in.data(), 4), std::span<float>(o2.data(), 4));
  CHECK(o2.to_vector() == std::vector<float>{1, 2, 3, 4});
  const std::vector<int> counts{3}, displs{1};
  auto o3 = dev({9, 9, 9, 9});
  nc.all_to_all_v(std::span<const float>(in.data(), 4), counts, displs, std::span<float>(o3.data(), 4), counts,
                  displs);
  CHECK(o3.to_vector() == std::vector<float>{9, 2, 3, 4});
  nc.broadcast(std::span<float>(in.data(), 4), 0);
  nc.barrier();
  auto req = nc.iall_reduce(std::span<float>(in.data(), 4), reduce_op::sum);
  req.wait();
  CHECK(in.to_vector() == std::vector<float>{1, 2, 3, 4});
  nccl_communicator sub = nc.split(0, 0);
  CHECK(sub.size() == 1);
  sub.all_reduce(std::span<float>(in.data(), 4), reduce_op::sum);
  CHECK(in.to_vector() == std::vector<float>{1, 2, 3, 4});
  CHECK(nc.stats().calls > 0);
  CHECK(nc.stats().bytes == 0);  // one rank receives nothing from others
  CHECK_THROWS_WITH_AS(nc.broadcast(std::span<float>(in.data(), 4), 3), "broadcast: root 3 is out of range for 1 ranks",
                       error);
}

TEST_CASE("device tensors redistribute over NCCL") {
  mpi_communicator world = mpi_communicator::world();
  nccl_communicator nc = nccl_communicator::create(world);
  device_context<nccl_communicator> ctx(nc);
  const mesh m{world.size()};
  dist_tensor<float> h(layout(m, {{0}, {}}), extents{4, 6}, world.rank());
  h.fill_global([](const auto& i) { return float(i[0] * 6 + i[1]); });
  const tensor_on<float, cuda_device> d = to_device(h);
  const auto r = redistribute(d, layout(m, {{}, {0}}), ctx);
  const auto back = to_host(redistribute(r, layout::replicated(m, 2), ctx));
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < 6; ++j) CHECK(back.local()(i, j) == float(i * 6 + j));
}
