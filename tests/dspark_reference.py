#!/usr/bin/env python3
"""Float64 reference of the DSpark draft network (docs/DSPARK.md), in plain
Python (no numpy), written from the equations rather than from the C++.

It reads a self-contained drafter file (every tensor F32: the mtp.* drafter,
the target's token_embd.weight and output.weight, the deepseek4.* and dspark.*
keys), the context rows (raw little-endian float32, positions 0..n-1, each
feature_width wide) and runs one draft round:

  dspark_reference.py draft FILE.gguf ROWS.f32 BONUS THRESHOLD MAX
      -> JSON {"tokens": [...], "logits": [[...], ...], "confidence": [...]}
  dspark_reference.py fp8 X1 X2 ...
      -> JSON [...]: the values rounded to FP8 E4M3 with one scale per 64

Small shapes only: the arithmetic is pure Python.
"""
import json
import math
import struct
import sys

FP8_MAX = 448.0
FP8_BLOCK = 64


# ---------------------------------------------------------------- GGUF (F32 tensors)

def read_gguf(path):
    data = open(path, "rb").read()
    at = [0]

    def take(fmt):
        v = struct.unpack_from("<" + fmt, data, at[0])
        at[0] += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        n = take("Q")
        s = data[at[0]:at[0] + n].decode("utf-8")
        at[0] += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t in scalar:
            return take(scalar[t])
        if t == 8:
            return string()
        if t == 9:
            et = take("I")
            n = take("Q")
            return [value(et) for _ in range(n)]
        raise ValueError("unknown GGUF value type %d" % t)

    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    at[0] = 4
    take("I")  # version
    n_tensors = take("Q")
    n_kv = take("Q")
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        ne = [take("Q") for _ in range(nd)]
        typ = take("I")
        off = take("Q")
        infos.append((name, ne, typ, off))
    align = kv.get("general.alignment", 32)
    base = (at[0] + align - 1) // align * align
    tensors = {}
    for name, ne, typ, off in infos:
        if typ != 0:
            raise ValueError("%s: type %d, the reference reads F32 only" % (name, typ))
        n = 1
        for d in ne:
            n *= d
        flat = struct.unpack_from("<%df" % n, data, base + off)
        row = ne[0]
        tensors[name] = (ne, [list(flat[i:i + row]) for i in range(0, n, row)])
    return kv, tensors


# ---------------------------------------------------------------- pieces

def matvec(rows, x):
    return [math.fsum(a * b for a, b in zip(r, x)) for r in rows]


def rmsnorm(x, w, eps):
    s = 1.0 / math.sqrt(math.fsum(v * v for v in x) / len(x) + eps)
    return [v * s * (w[i] if w is not None else 1.0) for i, v in enumerate(x)]


