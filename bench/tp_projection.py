#!/usr/bin/env python3
"""Two DGX Sparks as one tensor-parallel stage of two ranks, projected from
one GPU's measurements (docs/PERFORMANCE.md, "Two Sparks, projected").

    bench/tp_projection.py measured TP_CSV ALLREDUCE_TXT --model q4_k --layers 32 --vocab 128256
    bench/tp_projection.py bytes WHOLE_GB RANK_GB ALLREDUCE_TXT --layers 43 --vocab 129280

`measured` reads bench/tp_check.sh's tp.csv: the whole model's decode step,
rank 0 alone with its exchanges on the device (`rank0`: its compute) and
with host exchanges (`rank0host`), each with the bytes it reads a token.
A step is modelled as bytes / B + F: the two steps give the rate B the
kernels reach and F, the part that does not shrink with the bytes (kernel
launches and the latency of small kernels, the same for the whole model and
a rank). H = rank0host - rank0 is what the host exchanges add (copies and a
synchronisation each). On a Spark the bytes go at B's fraction of this
GPU's copy rate applied to the Spark's 273 GB/s; F and H stay as measured
(they do not depend on memory bandwidth; a Spark's smaller GPU and CPU make
them larger, so the projection is optimistic there, and those terms are
small next to a Spark's step).

`bytes` takes the bytes a token reads (whole model, rank 0) from the
tensor tables alone, for a model no GPU at hand can hold, with F = H = 0:
the bound the cut itself sets, before fixed costs.

Both add the exchanges of a token: 2 x layers sums of n_embd floats and one
gather of vocab/2 floats over the TCP mesh, each at the loopback p50 of
ALLREDUCE_TXT (allreduce_bench, two ranks) plus the wire's latency, plus
their bytes at the link's rate. Two pipeline stages pass a token through
both nodes in turn: the whole step plus one activation hop.
"""
import argparse
import csv
import re
import statistics
import sys


def median(rows, variant, col):
    v = [float(r[col]) for r in rows if r["variant"] == variant]
    if not v:
        sys.exit(f"no '{variant}' rows with {col}")
    return statistics.median(v)


def p50_us(text, ranks, kib):
    for line in text.splitlines():
        m = re.match(r"ranks\s+(\d+)\s+(\d+) KiB\s+p50\s+([\d.]+) us", line)
        if m and int(m.group(1)) == ranks and int(m.group(2)) == kib:
            return float(m.group(3))
    sys.exit(f"no p50 for {ranks} ranks, {kib} KiB in the all-reduce output")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["measured", "bytes"])
    ap.add_argument("args", nargs="+", help="TP_CSV ALLREDUCE_TXT, or WHOLE_GB RANK_GB ALLREDUCE_TXT")
    ap.add_argument("--model", default="q4_k", help="measured: the tp.csv model column")
    ap.add_argument("--layers", type=int, default=43, help="layers (two sums each): 43 for V4 Flash, 32 for llama-8b")
    ap.add_argument("--n-embd", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--spark-gbps", type=float, default=273.0, help="a Spark's memory bandwidth")
    ap.add_argument("--bw-fraction", type=float, default=0.8, help="bytes mode: the fraction of it the kernels reach")
    ap.add_argument("--link-gbps", type=float, default=25.0, help="200 Gb/s")
    ap.add_argument("--wire-us", type=float, default=10.0, help="added per call for the wire and the NICs")
    a = ap.parse_args()

    if a.mode == "measured":
        tp_csv, ar = a.args
        rows = [r for r in csv.DictReader(open(tp_csv)) if r["model"] == a.model]
        t_w, t_r = 1 / median(rows, "whole", "gen_tps"), 1 / median(rows, "rank0", "gen_tps")
        t_h = 1 / median(rows, "rank0host", "gen_tps")
        b_w = median(rows, "whole", "weights_bytes_per_token")
        b_r = median(rows, "rank0", "weights_bytes_per_token")
        copy = median(rows, "whole", "copy_gbps") * 1e9
        rate = (b_w - b_r) / (t_w - t_r)
        fixed = t_w - b_w / rate
        host = t_h - t_r
        frac = rate / copy
        print(f"{a.model} on the GPU: whole {t_w * 1e3:.3f} ms, rank 0 {t_r * 1e3:.3f} ms ({t_r / t_w:.3f} of the "
              f"whole step; bytes {b_r / b_w:.3f}), with host exchanges {t_h * 1e3:.3f} ms ({t_h / t_w:.3f})")
        print(f"  model: bytes at {rate / 1e9:.0f} GB/s ({frac:.2f} of the copy rate) + F {fixed * 1e3:.3f} ms; "
              f"host exchanges H {host * 1e3:.3f} ms a token")
    else:
        whole_gb, rank_gb, ar = a.args
        b_w, b_r = float(whole_gb) * 1e9, float(rank_gb) * 1e9
        fixed = host = 0.0
        frac = a.bw_fraction
        print(f"bytes a token: whole {b_w / 1e9:.3f} GB, rank 0 {b_r / 1e9:.3f} GB ({b_r / b_w:.3f}); "
              f"kernels at {frac:.2f} of the bandwidth, F = H = 0")
    spark = a.spark_gbps * 1e9 * frac
    s_w = b_w / spark + fixed
    s_r = b_r / spark + fixed + host
    text = open(ar).read()
    sum_kib = a.n_embd * 4 // 1024
    calls = 2 * a.layers
    lat = p50_us(text, 2, sum_kib)
    gather_kib = a.vocab * 4 // 2 // 1024
    lat_gather = p50_us(text, 2, 256) * gather_kib / 256
    wire = calls * a.n_embd * 4 + a.vocab * 4 // 2
    exch = (calls * (lat + a.wire_us) + lat_gather + a.wire_us) * 1e-6 + wire / (a.link_gbps * 1e9)
    t_tp = s_r + exch
    hop = (lat + a.wire_us) * 1e-6 + a.n_embd * 4 * 4 / (a.link_gbps * 1e9)
    t_pp = s_w + hop
    print(f"  a Spark ({a.spark_gbps:.0f} GB/s): whole step {s_w * 1e3:.2f} ms, rank step {s_r * 1e3:.2f} ms")
    print(f"  exchanges a token: {calls} sums of {sum_kib} KiB at {lat:.1f} + {a.wire_us:.0f} us, a gather of "
          f"{gather_kib} KiB, {wire / 1e6:.2f} MB at {a.link_gbps:.0f} GB/s: {exch * 1e3:.2f} ms")
    print(f"  one Spark {1 / s_w:.2f} tok/s; two Sparks TP {1 / t_tp:.2f} tok/s = {s_w / t_tp:.2f}x one Spark, "
          f"{t_pp / t_tp:.2f}x two pipeline stages ({1 / t_pp:.2f} tok/s)")
    terms = {"the rank's bytes beyond half": (b_r - b_w / 2) / spark, "F (fixed costs, not halved)": fixed / 2,
             "H (host exchanges)": host, "the exchanges over the link": exch}
    print("  beyond half a whole step: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in terms.items()) +
          f": {max(terms, key=terms.get)} limit it most")


if __name__ == "__main__":
    main()
