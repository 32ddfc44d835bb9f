# One helper adds a test: cxlpool_add_test(NAME SOURCES a.cc [LIBS ...] [LABELS ...]
#   [ENV K=V ...] [TIMEOUT s] [ARGS ...]).  Tests that cannot run exit 77, which
# ctest reports as skipped (SKIP_RETURN_CODE), never as passed.
function(cxlpool_add_test name)
  cmake_parse_arguments(T "GTEST" "TIMEOUT" "SOURCES;LIBS;LABELS;ENV;ARGS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS})
  if(T_GTEST)
    target_link_libraries(${name} PRIVATE GTest::gtest GTest::gmock GTest::gtest_main)
  endif()
  add_test(NAME ${name} COMMAND ${name} ${T_ARGS})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                                          SKIP_RETURN_CODE 77)
  set(env "CXLPOOL_SOURCE_DIR=${PROJECT_SOURCE_DIR}" "CXLPOOL_BINARY_DIR=${PROJECT_BINARY_DIR}"
          ${T_ENV})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${env}")
endfunction()
