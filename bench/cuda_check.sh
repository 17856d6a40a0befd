#!/usr/bin/env bash
# Runs the CUDA test suites and the kernel micro-benchmark from a build folder
# configured with -DBATON_CUDA=ON, on a machine with a GPU, and keeps the logs:
#
#   bench/cuda_check.sh BUILD_DIR LOG_DIR [--sanitize]
#
# LOG_DIR gets gpu.txt (device and clocks), tests.log, bench.log and, with
# --sanitize, sanitizer.log (compute-sanitizer memcheck over every suite, run
# side by side). Exits non-zero when a suite or the benchmark fails.
set -u -o pipefail
build=${1:?build folder}
logs=${2:?log folder}
sanitize=${3:-}
mkdir -p "$logs"

# Binaries link libcublas.so.13 dynamically; look for it where CUDA
# toolkits and Python wheels put it when the loader does not find it.
bench="$build/bench/bench_cuda_kernels"
if ldd "$bench" | grep -q "not found"; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, q, "lib") for p in nvidia.__path__ for q in os.listdir(p)))' 2>/dev/null); do
    if [ -e "$d/libcublas.so.13" ]; then
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      break
    fi
  done
fi
ldd "$bench" | grep "not found" && echo "cuda_check: missing shared libraries" >&2

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee "$logs/gpu.txt"

status=0
: > "$logs/tests.log"
for t in "$build"/tests/test_cuda_*; do
  [ -f "$t" ] && [ -x "$t" ] || continue
  echo "== $(basename "$t")" | tee -a "$logs/tests.log"
  timeout 120 "$t" --gtest_brief=1 2>&1 | tee -a "$logs/tests.log" | tail -n 3 || status=1
done

timeout 300 "$bench" 2>&1 | tee "$logs/bench.log" || status=1

if [ "$sanitize" = "--sanitize" ] && command -v compute-sanitizer >/dev/null; then
  pids=()
  for t in "$build"/tests/test_cuda_*; do
    [ -f "$t" ] && [ -x "$t" ] || continue
    (timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 "$t" --gtest_brief=1 \
       > "$logs/sanitizer.$(basename "$t").part" 2>&1; echo "exit $?" >> "$logs/sanitizer.$(basename "$t").part") &
    pids+=($!)
  done
  wait "${pids[@]}"
  for f in "$logs"/sanitizer.*.part; do
    echo "== $f"
    tail -n 6 "$f"
  done > "$logs/sanitizer.log"
  rm -f "$logs"/sanitizer.*.part
  grep -E "^== |ERROR SUMMARY|exit " "$logs/sanitizer.log"
fi
exit $status
