# Runs the quickstart on 8 ranks with --save-graphs and checks the dumps: every rank's
# three files, and in rank 0's execute.ir the seed's first MatMul with its local shapes
# (8, 8) x (8, 16) -> (8, 16), whose partial sums are moved over ranks 0-3 by no more
# bytes than a ReduceScatter of its (8, 16) output (3/4 of 512 bytes; an AllReduce: 768).
#
#   cmake -DMPIEXEC=... -DMPIEXEC_FLAGS=... -DQUICKSTART=... -DDIR=... -P check_saved_graphs.cmake
file(REMOVE_RECURSE "${DIR}")
separate_arguments(flags UNIX_COMMAND "${MPIEXEC_FLAGS}")
execute_process(COMMAND "${MPIEXEC}" -n 8 ${flags} "${QUICKSTART}" --save-graphs "${DIR}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "quickstart --save-graphs failed (${rc}):\n${out}\n${err}")
endif()

foreach(rank RANGE 7)
  foreach(f step_parallel_begin.ir execute.ir execute.dot)
    if(NOT EXISTS "${DIR}/rank_${rank}/${f}")
      message(FATAL_ERROR "missing ${DIR}/rank_${rank}/${f}")
    endif()
  endforeach()
endforeach()

file(READ "${DIR}/rank_0/step_parallel_begin.ir" begin)
if(NOT begin MATCHES "\\(matmul\\) = MatMul\\([^\n]*in_strategy: \\(\\(2, 4\\), \\(4, 1\\)\\), source: user\\}")
  message(FATAL_ERROR "step_parallel_begin.ir lacks the first MatMul with the user's strategy:\n${begin}")
endif()

file(READ "${DIR}/rank_0/execute.ir" ir)
set(t "<Tensor\\[Float32\\], ")
if(NOT ir MATCHES "%([0-9]+)\\(matmul\\) = MatMul\\([^\n]*\n    : \\(${t}\\(8, 8\\)>, ${t}\\(8, 16\\)>\\) -> \\(${t}\\(8, 16\\)>\\)")
  message(FATAL_ERROR "execute.ir: no MatMul 'matmul' of local shapes (8, 8) x (8, 16) -> (8, 16):\n${ir}")
endif()
set(mm "${CMAKE_MATCH_1}")
# Every communication entry reading the MatMul's output, over ranks 0-3.
string(REGEX MATCHALL "= [A-Za-z]+\\(%${mm}\\) {[^}\n]*rank_list: \\(0, 1, 2, 3\\), bytes: [0-9]+}" comms "${ir}")
if(NOT comms)
  message(FATAL_ERROR "execute.ir: no communication of the MatMul's output (%${mm}) over ranks 0-3:\n${ir}")
endif()
math(EXPR reduce_scatter "8 * 16 * 4 * 3 / 4")
foreach(c IN LISTS comms)
  string(REGEX MATCH "bytes: ([0-9]+)" _ "${c}")
  if(CMAKE_MATCH_1 GREATER reduce_scatter)
    message(FATAL_ERROR "execute.ir: ${c} moves more than a ReduceScatter (${reduce_scatter} bytes)")
  endif()
  message(STATUS "rank 0: the first MatMul's output: ${c}")
endforeach()
