# Oracle: the transformers DeepseekV4 model loaded with the weights of our tiny
# GGUF, logits compared with the ones our engine wrote.
import struct, sys, numpy as np, torch
d = sys.argv[1]
buf = open(f"{d}/model.gguf", "rb").read()
pos = 0
def rd(fmt):
    global pos
    v = struct.unpack_from("<" + fmt, buf, pos); pos += struct.calcsize("<" + fmt); return v[0]
def rstr():
    global pos
    n = rd("Q"); s = buf[pos:pos + n].decode(); pos += n; return s
SC = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
def rval(t):
    if t == 8: return rstr()
    if t == 9:
        et = rd("I"); n = rd("Q"); return [rval(et) for _ in range(n)]
    return rd(SC[t])
assert buf[:4] == b"GGUF"; pos = 4
ver = rd("I"); nt = rd("Q"); nkv = rd("Q")
kv = {}
for _ in range(nkv):
    k = rstr(); t = rd("I"); kv[k] = rval(t)
infos = []
for _ in range(nt):
    name = rstr(); nd = rd("I"); ne = [rd("Q") for _ in range(nd)]; t = rd("I"); off = rd("Q"); infos.append((name, ne, t, off))
al = kv.get("general.alignment", 32)
base = (pos + al - 1) // al * al
T = {}
for name, ne, t, off in infos:
    n = int(np.prod(ne)); dt = {0: np.float32, 1: np.float16, 26: np.int32}[t]
    a = np.frombuffer(buf, dtype=dt, count=n, offset=base + off).reshape(list(reversed(ne)))
    T[name] = torch.from_numpy(a.astype(np.float32) if t != 26 else a.astype(np.int64))
g = lambda k: kv["deepseek4." + k]
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
ratios = g("attention.compress_ratios")
n_layer = g("block_count")
lt = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
cfg = DeepseekV4Config(
    vocab_size=g("vocab_size"), hidden_size=g("embedding_length"), moe_intermediate_size=g("expert_feed_forward_length"),
    num_hidden_layers=n_layer, num_attention_heads=g("attention.head_count"), num_key_value_heads=1,
    head_dim=g("attention.key_length"), q_lora_rank=g("attention.q_lora_rank"),
    partial_rotary_factor=g("rope.dimension_count") / g("attention.key_length"),
    num_experts_per_tok=g("expert_used_count"), n_routed_experts=g("expert_count"), n_shared_experts=g("expert_shared_count"),
    routed_scaling_factor=g("expert_weights_scale"), max_position_embeddings=g("context_length"),
    rope_theta=g("rope.freq_base"), compress_rope_theta=g("attention.compress_rope_freq_base"),
    rope_parameters={"rope_type": "yarn", "factor": g("rope.scaling.factor"),
                     "original_max_position_embeddings": g("rope.scaling.original_context_length"),
                     "beta_fast": g("rope.scaling.yarn_beta_fast"), "beta_slow": g("rope.scaling.yarn_beta_slow")},
    layer_types=[lt[r] for r in ratios], compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    mlp_layer_types=["hash_moe" if i < g("hash_layer_count") else "moe" for i in range(n_layer)],
    hc_mult=g("hyper_connection.count"), hc_sinkhorn_iters=g("hyper_connection.sinkhorn_iterations"),
    hc_eps=g("hyper_connection.epsilon"), swiglu_limit=g("swiglu_clamp_exp")[0], sliding_window=g("attention.sliding_window"),
    o_groups=g("attention.output_group_count"), o_lora_rank=g("attention.output_lora_rank"),
    index_n_heads=g("attention.indexer.head_count"), index_head_dim=g("attention.indexer.key_length"),
    index_topk=g("attention.indexer.top_k"), rms_norm_eps=g("attention.layer_norm_rms_epsilon"),
    tie_word_embeddings=False)
