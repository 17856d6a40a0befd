#!/usr/bin/env bash
# DeepSeek V4 Flash on one GPU, full shape, synthetic weights (issue figures):
#
#   bench/ds4_gpu_check.sh BIN_DIR OUT_DIR [RAM_DIR [STEPS]]
#
# BIN_DIR as for bench/gpu_check.sh (bench/pack_gpu.sh makes it). RAM_DIR
# (default /mnt/ram) holds the 80.76 GiB Q2 file: a tmpfs is mounted there
# when it is not one already, since such machines have more memory than disk.
# STEPS (default "tests q2 split limit96 oracle q4") picks the steps:
#   tests    the deepseek4 CUDA suites (test_cuda_ds4_*, test_cuda_moe*)
#   kernels  bench_cuda_kernels' ds4 section (the full-shape decode kernels)
#   xq       bench_cuda_kernels' xq section (integer-dot matvec shapes and variants)
#   ncu      ncu's counters for each ds4 decode kernel, run once
#   profile  synth q2, then baton bench --profile at ctx 2048 (decode time per graph node)
#   oracle   bench/ds4_oracle/oracle.py against transformers (CPU, CUDA, 2 workers)
#   q2       synth deepseek4-flash q2 (alias data), baton bench at ctx 2048/8192/32768,
#            prefill in batches of 8192
#   limit96  the same file with --mem-limit 97887MiB (a 96 GB card) at ctx 393216
#   split    two workers on the one GPU (--mem-limit each, loopback TCP) vs one
#   q4       deepseek4-flash q4 planned onto two 128 GB unified nodes, split, and
#            each part loaded alone with --mem-limit 128GB (sparse data: the
#            file is a hole, so this measures memory, not read speed)
# OUT_DIR gets run.log and the CSVs. Exits non-zero when a step failed.
set -u -o pipefail
bin=${1:?binary folder}
out=${2:?output folder}
ram=${3:-/mnt/ram}
steps=${4:-tests q2 split limit96 oracle q4}
work=/tmp/baton-ds4-check
mkdir -p "$ram"
source "$(dirname "$0")/gpu_env.sh"
start_run_log
B="$bin/baton"
# Strips the loader's \r progress lines from a stderr capture.
clean() { tr '\r' '\n' < "$1" | grep -v "ETA" ; }

if has tests; then
  say "CUDA test suites"
  for t in "$bin"/tests/test_cuda_*; do
    [ -x "$t" ] || continue
    timeout 150 "$t" --gtest_brief=1 > "$work/$(basename "$t").log" 2>&1 || { status=1; grep -E "Failure|FAILED|error" "$work/$(basename "$t").log" | head -n 10 | tee -a "$log"; }
    echo "$(basename "$t"): $(grep -E '^\[  (PASSED|FAILED)  \]' "$work/$(basename "$t").log" | tr '\n' ' ')" | tee -a "$log"
  done
fi

if has xq && [ -x "$bin/bench/bench_cuda_kernels" ]; then
  say "kernel table: integer-dot matvec shapes and variants"
  timeout 240 "$bin/bench/bench_cuda_kernels" xq > "$out/kernels_xq.log" 2>&1 || status=1
fi
if has kernels && [ -x "$bin/bench/bench_cuda_kernels" ]; then
  say "kernel table: the DeepSeek decode kernels"
  timeout 120 "$bin/bench/bench_cuda_kernels" ds4 2>&1 | tee "$out/kernels_ds4.log" | tee -a "$log" || status=1
fi
if has ncu && [ -x "$bin/bench/bench_cuda_kernels" ]; then
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
  if [ -n "$ncu" ]; then
    timeout 240 "$ncu" --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      "$bin/bench/bench_cuda_kernels" ds4 once > "$out/ncu_ds4.log" 2>&1 || echo "ncu failed" | tee -a "$log"
    grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued" \
      "$out/ncu_ds4.log" | head -n 150 > "$work/ncu_short.log"; cat "$work/ncu_short.log" >> "$log"
  fi
fi

q2="$ram/flash-q2.gguf"
if has q2 || has limit96 || has split || has profile; then
  if ! mountpoint -q "$ram"; then mount -t tmpfs -o size=100G tmpfs "$ram" || echo "no tmpfs at $ram" | tee -a "$log"; fi
  df -h "$ram" | tail -n 1 | tee -a "$log"
  say "synth deepseek4-flash q2 (alias data) into $ram"
  t0=$SECONDS
  timeout 240 "$B" synth --shape deepseek4-flash --type q2 --data alias -q -o "$q2" 2>&1 | tail -n 2 | tee -a "$log" || status=1
  echo "written in $((SECONDS - t0)) s" | tee -a "$log"
fi

if has q2; then
  say "bench flash q2: decode at ctx 2048 / 8192 / 32768, prefill in chunks of 8192"
  timeout 300 "$B" bench -m "$q2" --backend cuda --csv --ctx-start 2048 --ctx-max 32768 --step-mul 4 \
    --gen-tokens 64 --batch 8192 --load-csv "$out/load_flash_q2.csv" > "$out/bench_flash_q2.csv" 2> "$work/bench.err" || status=1
  clean "$work/bench.err" | tail -n 25 | tee -a "$log"
  cat "$out/bench_flash_q2.csv" "$out/load_flash_q2.csv" 2>/dev/null | tee -a "$log"
