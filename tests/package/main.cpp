// A consumer of tessera: the mesh algebra through the package's include path, JSON
// through the nlohmann/json that tessera::tessera brings, mpi.h through tessera::mpi
// (no MPI call: the program runs without a launcher), and the package's version equal
// to the headers'.
#include <mpi.h>
#include <tessera/core/mesh.hpp>
#include <tessera/core/version.hpp>
#include <tessera/io/json.hpp>

#include <cstdio>

static_assert(MPI_VERSION >= 3, "tessera::mpi must bring in an MPI-3 mpi.h");
static_assert(tessera::version() == TESSERA_PACKAGE_VERSION,
              "find_package(tessera)'s version must be the headers' TESSERA_VERSION");

int main() {
  constexpr tessera::mesh m{2, 4};
  static_assert(m.size() == 8);
  // Mesh rank order is row-major: rank 5 of a (2, 4) mesh has coordinates (1, 1).
  const auto c = m.coords(5);
  if (c[0] != 1 || c[1] != 1 || m.rank_of(c) != 5) {
    std::puts("tessera consumer: wrong mesh coordinates");
    return 1;
  }
  const tessera::io::json::value v = tessera::io::json::parse(R"({"mesh": [2, 4]})", "consumer");
  if (v.at("mesh").size() != 2 || tessera::io::json::to_int64(v.at("mesh")[1]) != 4) {
    std::puts("tessera consumer: wrong JSON");
    return 1;
  }
  std::puts("tessera consumer: ok");
  return 0;
}
