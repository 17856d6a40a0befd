#!/usr/bin/env bash
# One pass over everything that needs the GPU, for a machine that has one:
#
#   bench/gpu_check.sh BIN_DIR OUT_DIR [WORK_DIR [SHAPE]]
#
# BIN_DIR holds the binaries of a Release CUDA build (baton, tests/test_cuda_*,
# optionally bench/bench_cuda_kernels),
# libs/ (shared libraries the machine may lack, used only for those it lacks)
# and shared/models/stories260K.gguf. bench/pack_gpu.sh BUILD BIN_DIR makes it.
# WORK_DIR (default /tmp/baton-gpu-check) receives the synthetic 8B models
# (5-9 GB each): keep it on a local disk, never under OUT_DIR. SHAPE (default
# llama-8b) is the `baton synth` shape benchmarked; llama-tiny checks the
# script itself in seconds.
#
# Steps, each bounded by a timeout, all run even when one fails:
#   1. the CUDA test suites (kernels and the CUDA stage)
#   2. the oracle: stories260K, 100 greedy tokens, --backend cuda == cpu
#   3. baton synth llama-8b in Q4_K and Q8_0 (alias data: written at disk speed)
#   4. baton bench on each: ceilings, load (progress, RSS, device memory), sweep;
#      for Q4_K also rank 0 of `baton split --tp 2` alone (--tp-alone, ctx 512;
#      not for llama-tiny)
#   5. compute-sanitizer memcheck over the short cases of the CUDA stage suite
#      and of the tensor-parallel CUDA suite
#   6. when BIN_DIR/bench/bench_cuda_kernels exists, its sections named in
#      BENCH_SECTIONS (default "xq decode"; "" skips it), into kernels.log
# OUT_DIR gets run.log (everything printed), bench_<model>.csv and load.csv.
# Exits non-zero when a step failed.
set -u -o pipefail
bin=${1:?binary folder}
out=${2:?output folder}
work=${3:-/tmp/baton-gpu-check}
shape=${4:-llama-8b}
mkdir -p "$out" "$work"
log="$out/run.log"
: > "$log"
status=0

# Shared libraries: the machine's own first; ours only for names it lacks.
source "$(dirname "$0")/gpu_env.sh"
ldd "$bin/baton" | grep "not found" | tee -a "$log" && status=1

say "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  nproc; free -g | head -2; df -h "$work" | tail -1; uname -r; } 2>&1 | tee -a "$log"

say "1. CUDA test suites"
export BATON_SHARED="$(cd "$bin/shared" && pwd)"
for t in "$bin"/tests/test_cuda_*; do
  [ -x "$t" ] || continue
  echo "-- $(basename "$t")" | tee -a "$log"
  timeout 150 "$t" --gtest_brief=1 >> "$log" 2>&1 || { status=1; echo "FAILED: $(basename "$t")" | tee -a "$log"; }
  tail -n 2 "$log"
done

say "2. oracle: stories260K, 100 greedy tokens, cuda vs cpu"
stories="$BATON_SHARED/models/stories260K.gguf"
for b in cpu cuda; do
  timeout 60 "$bin/baton" run -m "$stories" -p "Once upon a time" -n 100 --temp 0 --json --backend "$b" \
    > "$work/oracle_$b.json" 2>> "$log" || status=1
done
python3 - "$work/oracle_cpu.json" "$work/oracle_cuda.json" <<'EOF' 2>&1 | tee -a "$log" || status=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = a["tokens"] == b["tokens"]
print("cpu  %d tokens, decode %.0f tok/s: %r" % (len(a["tokens"]), a["decode_tokens_per_s"], a["text"][:80]))
print("cuda %d tokens, decode %.0f tok/s: %r" % (len(b["tokens"]), b["decode_tokens_per_s"], b["text"][:80]))
print("top logits cpu ", a["top_logits"]); print("top logits cuda", b["top_logits"])
print("ORACLE", "PASS: the 100 greedy tokens are equal" if same and len(a["tokens"]) == 100 else "FAIL")
sys.exit(0 if same and len(a["tokens"]) == 100 else 1)
EOF

