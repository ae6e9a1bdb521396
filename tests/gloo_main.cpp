// The main of the test executables that run over Gloo (compiled once): a job networked
// by a scheduler (tests/comm/job_by_hand.sh starts it) or by tessera-run. tessera::run
// makes the world (the scheduler process only serves the rendezvous); each worker runs
// the doctest cases with the world at testing::gloo_world(), and the job fails if any
// worker failed. Rank 0 prints doctest's usual report; the others print only their
// failures, then one line naming the rank.
#define DOCTEST_CONFIG_IMPLEMENT
#include "ran_none.hpp"

#include <cstdio>
#include <span>
#include <tessera/comm/launch.hpp>

namespace tessera::testing {
any_communicator*& gloo_world_slot() {
  static any_communicator* world = nullptr;
  return world;
}
}  // namespace tessera::testing

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [&](tessera::any_communicator& world) {
    tessera::testing::gloo_world_slot() = &world;
    doctest::Context context;
    context.setOption("no-colors", true);
    if (world.rank() != 0) context.setOption("minimal", true);
    context.applyCommandLine(argc, argv);
    const int failed = tessera_test::fail_if_ran_none(context.run()) != 0 ? 1 : 0;
    if (failed && world.rank() != 0) std::fprintf(stderr, "[rank %d] test cases failed on this rank\n", world.rank());
    int any_failed = failed;
    world.all_reduce(std::span<int>(&any_failed, 1), tessera::reduce_op::max);
    if (any_failed && !failed && world.rank() == 0)
      std::fprintf(stderr, "[rank 0] passed here, but test cases failed on another rank\n");
    return any_failed;
  });
}
