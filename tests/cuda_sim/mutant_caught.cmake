# ctest's verdict on one planted bug (mutants.cmake): runs EXECUTABLE, production_cuda_ops_test
# built for cuda-sim with one mutated source, on the one test TEST under TANDEM_CUDA_SIM_ORDER=ORDER
# (and TANDEM_CUDA_SIM_STREAMS=STREAMS when STREAMS is not empty), and succeeds only if the mutant was caught: gtest exited 1 (not a crash, not a signal), exactly one
# test ran (so TEST still exists), and that test's "[  FAILED  ]" line is there.
# cmake -DEXECUTABLE=... -DTEST=... -DORDER=... [-DSTREAMS=...] -DDESCRIPTION=.../MUTANT.txt -P mutant_caught.cmake
foreach(required EXECUTABLE TEST ORDER DESCRIPTION)
  if(NOT DEFINED ${required})
    message(FATAL_ERROR "mutant_caught.cmake: -D${required}=... is required")
  endif()
endforeach()
file(READ ${DESCRIPTION} description)
message("${description}")
set(streams_text "")
if(DEFINED STREAMS AND NOT STREAMS STREQUAL "")
  set(ENV{TANDEM_CUDA_SIM_STREAMS} ${STREAMS})
  set(streams_text "TANDEM_CUDA_SIM_STREAMS=${STREAMS} ")
endif()
message("running: TANDEM_CUDA_SIM_ORDER=${ORDER} ${streams_text}${EXECUTABLE} --gtest_filter=${TEST}")
set(ENV{TANDEM_CUDA_SIM_ORDER} ${ORDER})
execute_process(COMMAND ${EXECUTABLE} --gtest_filter=${TEST} RESULT_VARIABLE status OUTPUT_VARIABLE output
  ERROR_VARIABLE output TIMEOUT 280)
message("${output}")

string(REGEX REPLACE "([][.*+?^$()|\\])" "\\\\\\1" test_pattern "${TEST}")
set(failed_line "")
# gtest's line when the test ends: "[  FAILED  ] NAME[, where GetParam() = ...] (N ms)".
if(output MATCHES "(\\[  FAILED  \\] ${test_pattern}(, where [^\n]*)? \\([0-9]+ ms\\))")
  set(failed_line "${CMAKE_MATCH_1}")
endif()
if(NOT status MATCHES "^[0-9]+$")
  message(FATAL_ERROR "NOT CAUGHT: the test ended by '${status}', a crash, which is no verdict")
elseif(NOT output MATCHES "\\[==========\\] 1 test from 1 test suite ran\\.")
  message(FATAL_ERROR "NOT CAUGHT: not exactly one test ran for --gtest_filter=${TEST} (renamed or removed?)")
elseif(NOT status EQUAL 1)
  message(FATAL_ERROR "NOT CAUGHT: the test's exit status is ${status}, not gtest's 1 for a failed test "
                      "(0: the planted bug went unnoticed)")
elseif(failed_line STREQUAL "")
  message(FATAL_ERROR "NOT CAUGHT: no line '[  FAILED  ] ${TEST} (N ms)'")
endif()
message("CAUGHT: ${failed_line}")
