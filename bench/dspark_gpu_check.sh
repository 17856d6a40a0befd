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
# drafter then reads the last three). SHAPE=deepseek4-tiny runs the same
# steps on the tiny shape (every layer kind, seconds to write); CPU_REF=1
# adds the CPU's forward (exact, the same for any batching) to `batching`. STEPS (default "tests bench agree ceiling"):
#   tests    test_cuda_ds4_attention, test_cuda_dspark, test_cuda_ds4_spec,
#            the GPU cases of the CLI's CliDspark and ServeDraftCuda (TESTS
#            names others)
#   bench    baton bench at ctx 128 and 2048 (BENCH_CTX): --verify 2,3,4,5,6 and
#            --draft-rounds 20 (the drafter's round against the one-token step)
#   agree    greedy -n 2000 with the drafter (threshold 0: every verify its
#            whole block) and with --no-draft; the first difference, then
#            teacher-forced: each drafted token against the plain one-token
#            step's logits at the drafted run's prefix (baton logits -b 1),
#            the share it is that step's pick and the logit gap where not
#   ceiling  --draft-test forced-accept -n 512: every guess kept, tok/s
#   batching the plain greedy output's logits from forwards of 1 token and of
#            BATCHES (default "2 6 64") tokens (baton logits -b N), their
#            differences to the one-token forwards' in 32-row bands: where a
#            verify-shaped forward leaves the decode step's arithmetic
#   profile  baton bench --profile --draft-rounds 3: the draft round's
#            kernels, node by node and their marginal cost in the replay
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
  for t in ${TESTS:-test_cuda_ds4_attention test_cuda_dspark test_cuda_ds4_spec test_cli_dspark test_cli_serve_draft}; do
    filter=()
    [[ "$t" == test_cli_* ]] && filter=(--gtest_filter='*Cuda*')
    timeout 240 "$bin/tests/$t" --gtest_brief=1 "${filter[@]}" > "$out/$t.log" 2>&1 || status=1
    grep -E "Failure|FAILED|error" "$out/$t.log" | head -n 20 | tee -a "$log"
    echo "$t: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)  \]' "$out/$t.log" | tr '\n' ' ')" | tee -a "$log"
  done
fi

shape=${SHAPE:-deepseek4-flash}
[ "$shape" = deepseek4-flash ] || unset FLASH_LAYERS
q2="$ram/$shape-q2-dspark${FLASH_LAYERS:+-L$FLASH_LAYERS}.gguf"
if has bench || has agree || has ceiling || has profile || has batching; then
  if [ ! -s "$q2" ]; then
    if ! mountpoint -q "$ram"; then mount -t tmpfs -o size=110G tmpfs "$ram" || echo "no tmpfs at $ram" | tee -a "$log"; fi
    say "synth $shape q2 --dspark (alias data) into $ram"
    t0=$SECONDS
    timeout 240 "$bin/baton" synth --shape "$shape" --type q2 --dspark ${FLASH_LAYERS:+--layers $FLASH_LAYERS} \
      --data alias -q -o "$q2" 2>&1 | tail -n 2 | tee -a "$log" || status=1
    echo "written in $((SECONDS - t0)) s" | tee -a "$log"
  fi
fi

if has bench; then
  for ctx in ${BENCH_CTX:-128 2048}; do
    say "bench at ctx $ctx: verify forwards and draft rounds"
    timeout 240 "$bin/baton" bench -m "$q2" --backend cuda --ctx-start $ctx --ctx-max $ctx --gen-tokens 24 \
      --read-mb 0 --verify 2,3,4,5,6 --draft-rounds 20 > "$out/bench_$ctx.txt" 2> "$out/bench_$ctx.err" || status=1
    grep -E "^verify|^draft round|^drafting step|decode" "$out/bench_$ctx.err" | tee -a "$log"
    cat "$out/bench_$ctx.txt" >> "$log"
  done
fi

