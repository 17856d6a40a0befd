#!/usr/bin/env bash
# DSpark on the GPU (docs/DSPARK.md): the drafter's suites, then DeepSeek V4
# Flash Q2 synth with a synthetic drafter in its file:
#
#   bench/dspark_gpu_check.sh BIN OUT_DIR [RAM_DIR [STEPS]]
#
# BIN as `bench/pack_gpu.sh BUILD BIN test_cli_dspark test_cli_serve_draft`
# makes it (the CLI suites drive BIN/baton through $BATON_BINARY). RAM_DIR
# (default /mnt/ram) holds the model (a tmpfs is mounted there when it is not
# one). FLASH_LAYERS=N keeps only Flash's first N layers (an 80 GB card; the
# drafter then reads the last three). STEPS (default "tests bench agree ceiling"):
#   tests    test_cuda_dspark, test_cuda_ds4_spec, the GPU cases of the
#            CLI's CliDspark and ServeDraftCuda
#   bench    baton bench at ctx 128 and 2048: --verify 2,3,4,5,6 and
#            --draft-rounds 20 (the drafter's round against the one-token step)
#   agree    greedy -n 2000 with the drafter (threshold 0: every verify its
#            whole block) and with --no-draft; the first difference, then
#            teacher-forced: each drafted token against the plain one-token
#            step's logits at the drafted run's prefix (baton logits -b 1),
#            the share it is that step's pick and the logit gap where not
#   ceiling  --draft-test forced-accept -n 512: every guess kept, tok/s
set -u -o pipefail
bin=${1:?binary folder}
out=${2:?output folder}
ram=${3:-/mnt/ram}
steps=${4:-tests bench agree ceiling}
work=/tmp/baton-dspark-check
mkdir -p "$ram"
source "$(dirname "$0")/gpu_env.sh"
start_run_log
export BATON_BINARY="$(cd "$bin" && pwd)/baton" BATON_SHARED="$(cd "$bin" && pwd)/shared"

if has tests; then
  say "CUDA suites: the drafter network, the verify side, the CLI"
  for t in test_cuda_dspark test_cuda_ds4_spec test_cli_dspark test_cli_serve_draft; do
    filter=()
    [[ "$t" == test_cli_* ]] && filter=(--gtest_filter='*Cuda*')
    timeout 240 "$bin/tests/$t" --gtest_brief=1 "${filter[@]}" > "$out/$t.log" 2>&1 || status=1
    grep -E "Failure|FAILED|error" "$out/$t.log" | head -n 20 | tee -a "$log"
    echo "$t: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)  \]' "$out/$t.log" | tr '\n' ' ')" | tee -a "$log"
  done
fi

q2="$ram/flash-q2-dspark${FLASH_LAYERS:+-L$FLASH_LAYERS}.gguf"
if has bench || has agree || has ceiling; then
  if [ ! -s "$q2" ]; then
    if ! mountpoint -q "$ram"; then mount -t tmpfs -o size=110G tmpfs "$ram" || echo "no tmpfs at $ram" | tee -a "$log"; fi
    say "synth deepseek4-flash q2 --dspark (alias data) into $ram"
    t0=$SECONDS
    timeout 240 "$bin/baton" synth --shape deepseek4-flash --type q2 --dspark ${FLASH_LAYERS:+--layers $FLASH_LAYERS} \
      --data alias -q -o "$q2" 2>&1 | tail -n 2 | tee -a "$log" || status=1
    echo "written in $((SECONDS - t0)) s" | tee -a "$log"
  fi
fi

if has bench; then
  for ctx in 128 2048; do
    say "bench at ctx $ctx: verify forwards and draft rounds"
    timeout 240 "$bin/baton" bench -m "$q2" --backend cuda --ctx-start $ctx --ctx-max $ctx --gen-tokens 24 \
      --read-mb 0 --verify 2,3,4,5,6 --draft-rounds 20 > "$out/bench_$ctx.txt" 2> "$out/bench_$ctx.err" || status=1
    grep -E "^verify|^draft round|decode" "$out/bench_$ctx.err" | tee -a "$log"
    cat "$out/bench_$ctx.txt" >> "$log"
  done
fi

run_args=(-m "$q2" --backend cuda -p "Once upon a time" --temp 0 --ignore-eos --json --ctx 4096)
if has agree; then
  say "greedy 2000 tokens: drafted (threshold 0) against --no-draft"
  timeout 200 "$bin/baton" run "${run_args[@]}" -n 2000 --no-draft > "$out/plain.json" 2> "$out/plain.err" || status=1
  timeout 240 "$bin/baton" run "${run_args[@]}" -n 2000 --gpu-drafter --draft-threshold 0 > "$out/drafted.json" 2> "$out/drafted.err" || status=1
  python3 - "$out" "$bin/baton" "$q2" "$work" <<'PY' 2>&1 | tee -a "$log" || status=1
import json, subprocess, sys
out, baton, model, work = sys.argv[1:5]
p, d = (json.load(open(f"{out}/{n}.json")) for n in ("plain", "drafted"))
a, b = p["tokens"], d["tokens"]
same = sum(x == y for x, y in zip(a, b))
first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
print(f"plain {p['decode_tokens_per_s']:.1f} tok/s, drafted {d['decode_tokens_per_s']:.1f} tok/s; draft {d.get('draft')}")
print(f"{len(a)} and {len(b)} tokens; equal at {same} positions ({100.0 * same / max(1, len(a)):.2f}%); first difference at {first}")
# Teacher-forced: each drafted token against the plain one-token step's
# logits at the same prefix (the drafted run's own), so that one near-tie
# does not make every later position a difference.
import numpy as np
ids = d["prompt_tokens"] + b
npy = f"{work}/drafted_logits.npy"
subprocess.run([baton, "logits", "-m", model, "--backend", "cuda", "-b", "1", "--tokens", ",".join(map(str, ids)),
                "-o", npy], check=True, capture_output=True)
rows = np.load(npy, mmap_mode="r")
n0 = len(d["prompt_tokens"]) - 1
gaps = []
for i, t in enumerate(b):
    row = np.asarray(rows[n0 + i])
    top = int(row.argmax())
    if top != t: gaps.append((i, float(row[top] - row[t])))
print(f"teacher-forced: the drafted token is the plain step's pick at {len(b) - len(gaps)} of {len(b)} positions "
      f"({100.0 * (len(b) - len(gaps)) / max(1, len(b)):.2f}%); largest logit gap where not {max((g for _, g in gaps), default=0):.3g}"
      f"; gaps {[(i, round(g, 5)) for i, g in gaps[:12]]}")
PY
fi

if has ceiling; then
  say "forced full acceptance: the mechanism's ceiling"
  timeout 200 "$bin/baton" run "${run_args[@]}" -n 512 --no-draft > "$out/ceiling_plain.json" 2> /dev/null || status=1
  timeout 240 "$bin/baton" run "${run_args[@]}" -n 512 --draft-test forced-accept > "$out/ceiling.json" 2> "$out/ceiling.err" || status=1
  python3 - "$out" <<'PY' 2>&1 | tee -a "$log"
import json, sys
out = sys.argv[1]
p, c = (json.load(open(f"{out}/{n}.json")) for n in ("ceiling_plain", "ceiling"))
print(f"plain {p['decode_tokens_per_s']:.1f} tok/s; forced-accept {c['decode_tokens_per_s']:.1f} tok/s ({c['decode_tokens_per_s'] / p['decode_tokens_per_s']:.2f}x); {c.get('draft')}")
PY
fi
say "status $status"
exit $status
