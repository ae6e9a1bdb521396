// expect: static assertion failed.*layout: a mesh axis splits more than one tensor dim, or one dim twice
// Mesh axis 0 splits both tensor dims.
#include <tessera/tensor/dist_tensor.hpp>

tessera::dist_tensor<float, tessera::layout(tessera::mesh{2, 4}, {{0}, {0}}), tessera::extents{16, 32}> t(0);
