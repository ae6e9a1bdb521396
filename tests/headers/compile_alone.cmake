# Test headers.compile_alone (cmake -P): builds target TARGET of the build BUILD_DIR,
# which compiles each public header in a translation unit of its own (see
# CMakeLists.txt here), going on past failures, and fails naming every header that does
# not compile alone. Variables: BUILD_DIR, TARGET, CONFIG, JOBS, KEEP_GOING (the
# build tool's keep-going flags).
cmake_minimum_required(VERSION 3.20)
foreach(var BUILD_DIR TARGET)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "compile_alone.cmake: ${var} is not set")
  endif()
endforeach()

set(command ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET})
if(CONFIG)
  list(APPEND command --config ${CONFIG})
endif()
if(JOBS)
  list(APPEND command --parallel ${JOBS})
endif()
if(KEEP_GOING)
  list(APPEND command -- ${KEEP_GOING})
endif()
execute_process(COMMAND ${command} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)

# Warnings are printed, and do not fail the test.
string(REGEX MATCHALL "(warning|error)( #[0-9A-Za-z-]+)? ?:" diagnostics "${output}")
if(NOT status EQUAL 0)
  message("${output}")
  # The build tool names each object it failed to build, .../alone/tessera/core/mesh.hpp.cpp.o:
  # Ninja on a line `FAILED: <outputs>`, Make on a line `... *** [<target>] Error 1`.
  string(REGEX MATCHALL "(FAILED: |\\*\\*\\* \\[)[^\n]*" failures "${output}")
  set(headers "")
  foreach(failure IN LISTS failures)
    if(failure MATCHES "/alone/(tessera/[^ \t:]+)\\.(cpp|cu)\\.o")
      list(APPEND headers "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES headers)
  list(SORT headers)
  list(LENGTH headers count)
  if(count EQUAL 0)
    message(FATAL_ERROR "headers.compile_alone: the build of ${TARGET} failed (exit status ${status})")
  endif()
  string(REPLACE ";" "\n  " headers "${headers}")
  message(FATAL_ERROR "headers.compile_alone: ${count} headers do not compile alone:\n  ${headers}")
elseif(diagnostics)
  message("${output}")
endif()
message(STATUS "headers.compile_alone: every header compiles alone")
