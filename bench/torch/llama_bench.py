#!/usr/bin/python3
"""PyTorch reference training step for bench/run_llama_bench.sh: a plain
PyTorch Llama (fp32) of zdp's Llama-family math, SmolLM2-135M's shape by
default (30 layers, hidden 576, 9 heads, 3 KV heads, FFN 1536, vocab 49152,
tied embeddings, RMSNorm eps 1e-5, rope_theta 100000), random weights and
random tokens, W processes (torch.multiprocessing.spawn, gloo,
DistributedDataParallel), `--threads` intra-op threads each.

One optimizer step per micro-batch by default (G = 1); --ga G accumulates G
micro-batches per optimizer step (loss / G each, DDP's no_sync() for the
first G - 1 so gradients are all-reduced once per step, as zdp's stage 0
does): torch.optim.AdamW (lr 3e-4, betas
0.9/0.95, eps 1e-8, weight decay 0.1), clip_grad_norm_(1.0), the same as
bench/llama_bench.c.  Attention is the textbook form (Debian's torch 1.13
has no scaled_dot_product_attention): scores, causal mask, softmax, @ V,
with the KV heads repeated for their query heads (transformers' repeat_kv).

usage: llama_bench.py [--layers 30] [--hidden 576] [--heads 9] [--kv-heads 3]
                      [--ffn 1536] [--vocab 49152] [--T 256] [--micro 4]
                      [--world-size 1] [--threads 2] [--steps 3] [--warmup 1] [--ga 1]

Prints on rank 0: RESULT {...} with the median ms per optimizer step (the
slowest rank's), tokens/s = W*b*T*G / median, the CPU ms per step (each rank's median,
summed over ranks), the losses and every rank's peak RSS.
"""

import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import sys
import time


