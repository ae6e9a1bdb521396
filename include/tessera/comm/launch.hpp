// tessera::run, the main of a program that names no communicator type: its world is an
// any_communicator whose backend follows from how the process was started (the MPI
// world under mpiexec; the Gloo world under tessera-run or a scheduler; one rank with no
// launcher). This header includes comm/mpi.hpp, so it needs MPI to compile and link
// (CMake: tessera::mpi); the Gloo world is compiled in where tessera::gloo is linked
// (TESSERA_WITH_GLOO). any_communicator.hpp and local.hpp need neither, and a program
// built without MPI makes its handle from a local_communicator itself. As a program's
// entry point it sits above every layer: it reads seed 003's rank table with
// io/rank_table.hpp.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/comm/rendezvous.hpp>
#include <tessera/core/error.hpp>
#include <tessera/io/rank_table.hpp>
#if TESSERA_WITH_GLOO
#include <tessera/comm/gloo_world.hpp>
#endif

namespace tessera {

/// The backends tessera::run makes a world on.
enum class world_backend : std::uint8_t {
  local,  ///< no launcher: this process alone, local_communicator
  mpi,    ///< an MPI launcher (mpiexec, mpirun, srun): the MPI world, mpi_communicator
  gloo,   ///< tessera-run, or a scheduler and workers started by hand: gloo_communicator
};

constexpr std::string_view to_string(world_backend b) noexcept {
  switch (b) {
    case world_backend::local: return "local";
    case world_backend::mpi: return "mpi";
    case world_backend::gloo: return "gloo";
  }
  return "unknown";
}

/// The environment variable that names the world's backend, overriding the launcher's:
/// "local", "mpi" or "gloo".
inline constexpr const char* world_backend_variable = "TESSERA_COMM_BACKEND";

/// The backend of this process's world, from its environment; the one place where a
/// backend is chosen. In order:
///
/// 1. TESSERA_COMM_BACKEND, when set and not empty: "local", "mpi" or "gloo" (anything
///    else throws tessera::error naming the values known). "mpi" without a launcher is
///    MPI's one-process world (a singleton).
/// 2. The variables of a store-networked job (rendezvous_launched(): tessera-run's
///    TESSERA_RANK with TESSERA_MASTER_PORT, MS_ROLE / TESSERA_ROLE, or a rank table's
///    RANK_TABLE_FILE with RANK_ID): gloo.
/// 3. The variables an MPI launcher gives each process: OMPI_COMM_WORLD_SIZE (Open MPI's
///    mpiexec and mpirun), PMIX_RANK (PMIx: Open MPI 5, srun --mpi=pmix), PMI_RANK and
///    PMI_SIZE (MPICH's and Intel MPI's Hydra, srun --mpi=pmi2): mpi.
/// 4. Otherwise local: one rank, no launcher.
inline world_backend launched_backend() {
  if (const char* forced = std::getenv(world_backend_variable); forced != nullptr && *forced != '\0') {
    const std::string_view v = forced;
    for (world_backend b : {world_backend::local, world_backend::mpi, world_backend::gloo})
      if (v == to_string(b)) return b;
    throw error(std::string(world_backend_variable) + " is \"" + std::string(v) +
                "\"; expected \"local\", \"mpi\" or \"gloo\"");
  }
  if (rendezvous_launched()) return world_backend::gloo;
  using detail::env_value;
  if (env_value("OMPI_COMM_WORLD_SIZE") || env_value("PMIX_RANK") || (env_value("PMI_RANK") && env_value("PMI_SIZE")))
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

/// The default port of a rank-table job's rendezvous, which rank 0 serves on the
/// master address (the server holding rank 0); TESSERA_MASTER_PORT overrides it.
inline constexpr int rank_table_default_port = 29500;

/// The job of a process started with a rank table (RANK_TABLE_FILE, RANK_ID and
/// optionally DEVICE_ID, as seed 003's scripts export them): its rank and world size
/// from the table, the rendezvous on the master address, served by rank 0.
inline rendezvous_environment rank_table_environment() {
  const io::rank_placement p = io::rank_table_placement_from_environment();
  rendezvous_environment e;
  e.rank = p.rank;
  e.world_size = p.world_size;
  e.host = p.master_addr;
  e.port = rank_table_default_port;
  if (const char* port = detail::env_value("TESSERA_MASTER_PORT"))
    e.port = detail::env_int("TESSERA_MASTER_PORT", port, 1, 65535);
  e.serves = p.rank == 0;
  e.source = std::string("RANK_TABLE_FILE=") + std::getenv("RANK_TABLE_FILE");
  e.tls = tls_from_environment();
  return e;
}

/// A store-networked job (tessera-run, or a scheduler and workers started by hand).
/// The scheduler serves the rendezvous until every worker has finished or one failed,
/// and never runs body. The rendezvous runs under TLS where the environment enables it
/// (tls_from_environment(); the program must link tessera::tls), the collectives over
/// Gloo's plain TCP. A worker joins the Gloo world, runs body(world) and says
/// goodbye; an exception (or std::terminate) tells the other workers through the store,
/// prints the message and ends the process with status 1.
template <class F>
int run_rendezvous(F& body) {
  rendezvous_environment env;
  try {
    const bool table = env_value("RANK_TABLE_FILE") != nullptr && env_value("RANK_ID") != nullptr &&
                       env_value("MS_ROLE") == nullptr && env_value("TESSERA_ROLE") == nullptr &&
                       env_value("TESSERA_RANK") == nullptr;
    env = table ? rank_table_environment() : read_rendezvous_environment();
  } catch (const std::exception& e) {
    end_process(-1, "", e.what());
  }
  if (env.process_role == rendezvous_environment::role::scheduler) {
    try {
      rendezvous_server server("", env.port, env.attempt, env.tls);
      std::printf("tessera: scheduler: serving the rendezvous of %d workers on port %d\n", env.world_size,
                  server.port());
      std::fflush(stdout);
      return server.serve_until_done(env.world_size, rendezvous_timeout());
    } catch (const std::exception& e) {
      end_process(-1, "scheduler: ", e.what());
    }
  }
#if TESSERA_WITH_GLOO
  std::unique_ptr<rendezvous_server> served;  // rank 0 of a rank table: for the whole job
  std::unique_ptr<rendezvous_member> member;
  try {
    if (env.serves) served = std::make_unique<rendezvous_server>("", env.port, 0, env.tls, "tessera: rank 0");
    member = std::make_unique<rendezvous_member>(env);
  } catch (const std::exception& e) {
    end_process(env.rank, "", e.what());
  }
  // Reports the failure to the other workers before this rank's connections close,
  // then ends the process; a failure that follows from an earlier one (a peer's
  // connection closed) names the first.
  static rendezvous_member* current = nullptr;
  current = member.get();
  static constexpr auto end_rank = [](const std::string& what, const char* prefix, bool consequence = false) {
    const std::string first = current->fail(what, consequence);
    if (first.empty()) end_process(current->rank(), prefix, what.c_str());
    end_process(current->rank(), "the job ended: ", first.c_str());
  };
  const std::terminate_handler previous = std::set_terminate([]() noexcept {
    std::string what = "std::terminate called without an active exception";
    if (std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        what = x.what();
      } catch (...) {
        what = "unknown exception (not derived from std::exception)";
      }
    }
    end_rank(what, "terminate: ");
  });
  int result = 0;
  {
    any_communicator world(std::move(member->world()));
    try {
      result = invoke_world_body(body, world);
    } catch (const comm_error& e) {
      end_rank(e.what(), "", true);
    } catch (const std::exception& e) {
      end_rank(e.what(), "");
    } catch (...) {
      end_rank("unknown exception (not derived from std::exception)", "");
    }
  }
  std::set_terminate(previous);
  member->finish();
  if (served) {  // the others still need the store until they finish
    member.reset();
    const int rc = served->serve_until_done(env.world_size, rendezvous_timeout());
    if (result == 0) result = rc;
  }
  return result;
#else
  (void)body;
  end_process(env.rank, "",
              ("this process was started by " + env.source +
               " (a job without MPI), but the program was built without Gloo: link it with tessera::gloo")
                  .c_str());
#endif
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
/// in the handle (no MPI call is made); under tessera-run or a scheduler (seed 001's
/// dynamic networking), the Gloo world (see detail::run_rendezvous). Failures behave as run_mpi's: an exception on any
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
    case world_backend::gloo:
      return detail::run_rendezvous(body);
    case world_backend::local:
      break;
  }
  return detail::run_local(body);
}

}  // namespace tessera