cfg._attn_implementation = "eager"
print(cfg.rope_parameters)
torch.manual_seed(0)
model = DeepseekV4ForCausalLM(cfg).float().eval()
sd = {}
sd["model.embed_tokens.weight"] = T["token_embd.weight"]
sd["lm_head.weight"] = T["output.weight"]
sd["model.norm.weight"] = T["output_norm.weight"]
sd["model.hc_head.hc_fn"] = T["output_hc_fn.weight"]
sd["model.hc_head.hc_base"] = T["output_hc_base.weight"]
sd["model.hc_head.hc_scale"] = T["output_hc_scale.weight"]
for l in range(n_layer):
    p, b = f"model.layers.{l}.", f"blk.{l}."
    for hc in ("attn", "ffn"):
        sd[p + f"{hc}_hc.fn"] = T[b + f"hc_{hc}_fn.weight"]
        sd[p + f"{hc}_hc.base"] = T[b + f"hc_{hc}_base.weight"]
        sd[p + f"{hc}_hc.scale"] = T[b + f"hc_{hc}_scale.weight"]
    sd[p + "input_layernorm.weight"] = T[b + "attn_norm.weight"]
    sd[p + "post_attention_layernorm.weight"] = T[b + "ffn_norm.weight"]
    a = p + "self_attn."
    sd[a + "q_a_proj.weight"] = T[b + "attn_q_a.weight"]
    sd[a + "q_a_norm.weight"] = T[b + "attn_q_a_norm.weight"]
    sd[a + "q_b_proj.weight"] = T[b + "attn_q_b.weight"]
    sd[a + "kv_proj.weight"] = T[b + "attn_kv.weight"]
    sd[a + "kv_norm.weight"] = T[b + "attn_kv_a_norm.weight"]
    sd[a + "o_a_proj.weight"] = T[b + "attn_output_a.weight"]
    sd[a + "o_b_proj.weight"] = T[b + "attn_output_b.weight"]
    sd[a + "sinks"] = T[b + "attn_sinks.weight"]
    if ratios[l]:
        c = a + "compressor."
        sd[c + "kv_proj.weight"] = T[b + "attn_compressor_kv.weight"]
        sd[c + "gate_proj.weight"] = T[b + "attn_compressor_gate.weight"]
        sd[c + "position_bias"] = T[b + "attn_compressor_ape.weight"]
        sd[c + "kv_norm.weight"] = T[b + "attn_compressor_norm.weight"]
    if ratios[l] == 4:
        i = a + "compressor.indexer."
        sd[i + "kv_proj.weight"] = T[b + "indexer_compressor_kv.weight"]
        sd[i + "gate_proj.weight"] = T[b + "indexer_compressor_gate.weight"]
        sd[i + "position_bias"] = T[b + "indexer_compressor_ape.weight"]
        sd[i + "kv_norm.weight"] = T[b + "indexer_compressor_norm.weight"]
        sd[i + "q_b_proj.weight"] = T[b + "indexer.attn_q_b.weight"]
        sd[i + "scorer.weights_proj.weight"] = T[b + "indexer.proj.weight"]
    m = p + "mlp."
    sd[m + "gate.weight"] = T[b + "ffn_gate_inp.weight"]
    if l < g("hash_layer_count"):
        sd[m + "gate.tid2eid"] = T[b + "ffn_gate_tid2eid.weight"]
    elif b + "exp_probs_b.bias" in T:
        sd[m + "gate.e_score_correction_bias"] = T[b + "exp_probs_b.bias"]
    sd[m + "experts.gate_up_proj"] = torch.cat([T[b + "ffn_gate_exps.weight"], T[b + "ffn_up_exps.weight"]], dim=1)
    sd[m + "experts.down_proj"] = T[b + "ffn_down_exps.weight"]
    sd[m + "shared_experts.gate_proj.weight"] = T[b + "ffn_gate_shexp.weight"]
    sd[m + "shared_experts.up_proj.weight"] = T[b + "ffn_up_shexp.weight"]
    sd[m + "shared_experts.down_proj.weight"] = T[b + "ffn_down_shexp.weight"]
own = model.state_dict()
missing = [k for k in own if k not in sd]
extra = [k for k in sd if k not in own]
print("missing", missing[:20], "extra", extra[:20])
for k, v in sd.items():
    assert own[k].shape == v.shape, (k, own[k].shape, v.shape)
model.load_state_dict(sd, strict=False)
tokens = np.fromfile(f"{d}/tokens.bin", dtype=np.int32)
ours = np.fromfile(f"{d}/logits.bin", dtype=np.float32).reshape(len(tokens), -1)
cap = {}
np.set_printoptions(linewidth=250, precision=5, suppress=True)
model.model.layers[2].self_attn.compressor.indexer.scorer.register_forward_hook(lambda m, i, o: (cap.setdefault("sc", o.detach().clone()), None)[1])
for L in (2, 4):
    model.model.layers[L].self_attn.compressor.indexer.register_forward_hook(lambda m, i, o, L=L: (cap.setdefault(L, o.detach().clone()), None)[1])
with torch.no_grad():
    ids = torch.tensor(tokens, dtype=torch.long)[None]
    ref = model(ids, use_cache=True).logits[0].numpy()
    print("HF sc p35", cap["sc"][0, 35, :12].numpy())
    print("HF sc p40", cap["sc"][0, 40, :12].numpy())
    for L in (2, 4):
        for p in range(35, 280, 20):
            print(f"HF L{L} p{p} ids:", " ".join(str(v) for v in sorted(cap[L][0, p].tolist())))
    # decode token by token through the cache too
    from transformers import DynamicCache
    cache = DynamicCache(config=cfg)
    dec = []
    for t in range(len(tokens)):
        out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        dec.append(out.logits[0, -1].numpy())
    dec = np.stack(dec)
diff = np.abs(ours - ref)
print("prefill: max |ours - hf|", diff.max(), "max |hf|", np.abs(ref).max(), "per-position max", diff.max(1)[::20])
bad = np.nonzero(diff.max(1) > 1e-4)[0]
print("first differing positions", bad[:10])
print("hf decode vs hf prefill", np.abs(dec - ref).max(), " ours vs hf decode", np.abs(ours - dec).max())
