#!/usr/bin/env python3
"""Two DGX Sparks as one tensor-parallel stage of two ranks, projected from
one GPU's measurements (docs/PERFORMANCE.md, "Two Sparks, projected").

    bench/tp_projection.py TP_CSV ALLREDUCE_TXT [--model flash_q2] [options]

TP_CSV is bench/tp_check.sh's tp.csv: the whole model's decode step and rank
0's alone (--tp-alone) on the same GPU, with baton bench's columns (gen_tps,
weights_bytes_per_token, copy_gbps). ALLREDUCE_TXT is allreduce_bench's
output (two ranks over loopback TCP). The model:

  step on a Spark    = step on the GPU x (GPU copy rate / Spark bandwidth)
                       (both steps scaled alike: what the GPU spends beyond
                       the bytes is scaled with them)
  exchanges a token  = calls x (loopback p50 + wire latency)
                       + bytes / link rate   (calls = 2 x layers sums of
                       n_embd floats, one gather of vocab/2 floats)
  one Spark          = whole step on a Spark
  two Sparks, TP     = rank step on a Spark + exchanges
  two Sparks, PP     = whole step on a Spark (a token passes both stages in
                       turn) + one activation hop

--scale-bytes R projects a larger file of the same shape (the Q4 file) by
multiplying both steps by R (its bytes per token over the measured file's),
where one Spark cannot hold it and two pipeline stages are the comparison.
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
    ap.add_argument("tp_csv")
    ap.add_argument("allreduce_txt")
    ap.add_argument("--model", default="flash_q2", help="the tp.csv model column")
    ap.add_argument("--layers", type=int, default=43, help="layers (two sums each): 43 for V4 Flash, 32 for llama-8b")
    ap.add_argument("--n-embd", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--spark-gbps", type=float, default=273.0, help="a Spark's memory bandwidth")
    ap.add_argument("--link-gbps", type=float, default=25.0, help="200 Gb/s")
    ap.add_argument("--wire-us", type=float, default=10.0, help="added per call for the wire and the NICs")
    ap.add_argument("--scale-bytes", type=float, default=1.0)
    ap.add_argument("--rank-variant", default="rank0host",
                    help="rank0host: the rank's step with host exchanges (the TCP mesh's copies and syncs); "
                         "rank0: its compute alone (exchanges queued on the device)")
    a = ap.parse_args()

    rows = [r for r in csv.DictReader(open(a.tp_csv)) if r["model"] == a.model]
    whole_tps, rank_tps = median(rows, "whole", "gen_tps"), median(rows, a.rank_variant, "gen_tps")
    copy = median(rows, "whole", "copy_gbps")
    wb, rb = median(rows, "whole", "weights_bytes_per_token"), median(rows, a.rank_variant, "weights_bytes_per_token")
    scale = copy / a.spark_gbps * a.scale_bytes
    t_whole = 1e3 / whole_tps * scale  # ms on a Spark
    t_rank = 1e3 / rank_tps * scale
    text = open(a.allreduce_txt).read()
    sum_kib = a.n_embd * 4 // 1024
    calls = 2 * a.layers
    lat = p50_us(text, 2, sum_kib)
    gather_kib = a.vocab * 4 // 2 // 1024
    lat_gather = p50_us(text, 2, 256) * gather_kib / 256
    wire_bytes = calls * a.n_embd * 4 + a.vocab * 4 // 2
    t_exch = (calls * (lat + a.wire_us) + lat_gather + a.wire_us) / 1e3 + wire_bytes / (a.link_gbps * 1e9) * 1e3
    t_tp = t_rank + t_exch
    hop = (lat + a.wire_us) / 1e3 + a.n_embd * 4 * 4 / (a.link_gbps * 1e9) * 1e3  # 4 HC streams a row
    t_pp = t_whole + hop
    print(f"model {a.model} x{a.scale_bytes:g} bytes, {a.rank_variant}: measured on the GPU: whole "
          f"{1e3 / whole_tps:.3f} ms, rank 0 alone {1e3 / rank_tps:.3f} ms ({whole_tps / rank_tps:.3f} of the whole step; bytes "
          f"{rb / wb:.3f}); GPU copy rate {copy:.0f} GB/s")
    print(f"  a Spark: whole step {t_whole:.2f} ms, rank step {t_rank:.2f} ms (x{scale:.2f})")
    print(f"  exchanges a token: {calls} sums of {sum_kib} KiB at {lat:.1f} + {a.wire_us:.0f} us, a gather of "
          f"{gather_kib} KiB, {wire_bytes / 1e6:.2f} MB at {a.link_gbps:.0f} GB/s: {t_exch:.2f} ms")
    print(f"  one Spark {1e3 / t_whole:.2f} tok/s; two Sparks TP {1e3 / t_tp:.2f} tok/s "
          f"({t_whole / t_tp:.2f}x one Spark); two pipeline stages {1e3 / t_pp:.2f} tok/s "
          f"(TP {t_pp / t_tp:.2f}x them)")
    terms = {"the rank's step": t_rank - t_whole / 2, "the exchanges": t_exch}
    extra = terms["the rank's step"]
    print(f"  beyond half a step: the rank's step {extra:.2f} ms (what every rank computes whole, and the sync "
          f"of each exchange), the exchanges {t_exch:.2f} ms: {max(terms, key=terms.get)} limit it most")


if __name__ == "__main__":
    main()
