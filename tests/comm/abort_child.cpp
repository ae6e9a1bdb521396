// A job in which one rank fails: rank 1 throws inside run_mpi while the other ranks
// wait in a barrier for it. run_mpi must print the error and end the whole job
// (nonzero exit) within seconds instead of leaving the others blocked. Run by the
// comm_abort test: mpiexec -n 3 abort_child.
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <thread>
#include <tessera/comm/mpi.hpp>

int main(int argc, char** argv) {
  return tessera::run_mpi(argc, argv, [](tessera::mpi_communicator& world) {
    world.barrier();  // everyone is up
    if (world.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      throw std::runtime_error("deliberate failure on rank 1");
    }
    world.barrier();  // never completes: rank 1 is gone
    std::printf("rank %d: passed a barrier that rank 1 never reached\n", world.rank());
  });
}
