#!/usr/bin/env bash
# scripts/gpu-check.sh — the NCCL transport on a machine with a CUDA GPU (issue 6 item 6,
# docs/nccl.md). One script, meant to finish in under 8 minutes:
#   1. configure and build the `nccl` preset (Release, CHORUS_WITH_NCCL=ON): the gpu test job,
#      the `chorus` CLI and the examples;
#   2. the gpu-labelled tests (ctest -L gpu: the gpu job and the smoke benchmark
#      nccl.bench.smoke) and the NCCL unit tests; from a bundle, the same programs run directly;
#   3. `chorus check --transport nccl` with one rank (NCCL 2.28 allows one rank per GPU);
#   4. the examples with --transport=nccl: they place their tensors on chorus::local_device()
#      (examples/example_support.hpp, Note [Example devices]), so every collective of theirs runs
#      on CUDA tensors core allocated and every read waits on the stream (`chorus check` in step
#      3 uses CPU tensors: the staged path);
#   5. the host-overhead benchmark bench_nccl (chorus all_reduce vs raw ncclAllReduce, one rank,
#      8 B..64 MiB; issue and complete per op, then the enqueue alone; docs/performance.md,
#      "NCCL host overhead (bench_nccl)").
# Exits non-zero at the first failing step and says which. Needs no network.
#
# `scripts/gpu-check.sh --prebuilt .gpu-bundle` skips steps 1's configure and build and runs the
# programs that scripts/gpu-bundle.sh built elsewhere, with their libraries: for a GPU machine
# without chorus's build dependencies (the lent H200 has CUDA, CMake and ninja, not Boost, GTest
# or the other Debian packages, and cannot fetch them). It finds the machine's NCCL (the system's,
# or the nvidia-nccl Python package's). Without arguments it takes `.gpu-bundle` when that folder
# exists, and builds otherwise.
#
# Time: every chorus program runs with --timeout-ms=${CHORUS_GPU_TIMEOUT_MS} (20 s), so a hang
# ends as chorus's own Timeout naming the operation, well inside each step's `timeout` (which
# sends SIGTERM, then SIGKILL 2 s later). Each step's limit is also cut to what is left of one
# budget for the whole script, ${CHORUS_GPU_BUDGET_S} (default 450 s), so the script ends within
# about 7.5 minutes even if every step hung (the device tool allows 10 per command): a step
# that no time is left for fails, naming itself.
# Everything printed is also written to ${OUT:-/tmp}/gpu-check.log: $OUT is what the device tool
# brings back, whole, where a command's output comes back as its last 12,000 characters only.
set -euo pipefail

PREBUILT=""
if [ "${1:-}" = "--prebuilt" ]; then
  # Absolute, and relative to the caller's directory, before the cd below.
  PREBUILT=$(cd "${2:?"--prebuilt needs the bundle's directory (scripts/gpu-bundle.sh makes .gpu-bundle)"}" && pwd)
fi
cd "$(dirname "$0")/.."
if [ -z "${PREBUILT}" ] && [ "$#" -eq 0 ] && [ -x .gpu-bundle/bin/nccl_gpu_job ]; then
  PREBUILT=$(pwd)/.gpu-bundle
fi
LOG_DIR=${OUT:-/tmp}
mkdir -p "${LOG_DIR}"
exec > >(tee -a "${LOG_DIR}/gpu-check.log") 2>&1
JOBS=${JOBS:-$(nproc)}
BUILD=build/nccl
CHORUS_GPU_TIMEOUT_MS=${CHORUS_GPU_TIMEOUT_MS:-20000}
TIMEOUT_FLAG="--timeout-ms=${CHORUS_GPU_TIMEOUT_MS}"
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}  # an NCCL failure explains itself
STEP=""
FAILED_STEPS=()  # steps that failed without stopping the script (the unit tests)
on_exit() {
  local status=$?
  if [ "${status}" -ne 0 ]; then
    echo "gpu-check: FAILED at step: ${STEP} (exit ${status})" >&2
  fi
}
trap on_exit EXIT

