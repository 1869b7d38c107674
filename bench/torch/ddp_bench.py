#!/usr/bin/python3
"""PyTorch DDP (gloo, CPU) training zdp's GPT-2, for bench/run_gpt_bench.sh.

Same model (gpt_torch.GPT), same data order as `zdp train --model gpt
--data-order sequential`, one optimizer step per micro-batch (G = 1),
torch.optim.AdamW with gradient clipping 1.0 (clip_grad_norm_), W processes
started with torch.multiprocessing.spawn, `--threads` intra-op threads each
(torch.set_num_threads, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS).

usage: ddp_bench.py --n-layer L --n-head H --n-embd C --vocab-size V
                    --block-size T --micro-batch b --world-size W --threads N
                    --steps S [--warmup K] [--data TOKENS.bin] [--init INIT.safetensors]

Prints one JSON line on rank 0 ("RESULT {...}"): median / mean ms per step
over the timed steps (after K warm-up steps), tokens/s = W*b*T / median
step time, the losses, and every rank's peak RSS in MiB
(getrusage(RUSAGE_SELF).ru_maxrss, the same measure /usr/bin/time gives
zdp's ranks).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def worker(rank, a, port):
    # Threads must be fixed before torch starts its pools.
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gpt_torch as gt

    torch.set_num_threads(a.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=a.world_size)
    W, b, T = a.world_size, a.micro_batch, a.block_size

    cfg = gt.GPTConfig(a.n_layer, a.n_head, a.n_embd, a.vocab_size, a.block_size)
    model = gt.GPT(cfg, attn_impl=a.attn)
    if a.init:
        gt.load_weights(model, a.init)
    ddp = DDP(model)  # broadcasts rank 0's weights
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    if a.data:
        tokens = gt.read_tokens(a.data)
    else:
        tokens = gt.synthetic_tokens(cfg.vocab_size, max(W * b * (a.steps + a.warmup) * T + 1, 4 * T + 1), 1)
    nwin = gt.n_windows(tokens.numel(), T)

    times, losses = [], []
    for j in range(a.warmup + a.steps):
        x, y = gt.make_batch(tokens, gt.sequential_windows(j, rank, W, b, nwin), T)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = ddp(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.detach().clone()
        dist.all_reduce(lv)  # mean loss over ranks, as zdp prints it
        dt = time.perf_counter() - t0
        if j >= a.warmup:
            times.append(dt)
            losses.append(float(lv) / W)
    # Rank 0 reports the step times it saw (the ranks are synchronised by the
    # gradient all-reduce, so they see the same); every rank reports its RSS.
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss = [torch.zeros(1, dtype=torch.float64) for _ in range(W)]
    dist.all_gather(rss, torch.tensor([rss_kib / 1024.0], dtype=torch.float64))
    if rank == 0:
        med = statistics.median(times)
        res = {
            "impl": "torch-ddp", "world_size": W, "threads": a.threads, "micro_batch": b,
            "T": T, "n_layer": a.n_layer, "n_head": a.n_head, "n_embd": a.n_embd,
            "vocab_size": a.vocab_size, "n_params": model.num_params(),
            "steps": a.steps, "warmup": a.warmup,
            "ms_per_step_median": med * 1e3, "ms_per_step_mean": statistics.mean(times) * 1e3,
            "tokens_per_s": W * b * T / med,
            "flops_per_token": gt.flops_per_token(cfg, T),
            "loss_first": losses[0], "loss_last": losses[-1],
            "peak_rss_mib": [round(float(r), 1) for r in rss],
            "torch": torch.__version__, "attn": model.transformer.h[0].attn.attn_impl,
        }
        print("RESULT " + json.dumps(res), flush=True)
    # torch 1.13's gloo destroy_process_group can hang one rank at exit:
    # synchronise, then leave without it.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k in ("n-layer", "n-head", "n-embd", "vocab-size", "block-size", "micro-batch"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--data", default=None)
    ap.add_argument("--init", default=None)
    ap.add_argument("--attn", choices=("sdpa", "manual"), default="sdpa",
                    help="sdpa falls back to manual on torch < 2.0")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    port = a.port or (29500 + os.getpid() % 2000)
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(a, port), nprocs=a.world_size, join=True)


if __name__ == "__main__":
    main()
