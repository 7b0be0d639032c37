# fpa_nested_build(NAME test FIXTURE fixture SOURCE dir BINARY dir [TARGET target] [ARGS -D...])
# A ctest entry that configures and builds a second build folder (another compiler, sanitizer
# flags) when a test of FIXTURE first needs it, so the main build does not pay for it. This
# build's generator and compiler launcher (ccache) carry over.
function(fpa_nested_build)
  cmake_parse_arguments(NB "" "NAME;FIXTURE;SOURCE;BINARY;TARGET" "ARGS" ${ARGN})
  set(configure -S ${NB_SOURCE} -B ${NB_BINARY} -G ${CMAKE_GENERATOR} ${NB_ARGS})
  if(CMAKE_CXX_COMPILER_LAUNCHER)
    list(APPEND configure -DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER})
  endif()
  set(build --build ${NB_BINARY})
  if(NB_TARGET)
    list(APPEND build --target ${NB_TARGET})
  endif()
  list(JOIN configure "' '" configure)
  list(JOIN build "' '" build)
  add_test(NAME ${NB_NAME} COMMAND sh -c
           "'${CMAKE_COMMAND}' '${configure}' && '${CMAKE_COMMAND}' '${build}'")
  set_tests_properties(${NB_NAME} PROPERTIES FIXTURES_SETUP ${NB_FIXTURE} TIMEOUT 3600)
endfunction()
