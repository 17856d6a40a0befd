#!/usr/bin/env bash
# DeepSeek V4 Flash short batches, two builds side by side (issue 31: the
# routed experts by the expert):
#
#   bench/ds4_grouped_check.sh BIN_BEFORE BIN_AFTER OUT_DIR [RAM_DIR [STEPS]]
#
# BIN_* as bench/pack_gpu.sh makes them (BIN_BEFORE needs only baton; "-"
# runs the after build alone). RAM_DIR
# (default /mnt/ram) holds the 80.76 GiB Q2 file (a tmpfs is mounted there when
# it is not one). STEPS (default "tests kernels ab profile"):
#   tests    test_cuda_moe and test_cuda_ds4_stage of BIN_AFTER
#   kernels  bench_cuda_kernels moe of BIN_AFTER: one layer's routed experts,
#            per pair against grouped, 1 to 64 rows (kernels_moe.log)
#   ab       baton bench --parallel 1,2,5,8,16,32 at ctx 128 with each build,
#            before first: ab.csv (build, rows, aggregate tok/s, ms a step);
#            the after build also --verify 2,3,4,5,6,8 (one sequence's
#            forwards of K tokens against its one-token step)
#   profile  BIN_AFTER's bench --profile --parallel 1,2,5,8,16,32,64: the GPU
#            time per phase of each batch forward (profile.log) and its
#            medians per row count (phases.csv, bench/ds4_phase_table.py)
set -u -o pipefail
before=${1:?before binary folder}
after=${2:?after binary folder}
out=${3:?output folder}
ram=${4:-/mnt/ram}
steps=${5:-tests kernels ab profile}
bin=$after
work=/tmp/baton-ds4-grouped
mkdir -p "$ram"
here=$(cd "$(dirname "$0")" && pwd)
source "$here/gpu_env.sh"
start_run_log

if has tests; then
  say "CUDA suites: routed experts and the deepseek4 stage"
  for t in test_cuda_moe test_cuda_ds4_stage; do
    timeout 90 "$after/tests/$t" --gtest_brief=1 > "$work/$t.log" 2>&1 || { status=1; grep -E "Failure|FAILED|error|got" "$work/$t.log" | head -n 20 | tee -a "$log"; }
    echo "$t: $(grep -E '^\[  (PASSED|FAILED)  \]' "$work/$t.log" | tr '\n' ' ')" | tee -a "$log"
    grep -E "relative error|median" "$work/$t.log" | head -n 20 >> "$log"
    cat "$work/$t.log" >> "$out/tests.log"
  done
fi

if has kernels && [ -x "$after/bench/bench_cuda_kernels" ]; then
  say "kernel table: routed experts per pair and grouped"
  timeout 120 "$after/bench/bench_cuda_kernels" moe 2>&1 | tee "$out/kernels_moe.log" | tee -a "$log" || status=1
fi

# The Q2 file needs about 83 GiB of device memory.
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
if [ -z "${FLASH_LAYERS:-}" ] && [ "${mem_mib:-0}" -lt 100000 ] && { has ab || has profile; }; then
  say "only ${mem_mib} MiB of device memory: the Flash Q2 file does not fit, ab and profile skipped"
  steps=${steps//ab/}
  steps=${steps//profile/}
fi

# FLASH_LAYERS=N: only Flash's first N layers (20: 37 GiB, for an 80 GB card).
q2="$ram/flash-q2${FLASH_LAYERS:+-L$FLASH_LAYERS}.gguf"
if has ab || has profile; then
  if [ ! -s "$q2" ]; then
    if ! mountpoint -q "$ram"; then mount -t tmpfs -o size=100G tmpfs "$ram" || echo "no tmpfs at $ram" | tee -a "$log"; fi
    say "synth deepseek4-flash q2 (alias data) into $ram"
    t0=$SECONDS
    timeout 200 "$after/baton" synth --shape deepseek4-flash --type q2 ${FLASH_LAYERS:+--layers $FLASH_LAYERS} --data alias -q -o "$q2" 2>&1 | tail -n 2 | tee -a "$log" || status=1
    echo "written in $((SECONDS - t0)) s" | tee -a "$log"
  fi
fi

bench_args=(-m "$q2" --backend cuda --ctx-start 128 --ctx-max 128 --gen-tokens 16 --read-mb 0)
if has ab; then
  echo "build,rows,tok_s,step_ms" > "$out/ab.csv"
  builds="before after"
  [ "$before" = - ] && builds=after  # BIN_BEFORE "-": the after build alone
  for b in $builds; do
    dir=$before
    [ "$b" = after ] && dir=$after
    say "bench $b: --parallel 1,2,5,8,16,32 at ctx 128"
    extra=()
    # The after build also times verify-shaped forwards (K tokens of one sequence).
    [ "$b" = after ] && extra=(--verify 2,3,4,5,6,8)
    timeout 200 "$dir/baton" bench "${bench_args[@]}" --parallel 1,2,5,8,16,32 "${extra[@]}" > "$work/ab_$b.out" 2> "$work/ab_$b.err" || status=1
    tr '\r' '\n' < "$work/ab_$b.err" | grep -v ETA > "$out/ab_$b.log"
    grep -E "^ctx |^parallel |^verify |loaded " "$out/ab_$b.log" | tee -a "$log"
    sed -nE "s/^parallel ([0-9]+) at ctx [0-9]+: decode ([0-9.]+) tok\/s aggregate .* ([0-9.]+) ms a step$/$b,\1,\2,\3/p" \
      "$out/ab_$b.log" >> "$out/ab.csv"
  done
fi

if has profile; then
  say "bench after --profile: --parallel 1,2,5,8,16,32,64"
  # stderr straight into OUT: what a run cut short printed still comes back.
  timeout 200 "$after/baton" bench "${bench_args[@]}" --gen-tokens 8 --profile --parallel 1,2,5,8,16,32,64 \
    > "$work/profile.out" 2> "$out/profile.log" || status=1
  tr '\r' '\n' < "$out/profile.log" | grep -E "^parallel |graph replay: median" | tee -a "$log"
  python3 "$here/ds4_phase_table.py" "$out/profile.log" --rows 1,2,5,8,16,32,64 | tee "$out/phases.csv" | tee -a "$log"
fi
say "done, status $status"
exit $status
