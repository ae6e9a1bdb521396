// expect: static assertion failed.*matmul: both inputs must split the contraction dim into the same number of pieces
// MatMul ((2, 4), (2, 1)): A splits the contraction dim 4 ways, B 2 ways.
#include <tessera/ops/matmul_rule.hpp>

constexpr const tessera::matmul_layouts& r = tessera::static_matmul_rule<tessera::strategy{{2, 4}, {2, 1}}, 8>;

int main() { return r.dev.ndim; }
