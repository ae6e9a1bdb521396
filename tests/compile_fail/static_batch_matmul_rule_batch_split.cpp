// expect: static assertion failed.*batch_matmul: both inputs must split each batch dim alike
// BatchMatMul of (4, 8, 16) and (4, 16, 8) with ((2, 2, 2), (1, 2, 1)): A splits the batch 2 ways, B does not.
#include <tessera/ops/batch_matmul_rule.hpp>

constexpr const tessera::batch_matmul_layouts& r =
    tessera::static_batch_matmul_rule<tessera::strategy{{2, 2, 2}, {1, 2, 1}}, 8, tessera::extents{4, 8, 16},
                                      tessera::extents{4, 16, 8}>;

int main() { return r.dev.ndim; }
