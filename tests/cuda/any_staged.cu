// any_communicator over device-buffer communicators (compiled by nvcc): the handle over
// staged_communicator<mpi_communicator> gives the typed communicator's results on
// device arrays and its traffic, reports its backend and device buffers at run time,
// and its mesh_comm groups move device buffers; staged_communicator over a handle works
// as well. Runs on a GPU (several ranks share it through MPI); exits 77
// (skipped) without one.
#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/comm/staged.hpp>
#include <tessera/cuda.hpp>

namespace cuda_any_staged {  // the file's own scope in its test group's translation unit

using namespace tessera;

using staged_mpi = staged_communicator<mpi_communicator>;
static_assert(std::is_convertible_v<staged_mpi, any_communicator>);
static_assert(std::is_convertible_v<staged_communicator<local_communicator>, any_communicator>);
static_assert(communicator<staged_communicator<any_communicator>>);
static_assert(nonblocking_communicator<staged_communicator<any_communicator>>);
static_assert(comm_supports<staged_mpi, short> && comm_supports<staged_mpi, long double>);

namespace {

using darray = cuda::device_array<float>;
darray dev(const std::vector<float>& v) { return darray::from_host(v.data(), v.size(), {v.size()}); }

// Rank r's input: small integers, so every sum is exact.
std::vector<float> input_of(int r, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float((r + 1) * int(i % 11 + 1));
  return v;
}

}  // namespace

TEST_CASE("any_communicator over staged_communicator<mpi_communicator>: the typed results and traffic") {
  staged_mpi typed(mpi_communicator::world());
  any_communicator any = staged_mpi(mpi_communicator::world());
  CHECK(any.backend() == "staged(mpi)");
  CHECK(any.device_buffers());
  CHECK(uses_device_buffers(any));
  CHECK(any.target<staged_mpi>() != nullptr);
  const int g = any.size(), me = any.rank();
  const std::size_t block = 7, n = block * std::size_t(g);
  const std::vector<float> x = input_of(me, n);

  // Runs f on the typed communicator and on the handle, each writing a fresh device
  // array from `init`; the results and the traffic added must be equal.
  auto both = [&](const std::vector<float>& init, auto&& f) {
    darray t = dev(init), a = dev(init);
    const traffic t0 = typed.stats(), a0 = any.stats();
    f(typed, t);
    f(any, a);
    CHECK(a.to_vector() == t.to_vector());
    CHECK(any.stats() - a0 == typed.stats() - t0);
  };
  const darray in = dev(x);
  const std::span<const float> in_all(in.data(), n), in_block(in.data(), block);
  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::mean}) {
    both(x, [&](auto& c, darray& o) { c.all_reduce(std::span<float>(o.data(), n), op); });
    both(std::vector<float>(block, 0.f),
         [&](auto& c, darray& o) { c.reduce_scatter(in_all, std::span<float>(o.data(), block), op); });
    both(std::vector<float>(block, 0.f), [&](auto& c, darray& o) {
      auto r = c.ireduce_scatter(in_all, std::span<float>(o.data(), block), op);
      r.wait();
    });
    both(x, [&](auto& c, darray& o) {
      auto r = c.iall_reduce(std::span<float>(o.data(), n), op);
      while (!r.test()) {
      }
    });
  }
  both(std::vector<float>(n, 0.f), [&](auto& c, darray& o) { c.all_gather(in_block, std::span<float>(o.data(), n)); });
  both(std::vector<float>(n, 0.f), [&](auto& c, darray& o) { c.all_to_all(in_all, std::span<float>(o.data(), n)); });
  for (int root = 0; root < g; ++root) {
    both(input_of(me + root, n), [&](auto& c, darray& o) { c.broadcast(std::span<float>(o.data(), n), root); });
    both(input_of(me + root, n), [&](auto& c, darray& o) { c.ibroadcast(std::span<float>(o.data(), n), root).wait(); });
  }
  CHECK_THROWS_WITH_AS(any.broadcast(std::span<float>(dev(x).data(), n), g),
                       ("broadcast: root " + std::to_string(g) + " is out of range for " + std::to_string(g) + " ranks")
                           .c_str(),
                       error);

  any_communicator half = any.split(me % 2, me);
  CHECK(half.backend() == "staged(mpi)");
  CHECK(half.device_buffers());
  darray h = dev({float(me)});
  half.all_reduce(std::span<float>(h.data(), 1), reduce_op::sum);
  float expect = 0;
  for (int r = me % 2; r < g; r += 2) expect += float(r);
  CHECK(h.to_vector() == std::vector<float>{expect});
  any.barrier();
}

TEST_CASE("staged_communicator over an any_communicator, itself in a handle") {
  any_communicator world = mpi_communicator::world();
  const int g = world.size();
  any_communicator dev_world = staged_communicator<any_communicator>(std::move(world));
  CHECK(dev_world.backend() == "staged(mpi)");
  CHECK(dev_world.device_buffers());
  darray a = dev({1.f, 2.f});
  dev_world.all_reduce(std::span<float>(a.data(), 2), reduce_op::sum);
  CHECK(a.to_vector() == std::vector<float>{float(g), float(2 * g)});
  CHECK(dev_world.stats() == traffic{1, cost::all_reduce(8, g)});
}

TEST_CASE("mesh_comm groups of a handle over staged MPI move device buffers") {
  any_communicator any = staged_mpi(mpi_communicator::world());
  const int g = any.size(), me = any.rank();
  device_context<any_communicator> ctx(any);
  mesh_comm<any_communicator>& mc = ctx.on(mesh{1, g});
  any_communicator& row = mc.group({1});
  CHECK(row.backend() == "staged(mpi)");
  CHECK(row.size() == g);
  darray a = dev({float(me), 1.f});
  row.all_reduce(std::span<float>(a.data(), 2), reduce_op::sum);
  CHECK(a.to_vector() == std::vector<float>{float(g * (g - 1) / 2), float(g)});
  CHECK(ctx.total_stats() == traffic{1, cost::all_reduce(8, g)});
}
}  // namespace cuda_any_staged
