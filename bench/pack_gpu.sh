#!/usr/bin/env bash
# Gathers what bench/gpu_check.sh needs from a Release CUDA build into one
# folder that can travel to a GPU machine:
#
#   bench/pack_gpu.sh BUILD_DIR BIN_DIR [TEST...]
#
# BIN_DIR/baton, BIN_DIR/tests/test_cuda_* (and the other suites named as
# TEST, e.g. test_cli_dspark), BIN_DIR/bench/bench_cuda_kernels
# (when built), BIN_DIR/libs/ (the non-system
# shared libraries the binaries link, used there only where missing) and
# BIN_DIR/shared/models/stories260K.gguf. Configure the build with
# -DBoost_USE_STATIC_LIBS=ON so that Boost is linked in.
set -euo pipefail
build=${1:?build folder}
dest=${2:?destination folder}
shift 2
shared=${BATON_SHARED:-$(cd "$(dirname "$0")/../.." && pwd)/shared}
rm -rf "$dest"
mkdir -p "$dest/tests" "$dest/libs" "$dest/shared/models"
cp "$build/baton" "$dest/"
cp "$build"/tests/test_cuda_* "$dest/tests/" 2>/dev/null || true
for t in "$@"; do cp "$build/tests/$t" "$dest/tests/"; done
if [ -x "$build/bench/bench_cuda_kernels" ]; then
  mkdir -p "$dest/bench"
  cp "$build/bench/bench_cuda_kernels" "$dest/bench/"
fi
rm -f "$dest"/tests/*.cmake
strip --strip-debug "$dest/baton" "$dest"/tests/* "$dest"/bench/* 2>/dev/null || true
for lib in $(ldd "$dest/baton" "$dest"/tests/* $(ls "$dest"/bench/* 2>/dev/null) | awk '/=>/ {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libfmt.so.*|libcrypto.so.*|libssl.so.*|libboost_*) cp -L "$lib" "$dest/libs/" ;;
  esac
done
cp "$shared/models/stories260K.gguf" "$dest/shared/models/"
du -sh "$dest"
