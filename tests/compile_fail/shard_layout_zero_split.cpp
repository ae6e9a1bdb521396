// expect: static assertion failed.*strategy: every split must be positive
// A split of 0 pieces.
#include <tessera/core/strategy.hpp>

constexpr tessera::layout l = tessera::shard_layout<tessera::split_tuple{2, 0}, 8>;
