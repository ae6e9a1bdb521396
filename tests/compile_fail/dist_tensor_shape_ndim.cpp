// expect: static assertion failed.*layout: the shape's rank must equal the layout's tensor rank
// A layout of a matrix with a static shape of rank 3.
#include <tessera/tensor/dist_tensor.hpp>

tessera::dist_tensor<float, tessera::layout(tessera::mesh{2, 4}, {{0}, {1}}), tessera::extents{16, 32, 4}> t(0);
