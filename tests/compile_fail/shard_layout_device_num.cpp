// expect: static assertion failed.*strategy: the product of an input's splits must divide the device count
// MindSpore's shard((2, 4)) needs 8 devices or a multiple; 6 is not.
#include <tessera/core/strategy.hpp>

constexpr tessera::layout l = tessera::shard_layout<tessera::split_tuple{2, 4}, 6>;
