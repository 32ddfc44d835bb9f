# Regenerates the synthetic fixture trees into OUT and fails if any differs
# from the committed copy under FIXTURES (run: cmake -P, see CMakeLists.txt).
file(REMOVE_RECURSE ${OUT})
execute_process(COMMAND ${PYTHON} ${SCRIPT} --out ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_fixtures.py failed (${rc})")
endif()
file(GLOB trees LIST_DIRECTORIES true RELATIVE ${OUT} ${OUT}/*)
foreach(tree ${trees})
  execute_process(COMMAND diff -r --no-dereference ${OUT}/${tree}/root
                          ${FIXTURES}/${tree}/root
                  RESULT_VARIABLE drc OUTPUT_VARIABLE dout ERROR_VARIABLE dout)
  if(NOT drc EQUAL 0)
    message(FATAL_ERROR "fixture '${tree}' differs from make_fixtures.py output; "
                        "rerun tests/topology/make_fixtures.py and commit:\n${dout}")
  endif()
endforeach()
message(STATUS "checked fixtures: ${trees}")
