# Helpers shared by tessera's tests, benchmarks and examples.
#
#   tessera_set_warnings(<target>)
#   tessera_test_optimization(<target>)
#   tessera_add_test(NAME <name> SOURCES <files...> [MPI_RANKS <n...>] [LIBS <targets...>]
#                    [TIMEOUT <seconds>] [LABELS <labels...>] [GPU] [GROUP <executable>])
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

option(TESSERA_GPU_TESTS_COMPILE_ONLY
       "Compile the GPU tests' host code at -O0: on a machine without a GPU they only skip, so their build is a compile check (scripts/test.sh sets this there)"
       OFF)

# The optimisation of the GPU tests' CUDA sources in the calling directory: nvcc's -O,
# which sets its host compiler's (device code is optimised either way), rewritten in
# CMAKE_CUDA_FLAGS_<config> to -O1 as the host tests' (TESSERA_TESTS_FULL_OPTIMIZATION
# keeps the build type's), or to -O0 with TESSERA_GPU_TESTS_COMPILE_ONLY (the host pass
# of tests/cuda/'s largest translation unit: 53 s against 104 s at -O1). Rewritten, not
# added: nvcc warns about a second -O.
macro(tessera_gpu_test_cuda_flags)
  if(TESSERA_GPU_TESTS_COMPILE_ONLY)
    set(_tessera_gpu_opt -O0)
  elseif(NOT TESSERA_TESTS_FULL_OPTIMIZATION)
    set(_tessera_gpu_opt -O1)
  else()
    set(_tessera_gpu_opt "")
  endif()
  if(_tessera_gpu_opt)
    foreach(_tessera_config IN ITEMS RELEASE RELWITHDEBINFO MINSIZEREL)
      string(REGEX REPLACE "(^| )-O[0-9s]( |$)" "\\1${_tessera_gpu_opt}\\2" CMAKE_CUDA_FLAGS_${_tessera_config}
             "${CMAKE_CUDA_FLAGS_${_tessera_config}}")
    endforeach()
  endif()
endmacro()

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

option(TESSERA_TESTS_UNITY "Compile each group of test files (tessera_add_test's GROUP) as one translation unit" ON)

