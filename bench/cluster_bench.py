#!/usr/bin/env python3
"""Loopback pipeline benchmark of the distributed runtime (docs/PERFORMANCE.md).

On one machine, with a synthetic model (default: llama-1b in Q8_0):
  - single-stream decode tokens/s in this process (no workers) and through
    K = 1, 2, 4 local worker stages (`baton run --workers K`), with the bytes
    each stage sends per token to the next;
  - aggregate decode tokens/s with 1, 2, 4, 8 concurrent sequences on 2
    stages (`baton serve --workers 2`, greedy completions of a fixed length;
    here the two workers share the machine's cores, half each less one for
    the coordinator and the clients, so that they can run at the same time).
Ratios are taken inside the same run, so the machine's speed cancels out.

  bench/cluster_bench.py --baton build/baton [--model FILE | --shape llama-1b]
                         [--threads N] [--tokens N] [--rounds R] [--csv OUT]

Loopback only; bounded: every child process has a timeout.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

PROMPT = "Once upon a time"


def run(cmd, timeout=900):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-4000:]}")
    return p


def link_bytes(stderr):
    """bytes per token of every stage-to-stage link, from the workers' exit lines"""
    return [int(m) for m in re.findall(r"link to the next stage: .* (\d+) bytes per token", stderr)]


def single_stream(args, workers):
    cmd = [args.baton, "run", "-m", args.model, "-p", PROMPT, "-n", str(args.tokens), "--temp", "0",
           "--json", "-t", str(args.threads), "--ctx", "1024"]
    if workers:
        # Each worker stands for one node with all the cores: with one stream
        # only one stage runs at a time, so they do not compete.
        cmd += ["--workers", str(workers), "--threads-per-worker", str(args.threads)]
    p = run(cmd)
    j = json.loads(p.stdout)
    return j["decode_tokens_per_s"], j["n_gen"], link_bytes(p.stderr)


def post(port, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def concurrent(args, n_workers, levels):
    # The workers run at the same time here: they share the cores, leaving one
    # each for the coordinator and the clients.
    per_worker = max(1, args.threads // n_workers - 1)
    cmd = [args.baton, "serve", "-m", args.model, "--workers", str(n_workers), "--parallel", str(max(levels)),
           "--port", "0", "--threads-per-worker", str(per_worker), "--ctx", "1024", "--quiet"]
    err = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    port = None
    deadline = time.time() + 600
    try:
        while time.time() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            m = re.match(r"baton serve: listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
            if "baton serve: ready" in line:
                break
        if port is None:
            err.seek(0)
            sys.exit("baton serve did not start:\n" + err.read()[-4000:])
        eos = 2  # the synthetic tokenizer's end of sequence: banned so every request runs to max_tokens
        body = {"model": "x", "prompt": PROMPT, "max_tokens": args.tokens, "temperature": 0,
                "logit_bias": {str(eos): -100}}
        body["model"] = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models").read())["data"][0]["id"]
        post(port, dict(body, max_tokens=4))  # warm-up
        out = {n: [] for n in levels}
        for _ in range(args.rounds):
            for n in levels:
                done = [0] * n
                errors = []

                def client(i):
                    try:
                        done[i] = post(port, body)["usage"]["completion_tokens"]
                    except Exception as e:  # recorded, the run fails below
                        errors.append(str(e))

                t0 = time.time()
                threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                dt = time.time() - t0
                if errors:
                    sys.exit(f"{len(errors)} requests failed at concurrency {n}: {errors[0]}")
                out[n].append(sum(done) / dt)
        return out
    finally:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baton", required=True)
    ap.add_argument("--model")
    ap.add_argument("--shape", default="llama-1b")
    ap.add_argument("--type", default="q8_0")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--csv")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    if not args.model:
        args.model = os.path.join(tmp.name, f"{args.shape}-{args.type}.gguf")
        run([args.baton, "synth", "--shape", args.shape, "--type", args.type, "--data", "alias", "-q",
             "-o", args.model])
    # Rounds, each measuring every configuration once, side by side; the
    # figures are the medians of the per-round ratios (the machine's speed
    # drifts between rounds, a ratio inside one round is what is compared).
    rows = []
    single_stream(args, 0)  # warm-up: the file into the page cache, the CPU clocks up
    stages = (0, 1, 2, 4)
    tps = {k: [] for k in stages}
    links = {}
    for _ in range(args.rounds):
        for k in stages:
            t, _, l = single_stream(args, k)
            tps[k].append(t)
            links[k] = l
    med = statistics.median
    for k in stages:
        ratio = med([tps[k][r] / tps[0][r] for r in range(args.rounds)])
        rows.append(("single_stream", k, 1, med(tps[k]), ratio, "/".join(map(str, links[k]))))
        print(f"{k} stages: {med(tps[k]):.1f} tok/s, {ratio:.2f} x in process (median of {args.rounds} rounds: "
              f"{', '.join(f'{t:.1f}' for t in tps[k])}); bytes/token per link: {links[k]}", flush=True)
    levels = [1, 2, 4, 8]
    agg = concurrent(args, 2, levels)
    for n in levels:
        ratio = med([agg[n][r] / agg[1][r] for r in range(args.rounds)])
        rows.append(("concurrent", 2, n, med(agg[n]), ratio, ""))
        print(f"2 stages, {n} sequences: {med(agg[n]):.1f} tok/s = {ratio:.2f} x one sequence "
              f"({', '.join(f'{t:.1f}' for t in agg[n])})", flush=True)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("mode,stages,sequences,tokens_per_s,ratio,bytes_per_token_per_link\n")
            for r in rows:
                f.write(f"{r[0]},{r[1]},{r[2]},{r[3]:.2f},{r[4]:.3f},{r[5]}\n")


if __name__ == "__main__":
    main()