def rope_tail(x, rd, pos, base):
    """Rotates adjacent pairs of the last rd values of x (in place) to pos."""
    off = len(x) - rd
    for i in range(rd // 2):
        th = pos * base ** (-2.0 * i / rd)
        c, s = math.cos(th), math.sin(th)
        a, b = x[off + 2 * i], x[off + 2 * i + 1]
        x[off + 2 * i] = a * c - b * s
        x[off + 2 * i + 1] = a * s + b * c


def e4m3(v):
    a = abs(v)
    if a == 0:
        return 0.0
    m, e = math.frexp(a)  # a = m 2^e, m in [0.5, 1)
    step = 2.0 ** -9 if a < 2.0 ** -6 else 2.0 ** (e - 1 - 3)
    r = min(round(a / step) * step, FP8_MAX)  # round(): ties to even
    return math.copysign(r, v)


def fp8_round(x):
    out = list(x)
    for b0 in range(0, len(x), FP8_BLOCK):
        blk = x[b0:b0 + FP8_BLOCK]
        amax = max([1e-4] + [abs(v) for v in blk])
        m, e = math.frexp(amax / FP8_MAX)
        scale = 2.0 ** (e - 1 if m == 0.5 else e)
        for i, v in enumerate(blk):
            out[b0 + i] = e4m3(max(-FP8_MAX, min(FP8_MAX, v / scale))) * scale
    return out


def sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def hc_weights(mix, n, scale, base, iters, eps):
    pre = [sigmoid(mix[i] * scale[0] + base[i]) + eps for i in range(n)]
    post = [2.0 * sigmoid(mix[n + i] * scale[1] + base[n + i]) for i in range(n)]
    comb = []
    for j in range(n):
        row = [mix[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k] for k in range(n)]
        mx = max(row)
        ex = [math.exp(v - mx) for v in row]
        s = math.fsum(ex)
        comb.append([v / s + eps for v in ex])

    def cols():
        for k in range(n):
            s = math.fsum(comb[j][k] for j in range(n))
            for j in range(n):
                comb[j][k] /= s + eps

    def rows():
        for j in range(n):
            s = math.fsum(comb[j])
            comb[j] = [v / (s + eps) for v in comb[j]]

    cols()
    for _ in range(iters - 1):
        rows()
        cols()
    return pre, post, comb


# ---------------------------------------------------------------- the drafter

class Drafter:
    def __init__(self, path):
        kv, self.t = read_gguf(path)
        g = lambda k: kv["deepseek4." + k]
        d = lambda k: kv.get("dspark." + k, kv.get("deepseek4.dspark." + k))
        self.E = g("embedding_length")
        self.H = g("attention.head_count")
        self.hd = g("attention.key_length")
        self.rd = g("rope.dimension_count")
        self.G = g("attention.output_group_count")
        self.OR = g("attention.output_lora_rank")
        self.K = g("expert_used_count")
        self.n_expert = g("expert_count")
        self.ff = g("expert_feed_forward_length")
        self.w_scale = g("expert_weights_scale")
        self.w_norm = g("expert_weights_norm")
        self.window = g("attention.sliding_window")
        self.n_hc = g("hyper_connection.count")
        self.iters = g("hyper_connection.sinkhorn_iterations")
        self.hc_eps = g("hyper_connection.epsilon")
        self.eps = g("attention.layer_norm_rms_epsilon")
        self.clamp = g("swiglu_clamp_exp")[-1]
        self.stages = d("stage_count")
        self.block = d("block_size")
        self.noise = d("noise_token_id")
        self.rank = d("markov_rank")
        self.base = 10000.0
        self.kv = [dict() for _ in range(self.stages)]  # stage -> position -> latent row
        self.n = 0

    def w(self, name):
        return self.t[name][1]

    def v(self, name):  # a one-row tensor as a vector
        return self.t[name][1][0]

    def s(self, k, rest):
        return "mtp.%d.%s" % (k, rest)

    def latent(self, k, x, pos):
        kv = rmsnorm(matvec(self.w(self.s(k, "attn_kv.weight")), x), self.v(self.s(k, "attn_kv_a_norm.weight")), self.eps)
        rope_tail(kv, self.rd, pos, self.base)
        return fp8_round(kv[:self.hd - self.rd]) + kv[self.hd - self.rd:]

    def append(self, row):
        main_x = rmsnorm(matvec(self.w("mtp.0.main_proj.weight"), row), self.v("mtp.0.main_norm.weight"), self.eps)
        for k in range(self.stages):
            self.kv[k][self.n] = self.latent(k, main_x, self.n)
        self.n += 1

    def hc_pre(self, k, x, part):
        n, E = self.n_hc, self.E
        flat = rmsnorm([v for s in x for v in s], None, self.eps)
        mix = matvec(self.w(self.s(k, "hc_%s_fn.weight" % part)), flat)
        pre, post, comb = hc_weights(mix, n, self.v(self.s(k, "hc_%s_scale.weight" % part)),
                                     self.v(self.s(k, "hc_%s_base.weight" % part)), self.iters, self.hc_eps)
        h = [math.fsum(pre[s] * x[s][i] for s in range(n)) for i in range(E)]
        norm = "attn_norm.weight" if part == "attn" else "ffn_norm.weight"
        return rmsnorm(h, self.v(self.s(k, norm)), self.eps), post, comb

    def hc_post(self, x, y, post, comb):
        n = self.n_hc
        return [[post[s] * y[i] + math.fsum(comb[j][s] * x[j][i] for j in range(n)) for i in range(self.E)]
                for s in range(n)]

    def attention(self, k, hs, pos0):
        H, hd, rd = self.H, self.hd, self.rd
        qs, kvs = [], []
        for r, h in enumerate(hs):
            ql = rmsnorm(matvec(self.w(self.s(k, "attn_q_a.weight")), h), self.v(self.s(k, "attn_q_a_norm.weight")), self.eps)
            q = matvec(self.w(self.s(k, "attn_q_b.weight")), ql)
            heads = []
            for hh in range(H):
                qh = rmsnorm(q[hh * hd:(hh + 1) * hd], None, self.eps)
                rope_tail(qh, rd, pos0 + r, self.base)
                heads.append(qh)
            qs.append(heads)
            kvs.append(self.latent(k, h, pos0 + r))
        lo = max(0, pos0 - self.window)
        keys = [self.kv[k][p] for p in range(lo, pos0)] + kvs
        sinks = self.v(self.s(k, "attn_sinks.weight"))
        scale = 1.0 / math.sqrt(hd)
        wa = self.w(self.s(k, "attn_output_a.weight"))
        wb = self.w(self.s(k, "attn_output_b.weight"))
        out = []
        for r in range(len(hs)):
            att = []
            for hh in range(H):
                sc = [scale * math.fsum(a * b for a, b in zip(qs[r][hh], key)) for key in keys]
                mx = max(sc + [sinks[hh]])
                ex = [math.exp(v - mx) for v in sc]
                den = math.fsum(ex) + math.exp(sinks[hh] - mx)
                o = [math.fsum(ex[j] * keys[j][i] for j in range(len(keys))) / den for i in range(hd)]
                rope_tail(o, rd, -(pos0 + r), self.base)
                att += o
            gw = len(att) // self.G
            lat = []
            for g in range(self.G):
                lat += matvec(wa[g * self.OR:(g + 1) * self.OR], att[g * gw:(g + 1) * gw])
            out.append(matvec(wb, lat))
        return out

    def swiglu(self, h, gate, up, down):
        c = self.clamp
        g = matvec(gate, h)
        u = matvec(up, h)
        a = [min(gv, c) for gv in g]
        act = [gv / (1.0 + math.exp(-gv)) * max(-c, min(c, uv)) for gv, uv in zip(a, u)]
        return matvec(down, act)

    def moe(self, k, h):
        logits = matvec(self.w(self.s(k, "ffn_gate_inp.weight")), h)
        scores = [math.sqrt(v if v > 20 else math.log1p(math.exp(v))) for v in logits]
        bias_name = self.s(k, "exp_probs_b.bias")
        bias = self.v(bias_name) if bias_name in self.t else [0.0] * len(scores)
        order = sorted(range(len(scores)), key=lambda e: (-(scores[e] + bias[e]), e))[:self.K]
        wts = [scores[e] for e in order]
        tot = math.fsum(wts)
        wts = [(w / (tot + 1e-20) if self.w_norm else w) * self.w_scale for w in wts]
        ff, E = self.ff, self.E
        gate, up, down = (self.w(self.s(k, "ffn_%s_exps.weight" % p)) for p in ("gate", "up", "down"))
        y = [0.0] * E
        for e, wt in zip(order, wts):
            o = self.swiglu(h, gate[e * ff:(e + 1) * ff], up[e * ff:(e + 1) * ff], down[e * E:(e + 1) * E])
            y = [a + wt * b for a, b in zip(y, o)]
        sh = self.swiglu(h, self.w(self.s(k, "ffn_gate_shexp.weight")), self.w(self.s(k, "ffn_up_shexp.weight")),
                         self.w(self.s(k, "ffn_down_shexp.weight")))
        return [a + b for a, b in zip(y, sh)]

    def draft(self, bonus, pos0, threshold, max_tokens):
        assert pos0 == self.n
        embd = self.w("token_embd.weight")
        xs = [[list(embd[bonus if r == 0 else self.noise]) for _ in range(self.n_hc)] for r in range(self.block)]
        for k in range(self.stages):
            pre = [self.hc_pre(k, x, "attn") for x in xs]
            ys = self.attention(k, [p[0] for p in pre], pos0)
            xs = [self.hc_post(x, y, p[1], p[2]) for x, y, p in zip(xs, ys, pre)]
            pre = [self.hc_pre(k, x, "ffn") for x in xs]
            xs = [self.hc_post(x, self.moe(k, p[0]), p[1], p[2]) for x, p in zip(xs, pre)]
        last = self.stages - 1
        fn = self.w(self.s(last, "hc_head_fn.weight"))
        hscale = self.v(self.s(last, "hc_head_scale.weight"))[0]
        hbase = self.v(self.s(last, "hc_head_base.weight"))
        w1 = self.w(self.s(last, "markov_head.markov_w1.weight"))
        w2 = self.w(self.s(last, "markov_head.markov_w2.weight"))
        conf = self.v(self.s(last, "confidence_head.proj.weight"))
        out = self.w("output.weight")
        res = {"tokens": [], "logits": [], "confidence": []}
        prev = bonus
        for r in range(min(self.block, max(1, max_tokens))):
            x = xs[r]
            mix = matvec(fn, rmsnorm([v for s in x for v in s], None, self.eps))
            wts = [sigmoid(m * hscale + hbase[s]) + self.hc_eps for s, m in enumerate(mix)]
            h = [math.fsum(wts[s] * x[s][i] for s in range(self.n_hc)) for i in range(self.E)]
            e = w1[prev]
            c = sigmoid(math.fsum(a * b for a, b in zip(conf, h + e)))
            res["confidence"].append(c)
            low = c < threshold
            if low and r > 0:
                break
            logits = matvec(out, rmsnorm(h, self.v(self.s(last, "norm.weight")), self.eps))
            logits = [a + b for a, b in zip(logits, matvec(w2, e))]
            prev = max(range(len(logits)), key=lambda v: (logits[v], -v))
            res["tokens"].append(prev)
            res["logits"].append(logits)
            if low:
                break
        return res


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "fp8":
        print(json.dumps(fp8_round([float(v) for v in sys.argv[2:]])))
        return
    if len(sys.argv) != 7 or sys.argv[1] != "draft":
        sys.exit(__doc__)
    path, rows_path, bonus, threshold, max_tokens = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
    d = Drafter(path)
    raw = open(rows_path, "rb").read()
    vals = struct.unpack("<%df" % (len(raw) // 4), raw)
    width = len(d.t["mtp.0.main_proj.weight"][1][0])
    for i in range(0, len(vals), width):
        d.append(list(vals[i:i + width]))
    print(json.dumps(d.draft(bonus, d.n, threshold, max_tokens)))


if __name__ == "__main__":
    main()