CHORUS_GPU_BUDGET_S=${CHORUS_GPU_BUDGET_S:-450}
SCRIPT_START=${SECONDS}

# `limited SECONDS command...`: the command, SIGTERM after SECONDS or when the script's budget
# runs out, whichever comes first, SIGKILL 2 s later.
limited() {
  local seconds=$1
  shift
  local left=$((CHORUS_GPU_BUDGET_S - (SECONDS - SCRIPT_START)))
  if [ "${left}" -lt 5 ]; then
    echo "gpu-check: the ${CHORUS_GPU_BUDGET_S} s budget is spent; not starting: $*"
    return 124
  fi
  if [ "${seconds}" -gt "${left}" ]; then
    seconds=${left}
  fi
  timeout -k 2 "${seconds}" "$@"
}

step() {
  STEP="$1"
  echo
  echo "=== gpu-check: $1 ($(date -u +%H:%M:%S))"
}

step "device"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi not found (continuing: the gpu job says whether CUDA sees a device)"
fi

EXAMPLES=(data_parallel ddp_buckets tensor_parallel_mlp sharded_optimizer moe_dispatch)
if [ -z "${PREBUILT}" ]; then
  step "configure (preset nccl)"
  cmake --preset nccl >/tmp/chorus-gpu-configure.log 2>&1 \
    || { cat /tmp/chorus-gpu-configure.log; exit 1; }
  grep "chorus: NCCL transport" /tmp/chorus-gpu-configure.log
  grep -q "libchorus_nccl" "${BUILD}/build.ninja" \
    || { echo "the nccl preset did not find CUDA + NCCL"; exit 1; }

  step "build"
  limited 300 cmake --build "${BUILD}" -j "${JOBS}" --target nccl_gpu_job nccl_test chorus_cli \
    bench_nccl "${EXAMPLES[@]}"

  step "gpu tests and NCCL unit tests"
  # A skipped gpu test (no device seen by CUDA) is a failure here: this script exists to run them.
  limited 120 ctest --test-dir "${BUILD}" -L gpu --output-on-failure --no-tests=error 2>&1 \
    | tee /tmp/chorus-gpu-ctest.log
  if grep -q "Skipped" /tmp/chorus-gpu-ctest.log; then
    echo "the gpu tests were skipped: CUDA sees no device"
    exit 1
  fi
  # Device-free, with short store deadlines: a failure here is reported at the end, not fatal.
  limited 60 ctest --test-dir "${BUILD}" -R "Nccl" --output-on-failure --no-tests=error \
    || FAILED_STEPS+=("NCCL unit tests")
  CHORUS="${BUILD}/props/chorus"
  EXAMPLE_DIR="${BUILD}/examples"
  BENCH="${BUILD}/bench/bench_nccl"
