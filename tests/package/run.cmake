# Builds and runs a consumer project of tessera (cmake -P). Variables:
#   MODE                 find_package: install the tessera build TESSERA_BUILD_DIR to
#                        PREFIX first, and point the consumer at PREFIX;
#                        add_subdirectory: the consumer adds TESSERA_SOURCE_DIR itself.
#   TESSERA_SOURCE_DIR   the repository root
#   CONSUMER_SOURCE_DIR  the consumer project; CONSUMER_BINARY_DIR: its (fresh) build folder
#   GENERATOR, CXX_COMPILER, BUILD_TYPE: as in the tessera build
cmake_minimum_required(VERSION 3.20)

foreach(var MODE TESSERA_SOURCE_DIR CONSUMER_SOURCE_DIR CONSUMER_BINARY_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

set(configure_args
  -S ${CONSUMER_SOURCE_DIR} -B ${CONSUMER_BINARY_DIR} -G ${GENERATOR}
  -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=${BUILD_TYPE})

if(MODE STREQUAL "find_package")
  foreach(var TESSERA_BUILD_DIR PREFIX)
    if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
      message(FATAL_ERROR "run.cmake: ${var} is not set")
    endif()
  endforeach()
  file(REMOVE_RECURSE ${PREFIX})
  message(STATUS "run.cmake: installing ${TESSERA_BUILD_DIR} to ${PREFIX}")
  execute_process(
    COMMAND ${CMAKE_COMMAND} --install ${TESSERA_BUILD_DIR} --prefix ${PREFIX} --config ${BUILD_TYPE}
    COMMAND_ERROR_IS_FATAL ANY)
  list(APPEND configure_args -DCMAKE_PREFIX_PATH=${PREFIX} -DTESSERA_EXPECTED_PREFIX=${PREFIX})
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND configure_args -DTESSERA_SOURCE_DIR=${TESSERA_SOURCE_DIR})
else()
  message(FATAL_ERROR "run.cmake: unknown MODE '${MODE}'")
endif()

file(REMOVE_RECURSE ${CONSUMER_BINARY_DIR})
message(STATUS "run.cmake: configuring ${CONSUMER_SOURCE_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} ${configure_args} COMMAND_ERROR_IS_FATAL ANY)
message(STATUS "run.cmake: building")
execute_process(COMMAND ${CMAKE_COMMAND} --build ${CONSUMER_BINARY_DIR} --config ${BUILD_TYPE}
                COMMAND_ERROR_IS_FATAL ANY)
message(STATUS "run.cmake: running the consumer")
execute_process(COMMAND ${CONSUMER_BINARY_DIR}/bin/tessera_consumer COMMAND_ERROR_IS_FATAL ANY)
message(STATUS "run.cmake: ${MODE} consumer OK")
