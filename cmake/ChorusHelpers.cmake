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
# The release preset links with link-time optimisation (CMAKE_INTERPROCEDURAL_OPTIMIZATION):
# its objects hold GCC's intermediate code only, and optimisation, with the warnings it finds
# (-Wmaybe-uninitialized, -Warray-bounds, -Wfree-nonheap-object, ...), runs at the link, under
# the link command's options. So the warning options and -Werror are link options there too.
# GCC 12 then also inlines std::string concatenation across files and reports a
# -Wstringop-overflow false positive in it (a memcpy bound "between 2^63 + 1 and 2^64 - 1" for a
# literal prepended to a std::string, which no string's size reaches), so below GCC 13 that
# warning is off at the link (the compile-time -Wno-restrict above is the same story).
if(CMAKE_INTERPROCEDURAL_OPTIMIZATION)
  target_link_options(chorus_options INTERFACE
    -Wall -Wextra -Wpedantic -Wshadow -Wconversion
    $<$<BOOL:${CHORUS_WERROR}>:-Werror>
    $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict>
    $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-stringop-overflow>)
endif()

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

# Profile-guided optimisation (scripts/build-pgo): a CHORUS_PGO=generate build (the
# `release-pgo-generate` preset) counts branches and calls into CHORUS_PGO_DIR while a training
# workload runs (the property battery, `chorus bench`), and a CHORUS_PGO=use build (`release-pgo`)
# lays out, inlines and unrolls by those counts. GCC only. Global options, so that every object
# and executable of the build, libraries, tools and tests alike, is instrumented or optimised.
#  - -fprofile-prefix-path: a profile file is named after its object's path, here taken relative
#    to the build directory, so the use build (another directory) finds the generate build's.
#  - prefer-atomic: the threads executor counts from several threads at once (MPI's ranks are
#    processes, which merge their counts into the files under a lock at exit).
#  - -fprofile-partial-training: code the training never ran (another transport, most error
#    paths) is optimised as without a profile, not for size as GCC otherwise does with it.
#  - -Wno-missing-profile: the objects the training never ran (tests, benchmarks) have none.
#    scripts/build-pgo checks instead that the hottest objects' profiles are where this build
#    will look for them.
#  - -Wno-error=coverage-mismatch: a source edited since the training keeps building (without
#    the profile for the functions that changed); scripts/build-pgo retrains.
# With link-time optimisation the optimising happens at the link: the options go there too.
if(CHORUS_PGO)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    message(FATAL_ERROR "CHORUS_PGO needs GCC (its -fprofile-generate/-fprofile-use), "
                        "not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  if(CHORUS_SANITIZE OR CHORUS_LIBFUZZER)
    message(FATAL_ERROR "CHORUS_PGO is for optimised builds, not with sanitizers or libFuzzer")
  endif()
  if(CHORUS_PGO STREQUAL "generate")
    set(chorus_pgo_options -fprofile-generate=${CHORUS_PGO_DIR} -fprofile-update=prefer-atomic)
  elseif(CHORUS_PGO STREQUAL "use")
    if(NOT IS_DIRECTORY "${CHORUS_PGO_DIR}")
      message(WARNING "CHORUS_PGO=use: no profile in ${CHORUS_PGO_DIR}; "
                      "scripts/build-pgo trains one (the build is then an ordinary optimised one)")
    endif()
    set(chorus_pgo_options -fprofile-use=${CHORUS_PGO_DIR} -fprofile-partial-training
                           -Wno-missing-profile -Wno-error=coverage-mismatch)
  else()
    message(FATAL_ERROR "CHORUS_PGO must be '', 'generate' or 'use', not '${CHORUS_PGO}'")
  endif()
  list(APPEND chorus_pgo_options -fprofile-prefix-path=${CMAKE_BINARY_DIR})
  add_compile_options(${chorus_pgo_options})
  add_link_options(${chorus_pgo_options})
endif()

# libFuzzer (the `fuzz` preset): every library and test is built with coverage instrumentation
# for libFuzzer (-fsanitize=fuzzer-no-link); only the fuzz targets link libFuzzer itself
# (chorus_fuzz_target). Clang only.
if(CHORUS_LIBFUZZER)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CHORUS_LIBFUZZER needs clang (libFuzzer); "
                        "other compilers build the fuzz targets with tests/fuzz/standalone_main.cpp")
  endif()
  target_compile_options(chorus_options INTERFACE -fsanitize=fuzzer-no-link)
  # The fuzzers check chorus's own invariants as debug builds do (Note [Debug-only checks] in
  # core/include/chorus/check.hpp), though optimised (NDEBUG).
  target_compile_definitions(chorus_options INTERFACE CHORUS_DEBUG_CHECKS=1)
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
# ENVIRONMENT set, e.g. RC_PARAMS to fix RapidCheck's seed). TIMEOUT is per test case.
#
# With CHORUS_TEST_PER_BINARY (the asan-ubsan, tsan and fuzz presets) the executable is one CTest
# test named <name> that runs every case in one process, under a limit of
# kChorusPerBinaryTimeout (below) rather than TIMEOUT. A sanitized process takes ~0.09 s to start
# (asan-ubsan, measured 2026-12-04: 45 cases as 45 processes 4.0 s, 38 of them in one 0.17 s), and
# the ~2,650 short cases spent ~6 of CI's ~45 minutes starting. The cases stay independent: each
# resets what it changes (every executable also runs whole, as `build/<preset>/tests/<name>`).
set(kChorusPerBinaryTimeout 1200)
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
  if(CHORUS_TEST_PER_BINARY)
    add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
    set_tests_properties(${ARG_NAME} PROPERTIES
      LABELS "${ARG_LABELS}" TIMEOUT ${kChorusPerBinaryTimeout} ENVIRONMENT "${ARG_ENVIRONMENT}")
    return()
  endif()
  gtest_discover_tests(${ARG_NAME}
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT "${ARG_ENVIRONMENT}"
    DISCOVERY_TIMEOUT 60)
