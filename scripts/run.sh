#!/usr/bin/env bash
# Builds `baton` (Release, -O2) and runs the main job on the embedded default
# model as a local cluster: a coordinator and 2 worker processes on loopback,
# each holding a contiguous layer range. Extra arguments go to `baton run`
# (for example: -p "Tom and his dog" -n 40, or --workers 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(( $(nproc) < 2 ? $(nproc) : 2 ))
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBATON_TESTS=OFF >/dev/null
cmake --build build --target baton -j "$jobs"
case " $* " in
  *" --workers "*|*" --workers="*) exec build/baton run "$@" ;;
  *) exec build/baton run --workers 2 "$@" ;;
esac
