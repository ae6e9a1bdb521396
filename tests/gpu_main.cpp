// The main of the single-process GPU test executables (compiled once): runs the
// doctest cases when a CUDA device is present, else exits with 77, which ctest reports
// as skipped (the build machines compile the GPU tests but have no GPU). A run whose
// filters match no test case fails (ran_none.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include "ran_none.hpp"

#include <cstdio>
#include <tessera/cuda/runtime.hpp>

int main(int argc, char** argv) {
  if (!tessera::cuda::available()) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  doctest::Context context;
  context.setOption("no-colors", true);
  context.applyCommandLine(argc, argv);
  return tessera_test::fail_if_ran_none(context.run());
}
