// docs/launching.md's example: a tessera::run program whose world is chosen when the
// job starts (mpiexec, tessera-run, a scheduler and workers, a rank table, or none).
// Every rank averages its gradients with the others and checks the mean.
// [program]
#include <cstdio>
#include <span>
#include <string>
#include <vector>
#include <tessera/comm/launch.hpp>

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](tessera::any_communicator& world) {
    // [grads]
    std::vector<float> g = {float(world.rank()), 2.0f};               // this rank's gradients
    world.all_reduce(std::span<float>(g), tessera::reduce_op::mean);  // their mean, on every rank
    // [/grads]
    const float n = float(world.size());                              // ranks 0 ... n - 1
    if (g[0] != (n - 1) / 2 || g[1] != 2.0f)
      throw tessera::error("launching: the mean over " + std::to_string(world.size()) + " ranks is (" +
                           std::to_string((n - 1) / 2) + ", 2), all_reduce gave (" + std::to_string(g[0]) +
                           ", " + std::to_string(g[1]) + ")");
    if (world.backend() != to_string(tessera::launched_backend()))
      throw tessera::error("launching: the world's backend is " + std::string(world.backend()) +
                           ", launched_backend() names " + std::string(to_string(tessera::launched_backend())));
    if (world.rank() == 0)
      std::printf("%s world, %d rank(s): mean gradient (%g, %g)\n", std::string(world.backend()).c_str(),
                  world.size(), g[0], g[1]);
  });
}
// [/program]