# A doctest executable `<name>`. Without MPI_RANKS it links tessera::tessera and the
# shared doctest main, and runs as test `<name>`. With MPI_RANKS it links
# tessera::mpi and the MPI-aware main (tests/mpi_main.cpp), and runs as one test
# `<name>_np<N>` per rank count N, labelled `mpi`. GPU: the test needs a CUDA device;
# it links tessera::cuda and a main that exits with 77 (reported as skipped) when
# there is none, and is labelled `gpu`.
#
# GROUP <executable>: the test's files join the executable <executable>, shared by the
# tests of that group, instead of making an executable `<name>`; the tests keep their
# names and each runs only its own files' cases (doctest's --source-file). The
# instantiations of tessera's templates that the files share are then compiled once:
# with TESSERA_TESTS_UNITY (the default) the group's files of each language are compiled
# as one translation unit (tests/train/'s eight MPI files: a quarter of the time of
# compiling them apart), so files that reuse a name keep their code in a namespace named
# after the file. The tests of a group agree on MPI and GPU; the executable links every
# library any of them names.
function(tessera_add_test)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "GPU" "NAME;TIMEOUT;GROUP" "SOURCES;MPI_RANKS;LIBS;LABELS")
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

  set(main tessera_doctest_main)
  set(mpi_main tessera_doctest_mpi_main)
  if(ARG_GPU)
    set(main tessera_doctest_gpu_main)
    set(mpi_main tessera_doctest_gpu_mpi_main)
    list(APPEND ARG_LABELS gpu)
  endif()
  if(ARG_MPI_RANKS)
    set(kind "MPI")
    set(libs tessera::mpi ${mpi_main})
  else()
    set(kind "single-process")
    set(libs tessera::tessera ${main})
  endif()
  if(ARG_GPU)
    string(PREPEND kind "GPU ")
    list(APPEND libs tessera::cuda)
  endif()

  set(executable ${ARG_NAME})
  set(args "")
  if(ARG_GROUP)
    set(executable ${ARG_GROUP})
    if(NOT TARGET ${executable})
      tessera_add_test_executable(${executable})
      set_target_properties(${executable} PROPERTIES TESSERA_TEST_KIND "${kind}")
    endif()
    get_target_property(group_kind ${executable} TESSERA_TEST_KIND)
    if(NOT group_kind STREQUAL kind)
      message(FATAL_ERROR "tessera_add_test(${ARG_NAME}): its kind (${kind}) differs from that of "
                          "group ${executable} (${group_kind})")
    endif()
    # --source-file=*tests/train/test_modes.cpp,...: the files whose cases the test runs,
    # by their paths under the repository (tests of other folders may share a name):
    # its own, and the test files they include (tests/cuda/ops.cu includes those of
    # tests/ops/ to run their cases on device tensors).
    tessera_test_case_files(case_files ${ARG_SOURCES})
    set(filters "")
    set(cases "")
    foreach(path IN LISTS case_files)
      file(RELATIVE_PATH relative "${PROJECT_SOURCE_DIR}" "${path}")
      list(APPEND filters "*${relative}")
      file(STRINGS "${path}" file_cases REGEX "^[ \t]*(TEST_CASE|SCENARIO)")
      list(APPEND cases ${file_cases})
    endforeach()
    if(NOT cases)
      message(FATAL_ERROR "tessera_add_test(${ARG_NAME}): no TEST_CASE in its files: ${case_files}")
    endif()
    foreach(source IN LISTS ARG_SOURCES)
      get_filename_component(path "${source}" ABSOLUTE)
      if(TESSERA_TESTS_UNITY AND path MATCHES "\\.(cpp|cu)$")
        # One translation unit per language, including the group's files of that
        # language: written at generation, when every test of the group is known.
        set(language ${CMAKE_MATCH_1})
        get_target_property(files ${executable} TESSERA_TEST_SOURCES_${language})
        if(NOT files)
          get_target_property(directory ${executable} BINARY_DIR)
          set(unity "${directory}/${executable}_unity.${language}")
          set(files "$<TARGET_PROPERTY:${executable},TESSERA_TEST_SOURCES_${language}>")
          file(GENERATE OUTPUT "${unity}" CONTENT
               "// The ${language} files of test group ${executable}, compiled as one translation unit.\n#include \"$<JOIN:${files},\"\n#include \">\"\n")
          target_sources(${executable} PRIVATE "${unity}")
        endif()
        set_property(TARGET ${executable} APPEND PROPERTY TESSERA_TEST_SOURCES_${language} "${path}")
      else()
        target_sources(${executable} PRIVATE "${path}")
      endif()
    endforeach()
    list(JOIN filters "," filters)
    set(args "--source-file=${filters}")
  else()
    tessera_add_test_executable(${executable})
    target_sources(${executable} PRIVATE ${ARG_SOURCES})
  endif()
  target_link_libraries(${executable} PRIVATE ${ARG_LIBS} ${libs})
  if(ARG_GPU AND TESSERA_GPU_TESTS_COMPILE_ONLY)
    # After tessera_test_optimization's -O1: the last -O wins.
    target_compile_options(${executable} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0>)
  endif()

  if(NOT ARG_MPI_RANKS)
    add_test(NAME ${ARG_NAME} COMMAND ${executable} ${args})
    set_tests_properties(${ARG_NAME} PROPERTIES TIMEOUT ${ARG_TIMEOUT} SKIP_RETURN_CODE 77)
    if(ARG_LABELS)
      set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}")
    endif()
  else()
    foreach(n IN LISTS ARG_MPI_RANKS)
      tessera_add_mpi_run(NAME ${ARG_NAME}_np${n} TARGET ${executable} RANKS ${n}
                          TIMEOUT ${ARG_TIMEOUT} LABELS ${ARG_LABELS} ARGS ${args})
    endforeach()
  endif()
endfunction()

# tessera_test_case_files(<variable> <files...>): the absolute paths of the files and of
# the .cpp and .cu files they include, transitively (`#include "ops/test_matmul.cpp"`,
# found beside the including file or under tests/).
function(tessera_test_case_files variable)
  set(found "")
  set(queue "")
  foreach(source IN LISTS ARGN)
    get_filename_component(path "${source}" ABSOLUTE)
    list(APPEND queue "${path}")
  endforeach()
  while(queue)
    list(POP_FRONT queue path)
    if(path IN_LIST found)
      continue()
    endif()
    list(APPEND found "${path}")
    get_filename_component(directory "${path}" DIRECTORY)
    file(STRINGS "${path}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+\\.(cpp|cu)\"")
    if(includes)
      # A change to what it includes changes the test's filter: configure again.
      set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${path}")
    endif()
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[^\"]*\"([^\"]+)\".*$" "\\1" included "${line}")
      foreach(base IN ITEMS "${directory}" "${PROJECT_SOURCE_DIR}/tests")
        if(EXISTS "${base}/${included}")
          get_filename_component(included_path "${base}/${included}" ABSOLUTE)
          list(APPEND queue "${included_path}")
          break()
        endif()
      endforeach()
    endforeach()
  endwhile()
  set(${variable} "${found}" PARENT_SCOPE)
endfunction()

# An executable of the tests, without sources yet: warnings, the tests' optimisation,
# and tests/ on the include path (the helpers the test files share, device_under_test.hpp).
function(tessera_add_test_executable name)
  add_executable(${name})
  tessera_set_warnings(${name})
  tessera_test_optimization(${name})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
endfunction()
