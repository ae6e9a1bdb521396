// tessera's version: the one place it is written. CMakeLists.txt reads it from here into
// project(VERSION), so the installed package's tesseraConfigVersion.cmake agrees.
#pragma once

#include <string_view>

#define TESSERA_VERSION_MAJOR 0
#define TESSERA_VERSION_MINOR 1
#define TESSERA_VERSION_PATCH 0
/// "MAJOR.MINOR.PATCH".
#define TESSERA_VERSION "0.1.0"

namespace tessera {

/// The version of the headers in use, "MAJOR.MINOR.PATCH" (TESSERA_VERSION).
constexpr std::string_view version() { return TESSERA_VERSION; }

}  // namespace tessera
