"""PyTorch reference of the Llama family: transformers' LlamaForCausalLM and
Qwen3ForCausalLM, ported (transformers is not packaged for Debian 12).

zdp never depends on this file: it is the numerical reference for the
cross-checks in tests/torch/ (check_llama.py) and for the training
comparison of `zdp train --model-dir`.  Import it:

    sys.path.insert(0, "tests/torch"); import llama_ref as lr
    cfg = lr.LlamaRefConfig.from_hf(json.load(open("DIR/config.json")))
    model = lr.LlamaForCausalLMRef(cfg).double()
    model.load_state_dict(tensors)         # transformers' tensor names
    logits, loss = model(input_ids, targets)

The math, as transformers' modeling_llama.py / modeling_qwen3.py /
modeling_rope_utils.py compute it (eager attention, no cache, no dropout,
position_ids 0..T-1):
  x = embed_tokens[input_ids]
  per layer:  h = input_layernorm(x)
              q, k, v = q_proj(h), k_proj(h), v_proj(h)  viewed (B, T, heads, head_dim)
              Qwen3: q, k = q_norm(q), k_norm(k)         (RMSNorm over head_dim)
              q, k = q cos + rotate_half(q) sin, likewise k   (rotate_half(x) = [-x2, x1])
              attention: softmax(q k^T * head_dim^-0.5 + causal mask) v, with each KV
              head repeated n_head / n_kv_head times (repeat_kv)
              x = x + o_proj(attention);  x = x + down_proj(silu(gate_proj(h2)) * up_proj(h2))
  logits = lm_head(norm(x))   (lm_head.weight is embed_tokens.weight when tied)
  loss = F.cross_entropy over all B*T positions against `targets` (zdp's
         zdp_lm_batch; transformers' own labels path shifts by one instead).
RMSNorm: x * rsqrt(mean(x^2) + eps) * weight.  Two deliberate departures,
both because this reference runs in float64: transformers upcasts RMSNorm and
the attention softmax to float32 and builds inv_freq in float32; here they run
in the model's dtype (at least float32), so a float64 model is float64 all
the way.

Parameter names, order and [out, in] layouts are transformers' (so
named_parameters() lists what a checkpoint holds, and zdp registers the same,
include/zdp/llama.h).  A tied model has no lm_head.weight parameter.
"""

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F


@dataclass
class LlamaRefConfig:
    arch: str = "llama"           # "llama" or "qwen3" (model_type)
    n_layer: int = 2              # num_hidden_layers
    hidden: int = 64              # hidden_size
    n_head: int = 4               # num_attention_heads
    n_kv_head: int = 2            # num_key_value_heads
    head_dim: Optional[int] = None  # head_dim (default hidden // n_head)
    ffn: int = 128                # intermediate_size
    vocab_size: int = 100
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # None, {"rope_type": "linear", "factor": f},
    #   {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    #    "original_max_position_embeddings"}
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden // self.n_head

    @property
    def qk_norm(self):
        return self.arch == "qwen3"

    @classmethod
    def from_hf(cls, c):
        """From a config.json dict (the keys this port reads)."""
        return cls(arch=c.get("model_type", "llama"), n_layer=c["num_hidden_layers"],
                   hidden=c["hidden_size"], n_head=c["num_attention_heads"],
                   n_kv_head=c.get("num_key_value_heads", c["num_attention_heads"]),
                   head_dim=c.get("head_dim"), ffn=c["intermediate_size"],
                   vocab_size=c["vocab_size"],
                   max_position_embeddings=c.get("max_position_embeddings", 2048),
                   rms_norm_eps=c.get("rms_norm_eps", 1e-6),
                   rope_theta=c.get("rope_theta", 10000.0), rope_scaling=c.get("rope_scaling"),
                   attention_bias=bool(c.get("attention_bias", False)),
                   tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
                   initializer_range=c.get("initializer_range", 0.02))


def rope_inv_freq(cfg, dtype=torch.float64):
    """modeling_rope_utils: _compute_default_rope_parameters, the linear
    variant (inv_freq / factor) and _compute_llama3_parameters."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim))
    sc = cfg.rope_scaling
    rtype = None if sc is None else sc.get("rope_type", sc.get("type"))
    if rtype in (None, "default"):
        return inv_freq
    if rtype == "linear":
        return inv_freq / sc["factor"]
    if rtype != "llama3":
        raise ValueError(f"rope_scaling.rope_type = {rtype!r}: this port has default, linear, llama3")
    factor = sc["factor"]
    low, high = sc["low_freq_factor"], sc["high_freq_factor"]
    old_len = sc["original_max_position_embeddings"]
    low_freq_wavelen = old_len / low
    high_freq_wavelen = old_len / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are divided by factor ...
    inv_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    # ... short ones kept, and the band between interpolated.
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, inv_llama)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = torch.promote_types(x.dtype, torch.float32)
        h = x.to(dt)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hd, b = cfg.head_dim, cfg.attention_bias
        self.cfg = cfg
        self.q_proj = torch.nn.Linear(cfg.hidden, cfg.n_head * hd, bias=b)
        self.k_proj = torch.nn.Linear(cfg.hidden, cfg.n_kv_head * hd, bias=b)
        self.v_proj = torch.nn.Linear(cfg.hidden, cfg.n_kv_head * hd, bias=b)
        self.o_proj = torch.nn.Linear(cfg.n_head * hd, cfg.hidden, bias=b)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        c = self.cfg
        B, T, _ = x.shape
        hd = c.head_dim
        q = self.q_proj(x).view(B, T, -1, hd)
        k = self.k_proj(x).view(B, T, -1, hd)
        v = self.v_proj(x).view(B, T, -1, hd)
        if c.qk_norm:  # Qwen3: per head, before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)
        cos, sin = cos[None, None], sin[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = c.n_head // c.n_kv_head  # repeat_kv: head h reads KV head h // rep
        k = k[:, :, None].expand(B, c.n_kv_head, rep, T, hd).reshape(B, c.n_head, T, hd)
        v = v[:, :, None].expand(B, c.n_kv_head, rep, T, hd).reshape(B, c.n_head, T, hd)
        w = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        w = w.masked_fill(mask, torch.finfo(w.dtype).min)
        w = F.softmax(w, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
        o = torch.matmul(w, v).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(o)


class MLP(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = torch.nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.up_proj = torch.nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down_proj = torch.nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        # Registration order = transformers' module order: input_layernorm,
        # self_attn (q, k, v, o, q_norm, k_norm), post_attention_layernorm, mlp.
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = torch.nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_norm_eps)


class LlamaForCausalLMRef(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Model(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = torch.nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def head_weight(self):
        return self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def init_weights(self, generator):
        """transformers' _init_weights: Linear/Embedding N(0, initializer_range),
        biases 0, RMSNorm weights 1."""
        std = self.cfg.initializer_range
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * std)

    def rope(self, T, dtype):
        inv = rope_inv_freq(self.cfg, torch.float64)
        freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, input_ids, targets=None, weights=None):
        """logits (B, T, V); loss = (1/(B*T)) sum w * CE (w = 1 without weights)."""
        B, T = input_ids.shape
        dt = self.model.embed_tokens.weight.dtype
        cos, sin = self.rope(T, dt)
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        logits = F.linear(self.model.norm(x), self.head_weight())
        if targets is None:
            return logits, None
        ce = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), reduction="none")
        if weights is not None:
            ce = ce * weights.reshape(-1).to(ce.dtype)
        return logits, ce.mean()
