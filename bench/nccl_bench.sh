#!/usr/bin/env bash
# The NCCL stage-link acceptance run, on one machine with two GPUs
# (docs/PROTOCOL.md, "Link negotiation"):
#
#   bench/nccl_bench.sh BUILD_DIR [OUT_DIR] [--shape llama-8b] [--tokens N]
#
# 1. the NCCL transport alone: tests/test_cuda_nccl (correctness on two
#    devices, then the per-transfer latency and bandwidth it prints for one
#    decode row and one 64-token chunk of llama-8b);
# 2. a synthetic model (baton synth, default llama-8b Q8_0);
# 3. reference: one worker on GPU 0 (`baton serve --config` with one remote
#    worker): greedy text of N tokens, decode tokens/s for 1 stream, and
#    aggregate tokens/s for 4 concurrent sequences;
# 4. the same with two workers, one per GPU (CUDA_VISIBLE_DEVICES), first
#    with --link nccl, then with --link tcp: the text must be identical,
#    /health must say which link each run used, and the per-token cost of
#    the second stage's hop is 1/rate(2 stages) - 1/rate(1 stage).
#
# Acceptance (issue 8): same tokens; NCCL 1-stream rate >= 95% of the single
# GPU's; NCCL aggregate with 4 sequences >= 1.8x the single GPU's 1-stream
# rate. Prints one summary table and writes OUT_DIR/summary.json; exits
# non-zero when the texts differ or a link is not what was asked.
# Every child has a timeout; workers and servers are stopped on exit.
set -euo pipefail
build=${1:?build folder (configured with CUDA and NCCL)}
out=${2:-nccl_bench_out}
shift $(( $# >= 2 ? 2 : 1 ))
shape=llama-8b
tokens=128
while [[ $# -gt 0 ]]; do
  case $1 in
    --shape) shape=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
baton=$(realpath "$build/baton")
mkdir -p "$out"
out=$(realpath "$out")
# Library paths as the other GPU scripts set them; also NCCL_NVLS_ENABLE=0,
# the project's rule, for anything this script starts.
bin=$build work=$out
source "$(dirname "$0")/gpu_env.sh"

gpus=$(nvidia-smi -L | wc -l)
if (( gpus < 2 )); then
  echo "nccl_bench: needs two GPUs, found $gpus" >&2
  exit 2
fi
nvidia-smi -L > "$out/gpus.txt"
nvidia-smi topo -m > "$out/topo.txt" 2>&1 || true

echo "== 1. NCCL link on two devices (tests/test_cuda_nccl)"
timeout 600 "$build/tests/test_cuda_nccl" 2>&1 | tee "$out/test_cuda_nccl.log"
grep -q "PASSED" "$out/test_cuda_nccl.log"
grep -q "SKIPPED" "$out/test_cuda_nccl.log" && { echo "nccl_bench: the NCCL test skipped" >&2; exit 1; }

model="$out/$shape.gguf"
if [[ ! -s $model ]]; then
  echo "== 2. synthetic $shape"
  timeout 1800 "$baton" synth --shape "$shape" --data alias -o "$model" -q
fi

secret="$out/cluster.secret"
( umask 077; openssl rand -hex 32 > "$secret" )
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# serve_cluster NAME N_WORKERS LINK: starts `baton serve --config` with N
# remote workers (worker i on GPU i), waits for "ready", measures, stops.
serve_cluster() {
  local name=$1 n=$2 link=$3 port=$((29000 + RANDOM % 2000)) cfg="$out/$1.toml"
  cat > "$cfg" <<TOML
[model]
path = "$model"
[cluster]
workers = $n
local = false
listen = "127.0.0.1:$port"
secret_file = "$secret"
link = "$link"
[serving]
ctx = 2048
parallel = 4
batch = 64
TOML
  "$baton" serve --config "$cfg" --port 0 --quiet > "$out/$name.serve.out" 2> "$out/$name.serve.err" &
  local serve=$!
  pids+=("$serve")
  # Remote workers outlive their coordinator (they wait for it to come back):
  # this configuration's are stopped with it.
  local workers=()
  local i
  for ((i = 0; i < n; i++)); do
    CUDA_VISIBLE_DEVICES=$i "$baton" worker --coordinator "127.0.0.1:$port" --secret-file "$secret" \
      --model "$model" --backend cuda --name "$name-w$i" --listen 127.0.0.1:0 2> "$out/$name.w$i.err" &
    pids+=("$!")
    workers+=("$!")
  done
  local http=""
  for ((i = 0; i < 900; i++)); do
    http=$(sed -n 's|^baton serve: listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$out/$name.serve.out" | head -1)
    if [[ -n $http ]] && grep -q "baton serve: ready" "$out/$name.serve.out"; then break; fi
    kill -0 "$serve" 2>/dev/null || { echo "nccl_bench: $name: serve exited" >&2; cat "$out/$name.serve.err" >&2; exit 1; }
    sleep 1
  done
  grep -q "baton serve: ready" "$out/$name.serve.out" || { echo "nccl_bench: $name: not ready" >&2; exit 1; }
  timeout 1800 python3 - "$http" "$tokens" "$out/$name.json" <<'PY'
import json, sys, threading, time, urllib.request
port, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def get(p):
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{p}", timeout=60).read())
def complete(prompt, n):
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    r = json.loads(urllib.request.urlopen(req, timeout=1200).read())
    return r, time.perf_counter() - t0
complete("warm up", 8)
# Decode rate: two lengths, so that prefill and fixed costs cancel out.
r_short, t_short = complete("Once upon a time", 16)
r, t = complete("Once upon a time", n)
done = r["usage"]["completion_tokens"] - r_short["usage"]["completion_tokens"]
one = done / (t - t_short)
# Four sequences at once, different prompts.
results = [None] * 4
def worker(i):
    results[i] = complete(f"Story number {i}:", n)
t0 = time.perf_counter()
th = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
for x in th: x.start()
for x in th: x.join()
wall = time.perf_counter() - t0
agg = sum(x[0]["usage"]["completion_tokens"] for x in results) / wall
health = get("/health")
links = [s.get("link") for s in health["stages"]]
json.dump({"text": r["choices"][0]["text"], "one_stream_tps": one, "four_seq_tps": agg, "links": links,
           "completion_tokens": r["usage"]["completion_tokens"]}, open(path, "w"))
print(f"  1 stream {one:.1f} tok/s, 4 sequences {agg:.1f} tok/s, links {links}")
PY
  kill "$serve" "${workers[@]}" 2>/dev/null || true
  wait "$serve" "${workers[@]}" 2>/dev/null || true
  sleep 2
}

echo "== 3. one worker on GPU 0"
serve_cluster single 1 auto
echo "== 4. two workers, NCCL link"
serve_cluster nccl 2 nccl
echo "== 4. two workers, TCP link"
serve_cluster tcp 2 tcp

python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
r = {k: json.load(open(f"{out}/{k}.json")) for k in ("single", "nccl", "tcp")}
def per_token_us(k):  # the second stage's hop, per decode token
    return (1 / r[k]["one_stream_tps"] - 1 / r["single"]["one_stream_tps"]) * 1e6
log = open(f"{out}/test_cuda_nccl.log").read()
micro = re.findall(r"nccl link: .*", log)
summary = {
    "same_text_nccl": r["nccl"]["text"] == r["single"]["text"],
    "same_text_tcp": r["tcp"]["text"] == r["single"]["text"],
    "links_nccl": r["nccl"]["links"], "links_tcp": r["tcp"]["links"],
    "single_1_stream_tps": r["single"]["one_stream_tps"], "single_4_seq_tps": r["single"]["four_seq_tps"],
    "nccl_1_stream_tps": r["nccl"]["one_stream_tps"], "nccl_4_seq_tps": r["nccl"]["four_seq_tps"],
    "tcp_1_stream_tps": r["tcp"]["one_stream_tps"], "tcp_4_seq_tps": r["tcp"]["four_seq_tps"],
    "nccl_hop_us_per_token": per_token_us("nccl"), "tcp_hop_us_per_token": per_token_us("tcp"),
    "nccl_1_stream_vs_single": r["nccl"]["one_stream_tps"] / r["single"]["one_stream_tps"],
    "nccl_4_seq_vs_single_1_stream": r["nccl"]["four_seq_tps"] / r["single"]["one_stream_tps"],
    "nccl_transport": micro,
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
for k, v in summary.items():
    print(f"{k:32} {v}")
ok = summary["same_text_nccl"] and summary["same_text_tcp"]
ok = ok and r["nccl"]["links"][0] and r["nccl"]["links"][0]["kind"] == "nccl"
ok = ok and r["tcp"]["links"][0] and r["tcp"]["links"][0]["kind"] == "tcp"
print("acceptance: 1 stream >= 0.95:", summary["nccl_1_stream_vs_single"] >= 0.95,
      "| 4 sequences >= 1.8x:", summary["nccl_4_seq_vs_single_1_stream"] >= 1.8)
sys.exit(0 if ok else 1)
PY
