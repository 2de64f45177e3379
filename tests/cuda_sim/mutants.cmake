# Planted bugs (docs/CUDA-SIM.md "Planted bugs"): negative controls for cuda_sim_kernels_test.
# Each mutant is a copy of one shipped source with one exact text replaced, written under
# mutants/<name>/ in this build directory and found ahead of the source tree on the include path
# (the kernels include their headers and the wrappers their .cu files as "production/...", through
# -I in order). Only the wrappers of the kernels that include the mutated file are compiled again;
# the rest of the library is the shipped build's. The shipped sources carry no test-only code.
# ctest's CudaSimMutant.<name> passes only when the planted bug makes the named test fail in
# gtest's sense (mutant_caught.cmake): the test ran, alone, to a verdict, and it was FAILED.

# The test's object, compiled once for every mutant's executable.
add_library(cuda_sim_kernels_test_objects OBJECT cuda_sim_kernels_test.cpp)
tandem_cuda_sim_target(cuda_sim_kernels_test_objects)
target_link_libraries(cuda_sim_kernels_test_objects PRIVATE tandem_cuda_sim_kernels_host GTest::gtest tandem_warnings)

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

# tandem_cuda_sim_mutant(NAME name FILE path FIND text REPLACE text TEST full.gtest/name ORDER order
#                        [WHY text])
#   FILE: a shipped source, relative to the source root (production/cuda/kernel_support.cuh).
#   FIND: exact text that occurs exactly once in FILE (configure fails otherwise, so a mutant never
#     silently becomes the shipped code when the code changes); REPLACE: its planted replacement.
#   TEST: one test's full gtest name, no wildcards (Dtypes/SimKernels.X/f32); ORDER: the
#     TANDEM_CUDA_SIM_ORDER it runs under. The unmutated test must pass there: pick an order the
#     suite runs (forward, reverse, random:20261207).
#   WHY: what the bug models, printed with the verdict.
function(tandem_cuda_sim_mutant)
  cmake_parse_arguments(PARSE_ARGV 0 mutant "" "NAME;FILE;FIND;REPLACE;TEST;ORDER;WHY" "")
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
  foreach(output IN ITEMS "${mutant_FILE}|mutated" "MUTANT.txt|description")
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

  # The kernels whose .cu includes FILE (or is FILE) are compiled again; the others' objects are
  # tandem_cuda_sim_kernels' own.
  get_target_property(wrappers tandem_cuda_sim_kernels SOURCES)
  set(mutated_wrappers)
  set(mutated_kernels)
  foreach(wrapper IN LISTS wrappers)
    string(REGEX REPLACE "^.*/([A-Za-z0-9_]+)_cu\\.cpp$" "\\1" kernel "${wrapper}")
    tandem_cuda_sim_included_files(production/kernels/${kernel}.cu included)
    if(mutant_FILE IN_LIST included)
      list(APPEND mutated_wrappers ${wrapper})
      list(APPEND mutated_kernels ${kernel})
    endif()
  endforeach()
  if(NOT mutated_kernels)
    message(FATAL_ERROR "tandem_cuda_sim_mutant(${mutant_NAME}): no kernel of tandem_cuda_sim_kernels includes "
                        "${mutant_FILE}")
  endif()
  list(JOIN mutated_kernels "|" mutated_pattern)
  set(library tandem_cuda_sim_kernels_mutant_${mutant_NAME})
  add_library(${library} STATIC ${mutated_wrappers}
    "$<FILTER:$<TARGET_OBJECTS:tandem_cuda_sim_kernels>,EXCLUDE,/(${mutated_pattern})_cu\\.cpp\\.o$>")
  # As cuda_sim/CMakeLists.txt compiles them (a source's options are its directory's).
  set_source_files_properties(${mutated_wrappers} PROPERTIES COMPILE_OPTIONS -Wno-unknown-pragmas)
  tandem_cuda_sim_target(${library})
  target_include_directories(${library} BEFORE PRIVATE ${root})
  target_link_libraries(${library} PUBLIC tandem_cuda_sim_kernels_host PRIVATE tandem_warnings)

  set(executable cuda_sim_kernels_test_mutant_${mutant_NAME})
  add_executable(${executable} $<TARGET_OBJECTS:cuda_sim_kernels_test_objects>)
  target_link_libraries(${executable} PRIVATE ${library} GTest::gtest GTest::gtest_main)
  add_test(NAME CudaSimMutant.${mutant_NAME}
    COMMAND ${CMAKE_COMMAND} -DEXECUTABLE=$<TARGET_FILE:${executable}> -DTEST=${mutant_TEST} -DORDER=${mutant_ORDER}
      -DDESCRIPTION=${root}/MUTANT.txt -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/mutant_caught.cmake)
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
  TEST Dtypes/SimKernels.CrossEntropyWithinTheBoundAndMaskedRowsExactlyZero/f32
  ORDER forward
  WHY "A block reduction reads its neighbours' stores before they are all made.")

tandem_cuda_sim_mutant(NAME warp_sum_skips_its_first_shuffle
  FILE production/kernels/optimizer.cu
  FIND "for (unsigned int stride = 16; stride > 0; stride /= 2) total = total + __shfl_down_sync("
  REPLACE "for (unsigned int stride = 8; stride > 0; stride /= 2) total = total + __shfl_down_sync("
  TEST Dtypes/SimKernels.SquaredNormExactOnDyadicValuesOnTheVectorAndScalarPaths/f32
  ORDER forward
  WHY "A warp shuffle tree that starts at the wrong offset: lanes 16-31 never reach lane 0.")

tandem_cuda_sim_mutant(NAME add_misses_the_last_element
  FILE production/kernels/elementwise.cu
  FIND "if (i < count) store(output, i, add(load(a, i), load(b, i)));"
  REPLACE "if (i < count - 1) store(output, i, add(load(a, i), load(b, i)));"
  TEST Dtypes/SimKernels.ConvertAddBiasAreExactAndBiasGradSumsInTheHostsOrder/f32
  ORDER forward
  WHY "A tail bound off by one: the last element of an add is never written.")