endfunction()

# chorus_fuzz_target(NAME <name> SOURCES ... [DEPS ...] [RUNS <n>] [TIMEOUT <s>])
# A fuzz target (a source defining LLVMFuzzerTestOneInput): linked with libFuzzer when
# CHORUS_LIBFUZZER is on, else with tests/fuzz/standalone_main.cpp. CTest (label `fuzz`) runs it
# on its committed seed corpus tests/fuzz/corpus/<name>/ plus RUNS more inputs (libFuzzer's
# mutations, or the standalone driver's PRNG inputs, seed 1); new corpus entries and crash files
# land in the build tree, never in the committed corpus. The corpus libFuzzer writes is emptied
# before each run: kept, it would grow run after run and every later run would replay it all
# against the timeout. scripts/fuzz runs it for longer (and keeps its corpus).
function(chorus_fuzz_target)
  cmake_parse_arguments(ARG "" "NAME;RUNS;TIMEOUT" "SOURCES;DEPS" ${ARGN})
  if(NOT ARG_RUNS)
    set(ARG_RUNS 1000)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE chorus::options ${ARG_DEPS})
  if(CHORUS_LIBFUZZER)
    target_link_options(${ARG_NAME} PRIVATE -fsanitize=fuzzer)
  else()
    target_sources(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests/fuzz/standalone_main.cpp)
  endif()
  set(corpus ${CMAKE_CURRENT_SOURCE_DIR}/corpus/${ARG_NAME})
  set(work_dir ${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}.ctest)
  file(MAKE_DIRECTORY ${work_dir})
  # sh empties the output corpus ($0), then runs the target ("$@").
  add_test(NAME ${ARG_NAME}
           COMMAND sh -c "rm -rf \"$0\" && mkdir \"$0\" && exec \"$@\"" ${work_dir}/corpus
                   $<TARGET_FILE:${ARG_NAME}> -runs=${ARG_RUNS} -seed=1 -max_len=512
                   ${work_dir}/corpus ${corpus}
           WORKING_DIRECTORY ${work_dir})
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS fuzz TIMEOUT ${ARG_TIMEOUT})
endfunction()
