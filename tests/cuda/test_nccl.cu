// The NCCL communicator on one rank (this machine has one GPU, and NCCL refuses two
// ranks on one device): every collective's result and traffic count, splits, a
// grouped all_to_all_v, a redistribution of device tensors over NCCL, the non-blocking
// calls against the blocking ones, and the pipelined matmuls on device tensors; and
// any_communicator over it (any_nccl.cu, in this translation unit: nvcc is slow).
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <vector>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/comm/nccl.hpp>
#include <tessera/cuda.hpp>
#include <tessera/ops/matmul_pipelined.hpp>

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

static_assert(nonblocking_communicator<nccl_communicator>);

TEST_CASE("nccl_communicator: non-blocking calls equal the blocking ones, several in flight") {
  mpi_communicator world = mpi_communicator::world();
  nccl_communicator nc = nccl_communicator::create(world);
  const int g = nc.size();
  const std::vector<float> x{1, -2, 3.5f, 4, 5, -6, 7, 8};
  // The blocking results, and their traffic.
  auto ar = dev(x), rs_in = dev(x), rs = dev(std::vector<float>(x.size() / std::size_t(g))), bc = dev(x);
  nc.reset_stats();
  nc.all_reduce(std::span<float>(ar.data(), x.size()), reduce_op::sum);
  nc.reduce_scatter(std::span<const float>(rs_in.data(), x.size()), std::span<float>(rs.data(), rs.size()),
                    reduce_op::max);
  nc.broadcast(std::span<float>(bc.data(), x.size()), 0);
  const traffic blocking = nc.stats();
  // The same three non-blocking, in flight together, waited for in reverse order; a
  // kernel queued after each wait (a device copy on tessera's stream) sees the result.
  auto ar2 = dev(x), rs_in2 = dev(x), rs2 = dev(std::vector<float>(x.size() / std::size_t(g))), bc2 = dev(x);
  nc.reset_stats();
  auto r1 = nc.iall_reduce(std::span<float>(ar2.data(), x.size()), reduce_op::sum);
  auto r2 = nc.ireduce_scatter(std::span<const float>(rs_in2.data(), x.size()),
                               std::span<float>(rs2.data(), rs2.size()), reduce_op::max);
  auto r3 = nc.ibroadcast(std::span<float>(bc2.data(), x.size()), 0);
  CHECK(nc.stats() == blocking);  // counted when started
  CHECK(r3.pending());
  r3.wait();
  CHECK_FALSE(r3.pending());
  r2.wait();
  r1.wait();
  cuda::device_array<float> copy(cuda::device_array<float>::shape_type{x.size()});
  S::copy_box(ar2.data(), extents{index_t(x.size())}, extents{0}, copy.data(), extents{index_t(x.size())}, extents{0},
              extents{index_t(x.size())});
  CHECK(copy.to_vector() == ar.to_vector());
  CHECK(rs2.to_vector() == rs.to_vector());
  CHECK(bc2.to_vector() == bc.to_vector());
  // test() polls to completion; a completed request's wait() returns at once.
  auto r4 = nc.iall_reduce(std::span<float>(ar2.data(), x.size()), reduce_op::mean);
  while (!r4.test()) {
  }
  r4.wait();
  CHECK(ar2.to_vector() == ar.to_vector());  // one rank: every reduction of x is x
  // A request dropped unfinished orders tessera's stream after it.
  {
    auto r5 = nc.iall_reduce(std::span<float>(ar2.data(), x.size()), reduce_op::sum);
  }
  CHECK(ar2.to_vector() == ar.to_vector());
  // A blocking call after a non-blocking one runs after it on the device.
  auto r6 = nc.iall_reduce(std::span<float>(ar2.data(), x.size()), reduce_op::sum);
  nc.all_reduce(std::span<float>(ar2.data(), x.size()), reduce_op::sum);
  r6.wait();
  CHECK(ar2.to_vector() == ar.to_vector());
  // Two communicators' non-blocking calls in flight together (one communication stream
  // runs them in the order issued).
  nccl_communicator sub = nc.split(0, 0);
  auto ra = nc.iall_reduce(std::span<float>(ar2.data(), x.size()), reduce_op::sum);
  auto rb = sub.ibroadcast(std::span<float>(bc2.data(), x.size()), 0);
  rb.wait();
  ra.wait();
  CHECK(ar2.to_vector() == ar.to_vector());
  CHECK(bc2.to_vector() == bc.to_vector());
  CHECK_THROWS_WITH_AS((void)nc.ibroadcast(std::span<float>(bc2.data(), x.size()), 2),
                       "ibroadcast: root 2 is out of range for 1 ranks", error);
  CHECK_THROWS_WITH_AS((void)nc.ireduce_scatter(std::span<const float>(rs_in2.data(), 3),
                                                std::span<float>(rs2.data(), 2), reduce_op::sum),
                       "ireduce_scatter: in has 3 elements, expected 1 ranks x 2 = 2", error);
  nc.barrier();
}

TEST_CASE("matmul_overlapped and matmul_summa on device tensors over NCCL") {
  mpi_communicator world = mpi_communicator::world();
  nccl_communicator nc = nccl_communicator::create(world);
  device_context<nccl_communicator> ctx(nc);
  const int p = world.size();
  const index_t m = 6, k = 4, n = 5;
  const layout rep = layout::replicated(mesh{p}, 2);
  dist_tensor<float> a(rep, extents{m, k}, world.rank()), b(rep, extents{k, n}, world.rank());
  a.fill_global([](const auto& i) { return float(int(i[0] * 3 + i[1]) % 7 - 3); });
  b.fill_global([](const auto& i) { return float(int(i[0] * 5 + 2 * i[1]) % 5 - 2); });
  std::vector<float> c_ref(std::size_t(m * n), 0);  // small integers: exact
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j)
      for (index_t x = 0; x < k; ++x) c_ref[std::size_t(i * n + j)] += a.local()(i, x) * b.local()(x, j);
  const tensor_on<float, cuda_device> da = to_device(a), db = to_device(b);
  const ops::matmul_op op{strategy{{1, 1}, {1, p}}};
  for (auto how : {ops::partial_resolution::scatter_rows, ops::partial_resolution::scatter_cols,
                   ops::partial_resolution::all_reduce}) {
    const auto c = ops::matmul_overlapped(op, da, db, ctx, how, {3, 0});
    const auto full = to_host(redistribute(c, layout::replicated(mesh{p}, 2), ctx));
    CHECK(std::vector<float>(full.local().begin(), full.local().end()) == c_ref);
  }
  const auto s = ops::matmul_summa(op, da, db, ctx, {3, 0});
  const auto full = to_host(redistribute(s, layout::replicated(mesh{p}, 2), ctx));
  CHECK(std::vector<float>(full.local().begin(), full.local().end()) == c_ref);
}

namespace any_nccl_on_gpu {
#include "any_nccl.cu"
}
