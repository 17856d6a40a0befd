#!/usr/bin/env bash
# The tensor-parallel figures of one GPU, side by side in one run:
#
#   bench/tp_check.sh BIN_DIR OUT_DIR [WORK_DIR [MODELS [BASE_DIR]]]
#
# BIN_DIR as bench/pack_gpu.sh makes it (baton, tests/test_cuda_*,
# bench/allreduce_bench, libs/, shared/). MODELS (default "q4_k"): llama-8b
# types and/or flash_q2 (DeepSeek V4 Flash Q2, 80.76 GiB: on a tmpfs at
# /mnt/ram, so an H200). For each model, alternating, each its own process:
#   whole:  baton bench MODEL            (the whole model's step on this GPU)
#   rank0:  baton bench RANK0 --tp-alone (rank 0 of `baton split --tp 2` alone,
#           its partial sums answered on the device, the step one graph:
#           the rank's own compute; docs/PERFORMANCE.md)
#   rank0host: the same with --tp-exchange host (each exchange through
#           pinned memory and a synchronization, as a host group pays it)
#   base:   BASE_DIR/baton bench MODEL   (when BASE_DIR is given: the build
#           before, for the "nothing slower" check)
# with the decode at ctx 512 (llama-8b) or 2048 (flash_q2). Then the TCP
# all-reduce's latency between two processes' worth of threads on this host
# (allreduce_bench). First the tensor-parallel CUDA suites. RUNS (default 2)
# rounds of the variants; TESTS=0 skips the suites and the all-reduce.
# KEEP=1 leaves the Flash file on the tmpfs afterwards. FLASH_LAYERS=N
# writes only Flash's first N layers (20: 37 GiB, for an 80 GB card).
# OUT_DIR gets tp.csv (model, variant, run, then baton bench's columns),
# summary.txt (medians and ratios), allreduce.txt and run.log.
set -u -o pipefail
bin=${1:?binary folder}
out=${2:?output folder}
work=${3:-/tmp/baton-tp}
models=${4:-q4_k}
base=${5:-}
mkdir -p "$out" "$work"
log="$out/run.log"
: > "$log"
status=0
source "$(dirname "$0")/gpu_env.sh"
export BATON_SHARED="$(cd "$bin/shared" && pwd)"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee -a "$log"

runs=${RUNS:-2}
for t in test_cuda_tp test_cuda_stage test_cuda_ds4_stage test_cuda_ds4_tp test_cuda_sampling; do
  [ "${TESTS:-1}" = 0 ] && break
  [ -x "$bin/tests/$t" ] || continue
  echo "-- $t" | tee -a "$log"
  timeout 200 "$bin/tests/$t" --gtest_brief=1 >> "$log" 2>&1 || { status=1; echo "FAILED: $t" | tee -a "$log"; }
  tail -n 2 "$log"
done

if [ "${TESTS:-1}" != 0 ] && [ -x "$bin/bench/allreduce_bench" ]; then
  timeout 120 "$bin/bench/allreduce_bench" > "$out/allreduce.txt" 2>&1 || status=1
  cat "$out/allreduce.txt" | tee -a "$log"
fi

csv="$out/tp.csv"
: > "$csv"
for m in $models; do
  case "$m" in
    flash_q2)
      mkdir -p /mnt/ram
      mountpoint -q /mnt/ram || mount -t tmpfs -o size=125G tmpfs /mnt/ram || { status=1; continue; }
      # The model on the tmpfs, rank 0's file (45 GiB) on WORK_DIR's disk:
      # both on a 128 GiB machine's tmpfs would leave it no memory.
      file=/mnt/ram/flash-q2${FLASH_LAYERS:+-L$FLASH_LAYERS}.gguf; ranks="$work/ranks-flash"
      synth=(--shape deepseek4-flash --type q2 ${FLASH_LAYERS:+--layers $FLASH_LAYERS}); bench=(--ctx-start 2048 --ctx-max 2048 --gen-tokens 64 --batch 2048) ;;
    *)
      file="$work/llama-8b-$m.gguf"; ranks="$work/ranks-$m"
      synth=(--shape llama-8b --type "$m"); bench=(--ctx-start 512 --ctx-max 512 --gen-tokens 128 --batch 512) ;;
  esac
  [ -e "$file" ] || timeout 300 "$bin/baton" synth "${synth[@]}" --data alias -q -o "$file" >> "$log" 2>&1 || { status=1; continue; }
  rm -rf "$ranks"
  # Rank 0's file alone (--rank 0).
  timeout 300 "$bin/baton" split "$file" --tp 2 --rank 0 -o "$ranks" >> "$log" 2>&1 || { status=1; continue; }
  rank0=$(ls "$ranks"/*.tp2-r0.gguf | head -n 1)
  for r in $(seq 1 "$runs"); do
    for v in whole rank0 rank0host base; do
      case "$v" in
        whole) cmd=("$bin/baton" bench -m "$file") ;;
        rank0) cmd=("$bin/baton" bench -m "$rank0" --tp-alone) ;;
        rank0host) cmd=("$bin/baton" bench -m "$rank0" --tp-alone --tp-exchange host) ;;
        base) [ -n "$base" ] || continue; cmd=("$base/baton" bench -m "$file") ;;
      esac
      if ! timeout 300 "${cmd[@]}" --backend cuda --csv "${bench[@]}" > "$work/run.csv" 2> "$work/run.err"; then
        status=1; tail -n 5 "$work/run.err" | tee -a "$log"; continue
      fi
      [ -s "$csv" ] || echo "model,variant,run,$(head -n 1 "$work/run.csv")" > "$csv"
      tail -n +2 "$work/run.csv" | sed "s/^/$m,$v,$r,/" >> "$csv"
    done
  done
  rm -rf "$ranks"
  # KEEP=1 leaves Flash on the tmpfs for a next script (ds4_grouped_check.sh).
  [ "$m" = flash_q2 ] && [ "${KEEP:-0}" != 1 ] && rm -f "$file"
done

python3 - "$csv" <<'EOF' | tee "$out/summary.txt"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for model in dict.fromkeys(r["model"] for r in rows):
    def med(v, col):
        x = [float(r[col]) for r in rows if r["model"] == model and r["variant"] == v]
        return statistics.median(x) if x else float("nan")
    whole, rank0, base = med("whole", "gen_tps"), med("rank0", "gen_tps"), med("base", "gen_tps")
    host = med("rank0host", "gen_tps")
    print(f"{model}: decode tok/s whole {whole:.2f}, rank 0 alone {rank0:.2f}: "
          f"rank step / whole step {whole / rank0:.4f}; with host exchanges {host:.2f}: {whole / host:.4f}")
    if base == base:
        print(f"{model}: decode tok/s base {base:.2f}, this build {whole:.2f}: {whole / base:.4f}; "
              f"prefill {med('whole', 'prefill_tps') / med('base', 'prefill_tps'):.4f}")
EOF
cat "$csv" >> "$log"
exit $status
