#!/usr/bin/env bash
# Preflight matrix: for synthetic shapes, a grid of contexts and node sizes,
# `baton plan` decides fit or no-fit, and each decision is checked.
#
#   bench/preflight_matrix.sh [--baton PATH] [--quick | --long]
#
# --quick: a smaller grid. --long: the multi-GiB version of the same check,
# llama-1b in f32 (4.6 GiB, repeated-tile data) on one 8 GiB CPU node at
# ctx 512 (minutes: the forward runs on one thread).
# - fit, runnable shape (small, CPU backend): `baton run` loads the model and
#   generates 8 greedy tokens inside a memory cgroup capped at the plan + 5% +
#   the binary's baseline + 8 MiB (bench/cgroup_run.sh; needs root and cgroup
#   v1), and its peak must stay below the cap (a run held at the cap by
#   reclaim fails).
#   The page cache of the model file counts against the cap, so a plan that
#   undercounts fails the cell instead of passing silently.
# - no-fit: the message must name what would fit, and the claim is checked:
#   the largest context it names (--ctx N) must fit and N + 1 must not; the
#   node count it names must fit with that many nodes of the same kind.
# - fit, large shape (plan only, header-only sparse files): the plan itself.
#
# Prints one Markdown table; exit status 1 when any cell fails.
set -euo pipefail
cd "$(dirname "$0")/.."

baton=build/baton
quick=0
long=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --baton) baton=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --long) long=1; shift ;;
    *) echo "usage: $0 [--baton PATH] [--quick | --long]" >&2; exit 2 ;;
  esac
