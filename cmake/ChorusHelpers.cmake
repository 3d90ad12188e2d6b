# Build helpers shared by every folder: one options target carrying warnings, the language level
# and sanitizers, and one function per kind of target (the way absl_cc_library works).
include_guard(GLOBAL)

add_library(chorus_options INTERFACE)
add_library(chorus::options ALIAS chorus_options)
target_compile_features(chorus_options INTERFACE cxx_std_20)
target_compile_options(chorus_options INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wconversion
  $<$<BOOL:${CHORUS_WERROR}>:-Werror>
  # GCC 12 reports -Wrestrict false positives inside libstdc++'s std::string concatenation
  # ("literal" + std::string) at -O2 and above (GCC bug 105329, fixed in GCC 13).
  $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict>)

if(CHORUS_SANITIZE)
  target_compile_options(chorus_options INTERFACE
    -fsanitize=${CHORUS_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  target_link_options(chorus_options INTERFACE -fsanitize=${CHORUS_SANITIZE})
  if(CHORUS_SANITIZE MATCHES "thread")
    target_compile_definitions(chorus_options INTERFACE CHORUS_TSAN=1)
  endif()
  if(CHORUS_SANITIZE MATCHES "address")
    target_compile_definitions(chorus_options INTERFACE CHORUS_ASAN=1)
  endif()
endif()

# chorus_library(NAME <name> [ALIAS <alias>] [SOURCES ...] [PUBLIC_INCLUDE <dir>]
#                [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# A static library `chorus_<name>` with the alias `chorus::<name>` (or ALIAS when given).
function(chorus_library)
  cmake_parse_arguments(ARG "" "NAME;PUBLIC_INCLUDE" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS;ALIASES" ${ARGN})
  set(target chorus_${ARG_NAME})
  add_library(${target} STATIC ${ARG_SOURCES})
  add_library(chorus::${ARG_NAME} ALIAS ${target})
  foreach(alias IN LISTS ARG_ALIASES)
    add_library(${alias} ALIAS ${target})
  endforeach()
  if(ARG_PUBLIC_INCLUDE)
    target_include_directories(${target} PUBLIC ${ARG_PUBLIC_INCLUDE})
  endif()
  target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(${target} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE chorus::options ${ARG_PRIVATE_DEPS})
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

# chorus_test(NAME <name> SOURCES ... [DEPS ...] [LABELS ...] [ENVIRONMENT VAR=value ...])
# One GoogleTest executable registered with CTest, each test case a CTest test (run with
# ENVIRONMENT set, e.g. RC_PARAMS to fix RapidCheck's seed).
function(chorus_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;DEPS;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE chorus::options ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  gtest_discover_tests(${ARG_NAME}
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT "${ARG_ENVIRONMENT}"
    DISCOVERY_TIMEOUT 60)
endfunction()
