// The doctest main shared by every non-MPI test executable (compiled once).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
