#!/usr/bin/python3
"""zdp vs PyTorch DDP training GPT-2 on CPU (driven by bench/run_gpt_bench.sh).

For each configuration (model x ranks x threads) and repetition, alternates
  zdp ZeRO stage 0, zdp ZeRO stage 2, PyTorch DDP (gloo)
and reports medians over the repetitions of: ms/step, tokens/s, model FLOP
utilisation against the measured cblas_sgemm peak for the same cores, and
peak RSS per rank.

usage: gpt_bench.py --zdp build/bin/zdp --sgemm-peak BIN [--optim-bench BIN]
                    [--reps 3] [--steps 8] [--warmup 2] [--models gpt-s,gpt-m]
                    [--nps 1,2] [--impls zdp0,zdp2,zdp2blas,torch] [--json OUT.json]

zdp's step time: parse_zdp_step() reads rank 0's "step N | ..." lines; if a
line carries a time ("ms/step X", "dt X ms", "X ms") or a rate ("tokens/s
X", "tok/s X") that is used, otherwise the time between consecutive step
lines as they arrive (stdout is line-flushed).  Peak RSS per rank: every
rank runs under /usr/bin/time -f "ZDP_RSS_KIB %M".
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODELS = {
    # name: (n_layer, n_head, n_embd, T, micro_batch); vocab 256
    "gpt-s": (4, 4, 256, 128, 8),
    "gpt-m": (6, 6, 384, 256, 4),
}
VOCAB = 256
# -np 1 with 2 BLAS threads, -np 2 with 1 each: the machine's 2 cores either way.
LAYOUTS = {1: 2, 2: 1}


# ---- zdp's output -------------------------------------------------------------

_STEP = re.compile(r"^step\s+(\d+)\s*\|")
_MS = [re.compile(r"ms/step\s*[=:]?\s*([0-9.]+)"), re.compile(r"\bdt\s*[=:]?\s*([0-9.]+)\s*ms"),
       re.compile(r"step_ms\s*[=:]?\s*([0-9.]+)"), re.compile(r"([0-9.]+)\s*ms\b")]
_TOKS = [re.compile(r"tok(?:en)?s/s\s*[=:]?\s*([0-9.]+)"), re.compile(r"([0-9.]+)\s*tok(?:en)?s/s")]
_LOSS = re.compile(r"\|\s*loss\s+([-+0-9.eEnaif]+)")


def parse_zdp_step(line):
    """One line of `zdp train` output -> None, or {"step": N, "loss": x,
    "ms": per-step ms or None, "tokens_per_s": rate or None}.  The only
    place that knows zdp's output format."""
    line = line.strip()
    m = _STEP.match(line)
    if not m:
        return None
    out = {"step": int(m.group(1)), "loss": None, "ms": None, "tokens_per_s": None}
    lm = _LOSS.search(line)
    if lm:
        try:
            out["loss"] = float(lm.group(1))
        except ValueError:
            pass
    for r in _MS:
        mm = r.search(line)
        if mm:
            out["ms"] = float(mm.group(1))
            break
    for r in _TOKS:
        mm = r.search(line)
        if mm:
            out["tokens_per_s"] = float(mm.group(1))
            break
    return out


def write_ds_config(path, micro, stage):
    cfg = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1000000,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95],
                                                  "eps": 1e-8, "weight_decay": 0.1}},
        "zero_optimization": {"stage": stage},
    }
    with open(path, "w") as f:
        json.dump(cfg, f)


