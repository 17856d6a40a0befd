#!/usr/bin/env bash
# Compiles every CUDA source of the project for the Blackwell targets besides
# the default sm_90: sm_120 (RTX PRO 6000) and sm_121 (GB10, DGX Spark).
# Compile only: no GPU is needed. Skipped (exit 0, with a line) when there is
# no nvcc. scripts/test.sh runs it.
#   scripts/cuda_arch_check.sh [ARCHS]   (default "120;121")
set -euo pipefail
cd "$(dirname "$0")/.."
archs="${1:-120;121}"
nvcc=""
if command -v nvcc >/dev/null 2>&1; then nvcc=$(command -v nvcc)
elif [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [ -z "$nvcc" ]; then
  echo "cuda arch check: skipped (no nvcc on this machine)"
  exit 0
fi
jobs=$(( $(nproc) < 2 ? $(nproc) : 2 ))
build=build-arch
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBATON_CUDA=ON -DBATON_TESTS=OFF \
      -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$archs" >/dev/null
# The kernels library and the CUDA objects of the engine; nothing else.
objs=$(ninja -C "$build" -t targets all | sed -n 's/^\(CMakeFiles\/baton_engine_cuda\.dir\/engine\/cuda\/[^:]*\.cu\.o\):.*/\1/p')
[ -n "$objs" ] || { echo "cuda arch check: no CUDA objects of the engine in the build"; exit 1; }
start=$(date +%s)
cmake --build "$build" -j "$jobs" --target baton_cuda_kernels
# shellcheck disable=SC2086
ninja -C "$build" -j "$jobs" $objs
echo "cuda arch check: every .cu compiles for sm_${archs//;/, sm_} ($(( $(date +%s) - start )) s)"
