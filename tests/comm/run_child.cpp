// A job started by tessera::run: every rank prints the backend, rank and size of its
// world, and the ranks meet in a barrier. With --fail-on=R, rank R throws after the
// first barrier while the others wait in a second one: tessera::run must print the
// error and end the whole job (nonzero exit) within seconds. With --kill-on=R, the ranks
// take steps (an all-reduce each, as a training step's gradients) and rank R kills
// itself with SIGKILL at a random step between 1 and 20, which it prints first. Run by
// the comm_run_* tests, with and without mpiexec, and as a job networked by a scheduler
// (tests/comm/job_by_hand.sh).
#include <csignal>
#include <chrono>
#include <random>
#include <span>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tessera/comm/launch.hpp>

int main(int argc, char** argv) {
  int fail_on = -1, kill_on = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--fail-on=", 10) == 0) fail_on = std::atoi(argv[i] + 10);
    if (std::strncmp(argv[i], "--kill-on=", 10) == 0) kill_on = std::atoi(argv[i] + 10);
  }
  return tessera::run(argc, argv, [&](tessera::any_communicator& world) {
    std::printf("backend %s rank %d size %d\n", std::string(world.backend()).c_str(), world.rank(), world.size());
    std::fflush(stdout);
    world.barrier();  // everyone is up
    if (world.rank() == fail_on) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      throw std::runtime_error("deliberate failure on rank " + std::to_string(fail_on));
    }
    if (kill_on >= 0) {
      const int at = std::uniform_int_distribution<int>(1, 20)(*std::make_unique<std::random_device>());
      if (world.rank() == kill_on) std::printf("rank %d: killed at step %d\n", kill_on, at);
      std::fflush(stdout);
      std::vector<float> grads(1024, 1.0f);
      for (int step = 1; step <= 1000; ++step) {  // the others never finish: rank kill_on dies first
        if (world.rank() == kill_on && step == at) std::raise(SIGKILL);
        world.all_reduce(std::span<float>(grads), tessera::reduce_op::mean);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    world.barrier();  // never completes when a rank failed
    if ((fail_on >= 0 || kill_on >= 0) && world.size() > 1)
      std::printf("rank %d: passed a barrier that rank %d never reached\n", world.rank(), fail_on >= 0 ? fail_on : kill_on);
    return 0;
  });
}
