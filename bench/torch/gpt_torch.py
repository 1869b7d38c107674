#!/usr/bin/python3
"""PyTorch reference of zdp's GPT-2 (include/zdp/zdp.h, "GPT-2").

zdp never depends on this file: it is the numerical reference for the
cross-check in tests/torch/ and the rival in bench/run_gpt_bench.sh.

Architecture, exactly as zdp's model:
  x = wte[idx] + wpe[0:T]
  per block (pre-LayerNorm, eps 1e-5):
      x = x + attn.c_proj(causal_self_attention(attn.c_attn(ln_1(x))))
      x = x + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))
  logits = ln_f(x) @ wte^T          (lm_head tied to wte, no bias)
  loss = mean cross-entropy over all B*T positions
Parameters, in registration order, carry Hugging Face GPT2LMHeadModel names
with the "transformer." prefix; Conv1D weights are [in, out] (y = x @ W + b).

Also here, with no dependency beyond torch (and the standard library):
  - a safetensors reader/writer (struct + json + torch.frombuffer),
  - an llm.c token-shard reader/writer (256 int32 header: magic 20240520,
    version 1, token count; then uint16 tokens),
  - zdp's data order for `zdp train --model gpt --data-order sequential`,
  - zdp's optimizer (DeepSpeed FusedAdam / AdamW, fp32 arithmetic) and
    gradient clipping, and a reference training loop printing zdp's
    "step N | loss X | ..." lines.

Script use:
  gpt_torch.py init   --n-layer L --n-head H --n-embd C --vocab-size V --block-size T
                      --seed S --out INIT.safetensors
  gpt_torch.py tokens --vocab-size V --ntok N --seed S --out TOKENS.bin
  gpt_torch.py train  --n-layer .. --config CFG.json --world-size W --init INIT.safetensors
                      --data TOKENS.bin --steps S [--save-weights OUT.safetensors]
                      [--dtype float32|float64]
"""

import argparse
import json
import math
import struct
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

LN_EPS = 1e-5


# ---- model ----------------------------------------------------------------


@dataclass
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    block_size: int = 1024

    def validate(self):
        for k in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} = {getattr(self, k)}: must be >= 1")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head = {self.n_head} must divide n_embd = {self.n_embd}")
        return self


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: weight [in, out], y = x @ W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return y.view(shape)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, attn_impl):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)
        # F.scaled_dot_product_attention needs torch >= 2.0 (Debian 12 has 1.13).
        if attn_impl == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
            attn_impl = "manual"
        self.attn_impl = attn_impl

    def forward(self, x):
        B, T, C = x.shape
        nh, hs = self.n_head, C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)
        k = k.view(B, T, nh, hs).transpose(1, 2)
        v = v.view(B, T, nh, hs).transpose(1, 2)
        if self.attn_impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # "manual": the textbook formula, for the reference in float64
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = Conv1D(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg, attn_impl):
        super().__init__()
        # Registration order = zdp's: ln_1, attn, ln_2, mlp.
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=LN_EPS)
        self.attn = CausalSelfAttention(cfg, attn_impl)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=LN_EPS)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """named_parameters() yields exactly zdp's tensors, names and order."""

    def __init__(self, cfg, attn_impl="sdpa"):
        super().__init__()
        self.cfg = cfg.validate()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                h=nn.ModuleList([Block(cfg, attn_impl) for _ in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.n_embd, eps=LN_EPS),
            )
        )
        self.init_weights(torch.Generator().manual_seed(0))

    @torch.no_grad()
    def init_weights(self, gen):
        """GPT-2's initialisation as zdp documents it (not zdp's random
        stream): weights N(0, 0.02), attn.c_proj / mlp.c_proj weights
        N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1."""
        resid_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif ".ln_" in name or name.startswith("transformer.ln_f"):
                p.fill_(1.0)
            else:
                std = resid_std if name.endswith("c_proj.weight") else 0.02
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * std)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None):
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"T = {T} > block_size = {self.cfg.block_size}")
        tr = self.transformer
        pos = torch.arange(T, device=idx.device)
        x = tr.wte(idx) + tr.wpe(pos)
        for block in tr.h:
            x = block(x)
        x = tr.ln_f(x)
        logits = F.linear(x, tr.wte.weight)  # tied lm_head
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def param_names(cfg):
    """zdp's parameter names in registration order (zdp.h)."""
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        names += [p + s for s in (
            "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
            "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
            "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")]
    return names + ["transformer.ln_f.weight", "transformer.ln_f.bias"]


