#!/usr/bin/env bash
# Two builds side by side in one run on one GPU, for "within N% of the build
# before" checks:
#
#   bench/ab_check.sh BIN_A BIN_B OUT_DIR [WORK_DIR [RUNS [MODELS]]]
#
# BIN_A and BIN_B are folders as bench/pack_gpu.sh makes them (only their
# `baton` is used here; BIN_A may hold `baton` alone). WORK_DIR (default
# /tmp/baton-ab) receives the synthetic llama-8b files; the DeepSeek V4 Flash
# Q2 file (80.76 GiB) goes to a tmpfs at /mnt/ram, since such machines have
# more memory than disk. MODELS (default "q4_k q8_0 flash_q2") picks them.
# Each model is benched RUNS times (default 2) per build, A and B alternating,
# each run its own process, so that drift of the machine hits both alike:
#   llama-8b:  baton bench --ctx-start 512 --ctx-max 512 --gen-tokens 128 --batch 512
#   flash q2:  baton bench --ctx-start 2048 --ctx-max 2048 --gen-tokens 64 --batch 2048
# OUT_DIR gets ab.csv (one row per run: model, build, run, then baton
# bench's columns) and summary.txt (B's median over A's for decode and
# prefill tokens/s). Exits non-zero when a run failed.
set -u -o pipefail
bin_a=${1:?build A folder}
bin_b=${2:?build B folder}
out=${3:?output folder}
work=${4:-/tmp/baton-ab}
runs=${5:-2}
models=${6:-q4_k q8_0 flash_q2}
ram=/mnt/ram
mkdir -p "$out" "$work"
status=0
bin=$bin_b
source "$(dirname "$0")/gpu_env.sh"
csv="$out/ab.csv"
: > "$csv"

model_file() {
  case "$1" in
    flash_q2)
      mkdir -p "$ram"
      mountpoint -q "$ram" || mount -t tmpfs -o size=100G tmpfs "$ram" || return 1
      echo "$ram/flash-q2.gguf" ;;
    *) echo "$work/llama-8b-$1.gguf" ;;
  esac
}

for m in $models; do
  file=$(model_file "$m") || { echo "no tmpfs for $m"; status=1; continue; }
  case "$m" in
    flash_q2) synth=(--shape deepseek4-flash --type q2); bench=(--ctx-start 2048 --ctx-max 2048 --gen-tokens 64 --batch 2048) ;;
    *) synth=(--shape llama-8b --type "$m"); bench=(--ctx-start 512 --ctx-max 512 --gen-tokens 128 --batch 512) ;;
  esac
  if [ ! -e "$file" ]; then
    timeout 300 "$bin_b/baton" synth "${synth[@]}" --data alias -q -o "$file" || { status=1; continue; }
  fi
  for r in $(seq 1 "$runs"); do
    for b in A B; do
      dir=$bin_a; [ "$b" = B ] && dir=$bin_b
      if ! timeout 300 "$dir/baton" bench -m "$file" --backend cuda --csv "${bench[@]}" > "$work/run.csv" 2> "$work/run.err"; then
        status=1; tail -n 5 "$work/run.err"; continue
      fi
      [ -s "$csv" ] || echo "model,build,run,$(head -n 1 "$work/run.csv")" > "$csv"
      tail -n +2 "$work/run.csv" | sed "s/^/$m,$b,$r,/" >> "$csv"
    done
  done
  [ "$m" = flash_q2 ] && rm -f "$file"
done

python3 - "$csv" <<'EOF' | tee "$out/summary.txt"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for model in dict.fromkeys(r["model"] for r in rows):
    def med(build, col):
        v = [float(r[col]) for r in rows if r["model"] == model and r["build"] == build]
        return statistics.median(v) if v else float("nan")
    for col in ("gen_tps", "prefill_tps"):
        a, b = med("A", col), med("B", col)
        print(f"{model:9s} {col:12s} A {a:10.2f}  B {b:10.2f}  B/A {b / a:.4f}")
EOF
cat "$csv"
exit $status
