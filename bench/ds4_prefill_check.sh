#!/usr/bin/env bash
# DeepSeek V4 Flash prefill on one GPU (full shape, synthetic Q2 weights):
# the prefill kernels' tests, `baton bench` at ctx 8192 in one batch, and a
# per-kernel profile when nsys is there (else the bench step runs with
# --profile, which prints the GPU time per phase of each prefill forward).
#
#   bench/ds4_prefill_check.sh BIN_DIR OUT_DIR [RAM_DIR [STEPS]]
#
# STEPS (default "tests bench profile"):
#   tests    test_cuda_ds4_prefill, test_cuda_moe, the DeepSeek kernel suites
#            (test_cuda_ds4_hc, _router, _compressor, _indexer, _attention,
#            _norm_rope), test_cuda_ds4_stage
#            (or the names in $BATON_TESTS)
#   bench    baton bench --ctx-start 8192 --ctx-max 8192 --batch 8192 (prefill column)
#   profile  the same under nsys: cuda_gpu_kern_sum into OUT_DIR/kern_sum.csv
# BIN_DIR from bench/pack_gpu.sh; the 80.76 GiB file goes to a tmpfs at RAM_DIR.
set -u -o pipefail
bin=${1:?binary folder}
out=${2:?output folder}
ram=${3:-/mnt/ram}
steps=${4:-tests bench profile}
mkdir -p "$out" "$ram"
has() { [[ " $steps " == *" $1 "* ]]; }
work=/tmp/baton-prefill-check
mkdir -p "$work"
source "$(dirname "$0")/gpu_env.sh"
B="$bin/baton"
status=0
t0=$SECONDS
echo "nsys: $(command -v nsys || echo none)  ncu: $(command -v ncu || echo none)"
if has tests; then
  kernel_suites="test_cuda_ds4_hc test_cuda_ds4_router test_cuda_ds4_compressor test_cuda_ds4_indexer
    test_cuda_ds4_attention test_cuda_ds4_norm_rope"
  for t in ${BATON_TESTS:-test_cuda_ds4_prefill test_cuda_moe $kernel_suites test_cuda_ds4_stage}; do
    timeout 40 "$bin/tests/$t" > "$out/$t.log" 2>&1 || status=1
    echo "$t: $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/$t.log" | tr '\n' ' ') ($((SECONDS - t0)) s)"
    grep -E '^\[  FAILED  \]|Failure|error' "$out/$t.log" | head -n 8
  done
fi
q2="$ram/f.gguf"
if has bench || has profile; then
  mountpoint -q "$ram" || mount -t tmpfs -o size=100G tmpfs "$ram"
  [ -f "$q2" ] || timeout 120 "$B" synth --shape deepseek4-flash --type q2 --data alias -q -o "$q2" > /dev/null 2>&1 || status=1
  echo "synth done ($((SECONDS - t0)) s)"
fi
args=(bench -m "$q2" --backend cuda --ctx-start 8192 --ctx-max 8192 --gen-tokens 1 --batch 8192 --csv)
if has profile && command -v nsys > /dev/null; then
  timeout 150 nsys profile --trace=cuda --sample=none --cpuctxsw=none -o "$out/prof" -f true "$B" "${args[@]}" \
    > "$out/bench_profile.csv" 2> "$out/bench_profile.err" || status=1
  cat "$out/bench_profile.csv"
  nsys stats --report cuda_gpu_kern_sum --format csv -o "$out/kern" "$out/prof.nsys-rep" > /dev/null 2>&1 || status=1
  # Total ms, share and calls of the top kernels.
  python3 - "$out/kern_cuda_gpu_kern_sum.csv" <<'PY' || true
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows[:22]:
    print("%5.1f%% %9.1f ms %7s  %s" % (float(r["Time (%)"]), float(r["Total Time (ns)"]) / 1e6, r["Instances"], r["Name"][:90]))
PY
  rm -f "$out/prof.nsys-rep" "$out/prof.sqlite"
  echo "profile done ($((SECONDS - t0)) s)"
elif has bench; then
  timeout 120 "$B" "${args[@]}" --profile > "$out/bench.csv" 2> "$out/bench.err" || status=1
  cat "$out/bench.csv"
  # Per-phase times of --profile (the warm-up prefill, then the measured one).
  tr '\r' '\n' < "$out/bench.err" | grep -E "^ds4 prefill|prefill .* tok/s" || true
  echo "bench done ($((SECONDS - t0)) s)"
fi
exit $status
