#!/usr/bin/env python3
"""Time to first token of a request that shares a long prefix with the one
before it, against a running `baton serve` (docs/PERFORMANCE.md, "Prefix
cache"). Sends, as streaming /v1/completions with token-id prompts:

  1. a prompt of P random token ids (1 completion token): computed whole;
  2. the same P ids plus E more: the server's prefix cache should reuse the
     first P from the slot the first request left;
  3. a fresh prompt of P + E other ids: computed whole, for comparison.

Prints one CSV line per request: request, prompt_tokens, cached_tokens,
ttft_ms. Standard library only.

  bench/prefix_ttft.py --port 8080 --prefix 16384 --extra 64 [--vocab N]
"""
import argparse
import http.client
import json
import random
import sys
import time


def completion(host, port, model, prompt):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    first = None
    usage = None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if first is None and event.get("choices"):
            first = time.monotonic() - t0
        if event.get("usage"):
            usage = event["usage"]
    conn.close()
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return first, (usage or {}).get("prompt_tokens", 0), cached


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefix", type=int, default=16384, help="shared prompt tokens")
    ap.add_argument("--extra", type=int, default=64, help="tokens the second prompt adds")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    conn = http.client.HTTPConnection(args.host, args.port, timeout=30)
    conn.request("GET", "/v1/models")
    models = json.loads(conn.getresponse().read())
    model = models["data"][0]["id"]
    vocab = 1000
    rng = random.Random(args.seed)
    # Ids from the middle of a vocabulary of at least 2000 (no special tokens).
    ids = lambda n: [rng.randrange(vocab, 2 * vocab) for _ in range(n)]
    prefix = ids(args.prefix)
    print("request,prompt_tokens,cached_tokens,ttft_ms")
    for name, prompt in (("first", prefix), ("shared_prefix", prefix + ids(args.extra)),
                         ("fresh", ids(args.prefix + args.extra))):
        ttft, n, cached = completion(args.host, args.port, model, prompt)
        print(f"{name},{n},{cached},{ttft * 1000:.1f}", flush=True)


if __name__ == "__main__":
    main()
