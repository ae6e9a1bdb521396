// expect: static assertion failed.*redistribute: both layouts must be on the same mesh
// A plan between layouts on meshes (2) and (4).
#include <tessera/plan/planner.hpp>

constexpr const tessera::plan& p = tessera::static_plan<tessera::layout(tessera::mesh{2}, {{0}}),
                                                        tessera::layout(tessera::mesh{4}, {{0}}),
                                                        tessera::extents{8}, float>;
