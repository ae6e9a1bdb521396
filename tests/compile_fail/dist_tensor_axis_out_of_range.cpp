// expect: static assertion failed.*layout: a mesh axis index is out of range
// Mesh (2, 4) has axes 0 and 1; dim 1 names axis 2.
#include <tessera/tensor/dist_tensor.hpp>

tessera::dist_tensor<float, tessera::layout(tessera::mesh{2, 4}, {{0}, {2}})> t(tessera::extents{16, 32}, 0);
