#!/usr/bin/env bash
# Serving load on one GPU through the HTTP API (docs/PERFORMANCE.md, "Many
# users at once"): `baton bench --serve` against `baton serve --backend cuda`
# in process, 128-token prompts and 128-token completions.
#
#   bench/serve_load.sh BIN_DIR OUT_DIR CASE...
#
# BIN_DIR as bench/pack_gpu.sh makes it. Each CASE is MODEL:BATCH, MODEL
# being llama (llama-8b Q4_K, 64 slots, ctx 512, 1/4/16/64 clients) or ds4
# (DeepSeek V4 Flash Q2, 32 slots, ctx 2048, 1/8/32 clients), BATCH the
# step budget (--batch). Synthetic files with alias data: llama-8b in
# $WORK (default /tmp/baton-serve), the 80.76 GiB Flash file in a tmpfs at
# /mnt/ram. OUT_DIR gets MODEL-bBATCH.csv per case and the servers' logs.
set -u -o pipefail
bin=${1:?binary folder}
out=${2:?output folder}
shift 2
work=${WORK:-/tmp/baton-serve}
ram=/mnt/ram
mkdir -p "$out" "$work"
source "$(dirname "$0")/gpu_env.sh"
B="$bin/baton"
status=0
for c in "$@"; do
  model=${c%%:*} batch=${c#*:}
  case "$model" in
    llama)
      file=$work/llama-8b-q4_k.gguf
      [ -e "$file" ] || timeout 300 "$B" synth --shape llama-8b --type q4_k --data alias -q -o "$file" || { status=1; continue; }
      levels=1,4,16,64 serve=(--parallel 64 --ctx 512) reps=2 ;;
    ds4)
      mkdir -p "$ram"
      mountpoint -q "$ram" || mount -t tmpfs -o size=100G tmpfs "$ram" || { echo "no tmpfs at $ram"; status=1; continue; }
      file=$ram/flash-q2.gguf
      [ -e "$file" ] || timeout 300 "$B" synth --shape deepseek4-flash --type q2 --data alias -q -o "$file" || { status=1; continue; }
      levels=1,8,32 serve=(--parallel 32 --ctx 2048) reps=1 ;;
    *) echo "unknown case $c"; status=1; continue ;;
  esac
  echo "== $model --batch $batch"
  timeout 420 "$B" bench --serve -c "$levels" -p 128 -n 128 -r "$reps" --csv "$out/$model-b$batch.csv" \
    --server-log "$out/$model-b$batch.server.log" -- \
    -m "$file" --backend cuda "${serve[@]}" --batch "$batch" 2> "$out/$model-b$batch.log" || {
    status=1; tail -n 20 "$out/$model-b$batch.log"; }
  cat "$out/$model-b$batch.csv" 2>/dev/null
done
exit $status
