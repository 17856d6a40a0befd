#!/usr/bin/env python3
"""transformers as an oracle for `baton convert` + `baton logits`.

Builds a random-initialised LlamaForCausalLM with grouped-query attention
(hidden 256, 4 layers, 8 heads, 2 KV heads, vocab 512, intermediate 688,
1024 positions) from a fixed seed, saves it with save_pretrained (safetensors)
in float32, float16 and bfloat16, converts each with `baton convert`, runs
`baton logits` over a random prompt (320 tokens by default) on each backend,
and compares with the logits transformers computes for the same weights (the
saved values, math in float32 on the CPU, eager attention).

Error measure: max |baton - transformers| / max |transformers| over every
position and vocabulary entry. Limits: 1e-3 for f32 weights, 2e-2 for f16 and
bf16. Prints a table (and --csv FILE) and exits 1 when any row fails.

usage: python3 bench/hf_oracle.py BATON_BINARY [--backends cpu,cuda]
           [--tokens 320] [--seed 1234] [--work DIR] [--csv FILE]
Needs python3 with torch and transformers; no network.
"""
import argparse
import copy
import csv
import os
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM

LIMITS = {"f32": 1e-3, "f16": 2e-2, "bf16": 2e-2}
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def make_model(seed):
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=512,
        intermediate_size=688,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    # The default init (std 0.02) gives nearly flat logits; wider weights make
    # the comparison see every layer.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5 * 1.5)
            else:
                p.uniform_(0.8, 1.2)
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
    return model


def reference_logits(model, dtype, tokens):
    # The weights as saved in `dtype`, math in float32.
    m = LlamaForCausalLM(model.config).eval()
    m.load_state_dict({k: v.to(dtype).to(torch.float32) for k, v in model.state_dict().items()})
    with torch.no_grad():
        out = m(torch.tensor([tokens], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float64)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("baton", help="path of the baton binary")
    ap.add_argument("--backends", default="cpu,cuda")
    ap.add_argument("--tokens", type=int, default=320)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--work", help="folder for checkpoints and GGUFs (default: a temporary one)")
    ap.add_argument("--csv", help="also write the table as CSV here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False

    work = args.work or tempfile.mkdtemp(prefix="baton-hf-oracle-")
    os.makedirs(work, exist_ok=True)
    model = make_model(args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, model.config.vocab_size, (args.tokens,), generator=gen).tolist()
    token_arg = ",".join(map(str, tokens))
    print(f"model: llama, hidden 256, 4 layers, 8/2 heads, vocab 512, ff 688; seed {args.seed}; "
          f"{args.tokens} tokens; work folder {work}", flush=True)

    rows = []
    failed = False
    for name, dtype in DTYPES.items():
        ckpt = os.path.join(work, f"hf-{name}")
        copy.deepcopy(model).to(dtype).save_pretrained(ckpt, safe_serialization=True)
        gguf = os.path.join(work, f"model-{name}.gguf")
        rc, out = run([args.baton, "convert", "--from", ckpt, "-o", gguf, "--quiet"])
        if rc != 0:
            print(f"baton convert failed for {name}:\n{out}", file=sys.stderr)
            failed = True
            continue
        ref = reference_logits(model, dtype, tokens)
        for backend in args.backends.split(","):
            path = os.path.join(work, f"logits-{name}-{backend}.f32")
            rc, out = run([args.baton, "logits", "-m", gguf, "--tokens", token_arg, "-o", path,
                           "--backend", backend, "-t", str(args.threads)])
            if rc != 0:
                print(f"baton logits failed for {name} on {backend} (exit {rc}):\n{out}", file=sys.stderr)
                rows.append([name, backend, "", "", "", LIMITS[name], "", "FAIL"])
                failed = True
                continue
            with open(path, "rb") as f:
                raw = bytearray(f.read())
            if len(raw) != ref.numel() * 4:
                print(f"{name}/{backend}: {len(raw)} bytes of logits, expected {ref.numel() * 4}", file=sys.stderr)
                failed = True
                continue
            got = torch.frombuffer(raw, dtype=torch.float32).to(torch.float64).reshape(ref.shape)
            diff = float((got - ref).abs().max())
            scale = float(ref.abs().max())
            rel = diff / scale
            argmax = float((got.argmax(dim=1) == ref.argmax(dim=1)).to(torch.float64).mean())
            ok = rel <= LIMITS[name]
            failed = failed or not ok
            rows.append([name, backend, f"{diff:.3e}", f"{scale:.3f}", f"{rel:.3e}", LIMITS[name],
                         f"{argmax:.4f}", "ok" if ok else "FAIL"])

    header = ["weights", "backend", "max_abs_diff", "max_abs_ref", "max_rel_err", "limit", "argmax_agree", "result"]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
    print("FAIL" if failed else "all within limits")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