def build_model(torch, a):
    nn = torch.nn
    F = torch.nn.functional
    hd = a.hidden // a.heads

    class RMSNorm(nn.Module):
        def __init__(self, n, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return x * r * self.weight

    inv_freq = 1.0 / (a.theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(a.T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).float()  # (T, hd)
    sin = torch.cat([ang.sin(), ang.sin()], -1).float()

    def rot_half(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], -1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm(a.hidden, 1e-5)
            self.q_proj = nn.Linear(a.hidden, a.heads * hd, bias=False)
            self.k_proj = nn.Linear(a.hidden, a.kv_heads * hd, bias=False)
            self.v_proj = nn.Linear(a.hidden, a.kv_heads * hd, bias=False)
            self.o_proj = nn.Linear(a.heads * hd, a.hidden, bias=False)
            self.post_attention_layernorm = RMSNorm(a.hidden, 1e-5)
            self.gate_proj = nn.Linear(a.hidden, a.ffn, bias=False)
            self.up_proj = nn.Linear(a.hidden, a.ffn, bias=False)
            self.down_proj = nn.Linear(a.ffn, a.hidden, bias=False)

        def forward(self, x, mask):
            B, T, _ = x.shape
            h = self.input_layernorm(x)
            q = self.q_proj(h).view(B, T, a.heads, hd).transpose(1, 2)
            k = self.k_proj(h).view(B, T, a.kv_heads, hd).transpose(1, 2)
            v = self.v_proj(h).view(B, T, a.kv_heads, hd).transpose(1, 2)
            c, s = cos[:T], sin[:T]
            q = q * c + rot_half(q) * s
            k = k * c + rot_half(k) * s
            rep = a.heads // a.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, a.heads * hd)
            x = x + self.o_proj(y)
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(a.vocab, a.hidden)
            self.layers = nn.ModuleList([Block() for _ in range(a.layers)])
            self.norm = RMSNorm(a.hidden, 1e-5)
            # A plain attribute, not a buffer: gloo cannot broadcast bool tensors.
            self.mask = torch.ones(a.T, a.T, dtype=torch.bool).triu(1)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx, targets):
            x = self.embed_tokens(idx)
            for blk in self.layers:
                x = blk(x, self.mask)
            logits = self.norm(x) @ self.embed_tokens.weight.t()  # tied lm_head
            return F.cross_entropy(logits.view(-1, a.vocab), targets.view(-1))

    return Llama()


def cpu_s():
    """CPU seconds of this process, all threads, user + system (as llama_bench.c)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def sys_flt():
    """System CPU seconds and minor page faults of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_stime, ru.ru_minflt


def worker(rank, a, port):
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    W = a.world_size
    if W > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=W)
    model = build_model(torch, a)
    n_params = sum(p.numel() for p in model.parameters())
    run = DDP(model) if W > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    g = torch.Generator().manual_seed(1234 + 7919 * rank)
    times, cpus, losses, syss, flts = [], [], [], [], []
    for j in range(a.warmup + a.steps):
        if W > 1:
            dist.barrier()
        t0, c0, (s0, f0) = time.perf_counter(), cpu_s(), sys_flt()
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for k in range(a.ga):
            x = torch.randint(a.vocab, (a.micro, a.T), generator=g)
            y = torch.randint(a.vocab, (a.micro, a.T), generator=g)
            # DDP all-reduces in backward unless inside no_sync(): only the
            # window's last backward reduces (the accumulated sum).
            sync = W == 1 or k == a.ga - 1
            with (contextlib.nullcontext() if sync else run.no_sync()):
                lk = run(x, y)
                (lk / a.ga).backward()
            loss += float(lk) / a.ga
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt, dc = time.perf_counter() - t0, cpu_s() - c0
        s1, f1 = sys_flt()
        if j >= a.warmup:
            syss.append(s1 - s0)
            flts.append(f1 - f0)
            times.append(dt)
            cpus.append(dc)
            losses.append(float(loss))
    med, cpu = statistics.median(times), statistics.median(cpus)
    sy, fl = statistics.median(syss), statistics.median(flts)
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if W > 1:
        t = torch.tensor([med], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        med = float(t)
        c = torch.tensor([cpu], dtype=torch.float64)
        dist.all_reduce(c, op=dist.ReduceOp.SUM)
        cpu = float(c)
        c = torch.tensor([sy, fl], dtype=torch.float64)
        dist.all_reduce(c, op=dist.ReduceOp.SUM)
        sy, fl = float(c[0]), float(c[1])
        rss = [torch.zeros(1, dtype=torch.float64) for _ in range(W)]
        dist.all_gather(rss, torch.tensor([rss_kib / 1024.0], dtype=torch.float64))
        rss = [round(float(r), 1) for r in rss]
    else:
        rss = [round(rss_kib / 1024.0, 1)]
    if rank == 0:
        res = {"impl": "torch", "world_size": W, "threads": a.threads, "micro_batch": a.micro,
               "ga": a.ga, "T": a.T, "n_params": n_params, "steps": a.steps, "warmup": a.warmup,
               "ms_per_step_median": med * 1e3, "cpu_ms_per_step": cpu * 1e3,
               "sys_ms_per_step": sy * 1e3, "minflt_per_step": fl,
               "tokens_per_s": W * a.micro * a.T * a.ga / med,
               "loss_first": losses[0], "loss_last": losses[-1], "peak_rss_mib": rss,
               "torch": torch.__version__, "blas": torch.__config__.show().count("OpenBLAS") > 0}
        print("RESULT " + json.dumps(res), flush=True)
    if W > 1:
        dist.barrier()  # torch 1.13's gloo teardown can hang: leave without it
    sys.stdout.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, v in (("layers", 30), ("hidden", 576), ("heads", 9), ("kv-heads", 3), ("ffn", 1536),
                 ("vocab", 49152), ("T", 256), ("micro", 4), ("world-size", 1), ("threads", 2),
                 ("steps", 3), ("warmup", 1), ("ga", 1), ("port", 0)):
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--theta", type=float, default=100000.0)
    a = ap.parse_args()
    if a.ga < 1:
        sys.exit(f"llama_bench.py: --ga {a.ga}: the micro-batches per optimizer step must be >= 1")
    port = a.port or (29500 + os.getpid() % 2000)
    if a.world_size == 1:
        worker(0, a, port)
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(a, port), nprocs=a.world_size, join=True)


if __name__ == "__main__":
    main()