first=1
for type in q4_k q8_0; do
  model="$work/$shape-$type.gguf"
  say "3. synth $shape $type"
  t0=$SECONDS
  timeout 180 "$bin/baton" synth --shape "$shape" --type "$type" --data alias -q -o "$model" \
    2> "$work/synth.err" || { status=1; cat "$work/synth.err" >> "$log"; continue; }
  echo "written in $((SECONDS - t0)) s: $(ls -l "$model")" | tee -a "$log"
  say "4. bench $shape $type"
  timeout 180 "$bin/baton" bench -m "$model" --backend cuda --csv --ctx-start 512 --ctx-max 4096 --step-mul 2 \
    --gen-tokens 128 --batch 512 --load-csv "$work/load_$type.csv" > "$out/bench_$shape-$type.csv" 2> "$work/bench.err" \
    || status=1
  tr '\r' '\n' < "$work/bench.err" | grep -v "^loading .*ETA" | tee -a "$log"
  grep "^loading" <(tr '\r' '\n' < "$work/bench.err") | head -3 | tee -a "$log"
  cat "$out/bench_$shape-$type.csv" | tee -a "$log"
  # llama-tiny's 128 attention columns a rank are no Q4_K block: split --tp 2 refuses it.
  if [ "$type" = q4_k ] && [ "$shape" != llama-tiny ]; then
    say "4b. rank 0 of $shape $type at tp 2 alone (--tp-alone)"
    rm -rf "$work/ranks"
    timeout 300 "$bin/baton" split "$model" --tp 2 -o "$work/ranks" >> "$log" 2>&1 || status=1
    rank0=$(ls "$work"/ranks/*.tp2-r0.gguf 2> /dev/null | head -n 1)
    if [ -n "$rank0" ]; then
      timeout 180 "$bin/baton" bench -m "$rank0" --backend cuda --tp-alone --csv --ctx-start 512 --ctx-max 512 \
        --gen-tokens 128 --batch 512 --parallel 8 > "$out/bench_$shape-$type-tp2-r0.csv" 2> "$work/bench.err" \
        || status=1
      tr '\r' '\n' < "$work/bench.err" | grep -v "^loading .*ETA" | tee -a "$log"
      cat "$out/bench_$shape-$type-tp2-r0.csv" | tee -a "$log"
    fi
    rm -rf "$work/ranks"
  fi
  if [ -f "$work/load_$type.csv" ]; then
    if [ $first = 1 ]; then cat "$work/load_$type.csv" > "$out/load.csv"; first=0; else tail -n 1 "$work/load_$type.csv" >> "$out/load.csv"; fi
  fi
  rm -f "$model"
done
[ -f "$out/load.csv" ] && cat "$out/load.csv" | tee -a "$log"

say "5. compute-sanitizer memcheck over the CUDA stage suite (short cases)"
if command -v compute-sanitizer > /dev/null; then
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/tests/test_cuda_stage" --gtest_brief=1 \
    --gtest_filter='CudaStage.GraphDecodeEqualsPrefill:CudaStage.PrefillGemmMatchesCpu:CudaStage.PinnedRingLoadsEveryByte:CudaStage.DeviceMemoryIsThePlan' \
    > "$work/memcheck.log" 2>&1; echo "memcheck exit $?" >> "$work/memcheck.log"
  grep -E "ERROR SUMMARY|PASSED|FAILED|exit|Invalid" "$work/memcheck.log" | head -20 | tee -a "$log"
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/tests/test_cuda_tp" --gtest_brief=1 \
    --gtest_filter='CudaTp.Stories260KAtTwoRanksGivesTheOneRankTokens:CudaTp.BatchThroughTwoRanksEqualsEachSequenceAlone:CudaTp.LoneRankMatchesTheCpuLoneRank' \
    > "$work/memcheck_tp.log" 2>&1; echo "memcheck exit $?" >> "$work/memcheck_tp.log"
  grep -E "ERROR SUMMARY|PASSED|FAILED|exit|Invalid" "$work/memcheck_tp.log" | head -20 | tee -a "$log"
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/tests/test_cuda_ds4_tp" --gtest_brief=1 \
    --gtest_filter='CudaDs4Tp.BatchThroughTwoRanksEqualsEachSequenceAlone:CudaDs4Tp.LoneRankMatchesTheCpuLoneRank' \
    > "$work/memcheck_ds4_tp.log" 2>&1; echo "memcheck exit $?" >> "$work/memcheck_ds4_tp.log"
  grep -E "ERROR SUMMARY|PASSED|FAILED|exit|Invalid" "$work/memcheck_ds4_tp.log" | head -20 | tee -a "$log"
fi
if [ -x "$bin/bench/bench_cuda_kernels" ] && [ -n "${BENCH_SECTIONS-xq decode}" ]; then
  say "6. kernel micro-benchmark: ${BENCH_SECTIONS-xq decode}"
  for section in ${BENCH_SECTIONS-xq decode}; do
    timeout 240 "$bin/bench/bench_cuda_kernels" "$section" >> "$out/kernels.log" 2>&1 || status=1
  done
  cat "$out/kernels.log" | tee -a "$log"
fi
say "done, status $status"
exit $status
