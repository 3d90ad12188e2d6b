# chorus_mpi_test(NAME <name> NP <n> COMMAND <exe> <args...> [EXIT_STATUS])
# A ctest (labels mpi) that runs `mpirun -np <n> <exe> <args>` on this machine: shared memory
# only, as root if need be, more ranks than cores allowed. EXIT_STATUS runs it through sh and
# prints "mpirun exit status <s>" last, for tests that expect the job to fail in a given way
# (their PASS_REGULAR_EXPRESSION judges the output; how mpirun itself ends does not count: Open
# MPI 4.1's mpirun sometimes segfaults in PMIx_server_finalize after an MPI_Abort, and once, under
# TSan, it did not end at all). So there mpirun also runs under `timeout`, well inside the test's
# own limit: a job that stops after printing the expected failure still passes on that output,
# and one that hangs before printing it fails on the regular expression, with its output kept.
# That limit is CHORUS_MPI_FAILING_JOB_SECONDS (a global property): these jobs print their
# failure within 4 s in every preset (CI, 2026-12-04: 0.6-3.7 s, dev, asan-ubsan and tsan), but
# mpiexec sometimes stays after its ranks exited, their output complete (Open MPI's
# finalize/abort hang, open-mpi/ompi#3380 and relatives); 60 s bounds what that costs CI (it was
# 200 s) and leaves 15x the slowest job's time.
include_guard(GLOBAL)

# The flags live in a global property: with the global include guard, a variable set here would be
# seen only by the first directory that includes this file.

set(CHORUS_MPIEXEC_FLAGS --oversubscribe --mca btl self,vader
    # Containers often forbid the cross-memory-attach syscalls vader uses for large messages.
    --mca btl_vader_single_copy_mechanism none)
if(CMAKE_HOST_UNIX)
  execute_process(COMMAND id -u OUTPUT_VARIABLE chorus_uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(chorus_uid STREQUAL "0")
    list(APPEND CHORUS_MPIEXEC_FLAGS --allow-run-as-root)
  endif()
endif()
set_property(GLOBAL PROPERTY CHORUS_MPIEXEC_FLAGS ${CHORUS_MPIEXEC_FLAGS})
# Also in the cache, for scripts that run MPI jobs from a build directory (scripts/build-pgo).
set(CHORUS_MPIEXEC_FLAGS "${CHORUS_MPIEXEC_FLAGS}" CACHE INTERNAL "mpiexec flags of the MPI tests")
set_property(GLOBAL PROPERTY CHORUS_MPI_FAILING_JOB_SECONDS 60)

function(chorus_mpi_test)
  cmake_parse_arguments(ARG "EXIT_STATUS" "NAME;NP" "COMMAND" ${ARGN})
  get_property(CHORUS_MPIEXEC_FLAGS GLOBAL PROPERTY CHORUS_MPIEXEC_FLAGS)
  get_property(limit GLOBAL PROPERTY CHORUS_MPI_FAILING_JOB_SECONDS)
  set(command ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ARG_NP} ${CHORUS_MPIEXEC_FLAGS}
      ${ARG_COMMAND})
  if(ARG_EXIT_STATUS)
    add_test(NAME ${ARG_NAME}
             COMMAND sh -c "timeout -k 10 ${limit} \"$@\" 2>&1; echo \"mpirun exit status $?\"" sh
                     ${command})
  else()
    add_test(NAME ${ARG_NAME} COMMAND ${command})
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS ${ARG_NP})
  chorus_mpi_sanitizer_environment(${ARG_NAME})
endfunction()

# chorus_mpi_fail_on_failed_ranks(<test>...): with PASS_REGULAR_EXPRESSION ctest ignores the
# exit status, so a job whose rank 0 prints its success line while another rank fails would pass
# (until 2026-12-03 it did: a wrong result on ranks 1 and 2 of mpi.job.big_all_to_all.mpi.np3
# passed). A job that must succeed also fails on what a failed rank leaves in the output:
# chorus::mpi::run's line for a rank that threw, and mpirun's for an abort, a signal or a
# non-zero exit.
function(chorus_mpi_fail_on_failed_ranks)
  foreach(test IN LISTS ARGN)
    set_property(TEST ${test} APPEND PROPERTY FAIL_REGULAR_EXPRESSION
      "chorus: rank [0-9]+ of [0-9]+ failed" "MPI_ABORT was invoked" "exited on signal"
      "non-zero exit code")
  endforeach()
endfunction()

# Under ASan, Open MPI's own allocations are not chorus's leaks: tests/transports/
# openmpi_lsan.supp suppresses stacks through Open MPI. Open MPI has no frame pointers, so
# unwinding must be the slow, full one, and its components stay loaded so frames resolve.
function(chorus_mpi_sanitizer_environment test)
  if(CHORUS_SANITIZE MATCHES "address")
    set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT
      "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:fast_unwind_on_malloc=0"
      "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/transports/openmpi_lsan.supp:print_suppressions=0"
      "OMPI_MCA_mca_base_component_disable_dlclose=1")
  endif()
endfunction()
