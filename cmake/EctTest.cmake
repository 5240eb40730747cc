# ect_add_test(NAME SOURCE [TIMEOUT seconds] [LABELS ...])
# One cmocka executable per test module, linked against the static library
# with the internal headers visible. Every test gets a timeout.
pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
function(ect_add_test name src)
  cmake_parse_arguments(T "" "TIMEOUT" "LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${name} ${src} ${CMAKE_SOURCE_DIR}/tests/unit/testutil.c)
  target_link_libraries(${name} PRIVATE ect_internal PkgConfig::CMOCKA)
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests/unit)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "ECT_BIN=$<TARGET_FILE:ect>;ECT_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

# ect_add_script_test(NAME SCRIPT [TIMEOUT seconds]): a shell test of the CLI.
function(ect_add_script_test name script)
  cmake_parse_arguments(T "" "TIMEOUT" "" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND bash ${script})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "ECT_BIN=$<TARGET_FILE:ect>;ECT_SOURCE_DIR=${CMAKE_SOURCE_DIR};ECT_BUILD_DIR=${CMAKE_BINARY_DIR}")
endfunction()
