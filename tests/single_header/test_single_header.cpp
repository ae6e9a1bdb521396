// The test suite's check of the generated single header: this file sees only
// single_include/ (plus the xtensor and MPI include folders), never include/.
#include <doctest/doctest.h>

#include <mpi.h>
#include <tessera/tessera.hpp>

namespace {

constexpr tessera::mesh m{2, 4};
static_assert(m.size() == 8);
// Mesh (2, 4): the group of rank 5 over axis 1 is {4, 5, 6, 7}; over axis 0, {1, 5}.
static_assert(tessera::group_member(m, {1}, 5, 0) == 4);
static_assert(tessera::group_member(m, {0}, 5, 0) == 1);
static_assert(tessera::cost::all_gather(100, 4) == 300);

}  // namespace

TEST_CASE("single header: the mesh algebra agrees with the world's rank order") {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const tessera::mesh world{size};
  CHECK(world.size() == size);
  CHECK(tessera::group_member(world, {0}, rank, rank) == rank);
  for (int i = 0; i < size; ++i) CHECK(tessera::group_index(world, {0}, tessera::group_member(world, {0}, rank, i)) == i);
  CHECK(tessera::cost::all_gather(8, size) == 8 * (size - 1));
}
