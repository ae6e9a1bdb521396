// expect: static assertion failed: matmul: both inputs must split the contraction dim into the same number of pieces
// examples/semi_auto_static.cpp with fc's strategy changed to ((1, 2), (1, 2)): x splits
// the contraction dim 2 ways, the weight does not; the example must not compile.
#define SEMI_AUTO_FC_STRATEGY {{1, 2}, {1, 2}}
#include "../../examples/semi_auto_static.cpp"
