#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for a fixed
# time, then prints executions and crashes per target as a table.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]      (default 60 s, every target)
#   tests/fuzz/run.sh [--build DIR] [--runs N] [SECONDS] [TARGET...]
#
# --build: the build folder (default build-fuzz); --runs: stop each target
# after N executions or SECONDS, whichever comes first.
#
# Each target starts from its committed seeds (tests/fuzz/corpus/TARGET/, read
# only) plus the corpus it grew in earlier runs (DIR/fuzz-corpus/TARGET/).
# Crash, leak, timeout and out-of-memory inputs land in
# DIR/fuzz-artifacts/TARGET/; replay one with `DIR/tests/fuzz/TARGET FILE`.
# Exit status 1 when any target found something.
set -euo pipefail
cd "$(dirname "$0")/../.."

build=build-fuzz
runs=-1
while [[ ${1:-} == --* ]]; do
  case $1 in
    --build) build=$2 ;;
    --runs) runs=$2 ;;
    *) echo "usage: $0 [--build DIR] [--runs N] [SECONDS] [TARGET...]" >&2; exit 2 ;;
  esac
  shift 2
done
seconds=${1:-60}
shift || true
all=(fuzz_gguf fuzz_frame fuzz_split fuzz_http fuzz_tokenizer fuzz_jinja fuzz_chat_output fuzz_chat_request)
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")

jobs=$(( $(nproc) < 2 ? $(nproc) : 2 ))
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
      -DBATON_CUDA=OFF -DBATON_TESTS=OFF -DBATON_FUZZ=ON -DBATON_SANITIZE=address,undefined >/dev/null
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

rows=()
found=0
for t in "${targets[@]}"; do
  corpus=$build/fuzz-corpus/$t
  artifacts=$build/fuzz-artifacts/$t
  log=$build/fuzz-logs/$t.log
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  seeds=()
  [[ -d tests/fuzz/corpus/$t ]] && seeds=("tests/fuzz/corpus/$t")
  [[ $t == fuzz_gguf ]] && seeds=("tests/fuzz/corpus/gguf")
  # The published chat templates too (fixtures, read only).
  [[ $t == fuzz_jinja && -d ../shared/chat_templates ]] && seeds+=("../shared/chat_templates")
  count_findings() { find "$artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l; }
  before=$(count_findings)
  echo "=== $t: $seconds s" >&2
  # -timeout: an input slower than 10 s is a denial of service, reported
  # like a crash; -rss_limit_mb: so is a run that needs more than 2 GiB.
  set +e
  "$build/tests/fuzz/$t" -max_total_time="$seconds" -runs="$runs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" "$corpus" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(awk '/stat::number_of_executed_units/ {print $NF}' "$log" | tail -1)
  rate=$(awk '/stat::average_exec_per_sec/ {print $NF}' "$log" | tail -1)
  crashes=$(( $(count_findings) - before ))
  ((rc == 0)) || crashes=$((crashes > 0 ? crashes : 1))
  ((crashes == 0)) || found=1
  secs=$(awk '/^Done [0-9]+ runs in/ {print $(NF-1)}' "$log" | tail -1)
  rows+=("$(printf '| %-15s | %7s | %12s | %9s | %9s | %7s |' "$t" "${secs:-$seconds}" "${execs:-?}" "${rate:-?}" \
            "$(find "$corpus" -type f | wc -l)" "$crashes")")
done

printf '| %-15s | %7s | %12s | %9s | %9s | %7s |\n' target seconds executions "exec/s" corpus crashes
printf '|%s|%s|%s|%s|%s|%s|\n' ----------------- --------- -------------- ----------- ----------- ---------
printf '%s\n' "${rows[@]}"
exit "$found"