else
  step "the prebuilt bundle ${PREBUILT}"
  [ -x "${PREBUILT}/bin/nccl_gpu_job" ] \
    || { echo "${PREBUILT}/bin/nccl_gpu_job missing: run scripts/gpu-bundle.sh first"; exit 1; }
  NCCL_DIR=""
  # grep reads captured output: under pipefail a producer killed by grep -q's early exit would
  # count as a failure.
  if ! grep -q "libnccl.so.2" <<<"$(ldconfig -p 2>/dev/null || true)"; then
    NCCL_DIR=$(python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib"))' \
      2>/dev/null || true)
    if [ ! -e "${NCCL_DIR}/libnccl.so.2" ]; then
      NCCL_DIR=$(dirname "$(find /usr /opt -name libnccl.so.2 2>/dev/null | head -n 1)" 2>/dev/null || true)
    fi
    [ -e "${NCCL_DIR}/libnccl.so.2" ] || { echo "no libnccl.so.2 on this machine"; exit 1; }
  fi
  # For the bundle's programs (and what they start); free_port's python3 runs without it.
  export LD_LIBRARY_PATH="${PREBUILT}/lib${NCCL_DIR:+:${NCCL_DIR}}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
  echo "NCCL: ${NCCL_DIR:-found by the loader}"
  ldd "${PREBUILT}/bin/nccl_gpu_job" | grep -E "not found|nccl|cudart" || true
  # -r resolves every symbol too: an NCCL too old for a function chorus calls shows here.
  missing=$(ldd -r "${PREBUILT}"/bin/* 2>&1 | grep -E "not found|undefined symbol" || true)
  if [ -n "${missing}" ]; then
    echo "a library or symbol the bundle needs is missing on this machine:"
    echo "${missing}"
    exit 1
  fi

  step "NCCL unit tests (device-free; prove the bundle runs here)"
  # Short store deadlines on loopback: a failure here is reported at the end, not fatal.
  limited 45 "${PREBUILT}/bin/nccl_test" || FAILED_STEPS+=("NCCL unit tests")

  step "gpu job"
  status=0
  limited 60 "${PREBUILT}/bin/nccl_gpu_job" "${TIMEOUT_FLAG}" || status=$?
  if [ "${status}" -eq 77 ]; then
    echo "the gpu job was skipped: CUDA sees no device"
    exit 1
  fi
  [ "${status}" -eq 0 ] || exit "${status}"

  step "smoke benchmark (nccl.bench.smoke's command)"
  # What ctest -L gpu runs besides the gpu job (bench/CMakeLists.txt): every size up to 64 KiB
  # checked bitwise on both paths. A skip (77) is a failure here too.
  status=0
  limited 60 "${PREBUILT}/bin/bench_nccl" --max-bytes=64K --iters=3 --reps=3 --warmup=1 \
    "${TIMEOUT_FLAG}" || status=$?
  if [ "${status}" -eq 77 ]; then
    echo "the smoke benchmark was skipped: CUDA sees no device"
    exit 1
  fi
  [ "${status}" -eq 0 ] || exit "${status}"
  CHORUS="${PREBUILT}/bin/chorus"
  EXAMPLE_DIR="${PREBUILT}/bin"
  BENCH="${PREBUILT}/bin/bench_nccl"
fi

free_port() {
  env -u LD_LIBRARY_PATH python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
    2>/dev/null || echo $((29500 + RANDOM % 1000))
}

# Runs "$@" as rank 0 of a one-rank NCCL world: through `chorus launch -n 1` when the CLI has
# it, otherwise with torchrun's variables set directly (rank 0 hosts the store).
one_rank() {
  if "${CHORUS}" launch --help >/dev/null 2>&1; then
    "${CHORUS}" launch -n 1 -- "$@"
  else
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" "$@"
  fi
}

step "chorus check --transport nccl (one rank)"
limited 75 bash -c "$(declare -f free_port one_rank); CHORUS='${CHORUS}'; \
  one_rank '${CHORUS}' check --transport nccl --cases 50 ${TIMEOUT_FLAG}"

step "examples with --transport=nccl (one rank)"
for example in "${EXAMPLES[@]}"; do
  echo "--- ${example}"
  limited 25 bash -c "$(declare -f free_port one_rank); CHORUS='${CHORUS}'; \
    one_rank '${EXAMPLE_DIR}/${example}' --transport=nccl ${TIMEOUT_FLAG}"
done

step "host-overhead benchmark (bench_nccl, one rank)"
# Two tables, 8 B to 64 MiB by powers of 2: issue and complete per op (chorus all_reduce_inplace
# on device memory vs raw ncclAllReduce, each followed by a stream synchronise), then the enqueue
# alone (chorus all_reduce + wait_tensor on a CUDA tensor, a stream wait, vs ncclAllReduce). It
# checks every result bitwise and exits 1 on a wrong one, 77 without a device (a failure here
# too). Alone it hosts its own store. Copy its tables into docs/performance.md. Target: chorus
# adds under 2 us per op (the enqueue table).
limited 120 "${BENCH}" "${TIMEOUT_FLAG}" 2>&1 | tee /tmp/chorus-gpu-bench.log

STEP="done"
echo
if [ "${#FAILED_STEPS[@]}" -gt 0 ]; then
  STEP="the failed steps named below (the others passed)"
  echo "gpu-check: FAILED (the steps above ran): ${FAILED_STEPS[*]}"
  exit 1
fi
echo "gpu-check: passed"
