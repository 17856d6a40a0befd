#!/usr/bin/env bash
# Builds every test suite with AddressSanitizer and UBSan and runs them all,
# printing each suite's GoogleTest summary. Exit status 0 only if all pass.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(( $(nproc) < 2 ? $(nproc) : 2 ))
build=build-test
# CUDA off: without a GPU the CUDA suites only skip, and no GPU code gets a
# sanitizer build; scripts/cuda_arch_check.sh (below) still compiles every .cu.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBATON_CUDA=OFF \
      -DBATON_SANITIZE=address,undefined -DBATON_TESTS=ON >/dev/null
cmake --build "$build" -j "$jobs"
# The serving tests drive the server with the official openai and @anthropic-ai/sdk npm packages.
if command -v npm >/dev/null 2>&1; then
  (cd tests/serve && npm ci --no-audit --no-fund --loglevel=error)
fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=()
for t in "$build"/tests/test_*; do
  [ -x "$t" ] || continue
  echo "=== $(basename "$t")"
  if ! "$t" --gtest_brief=1; then failed+=("$(basename "$t")"); fi
done
# The engine's rooms: includes point down, folders and files stay small.
echo "=== check_rooms"
if ! python3 scripts/check_rooms.py; then failed+=("check_rooms"); fi
# The Spark's CPU: an aarch64 cross build, its CPU suites under qemu-user
# (skipped with a message only where the packages cannot be installed).
echo "=== aarch64 (cross build, qemu-user)"
if ! bash scripts/test_aarch64.sh; then failed+=("aarch64"); fi
# The CUDA sources must also compile for sm_120 and sm_121 (no GPU needed).
if ! bash scripts/cuda_arch_check.sh; then failed+=("cuda_arch_check"); fi
# The quick form of the fuzzing (10 s per libFuzzer target; the long runs
# are in docs/RELIABILITY.md). Needs clang with libFuzzer; skipped otherwise.
if printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' |
     clang++ -x c++ -fsanitize=fuzzer - -o /tmp/baton-fuzz-probe.$$ >/dev/null 2>&1; then
  rm -f /tmp/baton-fuzz-probe.$$
  echo "=== fuzz (quick)"
  if ! bash tests/fuzz/run.sh 10; then failed+=("fuzz"); fi
else
  echo "=== fuzz (quick): skipped (no clang with libFuzzer on this machine)"
fi
if ((${#failed[@]})); then
  echo "FAILED suites: ${failed[*]}"
  exit 1
fi
echo "all test suites passed"
