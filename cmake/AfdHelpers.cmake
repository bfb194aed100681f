# Common compile flags for every afd target.
function(afd_target_defaults tgt)
  target_compile_options(${tgt} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(AFD_WERROR)
    target_compile_options(${tgt} PRIVATE -Werror)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      # GCC's flow-based warnings depend on inlining and the optimisation level, and fire
      # on inlined libstdc++ code that is correct (GCC 12: -Wrestrict inside std::string's
      # operator+ and char_traits::copy in a Release build). They stay warnings, still printed.
      target_compile_options(${tgt} PRIVATE -Wno-error=restrict -Wno-error=array-bounds -Wno-error=stringop-overflow
                             -Wno-error=stringop-overread -Wno-error=maybe-uninitialized -Wno-error=free-nonheap-object)
      if(CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12)
        target_compile_options(${tgt} PRIVATE -Wno-error=dangling-pointer -Wno-error=use-after-free)
      endif()
    endif()
  endif()
  if(AFD_SANITIZE)
    target_compile_options(${tgt} PRIVATE -fsanitize=${AFD_SANITIZE} -fno-omit-frame-pointer)
    target_link_options(${tgt} PRIVATE -fsanitize=${AFD_SANITIZE})
  endif()
endfunction()

# afd_add_module(name SOURCES a.cpp b.cpp DEPS other_targets...)
# One static library per src/ module: afd_<name>.
function(afd_add_module name)
  cmake_parse_arguments(M "" "" "SOURCES;DEPS" ${ARGN})
  add_library(afd_${name} STATIC ${M_SOURCES})
  target_include_directories(afd_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(afd_${name} PUBLIC ${M_DEPS})
  afd_target_defaults(afd_${name})
endfunction()

# afd_add_test(name SOURCES ... DEPS ... LABEL unit|integration|gpu|fuzz [TIMEOUT s])
# A GoogleTest executable whose tests are discovered into ctest with the label.
function(afd_add_test name)
  cmake_parse_arguments(T "" "LABEL;TIMEOUT" "SOURCES;DEPS" ${ARGN})
  if(NOT T_LABEL)
    set(T_LABEL unit)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_definitions(${name} PRIVATE AFD_SOURCE_DIR="${PROJECT_SOURCE_DIR}" AFD_BINARY_DIR="${PROJECT_BINARY_DIR}")
  afd_target_defaults(${name})
  gtest_discover_tests(${name} PROPERTIES LABELS ${T_LABEL} TIMEOUT ${T_TIMEOUT}
                       DISCOVERY_TIMEOUT 60)
endfunction()

# afd_add_pytest(<name> <file.py> [TIMEOUT s] [SERIAL] [ENV k=v ...]): one ctest entry that runs
# a pytest file of this directory with Debian's /usr/bin/python3, AFD_BIN naming the afd
# executable, labelled `integration`. SERIAL: the file starts process bundles; such files run
# one at a time (ctest resource lock `afd_process_bundles`), beside the other tests, and first
# (a high COST: ctest starts the most costly tests first, so the chain of bundle files does
# not become the suite's tail on a fresh build that has no timing history).
# Each test's verdict is printed as it finishes (-v: a timeout shows the test that hung; ctest
# keeps the output in Testing/Temporary/LastTest.log) and kept with its time in
# <build>/.../pytest/<name>.xml (JUnit XML); one test runs alone with
# `pytest <file.py> -k <test>`.
function(afd_add_pytest name file)
  cmake_parse_arguments(T "SERIAL" "TIMEOUT" "ENV" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_test(NAME ${name}
           COMMAND /usr/bin/python3 -m pytest -v -ra -p no:cacheprovider
                   --junitxml=${CMAKE_CURRENT_BINARY_DIR}/pytest/${name}.xml ${CMAKE_CURRENT_SOURCE_DIR}/${file})
  set_tests_properties(${name} PROPERTIES LABELS integration TIMEOUT ${T_TIMEOUT}
                       ENVIRONMENT "AFD_BIN=$<TARGET_FILE:afd>;${T_ENV}")
  if(T_SERIAL)
    set_tests_properties(${name} PROPERTIES RESOURCE_LOCK afd_process_bundles COST 1000)
  endif()
endfunction()
