// The bandwidth cost model: bytes each rank receives from other ranks in one
// collective, under a bandwidth-optimal (ring-style) algorithm. The planner
// prices plans with these functions and the communicators count their traffic
// with them, so a plan's byte count and the executor's measured bytes agree.
#pragma once

#include <tessera/core/config.hpp>

namespace tessera::cost {

/// AllGather over g ranks of `in_bytes` per rank: each rank receives the other
/// g - 1 blocks.
constexpr index_t all_gather(index_t in_bytes, int g) { return (g - 1) * in_bytes; }

/// ReduceScatter over g ranks of an `in_bytes` buffer (g blocks): (g - 1) / g of it.
constexpr index_t reduce_scatter(index_t in_bytes, int g) { return (g - 1) * in_bytes / g; }

/// AllReduce over g ranks of `bytes`: a ReduceScatter then an AllGather, 2 (g - 1) / g.
constexpr index_t all_reduce(index_t bytes, int g) { return 2 * (g - 1) * bytes / g; }

/// AllToAll over g ranks of an `in_bytes` buffer (g equal blocks): all blocks but one's own.
constexpr index_t all_to_all(index_t in_bytes, int g) { return (g - 1) * in_bytes / g; }

/// Broadcast of `bytes` from one root to g ranks: a non-root receives the buffer once.
constexpr index_t broadcast(index_t bytes, int g) { return g > 1 ? bytes : 0; }

}  // namespace tessera::cost
