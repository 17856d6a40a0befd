#!/usr/bin/env python3
"""Per-phase table of DeepSeek V4 batch forwards from `baton bench --profile` output.

The CUDA deepseek4 stage prints one line per batched or prefill forward under
--profile:

    ds4 forward of 8 rows: 29.8 ms (queued in 15.2 ms); hc 2.2 projections 4.4 ...

This groups them by row count and prints, per count, the median of each phase
and of the total (ms of GPU time between the phase events), as CSV:

    bench/ds4_phase_table.py bench.log [--rows 1,2,5,8,16,32,64] > table.csv

The bench's own prefill forwards (ctx-start rows) appear too unless --rows
names the counts to keep.
"""
import argparse
import re
import statistics
import sys

LINE = re.compile(r"ds4 forward of (\d+) rows: ([\d.]+) ms \(queued in ([\d.]+) ms\);(.*)$")
PHASE = re.compile(r" ([a-z][a-z ]*?) ([\d.]+)(?= [a-z]|$)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--rows", help="comma list of row counts to keep")
    a = ap.parse_args()
    keep = {int(v) for v in a.rows.split(",")} if a.rows else None
    by_rows: dict[int, list[dict[str, float]]] = {}
    phases: list[str] = []
    with open(a.log, errors="replace") as f:
        for raw in f:
            for line in raw.split("\r"):
                m = LINE.search(line.strip())
                if not m:
                    continue
                n = int(m.group(1))
                if keep is not None and n not in keep:
                    continue
                rec = {"total": float(m.group(2)), "queued": float(m.group(3))}
                for name, ms in PHASE.findall(m.group(4)):
                    rec[name] = float(ms)
                    if name not in phases:
                        phases.append(name)
                by_rows.setdefault(n, []).append(rec)
    if not by_rows:
        print("no 'ds4 forward of N rows' lines (was the bench run with --profile?)", file=sys.stderr)
        return 1
    cols = ["total", "queued"] + phases
    print("rows,forwards," + ",".join(c.replace(" ", "_") + "_ms" for c in cols) + ",total_ms_per_row")
    for n in sorted(by_rows):
        recs = by_rows[n]
        med = {c: statistics.median(r.get(c, 0.0) for r in recs) for c in cols}
        print(f"{n},{len(recs)}," + ",".join(f"{med[c]:.2f}" for c in cols) + f",{med['total'] / n:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
