#!/usr/bin/env bash
# scripts/gpu-bundle.sh — builds here what scripts/gpu-check.sh runs on a GPU machine, for a GPU
# machine that cannot build chorus itself (the lent H200 has CUDA, CMake and ninja but none of
# the Debian packages chorus builds with, and no network to fetch them).
#
# Builds the `nccl` preset (Release, CHORUS_WITH_NCCL=ON) and copies into .gpu-bundle/ (ignored
# by git; name it in the device tool's `carry`):
#   bin/     the gpu job, the NCCL unit tests, the chorus CLI, bench_nccl and the examples,
#            stripped;
#   lib/     the shared libraries they need that a CUDA image may lack (Boost.Context, fmt,
#            CUDA's runtime as built against, ...), found with ldd. Not the C/C++ runtime (the
#            image's is newer) and not NCCL (218 MB: gpu-check.sh finds the machine's own).
# Then `scripts/gpu-check.sh --prebuilt .gpu-bundle` runs the checks from the bundle. The bundle
# must stay well under the device tool's 64 MiB (working tree included); this script prints its
# size and fails above 48 MiB.
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=build/nccl
OUT=.gpu-bundle
JOBS=${JOBS:-2}
LIMIT_MIB=48

cmake --preset nccl >/dev/null
grep -q "libchorus_nccl" "${BUILD}/build.ninja" \
  || { echo "gpu-bundle: the nccl preset did not find CUDA + NCCL"; exit 1; }
EXAMPLES=(data_parallel ddp_buckets tensor_parallel_mlp sharded_optimizer moe_dispatch)
cmake --build "${BUILD}" -j "${JOBS}" --target nccl_gpu_job nccl_test chorus_cli bench_nccl \
  "${EXAMPLES[@]}"

rm -rf "${OUT}"
mkdir -p "${OUT}/bin" "${OUT}/lib"
binaries=("${BUILD}/tests/nccl_gpu_job" "${BUILD}/tests/nccl_test" "${BUILD}/props/chorus"
          "${BUILD}/bench/bench_nccl")
for example in "${EXAMPLES[@]}"; do
  binaries+=("${BUILD}/examples/${example}")
done
for binary in "${binaries[@]}"; do
  strip -o "${OUT}/bin/$(basename "${binary}")" "${binary}"
done

# Libraries a CUDA image may lack. Left out: the C and C++ runtimes and the dynamic loader (the
# image's are newer and must match its loader), the CUDA driver (the machine's own) and NCCL.
missing=$(ldd "${OUT}"/bin/* | grep "not found" || true)
if [ -n "${missing}" ]; then
  echo "gpu-bundle: libraries missing here:"
  echo "${missing}"
  exit 1
fi
for binary in "${OUT}"/bin/*; do
  ldd "${binary}" | awk '$3 ~ /^\// { print $3 }'
done | sort -u | while read -r library; do
  case "$(basename "${library}")" in
    libc.so* | libm.so* | libstdc++.so* | libgcc_s.so* | libpthread.so* | libdl.so* | \
      librt.so* | ld-linux* | libcuda.so* | libnccl.so*)
      ;;
    *)
      cp -L "${library}" "${OUT}/lib/"
      ;;
  esac
done

size_kib=$(du -sk "${OUT}" | cut -f1)
echo "gpu-bundle: ${OUT} holds $(ls "${OUT}/bin" | wc -l) programs and" \
  "$(ls "${OUT}/lib" | wc -l) libraries ($(ls "${OUT}/lib" | tr '\n' ' ')), $((size_kib / 1024)) MiB"
if [ "${size_kib}" -gt $((LIMIT_MIB * 1024)) ]; then
  echo "gpu-bundle: over ${LIMIT_MIB} MiB: too large to carry"
  exit 1
fi