fi

if has profile; then
  say "bench flash q2 --profile at ctx 2048: decode time per graph node"
  timeout 240 "$B" bench -m "$q2" --backend cuda --csv --ctx-start 2048 --ctx-max 2048 --gen-tokens 64 --batch 2048 \
    --read-mb 0 --profile > "$out/bench_profile.csv" 2> "$work/profile.err" || status=1
  clean "$work/profile.err" > "$out/profile.log"
  grep -E "graph profile|graph replay|decode" "$out/profile.log" | tee -a "$log"
  grep -A 40 "graph profile" "$out/profile.log" | head -n 42 | tee -a "$log"
  cat "$out/bench_profile.csv" | tee -a "$log"
fi

prompt="The history of the river begins in the mountains, where snow melts every spring and"
if has split; then
  say "flash q2: one worker vs two workers on the one GPU (--mem-limit 64GiB each)"
  cat > "$work/split.toml" <<TOML
[model]
path = "$q2"
[cluster]
workers = 2
local = true
[serving]
ctx = 4096
[[node]]
name = "gpu-a"
backend = "cuda"
memory = "64GiB"
[[node]]
name = "gpu-b"
backend = "cuda"
memory = "64GiB"
TOML
  timeout 200 "$B" run -m "$q2" --backend cuda --ctx 4096 -p "$prompt" -n 64 --temp 0 --json > "$work/one.json" \
    2> "$work/one.err" || status=1
  timeout 300 "$B" run --config "$work/split.toml" --backend cuda -p "$prompt" -n 64 --temp 0 --json > "$work/two.json" \
    2> "$work/two.err" || status=1
  clean "$work/two.err" | grep -v "^$" | tail -n 12 | tee -a "$log"
  python3 - "$work/one.json" "$work/two.json" <<'PY' 2>&1 | tee -a "$log" || status=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = a["tokens"] == b["tokens"] and len(a["tokens"]) == 64
print("one worker  %.1f tok/s decode" % a["decode_tokens_per_s"])
print("two workers %.1f tok/s decode (pipeline efficiency %.2f)" % (b["decode_tokens_per_s"], b["decode_tokens_per_s"] / a["decode_tokens_per_s"]))
print("SPLIT", "PASS: the 64 greedy tokens are equal" if same else "FAIL: tokens differ")
sys.exit(0 if same else 1)
PY
fi
if has limit96; then
  say "flash q2 on a 96 GB card: --mem-limit 97887MiB --ctx 393216"
  timeout 300 "$B" run -m "$q2" --backend cuda --mem-limit 97887MiB --ctx 393216 -p "$prompt" -n 32 --temp 0 \
    --json > "$out/limit96.json" 2> "$work/limit96.err" || status=1
  clean "$work/limit96.err" | tail -n 30 | tee -a "$log"
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("tokens", len(j["tokens"]), "decode tok/s %.1f" % j["decode_tokens_per_s"]); print(json.dumps({k: v for k, v in j.items() if "mem" in k or "plan" in k}, indent=1))' \
    "$out/limit96.json" 2>&1 | tee -a "$log"
fi

rm -f "$q2"

if has oracle; then
  say "oracle: transformers DeepseekV4 -> baton convert -> baton logits"
  timeout 300 python3 "$(dirname "$0")/ds4_oracle/oracle.py" "$B" --require-cuda --csv "$out/ds4_oracle.csv" \
    2>&1 | tail -n 20 | tee -a "$log" || status=1
fi


if has q4; then
  say "flash q4: plan onto two 128 GB unified nodes, split, load each part alone capped at 128 GB"
  q4dir="$work/q4"; mkdir -p "$q4dir"
  "$B" synth --shape deepseek4-flash --type q4 --data sparse -q -o "$q4dir/flash-q4.gguf" 2>&1 | tail -n 1 | tee -a "$log"
  "$B" plan "$q4dir/flash-q4.gguf" --nodes spark-a=128GB:unified,spark-b=128GB:unified --ctx 65536 2>&1 | tee -a "$log" || status=1
  t0=$SECONDS
  timeout 400 "$B" split "$q4dir/flash-q4.gguf" --layers 0:21,22:output -o "$q4dir/parts" 2> /dev/null | tee -a "$log" || status=1
  echo "split in $((SECONDS - t0)) s; on disk: $(du -sh "$q4dir/parts" | cut -f1)" | tee -a "$log"
  rm -f "$q4dir/flash-q4.gguf"
  n=0
  for part in "$q4dir"/parts/*.gguf; do
    n=$((n + 1))
    timeout 240 "$B" bench -m "$part" --backend cuda --load-only --mem-limit 128GB --load-csv "$work/load_q4_$n.csv" \
      > /dev/null 2> "$work/q4_$n.err" || status=1
    clean "$work/q4_$n.err" | tail -n 12 | tee -a "$log"
    if [ $n = 1 ]; then cat "$work/load_q4_$n.csv" > "$out/load_flash_q4_parts.csv"; else tail -n 1 "$work/load_q4_$n.csv" >> "$out/load_flash_q4_parts.csv"; fi
  done
  cat "$out/load_flash_q4_parts.csv" | tee -a "$log"
  rm -rf "$q4dir"
fi
say "done, status $status"
exit $status
