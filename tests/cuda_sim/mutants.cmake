# Planted bugs (docs/CUDA-SIM.md "Planted bugs"): negative controls for the device's own op test,
# tests/production_cuda_ops_test.cpp as cuda-sim runs it (production_cuda_ops_test_sim). Each
# mutant is a copy of one shipped source with one exact text replaced, written under
# mutants/<name>/ in this build directory and found ahead of the source tree on the include path
# (every compilation unit reaches the project's files as "production/...", through -I in order).
# Only the units that include the mutated file (or are it) are compiled again, each through a
# one-line wrapper; every other object is the shipped cuda-sim build's. The shipped sources carry
# no test-only code. ctest's CudaSimMutant.<name> passes only when the planted bug makes the named
# test fail in gtest's sense (mutant_caught.cmake): the test ran, alone, to a verdict, and it was
# FAILED.

# The test's object, compiled once for every mutant's executable.
add_library(production_cuda_ops_test_sim_objects OBJECT ${PROJECT_SOURCE_DIR}/tests/production_cuda_ops_test.cpp)
tandem_cuda_sim_target(production_cuda_ops_test_sim_objects)
target_link_libraries(production_cuda_ops_test_sim_objects PRIVATE tandem_production_cuda_sim GTest::gtest
  tandem_warnings)