def flops_per_token(cfg, T):
    """Training FLOPs per token (PaLM appendix B / nanoGPT convention):
        6 * N_mm + 12 * L * T * C
    N_mm = 12 L C^2 + V C: the weights used as matmuls (qkv, attn proj, fc,
    mlp proj, and the tied lm_head; position/token lookups are not matmuls,
    biases and LayerNorm are ignored).  12 L T C: attention scores Q K^T and
    the weighted sum A V, 2*2*T*C FLOPs per token per layer forward over the
    full T x T square (no causal halving), x3 for forward + backward.
    LayerNorm, GELU, softmax and the optimizer are not counted."""
    L, C, V = cfg.n_layer, cfg.n_embd, cfg.vocab_size
    n_mm = 12 * L * C * C + V * C
    return 6 * n_mm + 12 * L * T * C


# ---- safetensors ------------------------------------------------------------

_ST_DTYPES = {
    "F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
    "I16": (torch.int16, 2), "U16": (None, 2), "I8": (torch.int8, 1), "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}
_ST_NAMES = {v[0]: k for k, v in _ST_DTYPES.items() if v[0] is not None}


def read_safetensors(path):
    """Returns {name: tensor} (file order) and the metadata dict.  U16 comes
    back as int32.  Validates the header, dtypes, shapes and offsets."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} runs past the end ({len(raw)} bytes)")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name}: dtype {dt} not supported")
        tdt, size = _ST_DTYPES[dt]
        shape = [int(s) for s in info["shape"]]
        b, e = info["data_offsets"]
        numel = math.prod(shape)
        if not (0 <= b <= e <= len(data)) or e - b != numel * size:
            raise ValueError(f"{path}: tensor {name}: data_offsets [{b}, {e}] do not fit "
                             f"shape {shape} x {size} bytes in {len(data)} bytes of data")
        buf = bytes(data[b:e])
        if numel == 0:
            t = torch.empty(shape, dtype=tdt if tdt is not None else torch.int32)
        elif dt == "U16":
            t = torch.frombuffer(bytearray(buf), dtype=torch.int16).to(torch.int32) & 0xFFFF
            t = t.view(shape)
        else:
            t = torch.frombuffer(bytearray(buf), dtype=tdt).view(shape)
        out[name] = t
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: tensor} or [(name, tensor)], written in that order."""
    items = list(tensors.items()) if isinstance(tensors, dict) else list(tensors)
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in items:
        t = t.detach().contiguous().cpu()
        if t.dtype not in _ST_NAMES:
            raise ValueError(f"tensor {name}: dtype {t.dtype} not supported")
        b = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    import os
    os.replace(tmp, path)


def gpt2_state_from_safetensors(tensors, cfg):
    """Maps a GPT2LMHeadModel-layout file onto zdp's names: accepts names with
    or without the "transformer." prefix, ignores the attention-mask buffers
    (attn.bias, attn.masked_bias), and checks that an lm_head.weight, if
    present, equals wte (tied).  Returns {zdp name: float32 tensor}."""
    norm = {}
    for k, v in tensors.items():
        if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias"):
            continue
        if k == "lm_head.weight":
            norm[k] = v
            continue
        norm[k if k.startswith("transformer.") else "transformer." + k] = v
    out = {}
    for name in param_names(cfg):
        if name not in norm:
            raise KeyError(f"tensor {name} missing from the weights file")
        out[name] = norm.pop(name).to(torch.float32)
    lm = norm.pop("lm_head.weight", None)
    if lm is not None and not torch.equal(lm.to(torch.float32), out["transformer.wte.weight"]):
        raise ValueError("lm_head.weight differs from transformer.wte.weight: zdp ties them")
    if norm:
        raise KeyError(f"unexpected tensors in the weights file: {sorted(norm)[:8]}")
    return out


def load_weights(model, path):
    st, _ = read_safetensors(path)
    state = gpt2_state_from_safetensors(st, model.cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if tuple(state[name].shape) != tuple(p.shape):
                raise ValueError(f"{path}: {name}: shape {list(state[name].shape)}, "
                                 f"model wants {list(p.shape)}")
            p.copy_(state[name])


def save_weights(model, path, dtype=torch.float32):
    write_safetensors(path, [(n, p.detach().to(dtype)) for n, p in model.named_parameters()],
                      metadata={"format": "pt"})


# ---- llm.c token shards -----------------------------------------------------

SHARD_MAGIC, SHARD_VERSION = 20240520, 1


def read_tokens(path):
    """llm.c shard -> int64 tensor of tokens."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 1024:
        raise ValueError(f"{path}: {len(raw)} bytes, shorter than the 1024-byte header")
    hdr = struct.unpack("<256i", raw[:1024])
    if hdr[0] != SHARD_MAGIC:
        raise ValueError(f"{path}: magic {hdr[0]}, expected {SHARD_MAGIC} (llm.c token shard)")
    if hdr[1] != SHARD_VERSION:
        raise ValueError(f"{path}: version {hdr[1]}, expected {SHARD_VERSION}")
    n = hdr[2]
    if len(raw) != 1024 + 2 * n:
        raise ValueError(f"{path}: header says {n} tokens ({1024 + 2 * n} bytes), "
                         f"file has {len(raw)} bytes")
    t = torch.frombuffer(bytearray(raw[1024:]), dtype=torch.int16).to(torch.int64) & 0xFFFF
    return t


def write_tokens(path, tokens):
    t = torch.as_tensor(tokens, dtype=torch.int64)
    if t.numel() and (t.min() < 0 or t.max() > 65535):
        raise ValueError("tokens must fit uint16")
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = SHARD_MAGIC, SHARD_VERSION, t.numel()
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        f.write(t.to(torch.int32).to(torch.int16).numpy().tobytes())


def synthetic_tokens(vocab_size, ntok, seed):
    """A deterministic token stream with structure a model can learn: a
    random sparse Markov chain (each token has 4 likely successors)."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, vocab_size, (vocab_size, 4), generator=g)
    out = torch.empty(ntok, dtype=torch.int64)
    cur = int(torch.randint(0, vocab_size, (1,), generator=g))
    choice = torch.randint(0, 4, (ntok,), generator=g)
    noise = torch.rand(ntok, generator=g)
    rnd = torch.randint(0, vocab_size, (ntok,), generator=g)
    for i in range(ntok):
        out[i] = cur
        cur = int(rnd[i]) if noise[i] < 0.1 else int(succ[cur, choice[i]])
    return out


# ---- zdp's data order -------------------------------------------------------


def n_windows(ntok, T):
    """Window w = tokens [w*T, w*T + T] (T+1 tokens)."""
    n = (ntok - 1) // T
    if n < 1:
        raise ValueError(f"{ntok} tokens hold no window of T+1 = {T + 1} tokens")
    return n


def sequential_windows(j, r, W, b, nwin):
    """Rank r's j-th micro-batch (j counts across steps): windows
    (j*W + r)*b + k for k < b, modulo the window count."""
    return [((j * W + r) * b + k) % nwin for k in range(b)]


def make_batch(tokens, windows, T):
    rows = torch.stack([tokens[w * T: w * T + T + 1] for w in windows])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


# ---- zdp's optimizer ----------------------------------------------------------


class ZdpAdam:
    """DeepSpeed FusedAdam as zdp implements it (src/optim/optim.c):
    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    u = (m/bc1) / (sqrt(v/bc2) + eps); decoupled: u += wd p; p -= lr u.
    Arithmetic in the parameters' dtype with float hyper-parameters, as zdp.
    Mathematically torch.optim.AdamW (which decays p first)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 decoupled=True, bias_correction=True):
        self.params = list(params)
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, betas[0], betas[1], eps, weight_decay
        self.decoupled, self.bias_correction = decoupled, bias_correction
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self, grad_scale=1.0):
        self.t += 1
        f = lambda x: float(torch.tensor(x, dtype=self.params[0].dtype))  # noqa: E731
        bc1 = f(1.0 - self.b1 ** self.t) if self.bias_correction else 1.0
        bc2 = f(1.0 - self.b2 ** self.t) if self.bias_correction else 1.0
        b1, b2, eps, wd, lr = f(self.b1), f(self.b2), f(self.eps), f(self.wd), f(self.lr)
        for p, m, v in zip(self.params, self.m, self.v):
            g = p.grad * grad_scale if p.grad is not None else torch.zeros_like(p)
            if not self.decoupled:
                g = g + wd * p
            m.mul_(b1).add_(g * f(1.0 - b1))
            v.mul_(b2).add_(g * g * f(1.0 - b2))
            u = (m / bc1) / (torch.sqrt(v / bc2) + eps)
            if self.decoupled:
                u = u + wd * p
            p.sub_(lr * u)


def clip_coefficient(params, clip):
    """zdp / DeepSpeed: global L2 norm (accumulated in float64); scale
    1/((norm + 1e-6)/clip) when (norm + 1e-6)/clip > 1."""
    sq = sum(float(p.grad.double().pow(2).sum()) for p in params if p.grad is not None)
    norm = math.sqrt(sq)
    if clip > 0:
        factor = (norm + 1e-6) / clip
        if factor > 1:
            return norm, 1.0 / factor
    return norm, 1.0


def load_ds_config(path, world_size):
    """The subset of ds_config.json the reference needs, with DeepSpeed's
    batch-size derivation (train = micro * G * W)."""
    with open(path) as f:
        c = json.load(f)
    tb = c.get("train_batch_size")
    mb = c.get("train_micro_batch_size_per_gpu")
    G = c.get("gradient_accumulation_steps")
    W = world_size
    if mb is None and tb is not None and G is not None:
        mb = tb // (G * W)
    if G is None and tb is not None and mb is not None:
        G = tb // (mb * W)
    if mb is None and G is None and tb is not None:
        G, mb = 1, tb // W
    if G is None:
        G = 1
    if mb is None:
        raise ValueError(f"{path}: cannot derive train_micro_batch_size_per_gpu")
    opt = c.get("optimizer", {"type": "Adam"})
    typ = opt.get("type", "Adam").lower()
    p = opt.get("params", {})
    if typ not in ("adam", "adamw"):
        raise ValueError(f"{path}: optimizer {opt.get('type')}: the reference does Adam/AdamW only")
    decoupled = typ == "adamw" or p.get("adam_w_mode", True)
    return dict(
        micro_batch=int(mb), G=int(G),
        managed=c.get("managed_gradient_accumulation", True),
        clip=float(c.get("gradient_clipping", 1.0)),
        lr=float(p.get("lr", 1e-3)), betas=tuple(p.get("betas", (0.9, 0.999))),
        eps=float(p.get("eps", 1e-8)), weight_decay=float(p.get("weight_decay", 0.0)),
        decoupled=bool(decoupled), bias_correction=bool(p.get("bias_correction", True)),
    )


def reference_train(model, tokens, T, W, dsc, steps, schedule=None, log=print):
    """zdp train --model gpt --data-order sequential, in one process: step s
    runs n micro-batches per rank for W virtual ranks; the gradient is the
    mean over the n*W micro-batches' mean losses (zdp: backward with 1/n,
    mean over ranks); clip, then the update.  Returns the per-step losses."""
    params = list(model.parameters())
    opt = ZdpAdam(params, lr=dsc["lr"], betas=dsc["betas"], eps=dsc["eps"],
                  weight_decay=dsc["weight_decay"], decoupled=dsc["decoupled"],
                  bias_correction=dsc["bias_correction"])
    b, G = dsc["micro_batch"], dsc["G"]
    nwin = n_windows(tokens.numel(), T)
    j0, losses, samples = 0, [], 0
    for s in range(steps):
        n = schedule[s % len(schedule)] if schedule else G
        for p in params:
            p.grad = None
        step_losses = []
        for g in range(n):
            for r in range(W):
                x, y = make_batch(tokens, sequential_windows(j0 + g, r, W, b, nwin), T)
                _, loss = model(x, y)
                (loss / (n * W)).backward()
                step_losses.append(float(loss))
        j0 += n
        samples += n * W * b
        mean_loss = sum(step_losses) / len(step_losses)
        norm, coef = clip_coefficient(params, dsc["clip"])
        opt.step(grad_scale=coef)
        losses.append(mean_loss)
        log(f"step {s + 1} | loss {mean_loss:.6f} | global_samples {samples} | grad_norm {norm:.6f}")
    return losses


# ---- command line -------------------------------------------------------------


def _add_model_args(ap):
    ap.add_argument("--n-layer", type=int, required=True)
    ap.add_argument("--n-head", type=int, required=True)
    ap.add_argument("--n-embd", type=int, required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--block-size", type=int, required=True)


def _cfg(a):
    return GPTConfig(a.n_layer, a.n_head, a.n_embd, a.vocab_size, a.block_size).validate()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("init", help="write GPT-2-initialised weights")
    _add_model_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p = sub.add_parser("tokens", help="write a synthetic llm.c token shard")
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--ntok", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p = sub.add_parser("train", help="zdp train --model gpt, as a single-process reference")
    _add_model_args(p)
    p.add_argument("--config", required=True)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--init", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--schedule", default=None)
    p.add_argument("--save-weights", default=None)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)

    if a.cmd == "init":
        m = GPT(_cfg(a))
        m.init_weights(torch.Generator().manual_seed(a.seed))
        save_weights(m, a.out)
        return 0
    if a.cmd == "tokens":
        write_tokens(a.out, synthetic_tokens(a.vocab_size, a.ntok, a.seed))
        return 0
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    cfg = _cfg(a)
    m = GPT(cfg, attn_impl="manual")
    load_weights(m, a.init)
    m.to(dtype)
    dsc = load_ds_config(a.config, a.world_size)
    sched = [int(x) for x in a.schedule.split(",")] if a.schedule else None
    reference_train(m, read_tokens(a.data), cfg.block_size, a.world_size, dsc, a.steps, sched,
                    log=lambda s: (print(s), sys.stdout.flush()))
    if a.save_weights:
        save_weights(m, a.save_weights)
    return 0


if __name__ == "__main__":
    sys.exit(main())