run_args=(-m "$q2" --backend cuda -p "Once upon a time" --temp 0 --ignore-eos --json --ctx 4096)
if has agree; then
  say "greedy 2000 tokens: drafted (threshold 0) against --no-draft"
  timeout 200 "$bin/baton" run "${run_args[@]}" -n 2000 --no-draft > "$out/plain.json" 2> "$out/plain.err" || status=1
  timeout 240 "$bin/baton" run "${run_args[@]}" -n 2000 --gpu-drafter --draft-threshold 0 --draft-always > "$out/drafted.json" 2> "$out/drafted.err" || status=1
  python3 - "$out" "$bin/baton" "$q2" "$work" <<'PY' 2>&1 | tee -a "$log" || status=1
import json, subprocess, sys
import numpy as np
out, baton, model, work = sys.argv[1:5]
p, d = (json.load(open(f"{out}/{n}.json")) for n in ("plain", "drafted"))
a, b = p["tokens"], d["tokens"]
same = sum(x == y for x, y in zip(a, b))
first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
print(f"plain {p['decode_tokens_per_s']:.1f} tok/s, drafted {d['decode_tokens_per_s']:.1f} tok/s; draft {d.get('draft')}")
print(f"{len(a)} and {len(b)} tokens; equal at {same} positions ({100.0 * same / max(1, len(a)):.2f}%); first difference at {first}")

def logits(name, ids, batch):
    npy = f"{work}/{name}.npy"
    subprocess.run([baton, "logits", "-m", model, "--backend", "cuda", "-b", str(batch), "--tokens",
                    ",".join(map(str, ids)), "-o", npy], check=True, capture_output=True)
    return np.load(npy, mmap_mode="r")

# Teacher-forced: each generated token against the one-token forwards'
# logits at the same prefix (the run's own), so that one near-tie does not
# make every later position a difference. The plain run is the control:
# its decode steps against the same one-token forwards.
n0 = len(p["prompt_tokens"]) - 1
def forced(label, run, rows):
    gaps = []
    for i, t in enumerate(run):
        row = np.asarray(rows[n0 + i], dtype=np.float64)
        top = int(row.argmax())
        if top != t:
            gaps.append((i, float(row[top] - row[t]), float(row.std())))
    n = len(run)
    print(f"teacher-forced, {label}: the run's token is the one-token forward's pick at {n - len(gaps)} of {n} "
          f"({100.0 * (n - len(gaps)) / max(1, n):.2f}%); largest logit gap where not "
          f"{max((g for _, g, _ in gaps), default=0):.3g}; (position, gap, row std) {[(i, round(g, 4), round(s, 2)) for i, g, s in gaps[:16]]}")
plain_rows = logits("plain_b1", p["prompt_tokens"] + a, 1)
forced("plain run (control)", a, plain_rows)
forced("drafted run", b, logits("drafted_b1", d["prompt_tokens"] + b, 1))
# The same tokens in forwards of 6 rows (a verify's shape) against forwards
# of one: how far batching moves the logits, relative to the rows' spread.
b6 = logits("plain_b6", p["prompt_tokens"] + a, 6)
diff = np.abs(np.asarray(b6, dtype=np.float64) - np.asarray(plain_rows, dtype=np.float64)).max(axis=1)
std = np.asarray(plain_rows, dtype=np.float64).std(axis=1)
top2 = np.diff(np.sort(np.asarray(plain_rows, dtype=np.float64), axis=1)[:, -2:], axis=1)[:, 0]
for lo, hi in ((0, 128), (128, 512), (512, 1024), (1024, len(a) + n0 + 1)):
    print(f"rows {lo}-{hi}: max |b6 - b1| {diff[lo:hi].max():.4g} (median {np.median(diff[lo:hi]):.3g}), row std {np.median(std[lo:hi]):.3g}, "
          f"top-2 gap median {np.median(top2[lo:hi]):.3g}, under 1e-2 at {int((top2[lo:hi] < 1e-2).sum())} rows")
np.save(f"{work}/top2.npy", top2)
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
print(f"plain {p['decode_tokens_per_s']:.1f} tok/s; forced-accept {c['decode_tokens_per_s']:.1f} tok/s ({c['decode_tokens_per_s'] / p['decode_tokens_per_s']:.2f}x) "
      f"over {len(c['tokens'])} tokens (stop: {c['stop']}); {c.get('draft')}")
