#!/usr/bin/env bash
# Runs a command inside a fresh cgroup v1 memory cgroup capped at LIMIT, then
# reports the cgroup's peak usage and whether the OOM killer ended it.
#
#   bench/cgroup_run.sh [--uncache FILE]... LIMIT CMD [ARGS...]
#
# LIMIT is bytes, or a number with K/M/G (binary: 1M = 1048576).
# --uncache FILE flushes FILE's dirty pages and drops it from the page cache
# before the run: pages already cached stay charged to whoever read (or wrote)
# them first, so a model written just before would otherwise be read "for
# free" and its page cache would not count against the cap.
#
# Why a cgroup: on unified memory (DGX Spark) the weights, the page cache of
# the file being read and the staging buffers share one pool. A memory cgroup
# charges the page cache of files read inside it to the cgroup, so a loader
# that leaves the file in the page cache fails here instead of freezing a
# machine later.
#
# Needs root and the v1 memory controller at /sys/fs/cgroup/memory. The
# command's own output passes through; the report is the last line on
# stderr, for scripts:
#   cgroup_run: limit=BYTES peak=BYTES peak_pct=P at_cap=0|1 oom_killed=0|1 exit=RC
# at_cap=1: usage reached the cap, and the kernel reclaimed (the page cache
# first) to hold it there: the run needed more than the cap.
# Exit status: the command's (128 + signal when a signal ended it).
set -euo pipefail

root=/sys/fs/cgroup/memory
uncache=()
while [[ $# -gt 0 && $1 == --uncache ]]; do
  uncache+=("$2")
  shift 2
done
if [[ $# -lt 2 ]]; then
  echo "usage: $0 [--uncache FILE]... LIMIT CMD [ARGS...]" >&2
  exit 2
fi

to_bytes() {
  local v=$1 n unit
  n=${v%[KkMmGg]}
  unit=${v#"$n"}
  [[ $n =~ ^[0-9]+$ ]] || { echo "cgroup_run: bad size '$v'" >&2; exit 2; }
  case $unit in
    "") echo "$n" ;;
    [Kk]) echo $((n << 10)) ;;
    [Mm]) echo $((n << 20)) ;;
    [Gg]) echo $((n << 30)) ;;
  esac
}
limit=$(to_bytes "$1")
shift

if [[ ! -w $root ]]; then
  echo "cgroup_run: $root is not writable (needs root and the cgroup v1 memory controller)" >&2
  exit 2
fi

for f in "${uncache[@]}"; do
  # fdatasync, then POSIX_FADV_DONTNEED over the whole file (coreutils dd).
  dd of="$f" oflag=nocache conv=notrunc,fdatasync count=0 status=none
  dd if="$f" iflag=nocache count=0 status=none
done

cg=$root/baton-$$
mkdir "$cg"
child=
cleanup() {
  [[ -n $child ]] && kill -KILL "$child" 2>/dev/null || true
  # Charges of a removed cgroup move to its parent; force_empty reclaims
  # what it can first so the parent does not inherit our page cache.
  echo 0 >"$cg/memory.force_empty" 2>/dev/null || true
  rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "$limit" >"$cg/memory.limit_in_bytes"
# No swap on top of the cap (where swap accounting exists).
[[ -w $cg/memory.memsw.limit_in_bytes ]] && echo "$limit" >"$cg/memory.memsw.limit_in_bytes" 2>/dev/null || true

# The child joins the cgroup before exec, so everything it runs is charged.
set +e
sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" "$@" &
child=$!
wait "$child"
rc=$?
child=
set -e

peak=$(cat "$cg/memory.max_usage_in_bytes")
ooms=$(awk '$1 == "oom_kill" {print $2}' "$cg/memory.oom_control")
oom=0
[[ ${ooms:-0} -gt 0 ]] && oom=1
# Usage that reaches the cap is held there by reclaim (page cache first), so a
# run at the cap may have completed only because the kernel dropped its cache.
at_cap=$(awk -v p="$peak" -v l="$limit" 'BEGIN { print (p + 65536 >= l) ? 1 : 0 }')
pct=$(awk -v p="$peak" -v l="$limit" 'BEGIN { printf "%.1f", 100 * p / l }')
echo "cgroup_run: limit=$limit peak=$peak peak_pct=$pct at_cap=$at_cap oom_killed=$oom exit=$rc" >&2
exit "$rc"
