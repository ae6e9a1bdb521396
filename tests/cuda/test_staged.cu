// The staged communicator's non-blocking collectives under mpiexec (device buffers
// through MPI in pinned host memory): several requests in flight, completed in reverse
// order or by polling, give the blocking calls' values and traffic; a request dropped
// unfinished still delivers its result; bad sizes and roots are rejected with their
// text, and so is a buffer in host memory.
#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/comm/staged.hpp>
#include <tessera/cuda/device_array.hpp>

namespace cuda_test_staged {  // the file's own scope in its test group's translation unit

using namespace tessera;

static_assert(nonblocking_communicator<staged_communicator<mpi_communicator>>);
static_assert(nonblocking_communicator<staged_communicator<local_communicator>>);
static_assert(takes_device_buffers<staged_communicator<mpi_communicator>>);

namespace {

using darray = cuda::device_array<float>;

darray dev(const std::vector<float>& v) { return darray::from_host(v.data(), v.size(), {v.size()}); }

// Rank r's input: (r + 1) * (i + 1) - 3 i (small integers: every sum is exact).
std::vector<float> input_of(int r, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float((r + 1) * int(i + 1) - 3 * int(i));
  return v;
}

}  // namespace

TEST_CASE("staged_communicator: non-blocking collectives in flight together equal the blocking ones") {
  staged_communicator<mpi_communicator> comm(mpi_communicator::world());
  const int g = comm.size(), me = comm.rank();
  const std::size_t block = 5, n = block * std::size_t(g);
  const std::vector<float> x = input_of(me, n);

  // The values expected, from every rank's input.
  std::vector<float> sum(n, 0), mx(n, -1e30f);
  for (int r = 0; r < g; ++r) {
    const std::vector<float> xr = input_of(r, n);
    for (std::size_t i = 0; i < n; ++i) sum[i] += xr[i], mx[i] = std::max(mx[i], xr[i]);
  }
  const std::vector<float> sum_block(sum.begin() + std::ptrdiff_t(block) * me,
                                     sum.begin() + std::ptrdiff_t(block) * (me + 1));
  const int root = g - 1;
  const std::vector<float> bcast = input_of(root, n);

  // The blocking calls, and their traffic.
  darray a = dev(x), rs_in = dev(x), rs = dev(std::vector<float>(block, 0)), bc = dev(x), m = dev(x);
  comm.reset_stats();
  comm.all_reduce(std::span<float>(a.data(), n), reduce_op::sum);
  comm.reduce_scatter(std::span<const float>(rs_in.data(), n), std::span<float>(rs.data(), block), reduce_op::sum);
  comm.broadcast(std::span<float>(bc.data(), n), root);
  comm.all_reduce(std::span<float>(m.data(), n), reduce_op::max);
  const traffic blocking = comm.stats();
  CHECK(a.to_vector() == sum);
  CHECK(rs.to_vector() == sum_block);
  CHECK(bc.to_vector() == bcast);
  CHECK(m.to_vector() == mx);

  // The same four non-blocking, all in flight, waited for in reverse order.
  darray a2 = dev(x), rs_in2 = dev(x), rs2 = dev(std::vector<float>(block, 0)), bc2 = dev(x), m2 = dev(x);
  comm.reset_stats();
  auto r1 = comm.iall_reduce(std::span<float>(a2.data(), n), reduce_op::sum);
  auto r2 = comm.ireduce_scatter(std::span<const float>(rs_in2.data(), n), std::span<float>(rs2.data(), block),
                                 reduce_op::sum);
  auto r3 = comm.ibroadcast(std::span<float>(bc2.data(), n), root);
  auto r4 = comm.iall_reduce(std::span<float>(m2.data(), n), reduce_op::max);
  static_assert(pollable_request<decltype(r2)>);
  CHECK(comm.stats() == blocking);  // C's traffic, counted when started
  r4.wait();
  r3.wait();
  r2.wait();
  r1.wait();
  CHECK_FALSE(r1.pending());
  CHECK(a2.to_vector() == sum);
  CHECK(rs2.to_vector() == sum_block);
  CHECK(bc2.to_vector() == bcast);
  CHECK(m2.to_vector() == mx);
  CHECK(rs_in2.to_vector() == x);  // the input is left as it was

  // Polled to completion with test(); wait() after that returns at once. Mean divides.
  darray a3 = dev(x);
  auto r5 = comm.iall_reduce(std::span<float>(a3.data(), n), reduce_op::mean);
  while (!r5.test()) {
  }
  CHECK_FALSE(r5.pending());
  r5.wait();
  std::vector<float> mean = sum;
  for (float& v : mean) v /= float(g);
  CHECK(a3.to_vector() == mean);

  // Dropped unfinished: the destructor waits and copies the result back.
  darray a4 = dev(x);
  { auto dropped = comm.iall_reduce(std::span<float>(a4.data(), n), reduce_op::sum); }
  CHECK(a4.to_vector() == sum);

  // Many more than the pool keeps, in flight at once: each its own pinned block.
  constexpr int many = 12;
  std::vector<darray> bufs;
  for (int i = 0; i < many; ++i) bufs.push_back(dev(x));
  std::vector<decltype(r1)> flight;
  for (int i = 0; i < many; ++i) flight.push_back(comm.iall_reduce(std::span<float>(bufs[std::size_t(i)].data(), n),
                                                                   reduce_op::sum));
  for (int i = many - 1; i >= 0; --i) flight[std::size_t(i)].wait();
  for (const darray& b : bufs) CHECK(b.to_vector() == sum);

  // Errors name the non-blocking call.
  CHECK_THROWS_WITH_AS((void)comm.ireduce_scatter(std::span<const float>(rs_in2.data(), n - 1),
                                                  std::span<float>(rs2.data(), block), reduce_op::sum),
                       (std::string("ireduce_scatter: in has ") + std::to_string(n - 1) + " elements, expected " +
                        std::to_string(g) + " ranks x 5 = " + std::to_string(n))
                           .c_str(),
                       error);
  CHECK_THROWS_WITH_AS((void)comm.ibroadcast(std::span<float>(bc2.data(), n), g),
                       (std::string("ibroadcast: root ") + std::to_string(g) + " is out of range for " +
                        std::to_string(g) + " ranks")
                           .c_str(),
                       error);
  comm.barrier();
}

TEST_CASE("staged_communicator over a one-rank communicator: non-blocking calls complete at once") {
  staged_communicator<local_communicator> comm(local_communicator{});
  const std::vector<float> x{1, 2, 3, 4};
  darray a = dev(x), o = dev({0, 0, 0, 0}), b = dev(x);
  auto r1 = comm.ireduce_scatter(std::span<const float>(a.data(), 4), std::span<float>(o.data(), 4), reduce_op::sum);
  auto r2 = comm.ibroadcast(std::span<float>(b.data(), 4), 0);
  CHECK(r1.test());
  r2.wait();
  CHECK(o.to_vector() == x);
  CHECK(b.to_vector() == x);
  CHECK(comm.stats().calls == 2);
  CHECK(comm.stats().bytes == 0);
}

TEST_CASE("staged_communicator: host memory handed to it is an error that says so") {
  staged_communicator<mpi_communicator> comm(mpi_communicator::world());
  std::vector<float> host(8, 1.0f), out(8 * std::size_t(comm.size()));
  darray d = dev(host), g = dev(std::vector<float>(out.size(), 0.0f));
  const std::string says = "staged communicator: a buffer in host memory where GPU memory was expected";
  const auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const error& e) {
      return e.what();
    }
    return "";
  };
  // A host input (staged in, device to host) and a host output (staged out, host to
  // device), each beside a device buffer that is right.
  CHECK(message([&] { comm.all_reduce(std::span<float>(host), reduce_op::sum); }).starts_with(says));
  CHECK(message([&] {
          comm.all_gather(std::span<const float>(d.data(), 8), std::span<float>(out));
        }).starts_with(says));
  // The device buffers themselves still go through.
  comm.all_gather(std::span<const float>(d.data(), 8), std::span<float>(g.data(), g.size()));
  CHECK(g.to_vector() == std::vector<float>(out.size(), 1.0f));
}
}  // namespace cuda_test_staged
