#!/usr/bin/env python3
"""Writes the converter's test checkpoints with transformers' own save_pretrained.

`baton convert` must read checkpoints as the installed transformers writes
them, not only as our scripts rename them. This builds two small random
models from fixed seeds and saves each with save_pretrained (safetensors,
float32) next to the logits transformers computes for a fixed prompt:

  OUT/qwen3/            Qwen3ForCausalLM (q/k norms), 2 layers, vocab 256
  OUT/deepseek_v4/      DeepseekV4ForCausalLM, the oracle's 5-layer config
                        (bench/ds4_oracle/oracle.py), 160-token prompt
Each folder also gets reference.json ({"tokens", "rows", "cols",
"transformers"}) and reference_logits.f32 (rows x cols little-endian float32).
tests/fixtures/hf/ holds the output; tests/test_cli_convert_hf.cpp converts
each folder and compares `baton logits` with the reference.

usage: python3 bench/hf_fixtures.py OUT [--seed 1234]
Needs torch and transformers 5.17 or later; no network.
"""
import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ds4_oracle"))


def save(model, folder, tokens, version):
    import torch
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    with torch.no_grad():
        logits = model(torch.tensor([tokens], dtype=torch.long)).logits[0].float()
    rows, cols = logits.shape
    with open(os.path.join(folder, "reference_logits.f32"), "wb") as f:
        f.write(struct.pack(f"<{rows * cols}f", *logits.flatten().tolist()))
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump({"tokens": tokens, "rows": rows, "cols": cols, "transformers": version}, f)
    print(f"{folder}: {sorted(os.listdir(folder))}", flush=True)


def qwen3(seed):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                         rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    model = Qwen3ForCausalLM(config).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # the default init leaves norms at 1: give them values a wrong mapping would show
        for name, p in model.named_parameters():
            s = 1.0 / p.shape[-1] ** 0.5 if p.dim() >= 2 else 0.3
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + (torch.rand(p.shape, generator=g) * 2 - 1) * s)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    import torch
    import transformers
    torch.set_num_threads(4)
    gen = torch.Generator().manual_seed(args.seed + 1)
    save(qwen3(args.seed), os.path.join(args.out, "qwen3"),
         torch.randint(0, 256, (24,), generator=gen).tolist(), transformers.__version__)
    import oracle
    save(oracle.make_model(args.seed), os.path.join(args.out, "deepseek_v4"),
         torch.randint(0, oracle.VOCAB, (160,), generator=gen).tolist(), transformers.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
