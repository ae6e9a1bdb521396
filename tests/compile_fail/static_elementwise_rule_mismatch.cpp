// expect: static assertion failed.*elementwise: inputs must split a shared dim alike
// Add of (16, 32) and (32,) with ((2, 4), (2,)): input 0 splits the columns 4 ways, input 1 2 ways.
#include <tessera/ops/elementwise_rule.hpp>

constexpr const tessera::elementwise_layouts& r =
    tessera::static_elementwise_rule<tessera::strategy{{2, 4}, {2}}, 8,
                                     tessera::shape_list{tessera::extents{16, 32}, tessera::extents{32}}>;

int main() { return r.dev.ndim; }
