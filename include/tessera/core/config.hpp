// Capacities and basic types shared by the whole library.
#pragma once

#include <cstdint>

namespace tessera {

/// Largest number of mesh (device-matrix) axes a layout can use.
inline constexpr int max_mesh_ndim = 6;
/// Largest tensor rank a layout can describe.
inline constexpr int max_tensor_ndim = 6;

/// Element counts and global extents are 64-bit.
using index_t = std::int64_t;

}  // namespace tessera
