# pdserve_test(NAME SOURCES... LIBS ... [LABELS ...])
# A GoogleTest binary registered with ctest under its own name (one ctest entry per binary keeps
# the CI log short; gtest prints each case), labelled `unit` and built by the `unit_tests` target
# (what the sanitizer build runs: scripts/fuzz.sh).
function(pdserve_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT 900 LABELS "unit;${ARG_LABELS}")
  if(NOT TARGET unit_tests)
    add_custom_target(unit_tests)
  endif()
  add_dependencies(unit_tests ${name})
endfunction()
