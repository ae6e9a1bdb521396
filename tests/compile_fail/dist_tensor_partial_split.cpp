// expect: static assertion failed.*layout: a partial mesh axis cannot also split a tensor dim
// Mesh axis 1 splits dim 1 and is also partial.
#include <tessera/tensor/dist_tensor.hpp>

constexpr tessera::layout bad = tessera::layout(tessera::mesh{2, 4}, {{0}, {1}}).with_partial(1);
tessera::dist_tensor<float, bad> t(tessera::extents{16, 32}, 0);