def run_zdp(a, work, model, np_, threads, stage, data, init, blas=False):
    L, H, C, T, b = MODELS[model]
    cfgp = os.path.join(work, f"ds_{model}_s{stage}.json")
    write_ds_config(cfgp, b, stage)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    if blas:  # impl zdpNblas: every product through cblas_sgemm
        env["ZDP_GEMM"] = "blas"
    cmd = [a.mpirun, "-np", str(np_), "--bind-to", "none", "/usr/bin/time", "-f", "ZDP_RSS_KIB %M", a.zdp, "train",
           "--model", "gpt", "--n-layer", str(L), "--n-head", str(H), "--n-embd", str(C),
           "--vocab-size", str(VOCAB), "--block-size", str(T), "--config", cfgp,
           "--data", data, "--data-order", "sequential", "--steps", str(a.warmup + a.steps),
           "--val-every", "0", "--progress", "off", "--out-dir", os.path.join(work, "zdp-out")]
    if init:
        cmd += ["--init", init]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=env)
    steps, arrivals = [], []
    for line in p.stdout:
        s = parse_zdp_step(line)
        if s:
            steps.append(s)
            arrivals.append(time.perf_counter())
    err = p.stderr.read()
    rc = p.wait()
    if rc != 0 or len(steps) < a.warmup + a.steps:
        raise RuntimeError(f"zdp failed (exit {rc}, {len(steps)} step lines): {' '.join(cmd)}\n"
                           f"{err[-2000:]}")
    timed = steps[a.warmup:]
    if all(s["ms"] is not None for s in timed):
        ms = statistics.median(s["ms"] for s in timed)
        src = "printed ms"
    elif all(s["tokens_per_s"] is not None for s in timed):
        ms = statistics.median(np_ * b * T / s["tokens_per_s"] * 1e3 for s in timed)
        src = "printed tokens/s"
    else:
        gaps = [(arrivals[i] - arrivals[i - 1]) * 1e3 for i in range(a.warmup, len(arrivals))]
        ms = statistics.median(gaps)
        src = "line arrival"
    rss = [int(x) / 1024.0 for x in re.findall(r"ZDP_RSS_KIB (\d+)", err)]
    return {"ms": ms, "tokens_per_s": np_ * b * T / (ms * 1e-3), "rss_mib": sorted(rss),
            "loss_last": timed[-1]["loss"], "timing_source": src}


def run_torch(a, work, model, np_, threads, data, init):
    L, H, C, T, b = MODELS[model]
    cmd = [sys.executable, os.path.join(HERE, "ddp_bench.py"), "--n-layer", str(L), "--n-head",
           str(H), "--n-embd", str(C), "--vocab-size", str(VOCAB), "--block-size", str(T),
           "--micro-batch", str(b), "--world-size", str(np_), "--threads", str(threads),
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--data", data]
    if init:
        cmd += ["--init", init]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    m = re.search(r"^RESULT (.*)$", r.stdout, re.M)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"ddp_bench failed (exit {r.returncode}): {' '.join(cmd)}\n"
                           f"{r.stdout[-1000:]}\n{r.stderr[-2000:]}")
    res = json.loads(m.group(1))
    return {"ms": res["ms_per_step_median"], "tokens_per_s": res["tokens_per_s"],
            "rss_mib": sorted(res["peak_rss_mib"]), "loss_last": res["loss_last"],
            "timing_source": "perf_counter"}


def sgemm_peak(binary, threads, procs):
    r = subprocess.run([binary, "--threads", str(threads), "--procs", str(procs), "--seconds", "2"],
                       capture_output=True, text=True, check=True)
    m = re.search(r"peak_gflops ([0-9.]+)", r.stdout)
    return float(m.group(1)), r.stdout.strip()


