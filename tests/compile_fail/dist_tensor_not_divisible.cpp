// expect: static assertion failed.*layout: a tensor dim must be divisible by the product of its splits
// A static layout whose splits do not divide a static extent: 30 columns in 4 pieces.
#include <tessera/tensor/dist_tensor.hpp>

tessera::dist_tensor<float, tessera::layout(tessera::mesh{2, 4}, {{0}, {1}}), tessera::extents{16, 30}> t(0);
