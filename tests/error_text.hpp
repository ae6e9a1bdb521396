// error_of(f): the text of the tessera::error that f() throws, or "(no error)" when it
// throws none; the tests compare it with the exact message an input must produce.
#pragma once

#include <string>
#include <tessera/core/error.hpp>

namespace tessera::testing {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace tessera::testing