def torch_adamw_ms(numel, threads, reps=20):
    import torch
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(numel) * 0.01)
    p.grad = torch.randn(numel) * 1e-3
    out = {}
    for foreach in (False, True):
        opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.1, foreach=foreach)
        for _ in range(3):
            opt.step()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            opt.step()
            ts.append(time.perf_counter() - t0)
        out["foreach" if foreach else "for-loop"] = statistics.median(ts) * 1e3
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zdp", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--sgemm-peak", required=True)
    ap.add_argument("--optim-bench", default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--models", default="gpt-s,gpt-m")
    ap.add_argument("--nps", default="1,2")
    ap.add_argument("--impls", default="zdp0,zdp2,torch")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import gpt_torch as gt

    models = a.models.split(",")
    nps = [int(x) for x in a.nps.split(",")]
    impls = a.impls.split(",")
    print(f"# env: OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '(unset)')} nproc={os.cpu_count()}")
    peaks = {}
    for np_ in nps:
        th = LAYOUTS[np_]
        peaks[np_], txt = sgemm_peak(a.sgemm_peak, th, np_)
        print(f"# sgemm peak, {np_} process(es) x {th} thread(s): {peaks[np_]:.1f} GFLOP/s")
        for line in txt.splitlines():
            print("#   " + line)

    results = {}
    with tempfile.TemporaryDirectory() as work:
        files = {}
        for model in models:
            L, H, C, T, b = MODELS[model]
            cfg = gt.GPTConfig(L, H, C, VOCAB, T)
            ntok = max(nps) * b * (a.warmup + a.steps) * T + 1
            data = os.path.join(work, f"{model}.bin")
            gt.write_tokens(data, gt.synthetic_tokens(VOCAB, ntok, seed=5))
            m = gt.GPT(cfg)
            init = os.path.join(work, f"{model}.init.safetensors")
            gt.save_weights(m, init)
            files[model] = (data, init, m.num_params(), gt.flops_per_token(cfg, T))
        for rep in range(a.reps):
            for model in models:
                data, init, _, _ = files[model]
                for np_ in nps:
                    th = LAYOUTS[np_]
                    for impl in impls:
                        key = (model, np_, impl)
                        try:
                            if impl.startswith("zdp"):
                                blas = impl.endswith("blas")
                                stage = int(impl[3:-4] if blas else impl[3:])
                                r = run_zdp(a, work, model, np_, th, stage, data, init, blas)
                            else:
                                r = run_torch(a, work, model, np_, th, data, init)
                        except RuntimeError as e:
                            print(f"# {model} np{np_} {impl}: FAILED: {e}", file=sys.stderr)
                            continue
                        results.setdefault(key, []).append(r)
                        print(f"# rep {rep + 1} {model} np{np_} {impl}: {r['ms']:.1f} ms/step "
                              f"{r['tokens_per_s']:.0f} tok/s rss {r['rss_mib']} "
                              f"loss {r['loss_last']} ({r['timing_source']})", flush=True)

    print()
    print("| model | params | ranks x threads | impl | ms/step | tokens/s | MFU | peak RSS/rank MiB | loss@last |")
    print("|---|---|---|---|---|---|---|---|---|")
    table = []
    for model in models:
        _, _, n_params, fpt = files[model]
        for np_ in nps:
            for impl in impls:
                rs = results.get((model, np_, impl))
                if not rs:
                    print(f"| {model} | {n_params/1e6:.2f}M | {np_} x {LAYOUTS[np_]} | {impl} | failed | | | | |")
                    continue
                ms = statistics.median(r["ms"] for r in rs)
                tps = statistics.median(r["tokens_per_s"] for r in rs)
                mfu = tps * fpt / (peaks[np_] * 1e9)
                rss = max(max(r["rss_mib"]) for r in rs if r["rss_mib"]) if any(r["rss_mib"] for r in rs) else float("nan")
                name = {"zdp0": "zdp ZeRO-0", "zdp2": "zdp ZeRO-2", "zdp2blas": "zdp ZeRO-2, ZDP_GEMM=blas",
                        "torch": "PyTorch DDP"}.get(impl, impl)
                print(f"| {model} | {n_params/1e6:.2f}M | {np_} x {LAYOUTS[np_]} | {name} | {ms:.1f} | "
                      f"{tps:.0f} | {100*mfu:.1f}% | {rss:.0f} | {rs[-1]['loss_last']} |")
                table.append(dict(model=model, n_params=n_params, np=np_, threads=LAYOUTS[np_],
                                  impl=impl, ms=ms, tokens_per_s=tps, mfu=mfu, rss_mib=rss,
                                  flops_per_token=fpt, runs=rs))
    print(f"\nFLOPs/token = 6*(12*L*C^2 + V*C) + 12*L*T*C; MFU = tokens/s * FLOPs/token / sgemm peak "
          f"({', '.join(f'np{k}: {v:.1f} GFLOP/s' for k, v in peaks.items())}); "
          f"{a.reps} reps x {a.steps} timed steps after {a.warmup} warm-up, medians.")

    # Optimizer step alone.
    print("\n| model | params | ranks | zdp stage | zdp update ms (partition) | torch AdamW ms (for-loop / foreach, 1 proc) |")
    print("|---|---|---|---|---|---|")
    optim_rows = []
    for model in models:
        n_params = files[model][2]
        tq = torch_adamw_ms(n_params, 1)
        for np_ in nps:
            for stage in (0, 2):
                z = "n/a"
                if a.optim_bench:
                    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
                    r = subprocess.run([a.mpirun, "-np", str(np_), a.optim_bench, "--numel",
                                        str(n_params), "--stage", str(stage)],
                                       capture_output=True, text=True, env=env)
                    m = re.search(r"partition=(\d+) update_ms=([0-9.]+)", r.stdout)
                    if m:
                        z = f"{float(m.group(2)):.2f} ({int(m.group(1))/1e6:.2f}M)"
                        optim_rows.append(dict(model=model, np=np_, stage=stage,
                                               partition=int(m.group(1)), update_ms=float(m.group(2))))
                print(f"| {model} | {n_params/1e6:.2f}M | {np_} | {stage} | {z} | "
                      f"{tq['for-loop']:.2f} / {tq['foreach']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"peaks_gflops": peaks, "table": table, "optim": optim_rows}, f, indent=1)


if __name__ == "__main__":
    main()
