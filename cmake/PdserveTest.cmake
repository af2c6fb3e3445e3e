# pdserve_test(NAME SOURCES... LIBS ... [LABELS ...] [SHARDS N])
# A GoogleTest binary registered with ctest under its own name (one ctest entry per binary keeps
# the CI log short; gtest prints each case), or, with SHARDS N, as N entries NAME_shardK that run
# its cases split by GoogleTest's sharding (a binary long enough to be the last to finish under
# ctest -j, as engine_test under ASan), labelled `unit` and built by the `unit_tests` target
# (what the sanitizer build runs: scripts/fuzz.sh). Its main() (common/testing/gtest_main.cc)
# records skipped tests under PDSERVE_SKIP_DIR and exits 77 when every test skipped.

# Where the tests record what they skipped (scripts/check_skips.py reads it after ctest).
set(PDSERVE_SKIP_DIR ${CMAKE_BINARY_DIR}/skips)
file(MAKE_DIRECTORY ${PDSERVE_SKIP_DIR})

add_library(pdserve_gtest_main STATIC ${CMAKE_CURRENT_LIST_DIR}/../common/testing/gtest_main.cc)
target_link_libraries(pdserve_gtest_main PUBLIC GTest::gtest)

# The skip record and ctest's skipped status, for any ctest entry (pdserve_test's, the variants
# that rerun a binary with other settings, and the Python suites: tests/suite_main.py).
function(pdserve_count_skips name)
  set_property(TEST ${name} APPEND PROPERTY ENVIRONMENT PDSERVE_SKIP_DIR=${PDSERVE_SKIP_DIR})
  set_property(TEST ${name} PROPERTY SKIP_RETURN_CODE 77)
endfunction()

function(pdserve_test name)
  cmake_parse_arguments(ARG "" "SHARDS" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock pdserve_gtest_main)
  if(ARG_SHARDS)
    math(EXPR last "${ARG_SHARDS} - 1")
    foreach(k RANGE ${last})
      add_test(NAME ${name}_shard${k} COMMAND ${name})
      set_tests_properties(${name}_shard${k} PROPERTIES TIMEOUT 900 LABELS "unit;${ARG_LABELS}"
        ENVIRONMENT "GTEST_TOTAL_SHARDS=${ARG_SHARDS};GTEST_SHARD_INDEX=${k}")
      pdserve_count_skips(${name}_shard${k})
    endforeach()
  else()
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES TIMEOUT 900 LABELS "unit;${ARG_LABELS}")
    pdserve_count_skips(${name})
  endif()
  if(NOT TARGET unit_tests)
    add_custom_target(unit_tests)
  endif()
  add_dependencies(unit_tests ${name})
endfunction()

# A GoogleTest binary on this main, for tests/check_skips_test.py (not a ctest entry itself).
add_executable(gtest_main_fixture ${CMAKE_CURRENT_LIST_DIR}/../common/testing/gtest_main_fixture.cc)
target_link_libraries(gtest_main_fixture PRIVATE pdserve_gtest_main)
