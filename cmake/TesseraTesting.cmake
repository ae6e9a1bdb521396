# Helpers shared by tessera's tests, benchmarks and examples.
#
#   tessera_set_warnings(<target>)
#   tessera_test_optimization(<target>)
#   tessera_add_test(NAME <name> SOURCES <files...> [MPI_RANKS <n...>] [LIBS <targets...>]
#                    [TIMEOUT <seconds>] [LABELS <labels...>] [GPU])
#   tessera_add_mpi_run(NAME <test name> TARGET <executable target> RANKS <n>
#                       [TIMEOUT <seconds>] [LABELS <labels...>] [ARGS <args...>])
#
# tessera_add_test and the doctest main libraries it links (tessera_doctest_main,
# tessera_doctest_mpi_main) are used from tests/; tests/CMakeLists.txt creates them.

include_guard(GLOBAL)

set(TESSERA_TEST_TIMEOUT 300 CACHE STRING "Default timeout of each tessera test, in seconds")
option(TESSERA_TESTS_FULL_OPTIMIZATION "Compile the tests with the build type's optimisation (else -O1)" OFF)
set(TESSERA_MPIEXEC_EXTRA_FLAGS "--oversubscribe" CACHE STRING
    "Flags given to mpiexec after the rank count (OpenMPI: allow more ranks than cores)")

# Environment of every test run under mpiexec: OpenMPI refuses root without the
# first two; the others allow and tune more ranks than cores, and give each rank one
# OpenMP thread (oneDNN's and the host kernels'): the ranks already fill the cores.
set(TESSERA_MPI_TEST_ENVIRONMENT
  "OMPI_ALLOW_RUN_AS_ROOT=1"
  "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
  "OMPI_MCA_rmaps_base_oversubscribe=1"
  "OMPI_MCA_mpi_yield_when_idle=1"
  "OMP_NUM_THREADS=1")

# -Wall -Wextra on the project's own executables (never on the INTERFACE targets); for
# CUDA sources, on the host compiler's pass.
function(tessera_set_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
                                             $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  elseif(MSVC)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:/W4>)
  endif()
endfunction()

# Every target built for the tests (their executables, workers and mains, the docs'
# snippets) is compiled at -O1 in optimised builds (a later -O wins): their inputs are
# small, and -O3 doubles the suite's compile time. Examples, benchmarks and users' code keep
# the build type's flags; TESSERA_TESTS_FULL_OPTIMIZATION=ON gives the tests them too.
# nvcc's host pass of the GPU tests: tests/cuda/CMakeLists.txt.
function(tessera_test_optimization target)
  if(NOT TESSERA_TESTS_FULL_OPTIMIZATION)
    target_compile_options(${target} PRIVATE
                           $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<NOT:$<CONFIG:Debug>>>:-O1>)
  endif()
endfunction()

# Registers test `NAME`: executable target `TARGET` run under mpiexec with `RANKS`
# processes, labelled `mpi`.
function(tessera_add_mpi_run)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "" "NAME;TARGET;RANKS;TIMEOUT" "LABELS;ARGS")
  if(NOT ARG_NAME OR NOT ARG_TARGET OR NOT ARG_RANKS)
    message(FATAL_ERROR "tessera_add_mpi_run: NAME, TARGET and RANKS are required")
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT ${TESSERA_TEST_TIMEOUT})
  endif()
  add_test(NAME ${ARG_NAME}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ARG_RANKS}
            ${TESSERA_MPIEXEC_EXTRA_FLAGS} ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:${ARG_TARGET}> ${MPIEXEC_POSTFLAGS} ${ARG_ARGS})
  set(labels mpi ${ARG_LABELS})
  set_tests_properties(${ARG_NAME} PROPERTIES
    ENVIRONMENT "${TESSERA_MPI_TEST_ENVIRONMENT}"
    TIMEOUT ${ARG_TIMEOUT}
    SKIP_RETURN_CODE 77
    LABELS "${labels}")
endfunction()

# A doctest executable `<name>`. Without MPI_RANKS it links tessera::tessera and the
# shared doctest main, and runs as test `<name>`. With MPI_RANKS it links
# tessera::mpi and the MPI-aware main (tests/mpi_main.cpp), and runs as one test
# `<name>_np<N>` per rank count N, labelled `mpi`. GPU: the test needs a CUDA device;
# it links tessera::cuda and a main that exits with 77 (reported as skipped) when
# there is none, and is labelled `gpu`.
function(tessera_add_test)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "GPU" "NAME;TIMEOUT" "SOURCES;MPI_RANKS;LIBS;LABELS")
  if(NOT ARG_NAME OR NOT ARG_SOURCES)
    message(FATAL_ERROR "tessera_add_test: NAME and SOURCES are required")
  endif()
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "tessera_add_test(${ARG_NAME}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT ${TESSERA_TEST_TIMEOUT})
  endif()
  if(ARG_MPI_RANKS AND NOT TARGET tessera::mpi)
    message(WARNING "tessera_add_test(${ARG_NAME}): MPI not found, test skipped")
    return()
  endif()

  add_executable(${ARG_NAME} ${ARG_SOURCES})
  tessera_set_warnings(${ARG_NAME})
  tessera_test_optimization(${ARG_NAME})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS})
  # tests/: the helpers the test files share (device_under_test.hpp).
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests)

  set(main tessera_doctest_main)
  set(mpi_main tessera_doctest_mpi_main)
  if(ARG_GPU)
    target_link_libraries(${ARG_NAME} PRIVATE tessera::cuda)
    set(main tessera_doctest_gpu_main)
    set(mpi_main tessera_doctest_gpu_mpi_main)
    list(APPEND ARG_LABELS gpu)
  endif()
  if(NOT ARG_MPI_RANKS)
    target_link_libraries(${ARG_NAME} PRIVATE tessera::tessera ${main})
    add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
    set_tests_properties(${ARG_NAME} PROPERTIES TIMEOUT ${ARG_TIMEOUT} SKIP_RETURN_CODE 77)
    if(ARG_LABELS)
      set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}")
    endif()
  else()
    target_link_libraries(${ARG_NAME} PRIVATE tessera::mpi ${mpi_main})
    foreach(n IN LISTS ARG_MPI_RANKS)
      tessera_add_mpi_run(NAME ${ARG_NAME}_np${n} TARGET ${ARG_NAME} RANKS ${n}
                          TIMEOUT ${ARG_TIMEOUT} LABELS ${ARG_LABELS})
    endforeach()
  endif()
endfunction()
