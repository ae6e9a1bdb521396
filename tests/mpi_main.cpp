// The main of every MPI test executable (compiled once): runs the doctest cases on
// each rank and fails the job if any rank failed. Rank 0 prints doctest's usual
// report; the other ranks print only their failures, then one line naming the rank.
// Compiled again with TESSERA_TEST_REQUIRES_GPU=1 for the GPU tests: without a CUDA
// device every rank exits with 77, which ctest reports as skipped. A run whose filters
// match no test case fails on every rank (ran_none.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include "ran_none.hpp"

#include <mpi.h>

#include <cstdio>
#if TESSERA_TEST_REQUIRES_GPU
#include <tessera/cuda/runtime.hpp>
#endif

int main(int argc, char** argv) {
#if TESSERA_TEST_REQUIRES_GPU
  if (!tessera::cuda::available()) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
#endif
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  doctest::Context context;
  // mpiexec gives each rank a pseudo-terminal, which doctest takes for a console:
  // no colors by default, so that logs stay readable (--force-colors brings them back).
  context.setOption("no-colors", true);
  if (rank != 0) context.setOption("minimal", true);
  context.applyCommandLine(argc, argv);

  const int result = tessera_test::fail_if_ran_none(context.run());
  int failed = result != 0 ? 1 : 0;
  if (failed && rank != 0) std::fprintf(stderr, "[rank %d] test cases failed on this rank\n", rank);

  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed && !failed && rank == 0)
    std::fprintf(stderr, "[rank 0] passed here, but test cases failed on another rank\n");
  MPI_Finalize();
  return any_failed;
}