done
[[ -x $baton ]] || { echo "preflight_matrix: no baton binary at $baton (use --baton PATH)" >&2; exit 2; }
command -v jq >/dev/null || { echo "preflight_matrix: needs jq" >&2; exit 2; }
can_run=1
[[ -w /sys/fs/cgroup/memory ]] || { can_run=0; echo "preflight_matrix: no writable cgroup v1 memory controller: runs are skipped" >&2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/baton-matrix-XXXXXX")
trap 'rm -rf "$work"' EXIT
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

# plan MODEL NODES CTX: the plan's JSON (exit 0 fits, 2 does not).
plan() {
  "$baton" plan "$1" --nodes "$2" --ctx "$3" --threads 1 --chunk 64 --json 2>"$work/plan.err" || true
}

# Runs a model at a context inside a cgroup capped at CAP; sets run_peak and
# run_ok (1 when it completed with 8 tokens and was not OOM-killed).
run_capped() {
  local model=$1 ctx=$2 cap=$3 report
  run_ok=0
  run_peak=0
  if bench/cgroup_run.sh --uncache "$model" "$cap" "$baton" run -m "$model" -p Once --ctx "$ctx" --temp 0 -n 8 \
      --threads 1 --json >"$work/run.json" 2>"$work/run.err"; then
    [[ $(jq '.tokens | length' "$work/run.json") == 8 ]] && run_ok=1
  fi
  report=$(grep '^cgroup_run:' "$work/run.err" | tail -1)
  run_peak=$(sed -E 's/.* peak=([0-9]+).*/\1/' <<<"$report")
  [[ $report == *oom_killed=1* ]] && run_ok=0
  # Held at the cap by reclaim: it needed more than the cap (see cgroup_run.sh).
  [[ $report == *at_cap=1* ]] && run_ok=0
  return 0
}

# Small shapes (run on the CPU) and large ones (plan only).
small=(llama-tiny-f32 llama-tiny-q8_0 llama-tiny-q4_k)
ctxs=(128 512 2048)
sizes=(4MiB 8MiB 16MiB 64MiB)
large=("llama-8b-q8_0:8GiB,16GiB,24GiB:8192,131072" "deepseek4-flash-q2:96GB,128GB:65536,1048576")
data=random
if ((long)); then
  small=(llama-1b-f32)
  ctxs=(512)
  sizes=(8GiB)
  large=()
  data=alias  # generated at disk speed; the load reads every byte all the same
fi
if ((quick)); then
  small=(llama-tiny-f32 llama-tiny-q4_k)
  ctxs=(128 2048)
  sizes=(6MiB 64MiB)
  large=("llama-8b-q8_0:16GiB:8192,131072")
fi

# The binary's own baseline (process, libraries, sanitizer runtimes): the
# peak of a run of the smallest model, less its plan.
baseline=0
if ((can_run)); then
  "$baton" synth --shape llama-tiny-q4_k -o "$work/base.gguf" -q >/dev/null
  base_plan=$(plan "$work/base.gguf" "n=1GiB:unified:cpu:reserve=0" 128 | jq '.stages[0].total_bytes')
  run_capped "$work/base.gguf" 128 $((8 << 30))
  baseline=$((run_peak > base_plan ? run_peak - base_plan : 0))
  echo "baseline: $(mib "$baseline") MiB (peak $(mib "$run_peak") MiB, plan $(mib "$base_plan") MiB)" >&2
fi

rows=()
failed=0
check_cell() {  # shape model nodes ctx runnable
  local shape=$1 model=$2 nodes=$3 ctx=$4 runnable=$5 j fits total outcome detail
  j=$(plan "$model" "$nodes" "$ctx")
  if [[ -z $j ]]; then
    rows+=("| $shape | ${nodes%%:*} | $ctx | - | error | FAIL | $(head -c 120 "$work/plan.err") |")
    failed=1
    return
  fi
  fits=$(jq -r '.fits' <<<"$j")
  total=$(jq '[.stages[].total_bytes] | max' <<<"$j")
  if [[ $fits == true ]]; then
    if ((runnable && can_run)); then
      local cap=$((total + total / 20 + baseline + (8 << 20)))
      run_capped "$model" "$ctx" "$cap"
      detail="run peak $(mib "$run_peak") MiB, cap $(mib "$cap") MiB (peak - baseline = $(awk -v p="$run_peak" \
              -v b="$baseline" -v t="$total" 'BEGIN { printf "%.2f", (p - b) / t }') x plan)"
      if ((run_ok)); then outcome=pass; else outcome=FAIL; failed=1; detail+="; $(tail -c 200 "$work/run.err" | tr '\n' ' ')"; fi
    else
      outcome=pass
      detail="plan only"
    fi
    rows+=("| $shape | ${nodes%%:*} | $ctx | $(mib "$total") | fit | $outcome | $detail |")
    return
  fi
  # No fit: the suggestion must exist, and its numbers must hold.
  local sugg max_ctx need
  sugg=$(jq -r '.suggestion' <<<"$j")
  max_ctx=$(jq -r '.max_ctx' <<<"$j")
  need=$(jq -r '.nodes_needed' <<<"$j")
  outcome=pass
  detail="max_ctx $max_ctx, nodes_needed $need"
  [[ -n $sugg && $sugg != null ]] || { outcome=FAIL; detail+="; no suggestion"; }
  if ((max_ctx > 0)); then
    [[ $sugg == *"$max_ctx"* ]] || { outcome=FAIL; detail+="; suggestion does not name $max_ctx"; }
    [[ $(plan "$model" "$nodes" "$max_ctx" | jq -r .fits) == true ]] || { outcome=FAIL; detail+="; --ctx $max_ctx does not fit"; }
    [[ $(plan "$model" "$nodes" $((max_ctx + 1)) | jq -r .fits) == false ]] || { outcome=FAIL; detail+="; --ctx $((max_ctx + 1)) fits too"; }
  fi
  if ((need > 0)); then
    local many=$nodes i
    for ((i = 2; i <= need; ++i)); do many+=",${nodes/n=/n$i=}"; done
    [[ $(plan "$model" "$many" "$ctx" | jq -r .fits) == true ]] || { outcome=FAIL; detail+="; $need nodes do not fit"; }
  fi
  [[ $outcome == pass ]] || failed=1
  rows+=("| $shape | ${nodes%%:*} | $ctx | $(mib "$total") | no fit | $outcome | $detail |")
}

for shape in "${small[@]}"; do
  "$baton" synth --shape "$shape" --data "$data" -o "$work/$shape.gguf" -q >/dev/null
  for size in "${sizes[@]}"; do
    for ctx in "${ctxs[@]}"; do
      check_cell "$shape" "$work/$shape.gguf" "n=$size:unified:cpu:reserve=0" "$ctx" 1
    done
  done
  rm -f "$work/$shape.gguf"
done
for spec in ${large[@]+"${large[@]}"}; do
  IFS=: read -r shape sizes_csv ctxs_csv <<<"$spec"
  "$baton" synth --shape "$shape" --data sparse -o "$work/$shape.gguf" -q >/dev/null
  IFS=, read -ra lsizes <<<"$sizes_csv"
  IFS=, read -ra lctxs <<<"$ctxs_csv"
  for size in "${lsizes[@]}"; do
    for ctx in "${lctxs[@]}"; do
      check_cell "$shape" "$work/$shape.gguf" "n=$size:discrete:cuda" "$ctx" 0
    done
  done
  rm -f "$work/$shape.gguf"
done

echo "| shape | node | ctx | plan MiB (largest stage) | plan says | outcome | detail |"
echo "|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit "$failed"
