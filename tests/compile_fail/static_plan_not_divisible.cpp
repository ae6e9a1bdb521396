// expect: static assertion failed.*layout: a tensor dim must be divisible by the product of its splits
// The target layout cuts 6 rows into 4 pieces.
#include <tessera/plan/planner.hpp>

constexpr const tessera::plan& p = tessera::static_plan<tessera::layout(tessera::mesh{4}, {{}}),
                                                        tessera::layout(tessera::mesh{4}, {{0}}),
                                                        tessera::extents{6}, float>;