PY
  # Where the forced run left the plain output: the plain logits' top-2 gap there (agree's rows).
  pos=$(grep -o 'at position [0-9]*' "$out/ceiling.err" | grep -o '[0-9]*$' | head -n 1)
  if [ -n "$pos" ] && [ -s "$work/top2.npy" ]; then
    /usr/bin/env python3 -c "import numpy as np, sys; t = np.load(sys.argv[1]); p = int(sys.argv[2]); print(f'forced mode stopped at position {p}: top-2 gaps of the one-token rows {p - 2}..{p}: {[round(float(x), 5) for x in t[p - 2:p + 1]]}')" "$work/top2.npy" "$pos" | tee -a "$log"
  fi
fi
if has batching; then
  say "the same tokens in forwards of 1, 2, 6 and 64 rows"
  timeout 200 "$bin/baton" run "${run_args[@]}" -n 1019 --no-draft > "$out/batching_plain.json" 2> /dev/null || status=1
  python3 - "$out" "$bin/baton" "$q2" "$work" "${CPU_REF:-0}" "${BATCHES:-2 6 64}" <<'PY' 2>&1 | tee -a "$log" || status=1
import json, subprocess, sys
import numpy as np
out, baton, model, work, cpu_ref, batches = sys.argv[1:7]
p = json.load(open(f"{out}/batching_plain.json"))
ids = p["prompt_tokens"] + p["tokens"]
rows = {}
sizes = [int(b) for b in batches.split()]
for b in [1] + sizes:
    npy = f"{work}/batch_{b}.npy"
    subprocess.run([baton, "logits", "-m", model, "--backend", "cuda", "-b", str(b), "--tokens",
                    ",".join(map(str, ids)), "-o", npy], check=True, capture_output=True)
    rows[b] = np.load(npy).astype(np.float64)
std = np.median(rows[1].std(axis=1))
for b in sizes:
    same = int((rows[b] == rows[1]).all(axis=1).sum())
    print(f"forwards of {b} rows: {same} of {len(ids)} logit rows equal to the one-token forwards' to the bit")
print(f"{len(ids)} tokens, logit row std {std:.3g}; |logits(b) - logits(1)|, median / max of each 32-row band:")
for lo in range(0, len(ids), 32):
    hi = min(len(ids), lo + 32)
    cells = []
    for b in sizes:
        d = np.abs(rows[b][lo:hi] - rows[1][lo:hi]).max(axis=1)
        cells.append(f"b{b} {np.median(d):.2g}/{d.max():.2g}")
    print(f"  rows {lo:4d}-{hi - 1:4d}: " + "  ".join(cells))
if cpu_ref == "1":
    npy = f"{work}/batch_cpu.npy"
    subprocess.run([baton, "logits", "-m", model, "--backend", "cpu", "-b", "64", "--tokens",
                    ",".join(map(str, ids)), "-o", npy], check=True, capture_output=True)
    cpu = np.load(npy).astype(np.float64)
    print("|logits(cuda, b) - logits(cpu)|, median / max of each 32-row band:")
    for lo in range(0, len(ids), 32):
        hi = min(len(ids), lo + 32)
        cells = []
        for b in [1] + sizes:
            d = np.abs(rows[b][lo:hi] - cpu[lo:hi]).max(axis=1)
            cells.append(f"b{b} {np.median(d):.2g}/{d.max():.2g}")
        print(f"  rows {lo:4d}-{hi - 1:4d}: " + "  ".join(cells))
PY
fi

if has profile; then
  say "the draft round kernel by kernel"
  timeout 240 "$bin/baton" bench -m "$q2" --backend cuda --ctx-start 128 --ctx-max 128 --gen-tokens 12 \
    --read-mb 0 --draft-rounds 3 --profile > /dev/null 2> "$out/profile.err" || status=1
  sed -n '/^DSpark draft round, node by node/,/^draft round on the GPU (one graph)/p' "$out/profile.err" | tee -a "$log"
fi
say "status $status"
exit $status
