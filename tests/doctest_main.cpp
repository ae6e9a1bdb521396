// The doctest main shared by every non-MPI test executable (compiled once). A run whose
// filters match no test case fails (ran_none.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include "ran_none.hpp"

int main(int argc, char** argv) {
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  return tessera_test::fail_if_ran_none(context.run());
}