# The project's own files that `file` (relative to the source root) includes as "...", transitively,
# `file` among them.
function(tandem_cuda_sim_included_files file out)
  set(seen ${file})
  set(pending ${file})
  while(pending)
    list(POP_FRONT pending current)
    set(path ${PROJECT_SOURCE_DIR}/${current})
    if(NOT EXISTS ${path})
      continue()  # a quote-include outside the project (a stand-in header found through -I)
    endif()
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${path})
    file(STRINGS ${path} include_lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+\"")
    foreach(line IN LISTS include_lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*$" "\\1" included "${line}")
      if(NOT included IN_LIST seen)
        list(APPEND seen ${included})
        list(APPEND pending ${included})
      endif()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

# The shipped file a source of a cuda-sim library compiles, relative to the source root: a
# generated wrapper (cuda_sim/CMakeLists.txt) compiles the file it includes, any other source itself.
function(tandem_cuda_sim_unit_file source out)
  if(source MATCHES "/kernels/([A-Za-z0-9_]+)_cu\\.cpp$")
    set(${out} production/kernels/${CMAKE_MATCH_1}.cu PARENT_SCOPE)
  elseif(source MATCHES "/cuda/([A-Za-z0-9_]+)_cu\\.cpp$")
    set(${out} production/cuda/${CMAKE_MATCH_1}.cu PARENT_SCOPE)
  else()
    file(RELATIVE_PATH relative ${PROJECT_SOURCE_DIR} ${source})
    set(${out} ${relative} PARENT_SCOPE)
  endif()
endfunction()

# tandem_cuda_sim_mutant(NAME name FILE path FIND text REPLACE text TEST full.gtest/name ORDER order
#                        [STREAMS mode] [WHY text])
#   FILE: a shipped source, relative to the source root (production/cuda/kernel_support.cuh).
#   FIND: exact text that occurs exactly once in FILE (configure fails otherwise, so a mutant never
#     silently becomes the shipped code when the code changes); REPLACE: its planted replacement.
#   TEST: one test's full gtest name, no wildcards (Dtypes/CudaOps.X/f32); ORDER: the
#     TANDEM_CUDA_SIM_ORDER it runs under. The unmutated test must pass there: pick an order the
#     suite runs (forward, random:20261207). STREAMS: TANDEM_CUDA_SIM_STREAMS, if given.
#   WHY: what the bug models, printed with the verdict.
function(tandem_cuda_sim_mutant)
  cmake_parse_arguments(PARSE_ARGV 0 mutant "" "NAME;FILE;FIND;REPLACE;TEST;ORDER;STREAMS;WHY" "")
  foreach(required NAME FILE FIND TEST ORDER)
    if(NOT DEFINED mutant_${required} OR "${mutant_${required}}" STREQUAL "")
      message(FATAL_ERROR "tandem_cuda_sim_mutant(${mutant_NAME}): ${required} is required")
    endif()
  endforeach()
  # REPLACE "" (a deletion) leaves mutant_REPLACE undefined (cmake_parse_arguments drops empty
  # values before CMake 3.31): the keyword itself says it was given.
  math(EXPR last_argument "${ARGC} - 1")
  foreach(index RANGE ${last_argument})
    if("${ARGV${index}}" STREQUAL "REPLACE" AND NOT DEFINED mutant_REPLACE)
      set(mutant_REPLACE "")
    endif()
  endforeach()
  if(NOT DEFINED mutant_REPLACE OR mutant_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "tandem_cuda_sim_mutant(${mutant_NAME}): REPLACE is required (it may be \"\"); "
                        "unknown arguments: ${mutant_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT mutant_NAME MATCHES "^[A-Za-z0-9_]+$" OR mutant_TEST MATCHES "[*?:-]")
    message(FATAL_ERROR "tandem_cuda_sim_mutant(${mutant_NAME}): NAME must be [A-Za-z0-9_]+ and TEST one test's "
                        "full name without wildcards, got '${mutant_TEST}'")
  endif()
  set(source ${PROJECT_SOURCE_DIR}/${mutant_FILE})
  if(NOT EXISTS ${source})
    message(FATAL_ERROR "tandem_cuda_sim_mutant(${mutant_NAME}): ${mutant_FILE} does not exist")
  endif()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${source})

  # FIND exactly once: the length the replacements of FIND by nothing remove, in FIND's lengths.
  file(READ ${source} text)
  string(REPLACE "${mutant_FIND}" "" without "${text}")
  string(LENGTH "${text}" text_length)
  string(LENGTH "${without}" without_length)
  string(LENGTH "${mutant_FIND}" find_length)
  math(EXPR occurrences "(${text_length} - ${without_length}) / ${find_length}")
  if(NOT occurrences EQUAL 1)
    message(FATAL_ERROR "tandem_cuda_sim_mutant(${mutant_NAME}): its FIND text occurs ${occurrences} times in "
                        "${mutant_FILE}, not once; fix: update the mutant to the code as it is now.\nFIND:\n${mutant_FIND}")
  endif()
  string(REPLACE "${mutant_FIND}" "${mutant_REPLACE}" mutated "${text}")

  # Written only when it changed, so an unchanged mutant recompiles nothing.
  set(root ${CMAKE_CURRENT_BINARY_DIR}/mutants/${mutant_NAME})
  set(description "mutant ${mutant_NAME}: ${mutant_FILE}\n${mutant_WHY}\n--- FIND\n${mutant_FIND}\n--- REPLACE\n${mutant_REPLACE}\n")
  set(outputs "${mutant_FILE}|mutated" "MUTANT.txt|description")

  # The units (of the kernels and of the production twin built for cuda-sim) that include FILE or
  # are it: compiled again from a wrapper under the mutant's root; the other units' objects are
  # the shipped ones. An object's name ends in its source's last directory and file name.
  set(mutated_units)
  set(objects)
  foreach(library tandem_cuda_sim_kernels tandem_production_cuda_sim)
    get_target_property(library_sources ${library} SOURCES)
    set(excluded)
    foreach(library_source IN LISTS library_sources)
      tandem_cuda_sim_unit_file(${library_source} unit)
      tandem_cuda_sim_included_files(${unit} included)
      if(mutant_FILE IN_LIST included)
        string(REPLACE "/" "__" flat ${unit})
        set(wrapper_text "// Generated by tests/cuda_sim/mutants.cmake: ${unit} with mutant ${mutant_NAME}.\n#include \"${unit}\"\n")
        list(APPEND outputs "units/${flat}.cpp|wrapper_text_${flat}")
        set(wrapper_text_${flat} "${wrapper_text}")
        list(APPEND mutated_units ${root}/units/${flat}.cpp)
        get_filename_component(object_directory ${library_source} DIRECTORY)
        get_filename_component(object_directory ${object_directory} NAME)
        get_filename_component(object_name ${library_source} NAME)
        string(REGEX REPLACE "([][.*+?^$()|\\])" "\\\\\\1" object_pattern "/${object_directory}/${object_name}.o")
        list(APPEND excluded "${object_pattern}$")
      endif()
    endforeach()
    if(excluded)
      list(JOIN excluded "|" excluded_pattern)
      list(APPEND objects "$<FILTER:$<TARGET_OBJECTS:${library}>,EXCLUDE,${excluded_pattern}>")
    else()
      list(APPEND objects "$<TARGET_OBJECTS:${library}>")
    endif()
  endforeach()
  if(NOT mutated_units)
    message(FATAL_ERROR "tandem_cuda_sim_mutant(${mutant_NAME}): no unit of tandem_cuda_sim_kernels or "
                        "tandem_production_cuda_sim includes ${mutant_FILE}")
  endif()

  foreach(output IN LISTS outputs)
    string(REPLACE "|" ";" output "${output}")
    list(GET output 0 path)
    list(GET output 1 variable)
    set(previous "")
    if(EXISTS ${root}/${path})
      file(READ ${root}/${path} previous)
    endif()
    if(NOT previous STREQUAL "${${variable}}")
      file(WRITE ${root}/${path} "${${variable}}")
    endif()
  endforeach()

  # Every object is the executable's own, so nothing of the libraries linked below (for their
  # usage requirements and dependencies) is pulled from their archives: no shipped copy of a
  # mutated unit takes part.
  set(executable production_cuda_ops_test_sim_mutant_${mutant_NAME})
  add_executable(${executable} ${mutated_units} $<TARGET_OBJECTS:production_cuda_ops_test_sim_objects> ${objects})
  # As cuda_sim/CMakeLists.txt compiles the kernels (nvcc's #pragma unroll is unknown to GCC).
  set_source_files_properties(${mutated_units} PROPERTIES COMPILE_OPTIONS -Wno-unknown-pragmas)
  tandem_cuda_sim_target(${executable})
  target_include_directories(${executable} BEFORE PRIVATE ${root})
  target_link_libraries(${executable} PRIVATE tandem_production_cuda_sim GTest::gtest GTest::gtest_main
    tandem_warnings)
  add_test(NAME CudaSimMutant.${mutant_NAME}
    COMMAND ${CMAKE_COMMAND} -DEXECUTABLE=$<TARGET_FILE:${executable}> -DTEST=${mutant_TEST} -DORDER=${mutant_ORDER}
      -DSTREAMS=${mutant_STREAMS} -DDESCRIPTION=${root}/MUTANT.txt -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/mutant_caught.cmake)
  set_tests_properties(CudaSimMutant.${mutant_NAME} PROPERTIES LABELS cuda-sim TIMEOUT 300)
endfunction()

tandem_cuda_sim_mutant(NAME block_sum_without_its_first_barrier
  FILE production/cuda/kernel_support.cuh
  FIND [=[
Value block_sum(Value value, Value* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
]=]
  REPLACE [=[
Value block_sum(Value value, Value* scratch) {
  scratch[threadIdx.x] = value;
]=]
  TEST Dtypes/CudaOps.CrossEntropyWithinTheBoundAndMaskedRowsExactlyZero/f32
  ORDER forward
  WHY "A block reduction reads its neighbours' stores before they are all made.")

tandem_cuda_sim_mutant(NAME warp_sum_skips_its_first_shuffle
  FILE production/kernels/optimizer.cu
  FIND "for (unsigned int stride = 16; stride > 0; stride /= 2) total = total + __shfl_down_sync("
  REPLACE "for (unsigned int stride = 8; stride > 0; stride /= 2) total = total + __shfl_down_sync("
  TEST Dtypes/CudaOps.SquaredNormExactOnDyadicValuesAndDeterministic/f32
  ORDER forward
  WHY "A warp shuffle tree that starts at the wrong offset: lanes 16-31 never reach lane 0.")

tandem_cuda_sim_mutant(NAME add_misses_the_last_element
  FILE production/kernels/elementwise.cu
  FIND "if (i < count) store(output, i, add(load(a, i), load(b, i)));"
  REPLACE "if (i < count - 1) store(output, i, add(load(a, i), load(b, i)));"
  TEST Dtypes/CudaOps.ConvertAddBiasAreExactAndBiasGradSumsInTheHostsOrder/f32
  ORDER forward
  WHY "A tail bound off by one: the last element of an add is never written.")

tandem_cuda_sim_mutant(NAME ldmatrix_rows_from_the_next_matrix
  FILE production/kernels/attention_tensor_core.cu
  FIND "ldmatrix_x4(a, tile + (row0 + (matrix & 1) * 8 + lane % 8) * kPitch + col0 + (matrix >> 1) * 8);"
  REPLACE "ldmatrix_x4(a, tile + (row0 + ((matrix + 1) % 4 & 1) * 8 + lane % 8) * kPitch + col0 + ((matrix + 1) % 4 >> 1) * 8);"
  TEST Dtypes/CudaOps.AttentionWithinTheBoundAndDeterministic/bf16
  ORDER forward
  WHY "An ldmatrix lane-to-address map off by one matrix: lane l gives row l % 8 of matrix (l / 8 + 1) % 4 of the A operand.")

tandem_cuda_sim_mutant(NAME attention_tile_drops_the_last_row
  FILE production/kernels/attention_tensor_core.cu
  FIND "if (t < g.seq && d0 < g.head_dim) {"
  REPLACE "if (t < g.seq - 1 && d0 < g.head_dim) {"
  TEST Dtypes/CudaOps.AttentionWithinTheBoundAndDeterministic/bf16
  ORDER forward
  WHY "A tail tile bound off by one: the sequence's last row of Q, K, V and the gradients loads as zeros.")

# The cuda backend's second stream (production/cuda/cuda_backend.cpp, StreamLane) without either
# of its waits: in a deferred stream order (docs/CUDA-SIM.md "Streams") the race it leaves gives
# the same wrong sums on every run. Newest stream first runs the lane's work before the compute
# op it needs; oldest first runs the compute op after the wait before the lane's work.
tandem_cuda_sim_mutant(NAME lane_work_without_its_wait_for_the_compute_stream
  FILE production/cuda/cuda_backend.cpp
  FIND "    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(side_, issued, 0));\n"
  REPLACE ""
  TEST StreamLane.WorkRunsOnASecondStreamBetweenTheComputeOpsItIsOrderedWith
  ORDER forward
  STREAMS deferred
  WHY "A removed cudaStreamWaitEvent: the second stream's work does not wait for the compute stream's ops issued before it.")

tandem_cuda_sim_mutant(NAME compute_stream_without_its_wait_for_the_lane
  FILE production/cuda/cuda_backend.cpp
  FIND "if (pending_ticket == ticket) TANDEM_CUDA_CHECK(cudaStreamWaitEvent(backend_.stream_, event, 0));"
  REPLACE "if (pending_ticket == ticket) (void)event;"
  TEST StreamLane.WorkRunsOnASecondStreamBetweenTheComputeOpsItIsOrderedWith
  ORDER forward
  STREAMS deferred-oldest
  WHY "A removed cudaStreamWaitEvent: the compute stream's ops after lane->wait do not wait for the lane's work.")
