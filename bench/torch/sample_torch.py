"""PyTorch reference generator with a KV cache (docs/benchmarks-sample.md):
the same shapes as bench/bench_sample.c (gpt-m GPT-2, SmolLM2-135M-shaped
Llama), fp32, greedy, B prompts of P tokens prefilled in one pass, then N
tokens one pass per position.  Prints the same key=value line as
bench_sample (prefill_tok_s, decode_tok_s).  Weights are random: the time of
a pass does not depend on their values.

usage: python3 bench/torch/sample_torch.py --model gpt-m|smollm2 --prompt P --new N
           --batch B [--reps R] [--threads T]
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


def shapes(name):
    if name == "gpt-m":
        return dict(gpt=True, L=6, C=384, NH=6, KV=6, hd=64, F=4 * 384, V=256, T=512, eps=1e-5)
    return dict(gpt=False, L=30, C=576, NH=9, KV=3, hd=64, F=1536, V=49152, T=512, eps=1e-5, theta=100000.0)


def make(s, g):
    r = lambda *sh: torch.randn(*sh, generator=g) * 0.02
    L, C, QD, KD, Fh = s["L"], s["C"], s["NH"] * s["hd"], s["KV"] * s["hd"], s["F"]
    w = {"wte": r(s["V"], C), "layers": []}
    if s["gpt"]:
        w["wpe"] = r(s["T"], C)
    for _ in range(L):
        d = dict(q=r(QD, C), k=r(KD, C), v=r(KD, C), o=r(C, QD), n1=torch.ones(C), n2=torch.ones(C))
        if s["gpt"]:
            d.update(b1=torch.zeros(C), b2=torch.zeros(C), fc=r(Fh, C), fcb=torch.zeros(Fh), pr=r(C, Fh),
                     prb=torch.zeros(C), qb=torch.zeros(QD), kb=torch.zeros(KD), vb=torch.zeros(KD), ob=torch.zeros(C))
        else:
            d.update(gate=r(Fh, C), up=r(Fh, C), down=r(C, Fh))
        w["layers"].append(d)
    w["nf"], w["nfb"] = torch.ones(C), torch.zeros(C)
    if not s["gpt"]:
        inv = 1.0 / (s["theta"] ** (torch.arange(0, s["hd"], 2, dtype=torch.float64) / s["hd"]))
        ang = torch.arange(s["T"], dtype=torch.float64)[:, None] * inv[None, :]
        w["cos"], w["sin"] = ang.cos().float(), ang.sin().float()
    return w


def rope(x, cos, sin):  # x (B, h, t, hd); cos, sin (t, hd/2)
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def step(s, w, tok, pos, cache):
    """tok (B, t) at positions pos..pos+t; cache: per layer [K, V] (B, KV, T, hd), filled to pos."""
    B, t = tok.shape
    NH, KV, hd = s["NH"], s["KV"], s["hd"]
    x = w["wte"][tok]
    if s["gpt"]:
        x = x + w["wpe"][pos:pos + t]
    for l, d in enumerate(w["layers"]):
        if s["gpt"]:
            h = F.layer_norm(x, (s["C"],), d["n1"], d["b1"], s["eps"])
            q, k, v = F.linear(h, d["q"], d["qb"]), F.linear(h, d["k"], d["kb"]), F.linear(h, d["v"], d["vb"])
        else:
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s["eps"]) * d["n1"]
            q, k, v = F.linear(h, d["q"]), F.linear(h, d["k"]), F.linear(h, d["v"])
        q = q.view(B, t, NH, hd).transpose(1, 2)
        k = k.view(B, t, KV, hd).transpose(1, 2)
        v = v.view(B, t, KV, hd).transpose(1, 2)
        if not s["gpt"]:
            q, k = rope(q, w["cos"][pos:pos + t], w["sin"][pos:pos + t]), rope(k, w["cos"][pos:pos + t], w["sin"][pos:pos + t])
        K, V = cache[l]
        K[:, :, pos:pos + t], V[:, :, pos:pos + t] = k, v
        Kc, Vc = K[:, :, :pos + t], V[:, :, :pos + t]
        if KV != NH:
            Kc, Vc = Kc.repeat_interleave(NH // KV, dim=1), Vc.repeat_interleave(NH // KV, dim=1)
        mask = None
        if t > 1:
            mask = torch.ones(t, pos + t, dtype=torch.bool).tril(diagonal=pos)
        a = F.scaled_dot_product_attention(q, Kc, Vc, attn_mask=mask) if hasattr(F, "scaled_dot_product_attention") \
            else torch.softmax((q @ Kc.transpose(-1, -2) / math.sqrt(hd)).masked_fill(
                ~mask if mask is not None else torch.zeros(1, dtype=torch.bool), float("-inf")), -1) @ Vc
        a = a.transpose(1, 2).reshape(B, t, NH * hd)
        if s["gpt"]:
            x = x + F.linear(a, d["o"], d["ob"])
            h = F.layer_norm(x, (s["C"],), d["n2"], d["b2"], s["eps"])
            x = x + F.linear(F.gelu(F.linear(h, d["fc"], d["fcb"]), approximate="tanh"), d["pr"], d["prb"])
        else:
            x = x + F.linear(a, d["o"])
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s["eps"]) * d["n2"]
            x = x + F.linear(F.silu(F.linear(h, d["gate"])) * F.linear(h, d["up"]), d["down"])
    last = x[:, -1]
    if s["gpt"]:
        last = F.layer_norm(last, (s["C"],), w["nf"], w["nfb"], s["eps"])
    else:
        last = last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + s["eps"]) * w["nf"]
    return F.linear(last, w["wte"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-m")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    s = shapes(a.model)
    g = torch.Generator().manual_seed(1)
    w = make(s, g)
    best_pre = best_dec = float("inf")
    with torch.inference_mode():
        for _ in range(a.reps):
            cache = [[torch.zeros(a.batch, s["KV"], s["T"], s["hd"]) for _ in range(2)] for _ in range(s["L"])]
            tok = torch.randint(0, s["V"], (a.batch, a.prompt), generator=g)
            t0 = time.perf_counter()
            logits = step(s, w, tok, 0, cache)
            t1 = time.perf_counter()
            for i in range(a.new - 1):
                nxt = logits.argmax(-1, keepdim=True)
                logits = step(s, w, nxt, a.prompt + i, cache)
            t2 = time.perf_counter()
            best_pre, best_dec = min(best_pre, t1 - t0), min(best_dec, t2 - t1)
    print("model=%s P=%d N=%d B=%d impl=torch prefill_tok_s=%.1f decode_tok_s=%.1f"
          % (a.model, a.prompt, a.new, a.batch, a.batch * a.prompt / best_pre, a.batch * (a.new - 1) / best_dec))


if __name__ == "__main__":
    main()
