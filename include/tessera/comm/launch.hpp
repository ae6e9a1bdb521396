// tessera::run, the main of a program that names no communicator type: its world is an
// any_communicator whose backend follows from how the process was started (the MPI
// world under mpiexec, one rank with no launcher). This header includes comm/mpi.hpp,
// so it needs MPI to compile and link (CMake: tessera::mpi); any_communicator.hpp and
// local.hpp do not, and a program built without MPI makes its handle from a
// local_communicator itself.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/core/error.hpp>

namespace tessera {

/// The backends tessera::run makes a world on.
enum class world_backend : std::uint8_t {
  local,  ///< no launcher: this process alone, local_communicator
  mpi,    ///< an MPI launcher (mpiexec, mpirun, srun): the MPI world, mpi_communicator
};

constexpr std::string_view to_string(world_backend b) noexcept {
  switch (b) {
    case world_backend::local: return "local";
    case world_backend::mpi: return "mpi";
  }
  return "unknown";
}

namespace detail {

inline bool env_set(const char* name) noexcept {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

}  // namespace detail

/// The environment variable that names the world's backend, overriding the launcher's:
/// "local" or "mpi".
inline constexpr const char* world_backend_variable = "TESSERA_COMM_BACKEND";

/// The backend of this process's world, from its environment; the one place where a
/// backend is chosen. In order:
///
/// 1. TESSERA_COMM_BACKEND, when set and not empty: "local" or "mpi" (anything else
///    throws tessera::error naming the values known). "mpi" without a launcher is MPI's
///    one-process world (a singleton).
/// 2. The variables an MPI launcher gives each process: OMPI_COMM_WORLD_SIZE (Open MPI's
///    mpiexec and mpirun), PMIX_RANK (PMIx: Open MPI 5, srun --mpi=pmix), PMI_RANK and
///    PMI_SIZE (MPICH's and Intel MPI's Hydra, srun --mpi=pmi2): mpi.
/// 3. Otherwise local: one rank, no launcher.
///
/// A further backend (Gloo, whose workers find a rendezvous through environment
/// variables) adds its enumerator, a test of its launcher's variables here before the
/// MPI one, and its case in run().
inline world_backend launched_backend() {
  if (const char* forced = std::getenv(world_backend_variable); forced != nullptr && *forced != '\0') {
    const std::string_view v = forced;
    for (world_backend b : {world_backend::local, world_backend::mpi})
      if (v == to_string(b)) return b;
    throw error(std::string(world_backend_variable) + " is \"" + std::string(v) +
                "\"; expected \"local\" or \"mpi\"");
  }
  if (detail::env_set("OMPI_COMM_WORLD_SIZE") || detail::env_set("PMIX_RANK") ||
      (detail::env_set("PMI_RANK") && detail::env_set("PMI_SIZE")))
    return world_backend::mpi;
  return world_backend::local;
}

namespace detail {

template <class F>
int invoke_world_body(F& body, any_communicator& world) {
  using R = std::invoke_result_t<F&, any_communicator&>;
  if constexpr (std::is_void_v<R>) {
    std::invoke(body, world);
    return 0;
  } else {
    return static_cast<int>(std::invoke(body, world));
  }
}

/// Prints "tessera: rank 0: <prefix><what>" (or "tessera: <what>" when the rank is
/// unknown, rank < 0) and ends this process with status 1, after the abort hooks (a
/// device communicator stops its work): run()'s failure path without MPI.
[[noreturn]] inline void end_process(int rank, const char* prefix, const char* what) noexcept {
  std::fflush(stdout);
  if (rank >= 0) std::fprintf(stderr, "tessera: rank %d: %s%s\n", rank, prefix, what);
  else std::fprintf(stderr, "tessera: %s%s\n", prefix, what);
  std::fflush(stderr);
  run_abort_hooks();
  std::_Exit(1);
}

[[noreturn]] inline void local_terminate_handler() noexcept {
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      end_process(0, "terminate: ", x.what());
    } catch (...) {
      end_process(0, "terminate: ", "unknown exception (not derived from std::exception)");
    }
  }
  end_process(0, "terminate: ", "std::terminate called without an active exception");
}

/// The one-rank world: body(world) with world over a local_communicator. An exception
/// (or std::terminate) prints the message and ends the process with status 1.
template <class F>
int run_local(F& body) {
  const std::terminate_handler previous = std::set_terminate(&local_terminate_handler);
  int result = 0;
  try {
    any_communicator world(local_communicator{});
    result = invoke_world_body(body, world);
  } catch (const std::exception& e) {
    end_process(0, "", e.what());
  } catch (...) {
    end_process(0, "", "unknown exception (not derived from std::exception)");
  }
  std::set_terminate(previous);
  return result;
}

}  // namespace detail

/// The main of a tessera program whose communicator type is chosen when the job starts:
///
///     int main(int argc, char** argv) {
///       return tessera::run(argc, argv, [](tessera::any_communicator& world) {
///         ...  // SPMD body; may return void or int
///       });
///     }
///
/// Calls body(world) with the world of the backend launched_backend() names: under
/// mpiexec, run_mpi's world (MPI initialised and finalised here, or left as it was found,
/// a duplicate of MPI_COMM_WORLD) in the handle; with no launcher, a local_communicator
/// in the handle (no MPI call is made). Failures behave as run_mpi's: an exception on any
/// rank prints "tessera: rank R: <what>" to stderr and ends the whole job at once
/// (MPI_Abort under MPI; status 1 for the one-rank world), never leaving the other ranks
/// waiting in a collective. A TESSERA_COMM_BACKEND that names no backend prints
/// "tessera: <what>" and ends the process with status 1. Returns body's int result, or 0
/// when body returns void.
template <class F>
int run(int argc, char** argv, F&& body) {
  world_backend backend = world_backend::local;
  try {
    backend = launched_backend();
  } catch (const std::exception& e) {
    detail::end_process(-1, "", e.what());
  }
  switch (backend) {
    case world_backend::mpi:
      return run_mpi(argc, argv, [&body](mpi_communicator& w) -> int {
        any_communicator world(std::move(w));
        return detail::invoke_world_body(body, world);
      });
    case world_backend::local:
      break;
  }
  return detail::run_local(body);
}

}  // namespace tessera
